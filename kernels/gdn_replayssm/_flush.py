"""Flush rows of a ReplaySSM step as their own kernel: fold the committed history into the checkpoint.

A row flushes when `wp + 2T > L`, or when it joins a flush (`ring.flushing_rows`; README.md). Each program
(V tile, row, value head) returns at once unless its row flushes, so the launch costs little on the steps
where no row does. A flushing program:

1. loads its `[BV, K]` checkpoint tile;
2. folds the `wp` committed records into it. Exact fold (the default): replays the raw `k, v, g, beta`
   records one by one with the baseline's `delta_step`, so the fold is the baseline's state bit for bit.
   The records come in chunks of `BC`, and the next chunk's loads are issued before the current chunk is
   folded: the fold is a serial chain of `wp` steps, and a load per step on that chain would put a memory
   latency into every step. Open-loop fold: one dot per chunk of stored `u` records;
3. decode: folds the token as well, stores the state and the output; verify: stores the checkpoint, then
   runs the window recurrently with the baseline's code and writes the window's outputs and records.

The tile is independent of the baseline's: every reduction on this path is an `exact_sum`, whose result does
not depend on the layout (`_common.py`), so a small tile (8 or 16 rows, one warp: `_replay.flush_block_v`)
can spread one row's fold over many programs; the fold's latency, not its bytes, is what a flush step waits for.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import (
    append_record,
    chunk_rows,
    delta_step,
    flushes,
    keeps,
    l2norm_rows,
    load_token,
    record_writers,
    recurrent_token,
    ring_rows,
)

FLUSH_BLOCK_V = 16  # V rows per program above `_replay.FLUSH_SMALL_TILE_MAX_BATCH` rows
FLUSH_WARPS = 1
FLUSH_CHUNK = 4  # records per prefetched chunk of the exact fold (4 beat 2 and 8 on the H200: bench_parts)
OPEN_LOOP_CHUNK = tl.constexpr(16)  # records per dot of the open-loop fold (dot operands need >= 16 rows)


@triton.jit
def folded_records(wp, T: tl.constexpr, DEFER: tl.constexpr):
    """Records a flushing row folds: its `wp` committed ones, and with a deferred fold (`_replay.deferred_fold`)
    a decode row's token too, which the non-flush kernel appended as record `wp` (committed by definition)."""
    n = wp
    if DEFER and T == 1:
        n = wp + 1
    return n


