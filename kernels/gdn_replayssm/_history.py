"""The committed history's terms of a non-flush decode row, as a pass of their own before the decode kernel.

A non-flush decode row needs `S_w x = exp(G) (S0 x) + sum_c exp(G - G_c) u_c (k_c . x)` for `x = k, q`. The
decode kernel streams the `[V, K]` checkpoint for `S0 x`; the history sum depends on the cursors, so inside
the same program its loads wait for the cursor load, a second memory round trip after the tile's, during
which the program holds its registers and has few bytes in flight (H200: 52 % of the copy bandwidth at
B = 256, against 89 % for the baseline, which has no such wait). `_history_kernel` computes the sum and
`exp(G)` per (row, value head) first, into a small scratch buffer (`2V + 1` floats per row and head); the
decode kernel then reads the sum with its tile, as the baseline reads its inputs, and never waits for the
ring (`_replay.DECODE_HISTORY_PASS`).

`history_terms` is the one source of the sum for both: the decode kernel's own chunk loop and this pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import L2NORM_EPS, l2norm
from ._flush import record_chunk


@triton.jit
def history_terms(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_k, p_u, p_g, wp, base, b_k, b_q, o_k, o_v, mask_k, mask_v, L: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BV: tl.constexpr, BH: tl.constexpr,
):  # fmt: skip
    """`(sum_c exp(G - G_c) u_c (k_c . k), the same for q, G)` over the `wp` committed records (pointers from
    `ring_rows`), chunk by chunk of `BH` records, decayed across chunks; `[BV]`, `[BV]`, scalar."""
    b_acc_k = tl.zeros([BV], dtype=tl.float32)
    b_acc_q = tl.zeros([BV], dtype=tl.float32)
    b_gamma = tl.sum(tl.zeros([BH], dtype=tl.float32), axis=0)
    o_h = tl.arange(0, BH)
    for c0 in range(0, wp, BH):
        b_kc, b_uc, b_gc = record_chunk(p_k, p_u, p_g, c0, wp, base, o_h, o_k, o_v, mask_k, mask_v, L, K, V)
        m_c = c0 + o_h < wp
        b_total = tl.sum(b_gc, axis=0)
        b_kc = b_kc.to(tl.float32)
        b_norm = tl.where(m_c, 1.0 / tl.sqrt(tl.sum(b_kc * b_kc, axis=1) + L2NORM_EPS), 0.0)
        b_w = tl.exp(b_total - tl.cumsum(b_gc, axis=0)) * b_norm  # decay to the chunk's end, key norm
        b_pk = tl.sum(b_kc * b_k[None, :], axis=1) * b_w  # [BH]
        b_pq = tl.sum(b_kc * b_q[None, :], axis=1) * b_w
        b_uc = b_uc.to(tl.float32)
        b_decay = tl.exp(b_total)
        b_acc_k = b_acc_k * b_decay + tl.sum(b_uc * b_pk[None, :], axis=1)
        b_acc_q = b_acc_q * b_decay + tl.sum(b_uc * b_pq[None, :], axis=1)
        b_gamma += b_total
    return b_acc_k, b_acc_q, b_gamma


@triton.jit
def _history_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv,
    ring_u,
    ring_k,
    ring_g,
    write_pos,
    ring_base,
    state_indices,
    hist,
    scale,
    stride_x,
    stride_ru,
    stride_rk,
    stride_rg,
    L: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BH: tl.constexpr,
):
    """Grid `(B, HV)`. Writes `hist[i_b, i_hv] = [acc_k (V), acc_q (V), exp(G)]` for the non-flush decode rows;
    padding and flush rows are left alone (the decode kernel never reads them)."""
    i_b, i_hv = tl.program_id(0), tl.program_id(1)
    i_h = i_hv // (HV // H)
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:
        return
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    if wp + 2 > L:
        return
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    p_x = mixed_qkv + i_b * stride_x
    b_q = l2norm(tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32), False) * scale
    b_k = l2norm(tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32), False)
    p_u = ring_u + slot * stride_ru + i_hv * L * V
    p_k = ring_k + slot * stride_rk + i_h * L * K
    p_g = ring_g + slot * stride_rg + i_hv * L
    b_acc_k, b_acc_q, b_gamma = history_terms(
        p_k, p_u, p_g, wp, base, b_k, b_q, o_k, o_v, mask_k, mask_v, L, K, V, BV, BH
    )
    p_hist = hist + (i_b * HV + i_hv) * (2 * V + 1)
    tl.store(p_hist + o_v, b_acc_k, mask=mask_v)
    tl.store(p_hist + V + o_v, b_acc_q, mask=mask_v)
    tl.store(p_hist + 2 * V, tl.exp(b_gamma))


def history_scratch(B: int, HV: int, V: int, device: torch.device) -> torch.Tensor:
    """The pass's output buffer `[B, HV, 2V + 1]` float32."""
    return torch.empty(B, HV, 2 * V + 1, dtype=torch.float32, device=device)
