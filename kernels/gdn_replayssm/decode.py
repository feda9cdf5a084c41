"""Public ReplaySSM decode step (one token per row, no speculation)."""

from __future__ import annotations

import torch

from ._config import TileConfig
from .ring import ReplayCursors, ReplayRing
from .verify import replayssm_step

__all__ = ["replayssm_decode"]


def replayssm_decode(
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    ring: ReplayRing,
    cursors: ReplayCursors,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    scale: float | None = None,
    config: TileConfig | None = None,
) -> None:
    """ReplaySSM decode step: one token per row, the checkpoint written once every `L` steps.

    Non-flush rows read the checkpoint and the committed records, compute the output and append the token's
    record; no state is written. Flush rows (`write_pos == L - 1`, every row when `L = 1`) fold the history
    and the token into the checkpoint with the baseline's code. Call `replayssm_commit` (no `num_accepted`,
    `num_tokens=1`) once per step after the last layer. A step that defers its fold (`_replay.deferred_fold`:
    by default at 2-32 rows) reconstructs the flush rows' outputs too, folds on side streams, and the
    checkpoints hold the step only after that commit. With cursors allocated `step_fold=True`, a step of 1-8
    rows (`_replay.step_fold`) launches no fold: call `replayssm_fold` after the last layer, before the commit.

    Args:
        mixed_qkv: `[B, 2 * H * K + HV * V]` post-conv q | k | v, last dim contiguous, rows may be strided.
        a, b: `[B, HV]` gate inputs, last dim contiguous.
        A_log, dt_bias: `[HV]`.
        state: `[N, HV, V, K]` checkpoint pool (float32 / bfloat16 / float16), written on flush rows only.
        ring: this layer's `ReplayRing` (any `ring_len >= 1`); `ring.v is None` selects the open-loop fold.
        cursors: the `ReplayCursors` shared by all layers, read only.
        state_indices: `[B]` int32/int64 slots; `<= 0` (padding, null slot 0) gives zero outputs and no traffic.
            Slots must be distinct.
        out: `[B, HV, V]` contiguous, fully written.
        scale: query scale, default `K ** -0.5`.
        config: only its `dot_precision` applies (the open-loop fold's dots); the ReplaySSM kernels keep
            their own tiles. Default `default_tile`.
    """
    replayssm_step(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        ring=ring,
        cursors=cursors,
        state_indices=state_indices,
        out=out,
        scale=scale,
        config=config,
        decode=True,
    )