@triton.jit
def record_chunk(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_k, p_x, p_g, c0, wp, base, o_c, o_k, o_v, mask_k, mask_v, L: tl.constexpr, K: tl.constexpr, V: tl.constexpr
):  # fmt: skip
    """Logical records `c0 + o_c` of a slot's ring, masked at `wp` (pointers from `ring_rows`): keys
    `[BC, BK]`, a per-value-row record `x` (raw `v`, or `u`) as `[BV, BC]`, gates `[BC]`."""
    _, m_r, o_pos = chunk_rows(c0, wp, base, o_c, L)
    b_g = tl.load(p_g + o_pos, mask=m_r, other=0)
    b_k = tl.load(p_k + o_pos[:, None] * K + o_k[None, :], mask=m_r[:, None] & mask_k[None, :], other=0)
    b_x = tl.load(p_x + o_pos[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_r[None, :], other=0)
    return b_k, b_x, b_g


@triton.jit
def _records(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_k, p_v, p_g, p_beta, c0, wp, base, o_c, o_k, o_v, mask_k, mask_v, L: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, p_kn, NORMALISED_KEYS: tl.constexpr,
):  # fmt: skip
    """Raw records `c0 .. c0 + BC - 1` (masked at `wp`): keys `[BC, BK]`, values `[BV, BC]`, g and beta `[BC]`.
    `record_chunk` plus beta, with the keys loaded first (the order the H200 measurements were taken with).
    With `NORMALISED_KEYS` the keys are the normalised float32 ones at `p_kn`, in logical order.
    The positions are written out rather than taken from `chunk_rows`: through the helper, Triton 3.6 (the
    H200's) schedules the verify flush kernels differently, and the measured fold is this SASS."""
    o_r = c0 + o_c
    m_r = o_r < wp
    o_pos = (base + o_r) % L
    if NORMALISED_KEYS:
        b_k = tl.load(p_kn + o_r[:, None] * K + o_k[None, :], mask=m_r[:, None] & mask_k[None, :], other=0)
    else:
        b_k = tl.load(p_k + o_pos[:, None] * K + o_k[None, :], mask=m_r[:, None] & mask_k[None, :], other=0)
    b_v = tl.load(p_v + o_pos[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_r[None, :], other=0)
    b_g = tl.load(p_g + o_pos, mask=m_r, other=0)
    b_beta = tl.load(p_beta + o_pos, mask=m_r, other=0)
    return b_k, b_v, b_g, b_beta


@triton.jit
def _exact_fold(  # noqa: PLR0917 (Triton passes arguments positionally)
    b_h, p_k, p_v, p_g, p_beta, wp, base, o_k, o_v, mask_k, mask_v, L: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BC: tl.constexpr, EXACT: tl.constexpr, p_kn, NORMALISED_KEYS: tl.constexpr,
):  # fmt: skip
    """Replay the `wp` committed records into the state tile in the baseline op order; with `NORMALISED_KEYS`
    the keys come normalised from `_normalised_keys_kernel` (`p_kn`)."""
    o_c = tl.arange(0, BC)
    n_k, n_v, n_g, n_beta = _records(
        p_k, p_v, p_g, p_beta, 0, wp, base, o_c, o_k, o_v, mask_k, mask_v, L, K, V, p_kn, NORMALISED_KEYS
    )
    for c0 in range(0, wp, BC):
        b_k, b_v, b_g, b_beta = n_k, n_v, n_g, n_beta
        n_k, n_v, n_g, n_beta = _records(
            p_k, p_v, p_g, p_beta, c0 + BC, wp, base, o_c, o_k, o_v, mask_k, mask_v, L, K, V, p_kn, NORMALISED_KEYS
        )
        if NORMALISED_KEYS:  # noqa: SIM108 (a constexpr branch reads better in Triton)
            b_kn = b_k
        else:
            b_kn = l2norm_rows(b_k.to(tl.float32), EXACT)  # bit-identical to normalising each key alone
        b_vf = b_v.to(tl.float32)
        for j in tl.static_range(BC):
            if c0 + j < wp:
                # pick record j out of the chunk: a sum of one value and negative zeros, exact for every value
                # (x + -0.0 == x, -0.0 included), so the compiler also drops the additions it can see
                b_k_j = tl.sum(tl.where(o_c[:, None] == j, b_kn, -0.0), axis=0)
                b_v_j = tl.sum(tl.where(o_c[None, :] == j, b_vf, -0.0), axis=1)
                b_g_j = tl.sum(tl.where(o_c == j, b_g, -0.0), axis=0)
                b_beta_j = tl.sum(tl.where(o_c == j, b_beta, -0.0), axis=0)
                b_h, _ = delta_step(b_h, b_k_j, b_v_j, b_g_j, b_beta_j, EXACT)
    return b_h


@triton.jit
def _open_loop_fold(  # noqa: PLR0917 (Triton passes arguments positionally)
    b_h, p_u, p_k, p_g, wp, base, o_k, o_v, mask_k, mask_v, L: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """`S = exp(G) S0 + sum_c exp(G - G_c) u_c k_c^T` from the stored `u` records, one dot per chunk."""
    b_acc = tl.zeros([BV, BK], dtype=tl.float32)
    b_gamma = tl.sum(tl.zeros([BC], dtype=tl.float32), axis=0)
    o_c = tl.arange(0, BC)
    for c0 in range(0, wp, BC):
        b_k, b_u, b_g = record_chunk(p_k, p_u, p_g, c0, wp, base, o_c, o_k, o_v, mask_k, mask_v, L, K, V)
        m_c = c0 + o_c < wp
        b_total = tl.sum(b_g, axis=0)
        b_w = tl.where(m_c, tl.exp(b_total - tl.cumsum(b_g, axis=0)), 0.0)  # decay of record c to the chunk end
        b_uw = b_u.to(tl.float32) * b_w[None, :]
        b_acc = b_acc * tl.exp(b_total) + tl.dot(
            b_uw, l2norm_rows(b_k.to(tl.float32), False), input_precision=DOT_PRECISION
        )
        b_gamma += b_total
    return b_h * tl.exp(b_gamma) + b_acc


@triton.jit
def _normalised_window_token(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, i_tok, s, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale, stride_x, stride_a,
    stride_b, wp, p_kn, L: tl.constexpr, H: tl.constexpr, K: tl.constexpr, HV: tl.constexpr, V: tl.constexpr,
    EXACT: tl.constexpr,
):  # fmt: skip
    """Window token `s` of a flushing row as `load_token` gives it, with its normalised key and scaled query
    from `_normalised_keys_kernel`'s scratch (rows `wp + s` and `L + s`; `NORMALISED_KEYS` code 2). The norms
    `load_token` computes go unused, and the compiler drops them and the query's load (sm_90 SASS)."""
    _, _, b_k_raw, b_v_raw, b_g, b_beta = load_token(
        mixed_qkv, a, b, i_tok, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale, stride_x, stride_a,
        stride_b, H, K, HV, V, EXACT,
    )  # fmt: skip
    b_k = tl.load(p_kn + (wp + s) * K + o_k, mask=mask_k, other=0)
    b_q = tl.load(p_kn + (L + s) * K + o_k, mask=mask_k, other=0)
    return b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta


@triton.jit
def _flush_token(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, i_tok, s, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale, stride_x, stride_a,
    stride_b, wp, p_kn, L: tl.constexpr, H: tl.constexpr, K: tl.constexpr, HV: tl.constexpr, V: tl.constexpr,
    EXACT: tl.constexpr, NORMALISED_KEYS: tl.constexpr,
):  # fmt: skip
    """Window token `s` (input token `i_tok`) of a flushing row: `_normalised_window_token` with
    `NORMALISED_KEYS` code 2, else `load_token`."""
    if NORMALISED_KEYS == 2:
        return _normalised_window_token(
            mixed_qkv, a, b, i_tok, s, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale, stride_x,
            stride_a, stride_b, wp, p_kn, L, H, K, HV, V, EXACT,
        )  # fmt: skip
    return load_token(
        mixed_qkv, a, b, i_tok, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale, stride_x, stride_a,
        stride_b, H, K, HV, V, EXACT,
    )  # fmt: skip


@triton.jit
def flush_row(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, out, scale, stride_x,
    stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv, stride_rbeta, i_v, i_b, i_hv, slot,
    wp, base, T: tl.constexpr, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr, EXACT: tl.constexpr, keys=None, NORMALISED_KEYS: tl.constexpr = False,
    DEFER: tl.constexpr = False,
):  # fmt: skip
    """One flushing program's work on its `[BV, K]` tile (module docstring), for `_flush_kernel` and for the
    non-flush kernels that fold their own flush rows (`FUSED_FLUSH`). `keys`: `_normalised_keys_kernel`'s
    scratch when `NORMALISED_KEYS` (1: the records' keys; 2: also the window's keys and queries). With
    `DEFER` (`_replay.deferred_fold`) the non-flush kernel has done the row's step and appended its records,
    and this only folds the committed ones into the checkpoint: `wp`, and for decode the token's (record `wp`,
    committed by definition)."""
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    p_state = state + slot * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    p_u, p_k, p_g, p_v, p_beta = ring_rows(
        ring_u, ring_k, ring_g, ring_v, ring_beta, slot, i_h, i_hv, stride_ru, stride_rk, stride_rg, stride_rv,
        stride_rbeta, L, K, V, EXACT_FOLD,
    )  # fmt: skip
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)

    b_h = tl.load(p_state, mask=mask_h, other=0).to(tl.float32)
    p_kn = keys  # the row's part of the normalised keys' scratch (NORMALISED_KEYS, exact fold only)
    if NORMALISED_KEYS:
        p_kn = keys + (i_b * H + i_h) * (L + T * (NORMALISED_KEYS == 2)) * K
    n_fold = folded_records(wp, T, DEFER)
    if EXACT_FOLD:
        b_h = _exact_fold(
            b_h, p_k, p_v, p_g, p_beta, n_fold, base, o_k, o_v, mask_k, mask_v, L, K, V, BC, EXACT, p_kn,
            NORMALISED_KEYS,
        )  # fmt: skip
    else:
        b_h = _open_loop_fold(b_h, p_u, p_k, p_g, n_fold, base, o_k, o_v, mask_k, mask_v, L, K, V, BK, BV,
                              OPEN_LOOP_CHUNK, DOT_PRECISION)  # fmt: skip

    if DEFER:  # the outputs and the window's records are the non-flush kernel's
        tl.store(p_state, b_h.to(p_state.dtype.element_ty), mask=mask_h)
    elif T == 1:  # decode: the token is committed, fold it too and store the state
        b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta = _flush_token(
            mixed_qkv, a, b, i_b, 0, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale, stride_x,
            stride_a, stride_b, wp, p_kn, L, H, K, HV, V, EXACT, NORMALISED_KEYS,
        )  # fmt: skip
        b_h, _, b_o = recurrent_token(b_h, b_q, b_k, b_v_raw.to(tl.float32), b_g, b_beta, EXACT)
        tl.store(out + (i_b * HV + i_hv) * V + o_v, b_o.to(out.dtype.element_ty), mask=mask_v)
        tl.store(p_state, b_h.to(p_state.dtype.element_ty), mask=mask_h)
    else:  # verify: checkpoint = committed history; the window (maybe rejected) runs on and is recorded
        tl.store(p_state, b_h.to(p_state.dtype.element_ty), mask=mask_h)
        n_head, n_key = record_writers(i_v, i_hv, HV, H)
        for s in tl.static_range(T):
            b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta = _flush_token(
                mixed_qkv, a, b, i_b * T + s, s, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale,
                stride_x, stride_a, stride_b, wp, p_kn, L, H, K, HV, V, EXACT, NORMALISED_KEYS,
            )  # fmt: skip
            b_h, b_u, b_o = recurrent_token(b_h, b_q, b_k, b_v_raw.to(tl.float32), b_g, b_beta, EXACT)
            tl.store(out + ((i_b * T + s) * HV + i_hv) * V + o_v, b_o.to(out.dtype.element_ty), mask=mask_v)
            append_record(
                p_u, p_k, p_g, p_v, p_beta, (base + wp + s) % L, b_u, b_k_raw, b_g, b_v_raw, b_beta, o_k, o_v,
                mask_v, n_head, n_key, K, V, EXACT_FOLD,
            )  # fmt: skip


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _flush_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    state,
    ring_u,
    ring_k,
    ring_g,
    ring_v,
    ring_beta,
    write_pos,
    ring_base,
    state_indices,
    out,
    scale,
    stride_x,
    stride_a,
    stride_b,
    stride_state,
    stride_ru,
    stride_rk,
    stride_rg,
    stride_rv,
    stride_rbeta,
    keys,
    T: tl.constexpr,
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    EXACT: tl.constexpr,
    NORMALISED_KEYS: tl.constexpr,
    JOIN: tl.constexpr,
    DEFER: tl.constexpr,
):
    i_v, i_b, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: the non-flush kernel writes its zeros
        return
    wp = tl.load(write_pos + slot)
    if keeps(wp, write_pos, T, L, JOIN):
        return
    base = tl.load(ring_base + slot)
    flush_row(
        mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, out, scale, stride_x,
        stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv, stride_rbeta, i_v, i_b, i_hv,
        slot, wp, base, T, L, H, HV, K, V, BK, BV, BC, DOT_PRECISION, EXACT_FOLD, EXACT, keys, NORMALISED_KEYS, DEFER,
    )  # fmt: skip


@triton.jit
def flushing_scan(state_indices, write_pos, B, T: tl.constexpr, L: tl.constexpr, BB: tl.constexpr, JOIN: tl.constexpr):  # noqa: PLR0917
    """The step's flushing rows, found on the device by every program of a persistent fold: per row `o_b`
    (`[BB]`, rows past `B` masked) its slot, `wp`, whether it flushes (0 / 1) and its 1-based rank among the
    flushing rows."""
    o_b = tl.arange(0, BB)
    m_b = o_b < B
    slots = tl.load(state_indices + o_b, mask=m_b, other=0).to(tl.int64)
    live = m_b & (slots > 0)
    wps = tl.load(write_pos + slots, mask=live, other=0)
    flushing = (live & flushes(wps, write_pos, T, L, JOIN)).to(tl.int32)
    return o_b, slots, wps, flushing, tl.cumsum(flushing, axis=0)


@triton.jit
def flushing_row(r, o_b, slots, wps, flushing, rank):  # noqa: PLR0917 (Triton passes arguments positionally)
    """The flushing row of rank `r + 1` in `flushing_scan`'s results: its row, slot and `wp`, picked out of the
    scan (a sum of one value and zeros)."""
    pick = (flushing > 0) & (rank == r + 1)
    return (
        tl.sum(tl.where(pick, o_b, 0), axis=0),
        tl.sum(tl.where(pick, slots, 0), axis=0),
        tl.sum(tl.where(pick, wps, 0), axis=0),
    )


LIST_ENTRY = tl.constexpr(4)  # int32 per entry of `_flushing_list_kernel`'s list: row, slot, wp, ring base


@triton.jit
def _flushing_list_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    state_indices, write_pos, ring_base, rows, B, T: tl.constexpr, L: tl.constexpr, BB: tl.constexpr,
    JOIN: tl.constexpr,
):  # fmt: skip
    """The step's flushing rows as a list for `_flush_persistent_kernel` with `LISTED` (`_replay.LISTED_FOLDS`):
    `rows[0]` their count, then per flushing row, in row order, an entry of `LIST_ENTRY` int32 at
    `rows[LIST_ENTRY * rank]` (rank 1-based): its row, slot, `wp` and ring base. One program, grid `(1,)`."""
    o_b, slots, wps, flushing, rank = flushing_scan(state_indices, write_pos, B, T, L, BB, JOIN)
    m_f = flushing > 0
    bases = tl.load(ring_base + slots, mask=m_f, other=0)
    p_entry = rows + LIST_ENTRY * rank
    tl.store(p_entry, o_b, mask=m_f)
    tl.store(p_entry + 1, slots.to(tl.int32), mask=m_f)
    tl.store(p_entry + 2, wps, mask=m_f)
    tl.store(p_entry + 3, bases, mask=m_f)
    tl.store(rows, tl.sum(flushing, axis=0))


