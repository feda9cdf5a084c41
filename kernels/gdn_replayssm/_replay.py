"""The ReplaySSM kernel behind `replayssm_decode` (T = 1) and `replayssm_verify` (T = 2..8).

One program per (V tile, row, value head). Each program reads its row's cursors from the device and picks
its path there, so a whole step is one launch with no host synchronisation:

- non-flush rows read the checkpoint once and reconstruct `S_w x` for the window's normalised keys and
  queries as `exp(G) (S0 x) + sum_c exp(G - G_c) u_c (k_c . x)` with fp32-accumulating dots, then run the
  window through the `(I + A)^-1` transform by forward substitution (README.md). No state is written.
- flush rows fold the committed history into the `[BV, K]` state tile, sequentially from the raw records in
  the baseline op order (exact fold) or with one dot per chunk of `u` records (open-loop fold), then run the
  window recurrently with the baseline's code. Decode folds the token and stores the state; verify stores
  the checkpoint before the window, whose tokens may still be rejected.

Every row with a slot writes its window's records at logical positions `wp .. wp + T - 1` except a decode
flush, which leaves the ring to be emptied by the commit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import delta_step, gates, l2norm_rows, load_token, normalize_key, recurrent_token
from ._config import FP_FUSION, TileConfig
from ._window import (
    MAX_HISTORY_BLOCK,
    WINDOW_BLOCK_K,
    WINDOW_BLOCK_V,
    WINDOW_STAGES,
    WINDOW_WARPS,
    _window_kernel,
    history_block,
)
from .ring import ReplayCursors, ReplayRing

HISTORY_CHUNK = 16  # records per reconstruction dot (dot operands need >= 16 rows)
WINDOW_BLOCK = 16  # rows of the window tile: T keys then T queries, 2 T <= 16
# non-flush rows in their own kernel (`_window.py`) and flush rows in `_replayssm_kernel(FLUSH_ONLY=True)`;
# False runs both paths in the single kernel (one launch, the flush path's tile and registers for both).
# Measured on an H200 (ops/results/h200-replayssm): the split helps spec verify (T = 4, mixed acceptance
# 0.51x -> 0.67-0.88x of the baseline) and hurts decode (0.67x -> 0.34x), so decode keeps one kernel.
SPLIT_WINDOW = True
SPLIT_MIN_TOKENS = 2


@triton.jit
def _history_chunk(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
    p_u,
    p_k,
    p_g,
    c0,
    wp,
    base,
    o_k,
    o_v,
    mask_k,
    mask_v,
    L: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BC: tl.constexpr,
):
    """Records `c0 .. c0 + BC - 1` of the committed history (masked at `wp`): `u * w` `[BV, BC]`, normalised
    keys `[BC, BK]`, and the chunk's total log-decay; `w_c = exp(G_end - G_c)` decays record `c` to the
    chunk's end."""
    o_c = c0 + tl.arange(0, BC)
    m_c = o_c < wp
    o_pos = (base + o_c) % L
    b_g = tl.load(p_g + o_pos, mask=m_c, other=0)
    b_total = tl.sum(b_g, axis=0)
    b_w = tl.where(m_c, tl.exp(b_total - tl.cumsum(b_g, axis=0)), 0.0)
    b_k = tl.load(p_k + o_pos[:, None] * K + o_k[None, :], mask=m_c[:, None] & mask_k[None, :], other=0)
    b_u = tl.load(p_u + o_pos[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_c[None, :], other=0)
    return b_u.to(tl.float32) * b_w[None, :], l2norm_rows(b_k.to(tl.float32)), b_total


@triton.jit
def _flush_row(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
    mixed_qkv, a, b, p_state, p_u, p_k, p_g, p_v, p_beta, out, i_b, i_h, i_hv, wp, base, n_head, n_key,
    o_k, o_v, mask_k, mask_v, mask_h, b_A_log, b_dt_bias, scale, stride_x, stride_a, stride_b,
    T: tl.constexpr, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr, EXACT_FOLD: tl.constexpr,
):  # fmt: skip
    """Flush: fold the committed history into the state tile, then run the window with the baseline's code."""
    b_h = tl.load(p_state, mask=mask_h, other=0).to(tl.float32)
    if EXACT_FOLD:  # closed loop: replay the raw records in the baseline op order
        for c in range(wp):
            pos = (base + c) % L
            b_k_c = normalize_key(tl.load(p_k + pos * K + o_k, mask=mask_k, other=0))
            b_v_c = tl.load(p_v + pos * V + o_v, mask=mask_v, other=0).to(tl.float32)
            b_h, _ = delta_step(b_h, b_k_c, b_v_c, tl.load(p_g + pos), tl.load(p_beta + pos))
    else:  # open loop: S = exp(G) S0 + sum_c exp(G - G_c) u_c k_c^T, one dot per chunk
        b_acc = tl.zeros([BV, BK], dtype=tl.float32)
        b_gamma = tl.sum(tl.zeros([BC], dtype=tl.float32), axis=0)
        for c0 in range(0, wp, BC):
            b_uw, b_kc, b_total = _history_chunk(p_u, p_k, p_g, c0, wp, base, o_k, o_v, mask_k, mask_v, L, K, V, BC)
            b_acc = b_acc * tl.exp(b_total) + tl.dot(b_uw, b_kc, input_precision=DOT_PRECISION)
            b_gamma += b_total
        b_h = b_h * tl.exp(b_gamma) + b_acc

    if T == 1:  # decode: the token is committed, fold it too and store the state
        b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta = load_token(
            mixed_qkv, a, b, i_b, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale,
            stride_x, stride_a, stride_b, H, K, HV, V,
        )  # fmt: skip
        b_h, _, b_o = recurrent_token(b_h, b_q, b_k, b_v_raw.to(tl.float32), b_g, b_beta)
        tl.store(out + (i_b * HV + i_hv) * V + o_v, b_o.to(out.dtype.element_ty), mask=mask_v)
        tl.store(p_state, b_h.to(p_state.dtype.element_ty), mask=mask_h)
    else:  # verify: checkpoint = committed history; the window (maybe rejected) runs on and is recorded
        tl.store(p_state, b_h.to(p_state.dtype.element_ty), mask=mask_h)
        for s in tl.static_range(T):
            b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta = load_token(
                mixed_qkv, a, b, i_b * T + s, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale,
                stride_x, stride_a, stride_b, H, K, HV, V,
            )  # fmt: skip
            b_h, b_u, b_o = recurrent_token(b_h, b_q, b_k, b_v_raw.to(tl.float32), b_g, b_beta)
            tl.store(out + ((i_b * T + s) * HV + i_hv) * V + o_v, b_o.to(out.dtype.element_ty), mask=mask_v)
            pos = (base + wp + s) % L
            tl.store(p_u + pos * V + o_v, b_u.to(p_u.dtype.element_ty), mask=mask_v)
            tl.store(p_k + pos * K + o_k, b_k_raw.to(p_k.dtype.element_ty), mask=o_k < K * n_key)
            tl.store(p_g + pos, b_g, mask=n_head > 0)
            if EXACT_FOLD:
                tl.store(p_v + pos * V + o_v, b_v_raw.to(p_v.dtype.element_ty), mask=mask_v)
                tl.store(p_beta + pos, b_beta, mask=n_head > 0)


@triton.jit
def _replay_row(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
    mixed_qkv, a, b, p_state, p_u, p_k, p_g, p_v, p_beta, out, i_b, i_h, i_hv, wp, base, n_head, n_key,
    o_k, o_v, mask_k, mask_v, mask_h, b_A_log, b_dt_bias, scale, stride_x, stride_a, stride_b,
    T: tl.constexpr, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BX: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
):  # fmt: skip
    """No flush: outputs from the checkpoint + history through the UT transform; records appended."""
    o_x = tl.arange(0, BX)
    m_tok = o_x < T
    # window tile [BX, BK]: rows 0..T-1 are the tokens' keys, rows T..2T-1 their queries
    o_tok = tl.where(m_tok, o_x, o_x - T)
    o_col = tl.where(m_tok, H * K + i_h * K, i_h * K)
    p_x = mixed_qkv + (i_b * T + o_tok)[:, None] * stride_x + o_col[:, None] + o_k[None, :]
    b_x_raw = tl.load(p_x, mask=(o_x < 2 * T)[:, None] & mask_k[None, :], other=0)
    b_x = l2norm_rows(b_x_raw.to(tl.float32)) * tl.where(m_tok, 1.0, scale)[:, None]
    p_v_win = mixed_qkv + (i_b * T + o_x)[None, :] * stride_x + 2 * H * K + i_hv * V + o_v[:, None]
    b_v_raw = tl.load(p_v_win, mask=mask_v[:, None] & m_tok[None, :], other=0)  # [BV, BX]
    b_a = tl.load(a + (i_b * T + o_x) * stride_a + i_hv, mask=m_tok, other=0).to(tl.float32)
    b_b = tl.load(b + (i_b * T + o_x) * stride_b + i_hv, mask=m_tok, other=0).to(tl.float32)
    b_g, b_beta = gates(b_a, b_b, b_A_log, b_dt_bias)
    b_g = tl.where(m_tok, b_g, 0.0)
    b_G = tl.cumsum(b_g, axis=0)

    # P = S_w x^T for every window row x: the checkpoint part, then the committed history in chunks
    b_h = tl.load(p_state, mask=mask_h, other=0).to(tl.float32)
    b_p = tl.dot(b_h, tl.trans(b_x), input_precision=DOT_PRECISION)  # [BV, BX]
    b_acc = tl.zeros([BV, BX], dtype=tl.float32)
    b_gamma = tl.sum(tl.zeros([BC], dtype=tl.float32), axis=0)
    for c0 in range(0, wp, BC):
        b_uw, b_kc, b_total = _history_chunk(p_u, p_k, p_g, c0, wp, base, o_k, o_v, mask_k, mask_v, L, K, V, BC)
        b_kx = tl.dot(b_kc, tl.trans(b_x), input_precision=DOT_PRECISION)  # [BC, BX]
        b_acc = b_acc * tl.exp(b_total) + tl.dot(b_uw, b_kx, input_precision=DOT_PRECISION)
        b_gamma += b_total
    b_p = b_p * tl.exp(b_gamma) + b_acc

    # UT transform: u = (I + A)^-1 R by forward substitution; outputs from the same u
    b_xx = tl.dot(b_x, tl.trans(b_x), input_precision=DOT_PRECISION)  # [BX, BX]: k.k and k.q
    m_lower = (o_x[:, None] > o_x[None, :]) & m_tok[:, None]
    b_A = tl.where(m_lower, b_beta[:, None] * tl.exp(tl.where(m_lower, b_G[:, None] - b_G[None, :], 0.0)) * b_xx, 0.0)
    b_r = tl.where(m_tok[None, :], b_beta[None, :] * (b_v_raw.to(tl.float32) - tl.exp(b_G)[None, :] * b_p), 0.0)
    b_u = tl.zeros([BV, BX], dtype=tl.float32)
    for s in tl.static_range(T):
        b_r_s = tl.sum(tl.where(o_x[None, :] == s, b_r, 0.0), axis=1)
        b_a_s = tl.sum(tl.where(o_x[:, None] == s, b_A, 0.0), axis=0)  # A[s, j]
        b_u_s = b_r_s - tl.sum(b_u * b_a_s[None, :], axis=1)
        b_u = tl.where(o_x[None, :] == s, b_u_s[:, None], b_u)
        b_G_s = tl.sum(tl.where(o_x == s, b_G, 0.0), axis=0)
        m_past = o_x <= s
        b_kq_s = tl.sum(tl.where(o_x[None, :] == T + s, b_xx, 0.0), axis=1)  # k_j . q_s
        b_w_s = tl.where(m_past, tl.exp(tl.where(m_past, b_G_s - b_G, 0.0)) * b_kq_s, 0.0)
        b_pq_s = tl.sum(tl.where(o_x[None, :] == T + s, b_p, 0.0), axis=1)  # S_w q_s
        b_o = tl.exp(b_G_s) * b_pq_s + tl.sum(b_u * b_w_s[None, :], axis=1)
        tl.store(out + ((i_b * T + s) * HV + i_hv) * V + o_v, b_o.to(out.dtype.element_ty), mask=mask_v)

    # append the window's records behind the committed history
    o_pos = (base + wp + o_x) % L
    m_rec = mask_v[:, None] & m_tok[None, :]
    tl.store(p_u + o_pos[None, :] * V + o_v[:, None], b_u.to(p_u.dtype.element_ty), mask=m_rec)
    p_k_win = p_k + o_pos[:, None] * K + o_k[None, :]
    tl.store(p_k_win, b_x_raw.to(p_k.dtype.element_ty), mask=(o_x < T * n_key)[:, None] & mask_k[None, :])
    tl.store(p_g + o_pos, b_g, mask=o_x < T * n_head)
    if EXACT_FOLD:
        tl.store(p_v + o_pos[None, :] * V + o_v[:, None], b_v_raw.to(p_v.dtype.element_ty), mask=m_rec)
        tl.store(p_beta + o_pos, b_beta, mask=o_x < T * n_head)


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _replayssm_kernel(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
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
    T: tl.constexpr,
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BX: tl.constexpr,
    BC: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    FLUSH_ONLY: tl.constexpr,
):
    i_v, i_b, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    # 1 for the program that writes the records shared by a value head (g, beta) or a key head (k);
    # integer flags compared against index ranges keep every mask a plain tensor comparison
    n_head = (i_v == 0).to(tl.int32)
    n_key = n_head * (i_hv % (HV // H) == 0).to(tl.int32)

    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: zero output, no state or ring traffic
        if FLUSH_ONLY:  # the window kernel wrote the zeros
            return
        o_x = tl.arange(0, BX)
        p_out = out + ((i_b * T + o_x)[None, :] * HV + i_hv) * V + o_v[:, None]
        b_zero = tl.zeros([BV, BX], dtype=tl.float32).to(out.dtype.element_ty)
        tl.store(p_out, b_zero, mask=mask_v[:, None] & (o_x < T)[None, :])
        return

    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    p_state = state + slot * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    p_u = ring_u + slot * stride_ru + i_hv * L * V
    p_k = ring_k + slot * stride_rk + i_h * L * K
    p_g = ring_g + slot * stride_rg + i_hv * L
    if EXACT_FOLD:
        p_v = ring_v + slot * stride_rv + i_hv * L * V
        p_beta = ring_beta + slot * stride_rbeta + i_hv * L
    else:
        p_v = ring_v
        p_beta = ring_beta
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)

    if wp + 2 * T > L:
        _flush_row(
            mixed_qkv, a, b, p_state, p_u, p_k, p_g, p_v, p_beta, out, i_b, i_h, i_hv, wp, base, n_head, n_key,
            o_k, o_v, mask_k, mask_v, mask_h, b_A_log, b_dt_bias, scale, stride_x, stride_a, stride_b,
            T, L, H, HV, K, V, BK, BV, BC, DOT_PRECISION, EXACT_FOLD,
        )  # fmt: skip
    elif not FLUSH_ONLY:
        _replay_row(
            mixed_qkv, a, b, p_state, p_u, p_k, p_g, p_v, p_beta, out, i_b, i_h, i_hv, wp, base, n_head, n_key,
            o_k, o_v, mask_k, mask_v, mask_h, b_A_log, b_dt_bias, scale, stride_x, stride_a, stride_b,
            T, L, H, HV, K, V, BK, BV, BX, BC, DOT_PRECISION, EXACT_FOLD,
        )  # fmt: skip


def replayssm_fwd(
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
    scale: float,
    T: int,
    H: int,
    config: TileConfig,
) -> None:
    """Launcher: grid `(cdiv(V, BV), B, HV)`; arguments already validated by the public function."""
    _, HV, V, K = state.shape
    B = state_indices.shape[0]
    exact = ring.v is not None and ring.beta is not None
    L = ring.ring_len
    split = SPLIT_WINDOW and T >= SPLIT_MIN_TOKENS and history_block(L) <= MAX_HISTORY_BLOCK
    if split:
        BK = triton.next_power_of_2(K)
        block_v = min(WINDOW_BLOCK_V, max(16, triton.next_power_of_2(V)))
        nv = triton.cdiv(V, block_v)
        _window_kernel[(nv * HV, B)](
            mixed_qkv,
            a,
            b,
            A_log,
            dt_bias,
            state,
            ring.u,
            ring.k,
            ring.g,
            ring.v,
            ring.beta,
            cursors.write_pos,
            cursors.base,
            state_indices,
            out,
            scale,
            mixed_qkv.stride(0),
            a.stride(0),
            b.stride(0),
            state.stride(0),
            ring.u.stride(0),
            ring.k.stride(0),
            ring.g.stride(0),
            ring.v.stride(0) if exact else 0,
            ring.beta.stride(0) if exact else 0,
            T=T,
            L=L,
            H=H,
            HV=HV,
            K=K,
            V=V,
            BK=BK,
            BKC=max(16, min(WINDOW_BLOCK_K, BK)),
            BV=block_v,
            BX=WINDOW_BLOCK,
            BH=history_block(L),
            NV=nv,
            DOT_PRECISION=config.dot_precision,
            EXACT_FOLD=exact,
            NUM_STAGES=WINDOW_STAGES,
            num_warps=WINDOW_WARPS,
        )
    grid = (triton.cdiv(V, config.block_v), B, HV)
    _replayssm_kernel[grid](
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        ring_u=ring.u,
        ring_k=ring.k,
        ring_g=ring.g,
        ring_v=ring.v,
        ring_beta=ring.beta,
        write_pos=cursors.write_pos,
        ring_base=cursors.base,
        state_indices=state_indices,
        out=out,
        scale=scale,
        stride_x=mixed_qkv.stride(0),
        stride_a=a.stride(0),
        stride_b=b.stride(0),
        stride_state=state.stride(0),
        stride_ru=ring.u.stride(0),
        stride_rk=ring.k.stride(0),
        stride_rg=ring.g.stride(0),
        stride_rv=ring.v.stride(0) if exact else 0,
        stride_rbeta=ring.beta.stride(0) if exact else 0,
        T=T,
        L=ring.ring_len,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=triton.next_power_of_2(K),
        BV=config.block_v,
        BX=WINDOW_BLOCK,
        BC=HISTORY_CHUNK,
        DOT_PRECISION=config.dot_precision,
        FLUSH_ONLY=split,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        enable_fp_fusion=FP_FUSION,
    )
