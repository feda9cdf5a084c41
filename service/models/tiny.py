"""A tiny random-weight model of the real Qwen3.5/3.6-MoE hybrid, served by vLLM's Qwen GDN layer.

Layers follow the real pattern (three Gated-DeltaNet linear-attention layers, then one full
attention layer), the MLP is a routed MoE with top-k and a shared expert, and `--mtp` adds one
multi-token-prediction layer in vLLM's `mtp.*` layout. The tokenizer is a byte-level BPE trained on
the text this package ships. The same seed always gives the same bytes.

`peaky` makes greedy choices win by wide margins: the output head is a fixed permutation of the
embedding (`lm_head = 10 * embed[perm]`), so the greedy successor of token t is `perm^-1(t)` with a
top-2 logit gap of several units, and bf16 differences between engine settings cannot flip a token.
The MTP layer is then built to predict that successor, so its drafts are accepted. This is the
model for golden-output, parity and acceptance tests.

The CPU build of vLLM constrains the shapes: GDN head dims of 64 or 128, attention head_dim from a
fixed set, bf16 weights.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from service.errors import UserError

CORPUS_DIR = Path(__file__).with_name("corpus")
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PEAKY_HEAD_SCALE = 10.0
RANDOM_HEAD_SCALE = 20.0
MANIFEST = "warden_model.json"


@dataclass(frozen=True)
class TinyShape:
    """Dimensions of the tiny hybrid; every GDN/attention constraint of the CPU engine holds."""

    hidden_size: int = 128
    num_hidden_layers: int = 4  # full attention every 4th layer -> [linear, linear, linear, full]
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    shared_expert_intermediate_size: int = 64
    max_position_embeddings: int = 4096


def corpus_lines() -> list[str]:
    """The tokenizer's training text, in a fixed order."""
    lines: list[str] = []
    for path in sorted(CORPUS_DIR.glob("*.txt")):
        lines.extend(line for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return lines


def build_tokenizer(out: Path) -> Any:
    """Train the byte-level BPE tokenizer on the shipped corpus and save it with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        # A short corpus runs out of merges; pad the vocabulary so the config's vocab_size holds.
        filler = [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - tokenizer.get_vocab_size())]
        tokenizer.add_special_tokens(filler)
    tokenizer_cls: Any = PreTrainedTokenizerFast
    hf_tokenizer = tokenizer_cls(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",  # noqa: S106 (a tokenizer's special token, not a secret)
        pad_token="<|endoftext|>",  # noqa: S106 (a tokenizer's special token, not a secret)
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    hf_tokenizer.model_max_length = TinyShape.max_position_embeddings
    hf_tokenizer.save_pretrained(str(out))
    return hf_tokenizer


def _mtp_tensors(shape: TinyShape, peaky: bool, generator: Any, noise: float = 0.0) -> dict[str, Any]:
    """One MTP layer in vLLM's Qwen3.5-MoE MTP layout; embed_tokens/lm_head are shared with the model."""
    import torch

    h, i, e = shape.hidden_size, shape.moe_intermediate_size, shape.num_experts
    nh, nkv, hd = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim

    def rand(*dims: int) -> Any:
        return (torch.randn(*dims, generator=generator) * 0.02).to(torch.bfloat16)

    def zeros(*dims: int) -> Any:
        return torch.zeros(*dims, dtype=torch.bfloat16)  # Qwen3.5 RMSNorm is x * (1 + w)

    # fc = [I | 0] passes the embedding of token t+1 straight through, so on the peaky model the
    # MTP head predicts what the main model will choose next.
    # `noise` blurs that view with a random matrix, so the head misses some successors (drafts get rejected).
    if peaky:
        view = torch.eye(h) + noise * torch.randn(h, h, generator=generator) / h**0.5 if noise else torch.eye(h)
        fc = torch.cat([view, torch.zeros(h, h)], 1).to(torch.bfloat16)
    else:
        fc = rand(h, 2 * h)
    tensors: dict[str, Any] = {
        "mtp.fc.weight": fc,
        "mtp.pre_fc_norm_hidden.weight": zeros(h),
        "mtp.pre_fc_norm_embedding.weight": zeros(h),
        "mtp.norm.weight": zeros(h),
        "mtp.layers.0.input_layernorm.weight": zeros(h),
        "mtp.layers.0.post_attention_layernorm.weight": zeros(h),
        "mtp.layers.0.self_attn.q_proj.weight": rand(nh * hd * 2, h),  # query + output gate
        "mtp.layers.0.self_attn.k_proj.weight": rand(nkv * hd, h),
        "mtp.layers.0.self_attn.v_proj.weight": rand(nkv * hd, h),
        "mtp.layers.0.self_attn.o_proj.weight": rand(h, nh * hd),
        "mtp.layers.0.self_attn.q_norm.weight": zeros(hd),
        "mtp.layers.0.self_attn.k_norm.weight": zeros(hd),
        "mtp.layers.0.mlp.gate.weight": rand(e, h),
        "mtp.layers.0.mlp.shared_expert_gate.weight": rand(1, h),
        "mtp.layers.0.mlp.shared_expert.gate_proj.weight": rand(shape.shared_expert_intermediate_size, h),
        "mtp.layers.0.mlp.shared_expert.up_proj.weight": rand(shape.shared_expert_intermediate_size, h),
        "mtp.layers.0.mlp.shared_expert.down_proj.weight": rand(h, shape.shared_expert_intermediate_size),
    }
    for expert in range(e):
        prefix = f"mtp.layers.0.mlp.experts.{expert}"
        tensors[f"{prefix}.gate_proj.weight"] = rand(i, h)
        tensors[f"{prefix}.up_proj.weight"] = rand(i, h)
        tensors[f"{prefix}.down_proj.weight"] = rand(h, i)
    return tensors


def build_tiny_model(
    out: Path, *, mtp: bool = False, peaky: bool = False, seed: int = 0, mtp_noise: float = 0.0
) -> Path:
    """Write config, weights and tokenizer of a tiny Qwen3.5-MoE hybrid into `out` and return it. `mtp_noise` (with
    `mtp` and `peaky`) makes the MTP layer miss some successors; the main model's weights do not depend on it."""
    if mtp_noise and not (mtp and peaky):
        raise UserError("--mtp-noise blurs the peaky model's MTP layer", "add --mtp --peaky, or leave --mtp-noise out")
    if out.exists() and any(out.iterdir()):
        raise UserError(
            f"{out} already exists and is not empty",
            "pass a new folder (the builder never overwrites a model)",
        )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    shape = TinyShape()
    config = Qwen3_5MoeTextConfig(
        vocab_size=VOCAB_SIZE,
        **{k: v for k, v in asdict(shape).items()},
        tie_word_embeddings=False,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    if mtp:
        config.mtp_num_hidden_layers = 1

    torch.manual_seed(seed)
    model_cls: Any = Qwen3_5MoeForCausalLM
    model = model_cls(config).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(VOCAB_SIZE, generator=generator)
    with torch.no_grad():
        if peaky:
            model.lm_head.weight.copy_(PEAKY_HEAD_SCALE * model.model.embed_tokens.weight[perm])
        else:
            model.lm_head.weight.mul_(RANDOM_HEAD_SCALE)
    model.save_pretrained(str(out))
    if peaky:
        # The greedy chain the peaky model follows: next token of t is next_token_of[t].
        (out / "perm.json").write_text(json.dumps({"next_token_of": torch.argsort(perm).tolist()}) + "\n")

    if mtp:
        tensors = _mtp_tensors(shape, peaky, generator, mtp_noise)
        save_file(tensors, str(out / "mtp.safetensors"), metadata={"format": "pt"})
        weight_map = dict.fromkeys(sorted(load_file(str(out / "model.safetensors"))), "model.safetensors")
        weight_map.update(dict.fromkeys(sorted(tensors), "mtp.safetensors"))
        index = {"metadata": {}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    manifest = {"builder": "warden model tiny", "seed": seed, "mtp": mtp, "peaky": peaky, **asdict(shape)}
    if mtp_noise:
        manifest["mtp_noise"] = mtp_noise
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out