@triton.jit
def listed_row(rows, r):
    """Row, slot, `wp` and ring base of the flushing row of rank `r + 1` in `_flushing_list_kernel`'s list."""
    p_entry = rows + LIST_ENTRY * (r + 1)
    return tl.load(p_entry), tl.load(p_entry + 1).to(tl.int64), tl.load(p_entry + 2), tl.load(p_entry + 3)


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _flush_persistent_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    state,
    ring_u,
    ring_k,
    ring_g,
    ring_v,
    ring_beta,
    write_pos,
    ring_base,
    state_indices,
    out,
    scale,
    stride_x,
    stride_a,
    stride_b,
    stride_state,
    stride_ru,
    stride_rk,
    stride_rg,
    stride_rv,
    stride_rbeta,
    B,
    keys,
    T: tl.constexpr,
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    BB: tl.constexpr,
    NV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    EXACT: tl.constexpr,
    NORMALISED_KEYS: tl.constexpr,
    JOIN: tl.constexpr,
    DEFER: tl.constexpr,
    rows=None,
    LISTED: tl.constexpr = False,
):
    """`_flush_kernel` with a fixed grid: every program finds the flushing rows itself and takes every
    `num_programs`-th (row, value head, V tile) item of theirs, so a step without flushes costs one short
    program per slot of the machine instead of one per (row, head, tile). With `LISTED` the rows come from
    `_flushing_list_kernel`'s list at `rows` instead of each program's scan of the batch, whose `[BB]` vectors
    would stay in registers through the item loop (sm_90, B = 256: ~35 registers)."""
    if LISTED:
        n_rows = tl.load(rows)
    else:
        o_b, slots, wps, flushing, rank = flushing_scan(state_indices, write_pos, B, T, L, BB, JOIN)
        n_rows = tl.sum(flushing, axis=0)
    per_row = HV * NV
    for item in range(tl.program_id(0), n_rows * per_row, tl.num_programs(0)):
        r = item // per_row
        i_hv = (item % per_row) // NV
        i_v = item % NV
        if LISTED:
            i_b, slot, wp, base = listed_row(rows, r)
        else:
            i_b, slot, wp = flushing_row(r, o_b, slots, wps, flushing, rank)
            base = tl.load(ring_base + slot)
        flush_row(
            mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, out, scale, stride_x,
            stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv, stride_rbeta, i_v, i_b,
            i_hv, slot, wp, base, T, L, H, HV, K, V, BK, BV, BC, DOT_PRECISION, EXACT_FOLD, EXACT, keys,
            NORMALISED_KEYS, DEFER,
        )  # fmt: skip


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _layers_fold_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    state,
    ring_u,
    ring_k,
    ring_g,
    ring_v,
    ring_beta,
    offsets,
    write_pos,
    ring_base,
    state_indices,
    stride_state,
    stride_ru,
    stride_rk,
    stride_rg,
    stride_rv,
    stride_rbeta,
    B,
    LAYERS,
    T: tl.constexpr,
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    BB: tl.constexpr,
    NV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    EXACT: tl.constexpr,
    JOIN: tl.constexpr,
):
    """The folds every layer of a step left to `replayssm_fold`, in one launch: `_flush_persistent_kernel`'s
    fixed grid over (flushing row, layer, value head, V tile) items, each the deferred fold of `flush_row`.
    The tensors are layer 0's; `offsets[layer]` holds each layer's element offsets from them (state, u, k,
    g, v, beta: `ReplayLayers`). A deferred fold reads neither the step's inputs nor its gates' parameters,
    so `ring_g` stands in for those pointers (its loads of `A_log` and `dt_bias` are never used)."""
    o_b, slots, wps, flushing, rank = flushing_scan(state_indices, write_pos, B, T, L, BB, JOIN)
    per_layer = HV * NV
    per_row = LAYERS * per_layer
    for item in range(tl.program_id(0), tl.sum(flushing, axis=0) * per_row, tl.num_programs(0)):
        r = item // per_row
        layer = (item % per_row) // per_layer
        i_hv = (item % per_layer) // NV
        i_v = item % NV
        i_b, slot, wp = flushing_row(r, o_b, slots, wps, flushing, rank)
        p_offsets = offsets + layer * 6
        p_u = ring_u + tl.load(p_offsets + 1)
        p_v = ring_v
        p_beta = ring_beta
        if EXACT_FOLD:
            p_v = ring_v + tl.load(p_offsets + 4)
            p_beta = ring_beta + tl.load(p_offsets + 5)
        flush_row(
            ring_g, ring_g, ring_g, ring_g, ring_g, state + tl.load(p_offsets), p_u, ring_k + tl.load(p_offsets + 2),
            ring_g + tl.load(p_offsets + 3), p_v, p_beta, ring_g, 1.0, 0, 0, 0, stride_state, stride_ru, stride_rk,
            stride_rg, stride_rv, stride_rbeta, i_v, i_b, i_hv, slot, wp, tl.load(ring_base + slot), T, L, H, HV, K,
            V, BK, BV, BC, DOT_PRECISION, EXACT_FOLD, EXACT, None, 0, True,
        )  # fmt: skip


