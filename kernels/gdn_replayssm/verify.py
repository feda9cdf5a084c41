"""Public ReplaySSM steps: spec verify (T = 1 + num_spec) and, through the same kernel, decode (T = 1)."""

from __future__ import annotations

import torch

from ._config import TileConfig, check_device, default_tile
from ._replay import replayssm_fwd, ring_args, step_fold
from ._validate import check_kernel_state_dtype, check_replayssm_step
from ._window import MAX_HISTORY_BLOCK
from .ring import ReplayCursors, ReplayRing

__all__ = ["replayssm_verify"]


def replayssm_step(
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
    scale: float | None,
    config: TileConfig | None,
    decode: bool,
) -> None:
    geo = check_replayssm_step(
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
        decode=decode,
    )
    check_kernel_state_dtype(state)
    if ring.g.dtype != torch.float32 or (ring.beta is not None and ring.beta.dtype != torch.float32):
        raise ValueError("`ring.g` and `ring.beta` must be float32 for the Triton kernels")
    if geo.K > 256:
        raise ValueError(f"head_k_dim K={geo.K} is above the 256 that one state tile holds")
    if not decode and ring.ring_len > MAX_HISTORY_BLOCK:
        raise ValueError(
            f"`ring` has ring_len L={ring.ring_len}; spec verify holds at most {MAX_HISTORY_BLOCK} committed "
            "records in one tile: allocate a shorter ring"
        )
    check_device(state.device)
    tile = config or default_tile(head_v_dim=geo.V, device=state.device, num_tokens=geo.T, out_dtype=out.dtype)
    args = ring_args(
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
        scale=geo.K**-0.5 if scale is None else scale,
    )
    leave_fold = step_fold(cursors.step_fold, geo.T, geo.B)
    if leave_fold:
        cursors.unfolded[0] = True  # until `replayssm_fold`; the commit refuses the step before it
    replayssm_fwd(args, T=geo.T, L=ring.ring_len, H=geo.H, HV=geo.HV, K=geo.K, V=geo.V, B=geo.B,
                  dot_precision=tile.dot_precision, join=cursors.flush_join, leave_fold=leave_fold)  # fmt: skip


def replayssm_verify(
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
    """ReplaySSM spec-verify step over windows of `T = 1 + num_spec` tokens (2 <= T <= 8).

    Non-flush rows compute the window's outputs from the checkpoint plus the committed records, through the
    `(I + A)^-1` transform, and write no state. Flush rows (`write_pos + 2T > L`) fold the history into
    the checkpoint and run the window from it. Every row appends its window's records at logical positions
    `write_pos .. write_pos + T - 1`; call `replayssm_commit` with the accepted counts before the next step.
    By default the fold is deferred (`_replay.deferred_fold`): the flush rows' windows are reconstructed
    too, the fold runs on side streams under the next layers, and the checkpoints hold the folded history
    only after that commit. With cursors allocated `step_fold=True`, a step of 2-32 rows (`_replay.step_fold`)
    launches no fold: call `replayssm_fold` after the last layer, before the commit.

    Args:
        mixed_qkv: `[B * T, 2 * H * K + HV * V]` post-conv q | k | v, row `i * T + t` is token `t` of row `i`;
            last dim contiguous, rows may be strided.
        a, b: `[B * T, HV]` gate inputs, last dim contiguous.
        A_log, dt_bias: `[HV]`.
        state: `[N, HV, V, K]` checkpoint pool (float32 / bfloat16 / float16), written on flush rows only.
        ring: this layer's `ReplayRing` (`2T <= ring_len <= 128`); `ring.v is None` selects the open-loop fold.
        cursors: the `ReplayCursors` shared by all layers, read only.
        state_indices: `[B]` int32/int64 slots; `<= 0` (padding, null slot 0) gives zero outputs and no traffic.
            Slots must be distinct.
        out: `[B * T, HV, V]` contiguous, fully written.
        scale: query scale, default `K ** -0.5`.
        config: only its `dot_precision` applies (the reconstruction dots of non-flush rows); the ReplaySSM
            kernels keep their own tiles. Default `default_tile`.
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
        decode=False,
    )
