"""config.json and an empty-weights index with the real Qwen3.6-35B-A3B dimensions.

No weights: this is the model guard rules and placement reason about (layer types, head counts,
experts, presence of `mtp.*` tensors). Tensor names follow the Qwen3.5-MoE text layout under the
multimodal checkpoint's `model.language_model.` prefix; the shard files named in the index do not
exist. Only the text model is described: there is no vision tower here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.errors import UserError

HIDDEN_SIZE = 2048
NUM_LAYERS = 40
FULL_ATTENTION_INTERVAL = 4
NUM_EXPERTS = 256
SHARD = "model-00001-of-00001.safetensors"
MTP_SHARD = "mtp.safetensors"


def layer_types(num_layers: int = NUM_LAYERS, interval: int = FULL_ATTENTION_INTERVAL) -> list[str]:
    """Every `interval`-th layer (3, 7, ..., 39) is full attention; the rest are GDN."""
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


def text_config() -> dict[str, Any]:
    return {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "layer_types": layer_types(),
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "attn_output_gate": True,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "router_aux_loss_coef": 0.001,
        "vocab_size": 248320,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        "mtp_num_hidden_layers": 1,
        "mamba_ssm_dtype": "float32",
        "tie_word_embeddings": False,
        "eos_token_id": 248044,
        "bos_token_id": 248044,
        "dtype": "bfloat16",
    }


def config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text_config(),
        "tie_word_embeddings": False,
    }


def _layer_tensor_names(prefix: str, kind: str, experts: int) -> list[str]:
    names = [f"{prefix}.input_layernorm.weight", f"{prefix}.post_attention_layernorm.weight"]
    if kind == "linear_attention":
        names += [
            f"{prefix}.linear_attn.{part}"
            for part in (
                "A_log",
                "dt_bias",
                "conv1d.weight",
                "in_proj_a.weight",
                "in_proj_b.weight",
                "in_proj_qkv.weight",
                "in_proj_z.weight",
                "norm.weight",
                "out_proj.weight",
            )
        ]
    else:
        names += [
            f"{prefix}.self_attn.{part}.weight" for part in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
        ]
    names += [f"{prefix}.mlp.gate.weight", f"{prefix}.mlp.shared_expert_gate.weight"]
    names += [f"{prefix}.mlp.shared_expert.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    for expert in range(experts):
        names += [f"{prefix}.mlp.experts.{expert}.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    return names


def weight_index(mtp_weights: bool) -> dict[str, Any]:
    base = "model.language_model"
    names = [f"{base}.embed_tokens.weight", f"{base}.norm.weight", "lm_head.weight"]
    for i, kind in enumerate(layer_types()):
        names += _layer_tensor_names(f"{base}.layers.{i}", kind, NUM_EXPERTS)
    weight_map = dict.fromkeys(names, SHARD)
    if mtp_weights:
        mtp = ["mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.pre_fc_norm_embedding.weight"]
        mtp += _layer_tensor_names("mtp.layers.0", "full_attention", NUM_EXPERTS)
        weight_map.update(dict.fromkeys(mtp, MTP_SHARD))
    return {
        "metadata": {"total_size": 0, "warden_note": "empty-weights index: shards absent"},
        "weight_map": dict(sorted(weight_map.items())),
    }


def write_qwen36_config(out: Path, *, mtp_weights: bool = False) -> Path:
    """Write config.json and model.safetensors.index.json for Qwen3.6-35B-A3B into `out`."""
    if (out / "config.json").exists():
        raise UserError(f"{out}/config.json already exists", "pass a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    (out / "model.safetensors.index.json").write_text(json.dumps(weight_index(mtp_weights), indent=1) + "\n")
    return out


KNOWN_CONFIGS = {"qwen36-35b-a3b": write_qwen36_config}
