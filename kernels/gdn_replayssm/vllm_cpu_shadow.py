"""Shadow check for ReplaySSM in vLLM's CPU build: vLLM's own ops run beside it on a copy of each state pool, and
every verify's and decode's outputs (and every state a row resumes from on vLLM's own path) are compared.

For on-call, on live traffic: does ReplaySSM agree with the verify it replaces? It keeps a second state pool per
GDN layer and runs both verifies, so it is a diagnostic, not a serving mode.

Deviations are relative to the largest value compared. The outputs are bf16, where one unit in the last place is up
to 2^-7 of a value, and vLLM's CPU op rounds inside: on the tiny model served, its outputs were 1.2 % (of the
largest) from an fp64 recurrence where ReplaySSM's were 0.6 %, and the two 1.5 % apart. A bf16 state pool rounds each
stored state to 2^-8. A commit off by one token puts the outputs > 50 % apart (tests/integration/
test_replayssm_vllm_cpu.py), so the tolerances sit between the two.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger("vllm.gdn_replayssm")

OUTPUT_TOLERANCE = 5e-2
STATE_TOLERANCE = 2e-2

PoolKey = tuple[int, tuple[int, ...]]


def relative_deviation(got: torch.Tensor, expected: torch.Tensor) -> float:
    scale = float(expected.float().abs().max()) if expected.numel() else 0.0
    if scale == 0.0:
        return float(got.float().abs().max()) if got.numel() else 0.0
    return float((got.float() - expected.float()).abs().max()) / scale


def _live_tokens(spec_state_indices: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The token rows of live rows: a padding row (null slot 0) has no output to compare (ReplaySSM writes zeros
    there, vLLM's op whatever slot 0 holds)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.repeat_interleave(spec_state_indices[:, 0] > 0, lengths.long())


@dataclass
class ShadowCheck:
    """vLLM's verify (`baseline_op`, its per-draft-state op) and recurrent decode (`decode_op`) on shadow pools,
    compared with ReplaySSM's."""

    baseline_op: Callable[..., torch.Tensor]
    decode_op: Callable[..., torch.Tensor] | None = None
    pools: dict[PoolKey, torch.Tensor] = field(default_factory=dict)
    verify_calls: int = 0
    decode_calls: int = 0
    state_checks: int = 0
    over_tolerance: int = 0
    worst_output: float = 0.0
    worst_state: float = 0.0
    widest_batch: int = 0  # the most rows one verify call held

    def verify(self, key: PoolKey, state: torch.Tensor, ours: torch.Tensor, args: dict[str, Any]) -> torch.Tensor:
        """After ReplaySSM's verify of a layer: the same step through vLLM's op on the layer's shadow pool; returns
        vLLM's outputs."""
        expected = self.baseline_op(initial_state_source=self._pool(key, state), **args)
        self.verify_calls += 1
        live = _live_tokens(args["spec_state_indices"], args["cu_seqlens"])
        self._compare("verify", ours[live], expected[live], int(args["spec_state_indices"].shape[0]))
        return expected

    def decode(self, key: PoolKey, state: torch.Tensor, ours: torch.Tensor, args: dict[str, Any]) -> torch.Tensor:
        """After ReplaySSM's decode of a layer: the same step through vLLM's recurrent op on the shadow pool."""
        if self.decode_op is None:
            raise ValueError("this shadow check has no decode op: pass decode_op")
        expected = self.decode_op(initial_state_source=self._pool(key, state), **args)
        self.decode_calls += 1
        live = args["initial_state_indices"] > 0
        self._compare("decode", ours[live], expected[live], int(live.shape[0]))
        return expected

    def _pool(self, key: PoolKey, state: torch.Tensor) -> torch.Tensor:
        pool = self.pools.get(key)
        if pool is None:  # the layer's first step: no row has a ring yet, column 0 is every row's state
            pool = self.pools[key] = state.clone()
        return pool

    def _compare(self, what: str, ours: torch.Tensor, expected: torch.Tensor, rows: int) -> None:
        deviation = relative_deviation(ours, expected)
        self.widest_batch = max(self.widest_batch, rows)
        self.worst_output = max(self.worst_output, deviation)
        calls = self.verify_calls + self.decode_calls
        if deviation > OUTPUT_TOLERANCE:
            self.over_tolerance += 1
            log.error("GDN ReplaySSM shadow check: %s outputs differ from vLLM's by %.3g of the largest "
                      "(tolerance %.0e), call %d", what, deviation, OUTPUT_TOLERANCE, calls)  # fmt: skip
        if calls & (calls - 1) == 0:  # 1, 2, 4, 8, ...: early, then ever rarer
            self.summary()

    def resumed(self, key: PoolKey, state: torch.Tensor, slots: list[int]) -> None:
        """Rows leaving the spec path, their rings folded: vLLM would resume them from its column 0."""
        pool = self.pools.get(key)
        live = torch.tensor([s for s in slots if s > 0], dtype=torch.long)
        if pool is None or live.numel() == 0:
            return
        deviation = relative_deviation(state[live], pool[live])
        self.state_checks += len(live)
        self.worst_state = max(self.worst_state, deviation)
        if deviation > STATE_TOLERANCE:
            self.over_tolerance += 1
            log.error("GDN ReplaySSM shadow check: the checkpoints of %d rows leaving the spec path differ "
                      "from vLLM's by %.3g of the largest (tolerance %.0e)", len(live), deviation,
                      STATE_TOLERANCE)  # fmt: skip

    def written(self, key: PoolKey, state: torch.Tensor, slots: list[int]) -> None:
        """vLLM's non-spec path wrote these rows' column 0 in the real pool: the shadow continues from it too."""
        pool = self.pools.get(key)
        live = torch.tensor([s for s in slots if s > 0], dtype=torch.long)
        if pool is not None and live.numel():
            pool[live] = state[live]

    def summary(self) -> None:
        log.info("GDN ReplaySSM shadow check: %d verify calls, %d decode calls, %d over tolerance; largest output "
                 "deviation %.3g (tolerance %.0e); %d resumed states, largest deviation %.3g (tolerance %.0e); widest "
                 "batch %d rows", self.verify_calls, self.decode_calls, self.over_tolerance, self.worst_output,
                 OUTPUT_TOLERANCE, self.state_checks, self.worst_state, STATE_TOLERANCE, self.widest_batch)  # fmt: skip
