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

from .reference import gdn_gates_ref, gdn_output_ref, gdn_step_ref, l2norm_ref
from .vllm_cpu_shadow import PoolKey, ShadowCheck, relative_deviation

PROMPTS = ["The color of the sky is", "Devices fail in quiet ways", "A ring of inputs and one checkpoint", "Hello"]


def float64_window(pool: torch.Tensor, args: dict[str, Any]) -> torch.Tensor:
    """vLLM's verify semantics in float64: each row resumes from block column `num_accepted - 1` and runs its
    window token by token (`[N, HV, K, V]` pool, as vLLM's CPU build lays it out)."""
    q, k, v = args["q"], args["k"], args["v"]
    indices, accepted, bounds = args["spec_state_indices"], args["num_accepted_tokens"], args["cu_seqlens"].tolist()
    group = v.shape[1] // q.shape[1]
    g, beta = gdn_gates_ref(a=args["a"], b=args["b"], A_log=args["A_log"], dt_bias=args["dt_bias"], dtype=torch.float64)
    out = torch.zeros(q.shape[0], v.shape[1], v.shape[2], dtype=torch.float64)
    for i in range(indices.shape[0]):
        slot = int(indices[i, int(accepted[i]) - 1])
        if slot <= 0:
            continue
        S = pool[slot].transpose(-1, -2).double()
        for t in range(bounds[i], bounds[i + 1]):
            query = (l2norm_ref(q[t].double()) * q.shape[2] ** -0.5).repeat_interleave(group, 0)
            key = l2norm_ref(k[t].double()).repeat_interleave(group, 0)
            S, _ = gdn_step_ref(S, key, v[t].double(), g[t], beta[t])
            out[t] = gdn_output_ref(S, query)
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
