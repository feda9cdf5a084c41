"""The non-flush decode in two launches: the history's weights first, then a plain stream over the state.

`_decode_heads._key_head_decode_kernel` does a row's whole step in one program per (row, key head), and reads the
state at ~86 % of the copy bandwidth at B = 256 (run 29). A kernel that only reads the same state tiles and takes
their two row sums, one program per (row, value head, V tile), reads it at ~93 % of the read bandwidth (run 31:
129 against 160 us at B = 256, no history; the same kernel as one program per key head over four tiles, 137 us).
The difference is the step's other work in the streaming programs: the key head's side of the history, the gates,
the token's norms, the record stores. So here:

1. `_decode_weights_kernel`, grid `(B, H)`: everything that does not need the state. The token's normalised key
   and scaled query, each committed record's decay to the history's end times its key's dots with them (`w_k`,
   `w_q`, per value head, in the ring's physical order, zero past `wp`), the history's decay `exp(sum g)`, the
   token's `exp(g)`, `beta` and `k . q`; it stores the token's `k`, `g`, `beta` and `v` records.
2. `_decode_stream_kernel`, grid `(NV * HV * B,)`: per state tile, `S_w x = exp(sum g) S0 x + sum_c u_c w_c` for
   x = k, q from the tile, its rows' `u` records and the weights, then the token's `u` and output as the key-head
   kernel computes them; it stores the output and the `u` record.

The weights pass costs a launch and its own chain of dependent loads; the stream is left with the state tile,
a `[BV, BH]` tile of `u` records and a few scalars.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import L2NORM_EPS, gates, steps_row
from ._projections import norm_denominator
from ._window import history_block

WEIGHT_SCALARS = tl.constexpr(4)  # after a value head's `w_k`, `w_q`: exp(sum g), exp(g), beta, k . q


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _decode_weights_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, write_pos, ring_base,
    state_indices, out, scale, stride_x, stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv,
    stride_rbeta, weights, tokens, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BK: tl.constexpr, BVA: tl.constexpr, BH: tl.constexpr, G: tl.constexpr, EXACT_FOLD: tl.constexpr,
    JOIN: tl.constexpr, DEFER: tl.constexpr,
):  # fmt: skip
    """Grid `(B, H)`. `weights`: per (row, value head) `[2 BH + WEIGHT_SCALARS]` float32; `tokens`: per (row, key
    head) the normalised key and the scaled, normalised query, `[2, BK]` float32. `G = HV / H`. Padding rows, the
    null slot and the rows the flush launch takes write nothing."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_p = tl.arange(0, BH)
    m_p = o_p < L
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:
        return
    p_k = ring_k + slot * stride_rk + i_h * L * K
    b_kp = tl.load(p_k + o_p[:, None] * K + o_k[None, :], mask=m_p[:, None] & mask_k[None, :], other=0)
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    if not steps_row(wp, write_pos, 1, L, JOIN, DEFER):
        return
    p_x = mixed_qkv + i_b * stride_x
    b_q_raw = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k_raw = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0)
    b_q = b_q_raw / norm_denominator(b_q_raw) * scale
    b_k = b_k_raw.to(tl.float32) / norm_denominator(b_k_raw.to(tl.float32))
    b_kq = tl.sum(b_k * b_q, axis=0)
    p_t = tokens + (i_b * H + i_h) * 2 * BK
    tl.store(p_t + o_k, b_k)
    tl.store(p_t + BK + o_k, b_q)
    o_pc = (o_p + L - base % L) % L  # logical position of each physical row
    m_c = m_p & (o_pc < wp)  # the committed records; the others may hold anything, NaN included
    b_kc = tl.where(m_c[:, None], b_kp.to(tl.float32), 0.0)
    b_norm = tl.where(m_c, 1.0 / tl.sqrt(tl.sum(b_kc * b_kc, axis=1) + L2NORM_EPS), 0.0)
    b_pk = tl.sum(b_kc * b_k[None, :], axis=1) * b_norm
    b_pq = tl.sum(b_kc * b_q[None, :], axis=1) * b_norm
    pos = (base + wp) % L  # the token's record
    tl.store(p_k + pos * K + o_k, b_k_raw.to(ring_k.dtype.element_ty), mask=mask_k)
    o_va = tl.arange(0, BVA)
    for j in tl.static_range(G):
        i_hv = i_h * G + j
        b_g, b_beta = gates(
            tl.load(a + i_b * stride_a + i_hv).to(tl.float32),
            tl.load(b + i_b * stride_b + i_hv).to(tl.float32),
            tl.load(A_log + i_hv).to(tl.float32),
            tl.load(dt_bias + i_hv).to(tl.float32),
        )
        b_gc = tl.where(m_c, tl.load(ring_g + slot * stride_rg + i_hv * L + o_p, mask=m_p, other=0), 0.0)
        b_w = tl.exp(tl.sum(tl.where(o_pc[None, :] > o_pc[:, None], b_gc[None, :], 0.0), axis=1))
        p_w = weights + (i_b * HV + i_hv) * (2 * BH + WEIGHT_SCALARS)
        tl.store(p_w + o_p, b_w * b_pk)
        tl.store(p_w + BH + o_p, b_w * b_pq)
        tl.store(p_w + 2 * BH, tl.exp(tl.sum(b_gc, axis=0)))
        tl.store(p_w + 2 * BH + 1, tl.exp(b_g))
        tl.store(p_w + 2 * BH + 2, b_beta)
        tl.store(p_w + 2 * BH + 3, b_kq)
        tl.store(ring_g + slot * stride_rg + i_hv * L + pos, b_g)
        if EXACT_FOLD:
            tl.store(ring_beta + slot * stride_rbeta + i_hv * L + pos, b_beta)
            m_va = o_va < V
            b_v_raw = tl.load(p_x + 2 * H * K + i_hv * V + o_va, mask=m_va, other=0)
            tl.store(ring_v + slot * stride_rv + i_hv * L * V + pos * V + o_va,
                     b_v_raw.to(ring_v.dtype.element_ty), mask=m_va)  # fmt: skip


