"""The non-flush decode kernel (T = 1) below `_replay.KEY_HEAD_DECODE_MIN_BATCH` rows (`_replay.key_head_decode`).

It is the baseline's decode program with the state store replaced by a history term: the tile `[BV, K]` is read
once, `S0 k` and `S0 q` are row reductions (two vectors: no dot is worth its operand shuffles), and the committed
records add `sum_c exp(G - G_c) u_c (k_c . x)` chunk by chunk. `_replay.launch_window` launches it and says which
of its builds (preloading, column chunks, paired bf16 state) a batch takes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import L2NORM_EPS, append_record, flushes, load_token, record_writers, ring_rows
from ._flush import flush_row, record_chunk
from ._projections import chunked_projections, norm_denominator, pair_projections, tile_projections


@triton.jit
def _history_step(b_acc_k, b_acc_q, b_gamma, b_kc, b_uc, b_gc, c0, wp, o_h, b_k, b_q):  # noqa: PLR0917
    """Add one loaded history chunk (logical records `c0 + o_h`, masked at `wp`) to the decayed sums
    `acc = sum_c exp(G - G_c) u_c (k_c . x)` for x = k and q `[BV]`, and its gates to `G`."""
    m_c = c0 + o_h < wp
    b_total = tl.sum(b_gc, axis=0)
    b_kc = b_kc.to(tl.float32)
    b_norm = tl.where(m_c, 1.0 / tl.sqrt(tl.sum(b_kc * b_kc, axis=1) + L2NORM_EPS), 0.0)
    b_w = tl.exp(b_total - tl.cumsum(b_gc, axis=0)) * b_norm  # decay to the chunk's end / the key's norm
    b_pk = tl.sum(b_kc * b_k[None, :], axis=1) * b_w  # [BH]
    b_pq = tl.sum(b_kc * b_q[None, :], axis=1) * b_w
    b_uc = b_uc.to(tl.float32)
    b_decay = tl.exp(b_total)
    b_acc_k = b_acc_k * b_decay + tl.sum(b_uc * b_pk[None, :], axis=1)
    b_acc_q = b_acc_q * b_decay + tl.sum(b_uc * b_pq[None, :], axis=1)
    return b_acc_k, b_acc_q, b_gamma + b_total


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _decode_kernel(  # noqa: PLR0912, PLR0915, PLR0917 (one linear recipe; Triton passes arguments positionally)
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
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BH: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    BC: tl.constexpr,
    FUSED_FLUSH: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PRELOAD: tl.constexpr,
    EXACT: tl.constexpr,
    FIRST_CHUNK: tl.constexpr,
    JOIN: tl.constexpr,
    DEFER: tl.constexpr,
    PAIRED_STATE: tl.constexpr = False,
    KC: tl.constexpr = 0,
):
    i_v, i_b, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    p_out = out + (i_b * HV + i_hv) * V + o_v

    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: zero output, no state or ring traffic
        tl.store(p_out, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty), mask=mask_v)
        return
    p_u, p_k, p_g, p_v, p_beta = ring_rows(
        ring_u, ring_k, ring_g, ring_v, ring_beta, slot, i_h, i_hv, stride_ru, stride_rk, stride_rg, stride_rv,
        stride_rbeta, L, K, V, EXACT_FOLD,
    )  # fmt: skip
    # the tile load comes before the cursor test in the source, but the sm_90 compile issues it after the
    # early return below; without that return this kernel measured slower (README.md, "Kernels")
    p_h = state + slot * stride_state + i_hv * V * K
    if KC > 0:  # column chunks, loaded by `chunked_projections`
        b_h = tl.zeros([1], tl.float32)
    elif PAIRED_STATE:  # a bf16 state as int32 pairs of elements (`pair_projections`; K even)
        o_k2 = tl.arange(0, BK // 2)
        b_h = tl.load(
            p_h.to(tl.pointer_type(tl.int32)) + o_v[:, None] * (K // 2) + o_k2[None, :],
            mask=mask_v[:, None] & (o_k2 < K // 2)[None, :],
            other=0,
        )
    else:
        b_h = tl.load(p_h + o_v[:, None] * K + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :], other=0)
    if PRELOAD:  # the whole ring in physical order, issued with the tile: no load waits for the cursors
        o_p = tl.arange(0, BH)
        m_p = o_p < L
        b_gp = tl.load(p_g + o_p, mask=m_p, other=0)
        b_kp = tl.load(p_k + o_p[:, None] * K + o_k[None, :], mask=m_p[:, None] & mask_k[None, :], other=0)
        b_up = tl.load(p_u + o_p[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_p[None, :], other=0)
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    if not DEFER:  # with a deferred fold every row's token is this kernel's; the flush launch only folds
        flush = wp + 2 > L
        if JOIN > 0:  # coalesced flushes; written apart so that without them the sm_90 SASS stays run 18's
            flush = flushes(wp, write_pos, 1, L, JOIN)
        if flush:  # flush row: fold it here, or leave it to `_flush_kernel`
            if FUSED_FLUSH:
                flush_row(
                    mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, out, scale,
                    stride_x, stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv,
                    stride_rbeta, i_v, i_b, i_hv, slot, wp, base, 1, L, H, HV, K, V, BK, BV, BC, DOT_PRECISION,
                    EXACT_FOLD, EXACT,
                )  # fmt: skip
            return
    if not PAIRED_STATE and KC == 0:
        b_h = b_h.to(tl.float32)
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)
    b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta = load_token(
        mixed_qkv, a, b, i_b, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale,
        stride_x, stride_a, stride_b, H, K, HV, V, False,
    )  # fmt: skip
    if KC > 0:
        p_xk, p_xq = mixed_qkv + i_b * stride_x + H * K + i_h * K, mixed_qkv + i_b * stride_x + i_h * K
        b_den_k = norm_denominator(b_k_raw.to(tl.float32))  # `load_token` returns the raw key, not the raw query
        b_den_q = norm_denominator(tl.load(p_xq + o_k, mask=mask_k, other=0).to(tl.float32))
        b_sk, b_sq = chunked_projections(p_h, p_xk, p_xq, o_v, mask_v, b_den_k, b_den_q, scale, p_h, 0, 0, 0, K, BK,
                                         KC, False)  # fmt: skip
    elif PAIRED_STATE:
        b_sk, b_sq = pair_projections(b_h, b_k, b_q)
    else:
        b_sk, b_sq = tile_projections(b_h, b_k, b_q)

    # committed history: acc = sum_c exp(G_end - G_c) u_c (k_c . x)
    if PRELOAD:
        o_pc = (o_p + L - base % L) % L  # logical position of each physical row
        m_c = m_p & (o_pc < wp)  # the committed records; the others may hold anything, NaN included
        b_gc = tl.where(m_c, b_gp, 0.0)
        # decay from each record to the end of the history: the sum of the gates of the records after it
        b_after = tl.sum(tl.where(o_pc[None, :] > o_pc[:, None], b_gc[None, :], 0.0), axis=1)
        b_kc = tl.where(m_c[:, None], b_kp.to(tl.float32), 0.0)
        b_norm = tl.where(m_c, 1.0 / tl.sqrt(tl.sum(b_kc * b_kc, axis=1) + L2NORM_EPS), 0.0)
        b_w = tl.exp(b_after) * b_norm
        b_uc = tl.where(m_c[None, :], b_up.to(tl.float32), 0.0)
        b_acc_k = tl.sum(b_uc * (tl.sum(b_kc * b_k[None, :], axis=1) * b_w)[None, :], axis=1)
        b_acc_q = tl.sum(b_uc * (tl.sum(b_kc * b_q[None, :], axis=1) * b_w)[None, :], axis=1)
        b_gamma = tl.sum(b_gc, axis=0)
    else:  # chunk by chunk, decayed across chunks
        b_acc_k = tl.zeros([BV], dtype=tl.float32)
        b_acc_q = tl.zeros([BV], dtype=tl.float32)
        b_gamma = tl.sum(tl.zeros([BH], dtype=tl.float32), axis=0)
        o_h = tl.arange(0, BH)
        # the two loops are written out: through one helper, Triton 3.6 compiles the 8-record-chunk variant
        # ("decode 64x4 h8") to different SASS than the one measured
        if FIRST_CHUNK > 0 and wp <= FIRST_CHUNK:  # a short history in one short chunk (DECODE_FIRST_CHUNK)
            o_f = tl.arange(0, FIRST_CHUNK)
            for c0 in range(0, wp, FIRST_CHUNK):  # once, or not at all for an empty history
                b_kc, b_uc, b_gc = record_chunk(p_k, p_u, p_g, c0, wp, base, o_f, o_k, o_v, mask_k, mask_v, L, K, V)
                b_acc_k, b_acc_q, b_gamma = _history_step(
                    b_acc_k, b_acc_q, b_gamma, b_kc, b_uc, b_gc, c0, wp, o_f, b_k, b_q
                )
        else:
            for c0 in range(0, wp, BH):
                b_kc, b_uc, b_gc = record_chunk(p_k, p_u, p_g, c0, wp, base, o_h, o_k, o_v, mask_k, mask_v, L, K, V)
                b_acc_k, b_acc_q, b_gamma = _history_step(
                    b_acc_k, b_acc_q, b_gamma, b_kc, b_uc, b_gc, c0, wp, o_h, b_k, b_q
                )
    b_ea = tl.exp(b_gamma)
    b_sk = b_ea * b_sk + b_acc_k  # S_w k
    b_sq = b_ea * b_sq + b_acc_q  # S_w q

    # the token: S = exp(g) S_w + u k^T with u = beta (v - exp(g) S_w k); o = S q
    b_eg = tl.exp(b_g)
    b_u = b_beta * (b_v_raw.to(tl.float32) - b_eg * b_sk)
    b_o = b_eg * b_sq + b_u * tl.sum(b_k * b_q, axis=0)
    tl.store(p_out, b_o.to(out.dtype.element_ty), mask=mask_v)

    # append the token's record behind the committed history
    n_head, n_key = record_writers(i_v, i_hv, HV, H)
    append_record(
        p_u, p_k, p_g, p_v, p_beta, (base + wp) % L, b_u, b_k_raw, b_g, b_v_raw, b_beta, o_k, o_v, mask_v, n_head,
        n_key, K, V, EXACT_FOLD,
    )  # fmt: skip
