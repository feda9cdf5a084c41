"""How close ReplaySSM and vLLM's own CPU verify each come to an fp64 recurrence, on a model served in process.

    PYTHONPATH=kernels python -m gdn_replayssm.vllm_cpu_accuracy MODEL_DIR [--num-spec 3] [--ring-len 8]

Runs vLLM's offline engine (CPU build, one process) with MTP speculation and ReplaySSM with its shadow check on.
At each verify of each GDN layer it also runs the window in float64 from the state vLLM's own path resumes from
(the shadow pool), and prints one JSON line: the largest deviation of each implementation from that, and between
the two, relative to the largest output. Why: the shadow check's tolerance must sit above what the two honest
implementations differ by (`vllm_cpu_shadow`).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from .reference import recurrent_ref
from .vllm_cpu_shadow import PoolKey, ShadowCheck, relative_deviation

PROMPTS = ["The color of the sky is", "Devices fail in quiet ways", "A ring of inputs and one checkpoint", "Hello"]


def float64_window(pool: torch.Tensor, args: dict[str, Any]) -> torch.Tensor:
    """vLLM's verify semantics (`recurrent_ref`: each row resumes from block column `num_accepted - 1`) in float64,
    on a scratch copy of the `[N, HV, K, V]` pool vLLM's CPU build hands over; rows grouped by window length."""
    state = pool.transpose(-1, -2).double().contiguous()
    indices, bounds = args["spec_state_indices"], args["cu_seqlens"].tolist()
    out = torch.zeros(args["q"].shape[0], args["v"].shape[1], args["v"].shape[2], dtype=torch.float64)
    lengths = [bounds[i + 1] - bounds[i] for i in range(indices.shape[0])]
    for T in sorted(set(lengths) - {0}):
        rows = [i for i, n in enumerate(lengths) if n == T]
        tokens = torch.tensor([bounds[i] + t for i in rows for t in range(T)], dtype=torch.long)
        window = torch.empty(tokens.shape[0], out.shape[1], out.shape[2], dtype=torch.float64)
        recurrent_ref(mixed_qkv=torch.cat([args[x][tokens].flatten(1) for x in "qkv"], dim=1).contiguous(),
                      a=args["a"][tokens].contiguous(), b=args["b"][tokens].contiguous(), A_log=args["A_log"],
                      dt_bias=args["dt_bias"], state=state, state_indices=indices[rows, :T].contiguous(),
                      num_accepted=args["num_accepted_tokens"][rows].contiguous(), out=window)  # fmt: skip
        out[tokens] = window
    return out


class MeasuredShadow(ShadowCheck):
    """The shadow check, plus both implementations against float64 at every verify."""

    replayssm_vs_float64: float = 0.0
    vllm_vs_float64: float = 0.0

    def verify(self, key: PoolKey, state: torch.Tensor, ours: torch.Tensor, args: dict[str, Any]) -> torch.Tensor:
        pool = self.pools.get(key)
        truth = float64_window(pool if pool is not None else state, args)
        expected = super().verify(key, state, ours, args)
        self.replayssm_vs_float64 = max(self.replayssm_vs_float64, relative_deviation(ours.double(), truth))
        self.vllm_vs_float64 = max(self.vllm_vs_float64, relative_deviation(expected.double(), truth))
        return expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gdn_replayssm.vllm_cpu_accuracy", description=__doc__.split("\n")[0]
    )
    parser.add_argument("model", help="a model folder with MTP weights (warden model tiny DIR --mtp --peaky ...)")
    parser.add_argument("--num-spec", type=int, default=3, help="MTP draft tokens per step (default 3)")
    parser.add_argument("--ring-len", type=int, default=8, help="ReplaySSM ring length (default 8)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per prompt (default 32)")
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, where the hooks are
    from vllm import LLM, SamplingParams

    from .vllm_cpu_hooks import install

    replay = install(args.ring_len, shadow_check=True)
    assert replay.shadow is not None
    shadow = replay.shadow = MeasuredShadow(replay.shadow.baseline_op, decode_op=replay.shadow.decode_op)
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=1024, enforce_eager=True,
              distributed_executor_backend="uni", kv_cache_memory_bytes=64 << 20, enable_prefix_caching=False,
              speculative_config={"method": "mtp", "num_speculative_tokens": args.num_spec})  # fmt: skip
    llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)
    print(json.dumps({
        "model": os.path.abspath(args.model), "num_spec": args.num_spec, "ring_len": args.ring_len,
        "verify_calls": shadow.verify_calls, "folded_rows": replay.folded_rows,
        "replayssm_vs_float64": round(shadow.replayssm_vs_float64, 5),
        "vllm_vs_float64": round(shadow.vllm_vs_float64, 5),
        "replayssm_vs_vllm": round(shadow.worst_output, 5), "over_tolerance": shadow.over_tolerance,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
