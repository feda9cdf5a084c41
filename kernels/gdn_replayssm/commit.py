"""Cursor kernels: commit (accept a prefix of the window, i.e. rollback by cursor move), reset, and the step's
plan for coalesced flushes.

They run once per model step, not per layer, on the cursors shared by every GDN layer. They read the
accepted counts on the device, so the step stays free of host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import flushes, step_has_due_row
from ._config import check_device
from ._replay import join_deferred_folds
from ._validate import MAX_TOKENS, check_cursors, check_num_accepted, check_same_device, check_state_indices
from .ring import ReplayCursors

__all__ = ["replayssm_commit", "replayssm_plan", "replayssm_reset"]

_BLOCK = 128


@triton.heuristics({"HAS_NUM_ACCEPTED": lambda args: args["num_accepted"] is not None})
@triton.jit
def _commit_kernel(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
    write_pos,
    ring_base,
    state_indices,
    num_accepted,
    B,
    T: tl.constexpr,
    L: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_NUM_ACCEPTED: tl.constexpr,
    JOIN: tl.constexpr,
):
    if JOIN > 0:  # one program: the step's plan (`write_pos[0]`) is read by every row before it is cleared
        for b0 in range(0, B, BLOCK):
            _commit_rows(write_pos, ring_base, state_indices, num_accepted, B, b0, T, L, BLOCK, HAS_NUM_ACCEPTED,
                         JOIN)  # fmt: skip
        tl.store(write_pos, 0)  # a step without a plan joins no row
    else:
        _commit_rows(write_pos, ring_base, state_indices, num_accepted, B, tl.program_id(0) * BLOCK, T, L, BLOCK,
                     HAS_NUM_ACCEPTED, JOIN)  # fmt: skip


@triton.jit
def _commit_rows(  # noqa: PLR0917 (Triton passes arguments positionally)
    write_pos,
    ring_base,
    state_indices,
    num_accepted,
    B,
    b0,
    T: tl.constexpr,
    L: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_NUM_ACCEPTED: tl.constexpr,
    JOIN: tl.constexpr,
):
    o_b = b0 + tl.arange(0, BLOCK)
    m_b = o_b < B
    slot = tl.load(state_indices + o_b, mask=m_b, other=0).to(tl.int64)
    m_b = m_b & (slot > 0)
    wp = tl.load(write_pos + slot, mask=m_b, other=0)
    base = tl.load(ring_base + slot, mask=m_b, other=0)
    if HAS_NUM_ACCEPTED:
        n_acc = tl.minimum(tl.maximum(tl.load(num_accepted + o_b, mask=m_b, other=1), 1), T).to(tl.int32)
    else:
        n_acc = tl.full([BLOCK], 1, dtype=tl.int32)
    flush = flushes(wp, write_pos, T, L, JOIN)  # due, or joined the step's flush (`ring.flushing_rows`)
    if T == 1:  # decode folded the token on flush: the ring is empty again
        new_wp = tl.where(flush, 0, wp + n_acc)
        new_base = base
    else:  # verify: the window becomes the head of the ring
        new_wp = tl.where(flush, n_acc, wp + n_acc)
        new_base = tl.where(flush, (base + wp) % L, base)
    tl.store(write_pos + slot, new_wp, mask=m_b)
    tl.store(ring_base + slot, new_base, mask=m_b)


@triton.jit
def _plan_kernel(write_pos, state_indices, B, T: tl.constexpr, L: tl.constexpr, BLOCK: tl.constexpr):  # noqa: PLR0917
    tl.store(write_pos, step_has_due_row(write_pos, state_indices, B, T, L, BLOCK))


@triton.jit
def _reset_kernel(write_pos, ring_base, state_indices, B, BLOCK: tl.constexpr):
    o_b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_b = o_b < B
    slot = tl.load(state_indices + o_b, mask=m_b, other=0).to(tl.int64)
    m_b = m_b & (slot > 0)
    zero = tl.zeros([BLOCK], dtype=tl.int32)
    tl.store(write_pos + slot, zero, mask=m_b)
    tl.store(ring_base + slot, zero, mask=m_b)


def replayssm_commit(
    *,
    cursors: ReplayCursors,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    num_tokens: int,
) -> None:
    """Commits a step of `num_tokens` tokens per row: call once per model step, after the last GDN layer.

    Per row with slot > 0 and `n = clamp(num_accepted, 1, T)` (1 when None), with `wp, base` the slot's
    cursors before the step: a row that flushed (`wp + 2T > L`, or joined a flush: `flushing_rows`, by the
    step's plan, `replayssm_plan`) restarts its ring (decode: `wp = 0`; verify: `base += wp`, `wp = n`), any
    other row advances `wp += n`. Records past `n` are rejected drafts: never read, overwritten later. With
    coalesced flushes it then clears the plan. With cursors allocated `step_fold=True` it refuses (ValueError)
    a step whose layers left folds to `replayssm_fold` before that has run. With deferred folds
    (`_replay.deferred_fold`: verify steps and small decode batches by default) it first makes the current
    stream wait for the step's folds: the checkpoints are the step's from then on.

    Args:
        cursors: the `ReplayCursors` shared by all layers, updated in place.
        state_indices: `[B]` int32/int64 slots of the step, the same as the step's layers got; `<= 0` rows are
            skipped. Slots must be distinct.
        num_accepted: `[B]` accepted tokens of the step including the bonus token, or None for decode.
        num_tokens: tokens per row of the step, `T` (1 for decode).
    """
    check_step(cursors, state_indices, num_tokens, num_accepted)
    if cursors.unfolded[0]:
        raise ValueError(
            "replayssm_commit: this step's layers left their folds to replayssm_fold (cursors allocated with "
            "step_fold=True), which has not run since: call replayssm_fold(layers=..., cursors=..., "
            "state_indices=..., num_tokens=...) after the last GDN layer, before the commit; committing first "
            "would restart the flushing rows' rings with their histories never folded into the checkpoints"
        )
    join_deferred_folds(state_indices.device)
    B = state_indices.shape[0]
    join = cursors.flush_join
    _commit_kernel[(1 if join else triton.cdiv(B, _BLOCK),)](
        write_pos=cursors.write_pos,
        ring_base=cursors.base,
        state_indices=state_indices,
        num_accepted=num_accepted,
        B=B,
        T=num_tokens,
        L=cursors.ring_len,
        BLOCK=_BLOCK,
        JOIN=join,
        num_warps=4,
    )


def replayssm_plan(*, cursors: ReplayCursors, state_indices: torch.Tensor, num_tokens: int) -> None:
    """Plans a step's coalesced flushes: call once per model step, before the first GDN layer, when
    `cursors.flush_join > 0` (otherwise it does nothing).

    Records in `cursors.write_pos[0]` (the null slot's entry, never a row's) whether some live row of the step
    is due (`wp + 2T > L`). Every kernel of the step and its `replayssm_commit` read that one value for the
    rule of `flushing_rows` instead of each scanning the batch, and the commit clears it: a step without a plan
    flushes only its due rows, which is always valid.

    Args:
        cursors: the `ReplayCursors` shared by all layers.
        state_indices: `[B]` int32/int64 slots of the step, as its layers and commit get them; `<= 0` rows are
            skipped.
        num_tokens: tokens per row of the step, `T` (1 for decode).
    """
    check_step(cursors, state_indices, num_tokens)
    if cursors.flush_join == 0:
        return
    join_deferred_folds(state_indices.device)  # folds still pending read the plan they were launched with
    B = state_indices.shape[0]
    _plan_kernel[(1,)](
        write_pos=cursors.write_pos,
        state_indices=state_indices,
        B=B,
        T=num_tokens,
        L=cursors.ring_len,
        BLOCK=_BLOCK,
        num_warps=4,
    )


def check_step(
    cursors: ReplayCursors, state_indices: torch.Tensor, num_tokens: int, num_accepted: torch.Tensor | None = None
) -> None:
    check_state_indices(state_indices, ndim=1)
    check_cursors(cursors, num_slots=cursors.write_pos.shape[0], device=cursors.write_pos.device)
    if not 1 <= num_tokens <= MAX_TOKENS:
        raise ValueError(f"`num_tokens` must be in 1..{MAX_TOKENS}, got {num_tokens}")
    if num_tokens > 1 and cursors.ring_len < 2 * num_tokens:
        raise ValueError(f"`cursors.ring_len` {cursors.ring_len} must be >= 2 * num_tokens = {2 * num_tokens}")
    if num_accepted is not None:
        check_num_accepted(num_accepted, num_rows=state_indices.shape[0])
    check_same_device(write_pos=cursors.write_pos, state_indices=state_indices, num_accepted=num_accepted)
    check_device(state_indices.device)


def replayssm_join(*, cursors: ReplayCursors) -> None:
    """Makes the current stream wait for the deferred folds launched on the cursors' device since the last
    join; the checkpoints hold the step's folds from then on. `replayssm_commit`, `replayssm_reset` and
    `replayssm_plan` join first anyway. Call it after the last GDN layer where the layers and the commit are
    captured in different CUDA graphs (a forward graph without the commit, as vLLM captures one): a capture
    must join the side streams it forked before it ends. With nothing pending it does nothing.

    Args:
        cursors: the `ReplayCursors` shared by all layers.
    """
    check_cursors(cursors, num_slots=cursors.write_pos.shape[0], device=cursors.write_pos.device)
    join_deferred_folds(cursors.write_pos.device)


def replayssm_reset(*, cursors: ReplayCursors, state_indices: torch.Tensor) -> None:
    """Empties the rings of the listed slots (`<= 0` skipped): call once the slots' checkpoints hold the
    state to continue from (after prefill, a recycled block, a preempted request).

    Args:
        cursors: the `ReplayCursors` shared by all layers, updated in place.
        state_indices: `[B]` int32/int64 slots.
    """
    check_state_indices(state_indices, ndim=1)
    check_cursors(cursors, num_slots=cursors.write_pos.shape[0], device=cursors.write_pos.device)
    check_same_device(write_pos=cursors.write_pos, state_indices=state_indices)
    check_device(state_indices.device)
    join_deferred_folds(state_indices.device)  # pending folds read the cursors this resets
    B = state_indices.shape[0]
    _reset_kernel[(triton.cdiv(B, _BLOCK),)](
        write_pos=cursors.write_pos, ring_base=cursors.base, state_indices=state_indices, B=B, BLOCK=_BLOCK, num_warps=4
    )