@triton.jit
def _normalised_keys_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, write_pos, ring_base,
    state_indices, out, scale, stride_x, stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg,
    stride_rv, stride_rbeta, keys, T: tl.constexpr, L: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BC: tl.constexpr, BT: tl.constexpr, EXACT: tl.constexpr, NORMALISED_KEYS: tl.constexpr,
    JOIN: tl.constexpr, DEFER: tl.constexpr,
):  # fmt: skip
    """`keys[row, h, c]` (`[B, H, L, K]`, with code 2 `[B, H, L + T, K]`): the normalised key of each
    committed record of a flushing row, in logical order, as the exact fold computes it (`l2norm_rows`,
    compiled like the fold), for the flush programs to read instead of each normalising the same keys
    (`_replay.FLUSH_NORMALISED_KEYS`). With `NORMALISED_KEYS` code 2 (`_replay.FLUSH_NORMALISED_WINDOW`) also
    the window's tokens as `load_token` normalises them: token `s`'s key at row `wp + s` (free: `wp + T <=
    L`), its scaled query at row `L + s`. With `DEFER` a decode row's token is record `wp` of the ring, folded
    with the others. Grid `(B, H)`."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:
        return
    wp = tl.load(write_pos + slot)
    if keeps(wp, write_pos, T, L, JOIN):
        return
    base = tl.load(ring_base + slot)
    p_k = ring_k + slot * stride_rk + i_h * L * K
    p_kn = keys + (i_b * H + i_h) * (L + T * (NORMALISED_KEYS == 2)) * K
    o_c = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    n_fold = folded_records(wp, T, DEFER)
    for c0 in range(0, n_fold, BC):
        o_r, m_r, o_pos = chunk_rows(c0, n_fold, base, o_c, L)
        m = m_r[:, None] & mask_k[None, :]
        b_k = tl.load(p_k + o_pos[:, None] * K + o_k[None, :], mask=m, other=0)
        tl.store(p_kn + o_r[:, None] * K + o_k[None, :], l2norm_rows(b_k.to(tl.float32), EXACT), mask=m)
    if NORMALISED_KEYS == 2:
        o_s = tl.arange(0, BT)
        m = (o_s < T)[:, None] & mask_k[None, :]
        p_x = mixed_qkv + (i_b * T + o_s)[:, None] * stride_x + i_h * K + o_k[None, :]
        b_q = tl.load(p_x, mask=m, other=0).to(tl.float32)
        b_k = tl.load(p_x + H * K, mask=m, other=0).to(tl.float32)
        tl.store(p_kn + (wp + o_s)[:, None] * K + o_k[None, :], l2norm_rows(b_k, EXACT), mask=m)
        tl.store(p_kn + (L + o_s)[:, None] * K + o_k[None, :], l2norm_rows(b_q, EXACT) * scale, mask=m)
