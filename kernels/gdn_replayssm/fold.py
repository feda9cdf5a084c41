"""Step fold: one launch after the last GDN layer folds the flushing rows of every layer.

With cursors allocated `step_fold=True`, the layers of a step of `_replay.step_fold`'s batch sizes (decode 1-8
rows, verify 2-32) do every row's step in their one non-flush launch, as with a deferred fold, and launch no
fold of their own;
`replayssm_fold` then folds every layer's flushing rows in one launch (`_flush._layers_fold_kernel`). A small
batch's step is then one launch per layer on one stream, as the baseline's is, where each layer otherwise adds
a flush launch (idle in most steps) and a fork and join of a side stream. The folds come after the last layer
instead of under the next layers' launches, so larger batches keep their per-layer folds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from . import _replay
from ._config import FP_FUSION, TileConfig, default_tile, op_order
from ._flush import FLUSH_CHUNK, FLUSH_WARPS, _layers_fold_kernel
from ._replay import fold_tile_rows, persistent_programs, persistent_programs_per_sm, step_fold
from ._validate import check_kernel_state_dtype
from .commit import check_step
from .ring import ReplayCursors, ReplayRing

__all__ = ["ReplayLayers", "replayssm_fold"]

_RING_FIELDS = ("u", "k", "g", "v", "beta")


@dataclass(frozen=True)
class ReplayLayers:
    """Every GDN layer's state pool and ring, registered once (`register`) for `replayssm_fold`.

    Attributes:
        states: each layer's `[N, HV, V, K]` state pool, in layer order.
        rings: each layer's `ReplayRing`.
        offsets: `[layers, 6]` int64 on the states' device: each layer's element offsets from layer 0's state,
            `u`, `k`, `g`, `v` and `beta` (0 for a ring without `v` and `beta`).
    """

    states: tuple[torch.Tensor, ...]
    rings: tuple[ReplayRing, ...]
    offsets: torch.Tensor

    @classmethod
    def register(cls, *, states: list[torch.Tensor], rings: list[ReplayRing]) -> ReplayLayers:
        """Checks that the layers' tensors match layer 0's (shape, dtype, strides, device, fold) and records
        where each lies. Register again after reallocating any of them: the fold writes where they were."""
        if not states or len(states) != len(rings):
            raise ValueError(
                f"`states` and `rings` must list the same layers, at least one: got {len(states)} states and "
                f"{len(rings)} rings"
            )
        state0, ring0 = states[0], rings[0]
        check_kernel_state_dtype(state0)
        columns: list[list[int]] = []
        for i, (state, ring) in enumerate(zip(states, rings, strict=True)):
            if ring.fold != ring0.fold:
                raise ValueError(f"`rings[{i}]` has the {ring.fold} fold, `rings[0]` the {ring0.fold} fold")
            row = [_offset(f"states[{i}]", state, state0)]
            for name in _RING_FIELDS:
                t, t0 = getattr(ring, name), getattr(ring0, name)
                row.append(0 if t is None else _offset(f"rings[{i}].{name}", t, t0))
            columns.append(row)
        offsets = torch.tensor(columns, dtype=torch.int64).to(state0.device)
        return cls(states=tuple(states), rings=tuple(rings), offsets=offsets)


def _offset(name: str, t: torch.Tensor, t0: torch.Tensor) -> int:
    """`t`'s element offset from `t0`, after checking that one kernel can address both with `t0`'s strides."""
    if (t.shape, t.dtype, t.stride(), t.device) != (t0.shape, t0.dtype, t0.stride(), t0.device):
        raise ValueError(
            f"`{name}` must have layer 0's shape, dtype, strides and device {tuple(t0.shape)} {t0.dtype} "
            f"{t0.stride()} {t0.device}, got {tuple(t.shape)} {t.dtype} {t.stride()} {t.device}"
        )
    delta = t.data_ptr() - t0.data_ptr()
    if delta % t0.element_size():
        raise ValueError(f"`{name}` is not aligned to its {t0.element_size()}-byte elements: allocate it apart")
    return delta // t0.element_size()


def replayssm_fold(
    *,
    layers: ReplayLayers,
    cursors: ReplayCursors,
    state_indices: torch.Tensor,
    num_tokens: int,
    config: TileConfig | None = None,
) -> None:
    """Folds the flushing rows of every layer of the step: call once per model step, after the last GDN layer
    and before `replayssm_commit`, when the cursors were allocated `step_fold=True` (otherwise, and for
    batch sizes outside `_replay.step_fold`, whose layers fold their own, it launches nothing).

    The checkpoints are the step's, bit for bit the baseline's state as with per-layer folds, once it has run
    (in stream order: the commit after it needs no join).

    Args:
        layers: `ReplayLayers.register(states=..., rings=...)` of every GDN layer the step ran.
        cursors: the `ReplayCursors` shared by all layers, read only.
        state_indices: `[B]` int32/int64 slots of the step, as its layers got them.
        num_tokens: tokens per row of the step, `T` (1 for decode).
        config: only its `dot_precision` applies (the open-loop fold's dots). Default `default_tile` with the
            ring's `u` dtype as the output dtype, as the layers' default uses their outputs'; pass the layers'
            `config` if they got one.
    """
    check_step(cursors, state_indices, num_tokens)
    state, ring = layers.states[0], layers.rings[0]
    N, HV, V, K = state.shape
    H = ring.k.shape[1]
    if ring.ring_len != cursors.ring_len or cursors.write_pos.shape[0] != N or state.device != state_indices.device:
        raise ValueError(
            f"`layers` hold {N} slots with rings of {ring.ring_len} records on {state.device}; the cursors "
            f"{cursors.write_pos.shape[0]} slots with {cursors.ring_len} on {cursors.write_pos.device}: register "
            "the layers these cursors serve"
        )
    B = state_indices.shape[0]
    if not step_fold(cursors.step_fold, num_tokens, B):
        return
    cursors.unfolded[0] = False
    block_v = fold_tile_rows(_replay.STEP_FOLD_BLOCK_V, V, exact=ring.v is not None)
    nv = triton.cdiv(V, block_v)
    per_sm = persistent_programs_per_sm(block_v, FLUSH_WARPS, None)
    grid = (persistent_programs(state.device, B * len(layers.states) * HV * nv, per_sm),)
    # the layers' default takes the precision from their outputs' dtype; the fold has the ring's `u`, the
    # activation dtype as `ReplayRing.allocate` stores it, so the two fold alike (GPU test, open-loop bf16)
    tile = config or default_tile(head_v_dim=V, device=state.device, num_tokens=num_tokens, out_dtype=ring.u.dtype)
    _layers_fold_kernel[grid](
        state, ring.u, ring.k, ring.g, ring.v, ring.beta, layers.offsets, cursors.write_pos, cursors.base,
        state_indices, state.stride(0), ring.u.stride(0), ring.k.stride(0), ring.g.stride(0),
        0 if ring.v is None else ring.v.stride(0), 0 if ring.beta is None else ring.beta.stride(0), B,
        len(layers.states),
        T=num_tokens, L=ring.ring_len, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=block_v,
        BC=FLUSH_CHUNK, BB=triton.next_power_of_2(B), NV=nv, DOT_PRECISION=tile.dot_precision, EXACT=op_order(),
        JOIN=cursors.flush_join, num_warps=FLUSH_WARPS, enable_fp_fusion=FP_FUSION,
    )  # fmt: skip
