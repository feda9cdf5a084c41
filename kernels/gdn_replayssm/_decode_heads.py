"""The non-flush decode kernel with one program per (row, key head): `_key_head_decode_kernel`.

`_decode._decode_kernel` runs one program per (row, value head, V tile), and each of them redoes its key head's
side of the history: it loads the committed records' keys, normalises them and dots them with the token's k
and q. At Qwen3.6's shapes (HV = 2H, V = 2 x 64) four programs share one key head, and each one's history loads
wait for its row's cursors after its state tile: at B = 256 the first history record alone made the non-flush
decode 142 -> ~196 us (H200 runs 13-14), far more than its bytes.

Here one program takes a row's key head and every state tile under it, `HV / H` value heads times `cdiv(V, BV)`
tiles, one after the other. The keys' side (norms and the two dots) is computed once, from the whole ring read
in physical order (no load waits for the cursors, as in the preloading decode); each tile then needs only its
value head's gates, its `u` records and its state rows. Rings up to `_replay.PRELOAD_MAX_RECORDS` records.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import L2NORM_EPS, gates, steps_row
from ._descriptors import state_descriptor
from ._projections import (
    chunked_history_projections,
    chunked_projections,
    norm_denominator,
    pair_projections,
    tile_projections,
)
from ._window import history_block


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _key_head_decode_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
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
    state_desc,
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BH: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    JOIN: tl.constexpr,
    DEFER: tl.constexpr,
    PAIRED_STATE: tl.constexpr,
    G: tl.constexpr,
    NV: tl.constexpr,
    KC: tl.constexpr = 0,
    FUSED_HISTORY: tl.constexpr = False,
    STAGES: tl.constexpr = 0,
    PREFETCH: tl.constexpr = False,
    TMA_STATE: tl.constexpr = False,
    LATE_NORMS: tl.constexpr = False,
):
    """Grid `(B, H)`. Tile `j` of a program is value head `i_h * G + j // NV` (`G = HV / H`), V rows from
    `(j % NV) * BV` (`NV = cdiv(V, BV)`). `KC > 0`: the state tile is read as `BK / KC` column chunks of `KC`
    (`chunked_projections`), else whole; with `FUSED_HISTORY` (and `BH == KC`) the records' terms join the
    chunks' sums (`chunked_history_projections`). `STAGES > 0`: the tiles in a loop of that many stages, which
    the compiler software-pipelines (the next tile's state copied into shared memory while this one is summed),
    each tile recomputing its value head's gates; with `PREFETCH` there, each tile loads the next tile's token
    inputs (`a`, `b`, `v`) before its own stores, which the loads could not pass (the compiler cannot tell that they
    do not alias), so no tile waits on a global load of its own. Else unrolled, the stores of each tile ahead of the
    next tile's loads. `LATE_NORMS` (with `KC > 0`, not `FUSED_HISTORY`): the chunks' sums take the token's raw key
    and query, normalised once per row sum (`_projections._chunk_sums`)."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_r = tl.arange(0, BV)
    o_p = tl.arange(0, BH)
    m_p = o_p < L
    o_k2 = tl.arange(0, BK // 2)
    p_o = out + i_b * HV * V

    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: zero outputs, no state or ring traffic
        for j in tl.static_range(G * NV):
            o_v = (j % NV) * BV + o_r
            tl.store(p_o + (i_h * G + j // NV) * V + o_v, tl.zeros([BV], tl.float32).to(out.dtype.element_ty),
                     mask=o_v < V)  # fmt: skip
        return
    p_k = ring_k + slot * stride_rk + i_h * L * K
    b_kp = tl.load(p_k + o_p[:, None] * K + o_k[None, :], mask=m_p[:, None] & mask_k[None, :], other=0)
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    if not steps_row(wp, write_pos, 1, L, JOIN, DEFER):  # flush row: the flush launch takes it
        return

    # the key head's side, once: the token's q and k, and the records' normalised keys dotted with them
    p_x = mixed_qkv + i_b * stride_x
    if STAGES > 0 and PREFETCH:  # the first tile's token inputs, ahead of the ring_k store below
        b_a_next, b_b_next, b_v_next = _token_inputs(a, b, p_x, i_b, i_h * G, o_r, stride_a, stride_b, H, K, V)
    b_q, b_k, b_kq, b_den_q, b_den_k, b_k_raw, o_pc, m_c, b_pk, b_pq = _key_head_side(
        p_x, b_kp, o_k, mask_k, o_p, m_p, wp, base, scale, i_h, L, H, K)  # fmt: skip
    pos = (base + wp) % L  # the token's record
    tl.store(p_k + pos * K + o_k, b_k_raw.to(ring_k.dtype.element_ty), mask=mask_k)

    if STAGES > 0:  # a loop the compiler pipelines: tile j + 1's loads go out before tile j's sums
        for j in tl.range(0, G * NV, num_stages=STAGES):
            i_hv = i_h * G + j // NV
            o_v = (j % NV) * BV + o_r
            if PREFETCH:  # this tile's inputs came with the last tile; the next tile's go out now
                b_a_raw, b_b_raw, b_v_raw = b_a_next, b_b_next, b_v_next
                j_next = (j + 1) % (G * NV)
                o_v_next = (j_next % NV) * BV + o_r
                b_a_next, b_b_next, b_v_next = _token_inputs(
                    a, b, p_x, i_b, i_h * G + j_next // NV, o_v_next, stride_a, stride_b, H, K, V
                )
            else:
                b_a_raw, b_b_raw = tl.load(a + i_b * stride_a + i_hv), tl.load(b + i_b * stride_b + i_hv)
                b_v_raw = 0  # `_key_head_tile` loads it
            b_g, b_beta, b_wk, b_wq, b_ea, b_eg = _value_head_gates(
                b_a_raw, b_b_raw, A_log, dt_bias, ring_g, i_hv, slot, stride_rg, o_p, m_p, m_c, o_pc, b_pk, b_pq,
                L)  # fmt: skip
            _store_gates(ring_g, ring_beta, slot, i_hv, pos, stride_rg, stride_rbeta, b_g, b_beta, j % NV == 0, L,
                         EXACT_FOLD)  # fmt: skip
            _key_head_tile(state, ring_u, ring_v, p_o, p_x, b_v_raw, slot, i_h, i_hv, o_v, o_k, mask_k, o_k2, o_p,
                           m_p, m_c, pos, stride_state, stride_ru, stride_rv, b_k, b_q, b_kq, b_den_k, b_den_q, scale,
                           b_beta, b_wk, b_wq, b_ea, b_eg, state_desc, (j % NV) * BV, L, H, K, V, BK, EXACT_FOLD,
                           PAIRED_STATE, KC, FUSED_HISTORY, PREFETCH, TMA_STATE, LATE_NORMS)  # fmt: skip
    else:
        for j in tl.static_range(G * NV):
            i_hv = i_h * G + j // NV
            o_v = (j % NV) * BV + o_r
            if j % NV == 0:  # the value head's gates: the token's, and each record's decay to the history's end
                b_g, b_beta, b_wk, b_wq, b_ea, b_eg = _value_head_gates(
                    tl.load(a + i_b * stride_a + i_hv), tl.load(b + i_b * stride_b + i_hv), A_log, dt_bias, ring_g,
                    i_hv, slot, stride_rg, o_p, m_p, m_c, o_pc, b_pk, b_pq, L)  # fmt: skip
                _store_gates(ring_g, ring_beta, slot, i_hv, pos, stride_rg, stride_rbeta, b_g, b_beta, True, L,
                             EXACT_FOLD)  # fmt: skip
            _key_head_tile(state, ring_u, ring_v, p_o, p_x, 0, slot, i_h, i_hv, o_v, o_k, mask_k, o_k2, o_p, m_p,
                           m_c, pos, stride_state, stride_ru, stride_rv, b_k, b_q, b_kq, b_den_k, b_den_q, scale,
                           b_beta, b_wk, b_wq, b_ea, b_eg, state_desc, (j % NV) * BV, L, H, K, V, BK, EXACT_FOLD,
                           PAIRED_STATE, KC, FUSED_HISTORY, False, TMA_STATE, LATE_NORMS)  # fmt: skip


@triton.jit
def _key_head_side(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_x, b_kp, o_k, mask_k, o_p, m_p, wp, base, scale, i_h, L: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
):  # fmt: skip
    """The key head's side, computed once per program: the token's normalised `q` (scaled) and `k`, their dot,
    the norms' denominators and the raw `k`; each physical record's logical position and whether it is committed;
    and the committed records' normalised keys dotted with `k` and `q` (the records' keys `b_kp`, `[BH, BK]`)."""
    b_q_raw = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k_raw = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0)
    b_den_q = norm_denominator(b_q_raw)
    b_den_k = norm_denominator(b_k_raw.to(tl.float32))
    b_q = b_q_raw / b_den_q * scale
    b_k = b_k_raw.to(tl.float32) / b_den_k
    b_kq = tl.sum(b_k * b_q, axis=0)
    o_pc = (o_p + L - base % L) % L  # logical position of each physical row
    m_c = m_p & (o_pc < wp)  # the committed records; the others may hold anything, NaN included
    b_kc = tl.where(m_c[:, None], b_kp.to(tl.float32), 0.0)
    b_norm = tl.where(m_c, 1.0 / tl.sqrt(tl.sum(b_kc * b_kc, axis=1) + L2NORM_EPS), 0.0)
    b_pk = tl.sum(b_kc * b_k[None, :], axis=1) * b_norm
    b_pq = tl.sum(b_kc * b_q[None, :], axis=1) * b_norm
    return b_q, b_k, b_kq, b_den_q, b_den_k, b_k_raw, o_pc, m_c, b_pk, b_pq


@triton.jit
def _token_inputs(  # noqa: PLR0917 (Triton passes arguments positionally)
    a, b, p_x, i_b, i_hv, o_v, stride_a, stride_b, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    """The token's raw `a` and `b` of value head `i_hv` and its `v` rows `o_v` (masked to `V`), as stored."""
    b_v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=o_v < V, other=0)
    return tl.load(a + i_b * stride_a + i_hv), tl.load(b + i_b * stride_b + i_hv), b_v


@triton.jit
def _value_head_gates(  # noqa: PLR0917 (Triton passes arguments positionally)
    b_a_raw, b_b_raw, A_log, dt_bias, ring_g, i_hv, slot, stride_rg, o_p, m_p, m_c, o_pc, b_pk, b_pq,
    L: tl.constexpr,
):  # fmt: skip
    """Value head `i_hv`'s gates from the token's raw `a` and `b`: the token's `g`, `beta`, and each committed
    record's decay to the history's end times its key dots (`b_wk`, `b_wq`), the whole history's decay
    `exp(sum g)` and the token's `exp(g)`."""
    b_g, b_beta = gates(
        b_a_raw.to(tl.float32),
        b_b_raw.to(tl.float32),
        tl.load(A_log + i_hv).to(tl.float32),
        tl.load(dt_bias + i_hv).to(tl.float32),
    )
    b_gc = tl.where(m_c, tl.load(ring_g + slot * stride_rg + i_hv * L + o_p, mask=m_p, other=0), 0.0)
    b_after = tl.sum(tl.where(o_pc[None, :] > o_pc[:, None], b_gc[None, :], 0.0), axis=1)
    b_w = tl.exp(b_after)
    return b_g, b_beta, b_w * b_pk, b_w * b_pq, tl.exp(tl.sum(b_gc, axis=0)), tl.exp(b_g)


@triton.jit
def _store_gates(  # noqa: PLR0917 (Triton passes arguments positionally)
    ring_g, ring_beta, slot, i_hv, pos, stride_rg, stride_rbeta, b_g, b_beta, store, L: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
):  # fmt: skip
    """The token's gates into value head `i_hv`'s ring record `pos`, where `store`."""
    tl.store(ring_g + slot * stride_rg + i_hv * L + pos, b_g, mask=store)
    if EXACT_FOLD:
        tl.store(ring_beta + slot * stride_rbeta + i_hv * L + pos, b_beta, mask=store)


@triton.jit
def _key_head_tile(  # noqa: PLR0917 (one tile's recipe; Triton passes arguments positionally)
    state, ring_u, ring_v, p_o, p_x, b_v_pre, slot, i_h, i_hv, o_v, o_k, mask_k, o_k2, o_p, m_p, m_c, pos,
    stride_state, stride_ru, stride_rv, b_k, b_q, b_kq, b_den_k, b_den_q, scale, b_beta, b_wk, b_wq, b_ea, b_eg,
    state_desc, v0, L: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    EXACT_FOLD: tl.constexpr, PAIRED_STATE: tl.constexpr, KC: tl.constexpr, FUSED_HISTORY: tl.constexpr,
    V_LOADED: tl.constexpr, TMA_STATE: tl.constexpr, LATE_NORMS: tl.constexpr,
):  # fmt: skip
    """One state tile, rows `o_v` of value head `i_hv`: its outputs and its `u` (and `v`) records. The token's raw
    `v` rows are `b_v_pre` where `V_LOADED` (loaded ahead by the caller), else loaded here. With `TMA_STATE` (and
    `KC > 0`) the state's column chunks come through `state_desc` (rows from `v0`), else from `state`; `LATE_NORMS`:
    as `_key_head_decode_kernel`."""
    mask_v = o_v < V
    p_u = ring_u + slot * stride_ru + i_hv * L * V
    p_h = state + slot * stride_state + i_hv * V * K
    if KC > 0:
        b_h = tl.zeros([1], tl.float32)  # unused: `chunked_projections` loads its own chunks
    elif PAIRED_STATE:  # a bf16 state as int32 pairs of elements (K even)
        b_h = tl.load(p_h.to(tl.pointer_type(tl.int32)) + o_v[:, None] * (K // 2) + o_k2[None, :],
                      mask=mask_v[:, None] & (o_k2 < K // 2)[None, :], other=0)  # fmt: skip
    else:
        b_h = tl.load(p_h + o_v[:, None] * K + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :], other=0)
    b_up = tl.load(p_u + o_p[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_p[None, :], other=0)
    b_v_raw = b_v_pre if V_LOADED else tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0)
    if FUSED_HISTORY:  # S_w k, S_w q in one row sum each
        b_uc = tl.where(m_c[None, :], b_up.to(tl.float32), 0.0)
        b_sk, b_sq = chunked_history_projections(p_h, p_x + H * K + i_h * K, p_x + i_h * K, o_v, mask_v, b_den_k,
                                                 b_den_q, scale, b_ea, b_uc, b_wk, b_wq, state_desc, slot, i_hv, v0,
                                                 K, BK, KC, TMA_STATE)  # fmt: skip
    else:
        if KC > 0:
            b_sk, b_sq = chunked_projections(p_h, p_x + H * K + i_h * K, p_x + i_h * K, o_v, mask_v, b_den_k,
                                             b_den_q, scale, state_desc, slot, i_hv, v0, K, BK, KC,
                                             TMA_STATE, LATE_NORMS)  # fmt: skip
        elif PAIRED_STATE:
            b_sk, b_sq = pair_projections(b_h, b_k, b_q)
        else:
            b_sk, b_sq = tile_projections(b_h.to(tl.float32), b_k, b_q)
        b_uc = tl.where(m_c[None, :], b_up.to(tl.float32), 0.0)
        b_sk = b_ea * b_sk + tl.sum(b_uc * b_wk[None, :], axis=1)  # S_w k
        b_sq = b_ea * b_sq + tl.sum(b_uc * b_wq[None, :], axis=1)  # S_w q
    # the token: S = exp(g) S_w + u k^T with u = beta (v - exp(g) S_w k); o = S q
    b_u = b_beta * (b_v_raw.to(tl.float32) - b_eg * b_sk)
    b_o = b_eg * b_sq + b_u * b_kq
    tl.store(p_o + i_hv * V + o_v, b_o.to(p_o.dtype.element_ty), mask=mask_v)
    tl.store(p_u + pos * V + o_v, b_u.to(ring_u.dtype.element_ty), mask=mask_v)
    if EXACT_FOLD:
        tl.store(ring_v + slot * stride_rv + i_hv * L * V + pos * V + o_v,
                 b_v_raw.to(ring_v.dtype.element_ty), mask=mask_v)  # fmt: skip


def launch_key_head_decode(
    args: list[object], *, L: int, H: int, HV: int, K: int, V: int, B: int, block_v: int, num_warps: int,
    join: int, defer: bool, paired: bool, options: dict[str, object], min_history_block: int, k_chunk: int = 0,
    fused_history: bool = False, stages: int = 0, prefetch: bool = False, tma_state: bool = False,
    late_norms: bool = False,
) -> None:  # fmt: skip
    """`_key_head_decode_kernel` on `ring_args(...)`, grid `(B, H)`; `k_chunk` its `KC` (0: whole K; a chunked
    state tile is never read as pairs); `fused_history` its `FUSED_HISTORY` where the ring fits one chunk's columns
    (the records' tile is then `KC` wide); `stages` its `STAGES` (0: unrolled tiles), `prefetch` its `PREFETCH`
    (with stages only); `min_history_block` the fewest rows of the records' tile (a power of two), which holds
    the whole ring (`_replay.KEY_HEAD_DECODE_MIN_HISTORY_BLOCK`); `tma_state`: the chunked tiles of the pipelined
    loop read through a tensor descriptor of the state pool (`TMA_STATE`) where `_descriptors.state_descriptor`
    gives one (unrolled, each tile would wait for its copies: H200 run 41c, B = 16, 20.9 -> 35.0 us a step);
    `late_norms` its `LATE_NORMS` where the tiles are chunked and the records' terms are not in the chunks' sums."""
    bv = min(block_v, max(16, triton.next_power_of_2(V)))
    kc = min(k_chunk, triton.next_power_of_2(K))
    fused = fused_history and kc > 0 and history_block(L) <= kc
    bh = kc if fused else max(min_history_block, triton.next_power_of_2(L))
    state = args[5]
    assert isinstance(state, torch.Tensor)
    desc = state_descriptor(state, block_v=bv, k_chunk=kc) if tma_state and kc > 0 and stages > 0 else None
    _key_head_decode_kernel[(B, H)](
        *args, state if desc is None else desc, L=L, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=bv,
        BH=bh, JOIN=join, DEFER=defer, PAIRED_STATE=paired and not kc, G=HV // H,
        NV=triton.cdiv(V, bv), KC=kc, FUSED_HISTORY=fused, STAGES=stages, PREFETCH=prefetch and stages > 0,
        TMA_STATE=desc is not None, LATE_NORMS=late_norms and kc > 0 and not fused, num_warps=num_warps, **options,
    )  # fmt: skip