@triton.jit
def _decode_stream_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, write_pos, ring_base,
    state_indices, out, scale, stride_x, stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv,
    stride_rbeta, weights, tokens, L: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr, NV: tl.constexpr, JOIN: tl.constexpr,
    DEFER: tl.constexpr,
):  # fmt: skip
    """Grid `(NV * HV * B,)`, the V tiles of a row's value heads next to each other: one `[BV, K]` state tile,
    its outputs and its `u` records, from `_decode_weights_kernel`'s `weights` and `tokens`."""
    pid = tl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_b = pid // (NV * HV)
    i_h = i_hv // (HV // H)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    p_o = out + (i_b * HV + i_hv) * V + o_v
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: zero outputs, no state or ring traffic
        tl.store(p_o, tl.zeros([BV], tl.float32).to(out.dtype.element_ty), mask=mask_v)
        return
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_p = tl.arange(0, BH)
    m_p = o_p < L
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    if not steps_row(wp, write_pos, 1, L, JOIN, DEFER):  # flush row: the flush launch takes it
        return
    # the cursors first: loading a flush row's tile too would read 1/L more state (run 31: the order is free)
    p_h = state + slot * stride_state + i_hv * V * K
    b_h = tl.load(p_h + o_v[:, None] * K + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :], other=0)
    p_u = ring_u + slot * stride_ru + i_hv * L * V
    b_up = tl.load(p_u + o_p[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_p[None, :], other=0)
    p_t = tokens + (i_b * H + i_h) * 2 * BK
    b_k = tl.load(p_t + o_k)
    b_q = tl.load(p_t + BK + o_k)
    p_w = weights + (i_b * HV + i_hv) * (2 * BH + WEIGHT_SCALARS)
    b_wk = tl.load(p_w + o_p)
    b_wq = tl.load(p_w + BH + o_p)
    b_ea = tl.load(p_w + 2 * BH)
    b_eg = tl.load(p_w + 2 * BH + 1)
    b_beta = tl.load(p_w + 2 * BH + 2)
    b_kq = tl.load(p_w + 2 * BH + 3)
    b_v_raw = tl.load(mixed_qkv + i_b * stride_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0)
    o_pc = (o_p + L - base % L) % L
    m_c = m_p & (o_pc < wp)
    b_uc = tl.where(m_c[None, :], b_up.to(tl.float32), 0.0)
    b_hf = b_h.to(tl.float32)
    b_sk = b_ea * tl.sum(b_hf * b_k[None, :], axis=1) + tl.sum(b_uc * b_wk[None, :], axis=1)  # S_w k
    b_sq = b_ea * tl.sum(b_hf * b_q[None, :], axis=1) + tl.sum(b_uc * b_wq[None, :], axis=1)  # S_w q
    # the token: S = exp(g) S_w + u k^T with u = beta (v - exp(g) S_w k); o = S q
    b_u = b_beta * (b_v_raw.to(tl.float32) - b_eg * b_sk)
    b_o = b_eg * b_sq + b_u * b_kq
    tl.store(p_o, b_o.to(out.dtype.element_ty), mask=mask_v)
    pos = (base + wp) % L
    tl.store(p_u + pos * V + o_v, b_u.to(ring_u.dtype.element_ty), mask=mask_v)


def launch_stream_decode(
    args: list[object], *, L: int, H: int, HV: int, K: int, V: int, B: int, block_v: int, num_warps: int,
    join: int, defer: bool, options: dict[str, object], weight_warps: int = 4,
) -> None:  # fmt: skip
    """`_decode_weights_kernel` then `_decode_stream_kernel` on `ring_args(...)`, with their scratch (allocated
    here: a CUDA graph keeps it in its pool). `block_v` x `num_warps`: the stream's tile; `options`: its compile
    options (a register cap)."""
    state = args[5]
    assert isinstance(state, torch.Tensor)
    BK, BH = triton.next_power_of_2(K), history_block(L)
    bv = min(block_v, max(16, triton.next_power_of_2(V)))
    nv = triton.cdiv(V, bv)
    weights = torch.empty(B * HV * (2 * BH + WEIGHT_SCALARS.value), dtype=torch.float32, device=state.device)
    tokens = torch.empty(B * H * 2 * BK, dtype=torch.float32, device=state.device)
    _decode_weights_kernel[(B, H)](
        *args, weights, tokens, L=L, H=H, HV=HV, K=K, V=V, BK=BK, BVA=triton.next_power_of_2(V), BH=BH, G=HV // H,
        JOIN=join, DEFER=defer, num_warps=weight_warps,
    )  # fmt: skip
    _decode_stream_kernel[(nv * HV * B,)](
        *args, weights, tokens, L=L, H=H, HV=HV, K=K, V=V, BK=BK, BV=bv, BH=BH, NV=nv, JOIN=join, DEFER=defer,
        num_warps=num_warps, **options,
    )  # fmt: skip
