"""Spec verify's non-flush rows with one program per (row, key head): `_key_head_window_kernel`.

From `_replay.WINDOW_PRODUCTS_MIN_BATCH` rows the verify step runs two launches: `_window._key_products_kernel`, one
program per row and key head, takes the keys' side of the window (the history keys' and the window's products and
norms) into a float32 scratch; then `_window._window_kernel` runs one program per (V tile, value head, row), streams
its state tile once and finishes it. At Qwen3.6's shapes (T = 4, B = 256, H200 run 33) the pre-pass takes 28 us of a
330 us step, bound by its chain of dependent loads rather than its bytes, and each window program finishes its tile
(history terms, UT transform, outputs, records) with no state copy of its own in flight: 4 programs per SM, 0.57
eligible warps per scheduler, a fifth of the stall samples on the K pass's copies.

Here one program takes a row's key head, as the key-head decode does (`_decode_heads`): the keys' side once, in
registers (`_window._key_side`, the pre-pass's code), then every state tile under the key head, `HV / H` value heads
times `cdiv(V, BV)` tiles, in a loop the compiler software-pipelines (`STAGES`), so that the next tile's state is
copied into shared memory while this one finishes (`_window._window_outputs`, the window kernel's code). One launch,
no scratch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import ring_rows, steps_row
from ._window import WINDOW_BLOCK, _key_side, _side_loads, _window_outputs, history_block, window_rows


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _key_head_window_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
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
    BKC: tl.constexpr,
    BV: tl.constexpr,
    BX: tl.constexpr,
    BH: tl.constexpr,
    G: tl.constexpr,
    NV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    STAGES: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    JOIN: tl.constexpr,
    DEFER: tl.constexpr,
):
    """Grid `(B, H)`. Tile `j` of a program is value head `i_h * G + j // NV` (`G = HV / H`), V rows from
    `(j % NV) * BV` (`NV = cdiv(V, BV)`), the whole of K: `S0 x^T` is one dot of the tile with the window's raw
    keys and queries (`x`, converted once), then the window kernel's finish. The first tile of each value head
    writes its `g` and `beta` records; the key side writes the window's keys."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    o_x = tl.arange(0, BX)
    m_tok = o_x < T
    o_r = tl.arange(0, BV)

    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: zero outputs, no state or ring traffic
        for j in tl.static_range(G * NV):
            o_v = (j % NV) * BV + o_r
            p_out = out + ((i_b * T + o_x)[None, :] * HV + i_h * G + j // NV) * V + o_v[:, None]
            tl.store(p_out, tl.zeros([BV, BX], tl.float32).to(out.dtype.element_ty),
                     mask=(o_v < V)[:, None] & m_tok[None, :])  # fmt: skip
        return
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    keep = steps_row(wp, write_pos, T, L, JOIN, DEFER)
    if not keep:  # flush row: the flush launch takes it (the window kernel stores nothing for it either)
        return

    b_cx, b_kx, b_xx, m_c, m_x = _key_side(
        mixed_qkv, ring_k, slot, wp, base, keep, i_b, i_h, scale, stride_x, stride_rk, T, L, H, K, BK, BKC, BX, BH,
        DOT_PRECISION, 2, 2,  # two stages of K chunks; the history keys' squares summed (no Gram matrix)
    )  # fmt: skip
    # the window's rows (keys, then queries), raw, as the state's dots take them
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    p_x = window_rows(mixed_qkv, i_b, i_h, stride_x, T, H, K, BX)
    b_xt = tl.trans(tl.load(p_x + o_k[None, :], mask=m_x[:, None] & mask_k[None, :], other=0).to(tl.float32))
    o_hpos = (base + tl.arange(0, BH)) % L
    o_wpos = (base + wp + o_x) % L

    for j in tl.range(0, G * NV, num_stages=STAGES):
        i_hv = i_h * G + j // NV
        o_v = (j % NV) * BV + o_r
        mask_v = o_v < V
        p_u, _, p_g, p_v, p_beta = ring_rows(
            ring_u, ring_k, ring_g, ring_v, ring_beta, slot, i_h, i_hv, stride_ru, stride_rk, stride_rg, stride_rv,
            stride_rbeta, L, K, V, EXACT_FOLD,
        )  # fmt: skip
        p_h = state + slot * stride_state + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
        b_h = tl.load(p_h, mask=mask_v[:, None] & mask_k[None, :], other=0).to(tl.float32)
        b_p = tl.dot(b_h, b_xt, input_precision=DOT_PRECISION)
        b_gh, b_uh, b_a, b_b, b_v_raw = _side_loads(
            p_g, p_u, a, b, mixed_qkv, o_hpos, m_c, o_v, mask_v, o_x, m_tok, i_b, i_hv, stride_a, stride_b, stride_x,
            T, H, K, V,
        )  # fmt: skip
        _window_outputs(
            b_p, b_cx, b_kx, b_xx, b_gh, b_uh, b_a, b_b, b_v_raw, A_log, dt_bias, out, p_u, p_g, p_v, p_beta, o_v,
            mask_v, o_x, m_tok, m_c, o_wpos, keep, tl.where(j % NV == 0, 1, 0), i_b, i_hv, T, HV, V, DOT_PRECISION,
            EXACT_FOLD,
        )  # fmt: skip


def launch_key_head_window(
    args: list[object], *, T: int, L: int, H: int, HV: int, K: int, V: int, B: int, block_v: int, num_warps: int,
    stages: int, block_k: int, dot_precision: str, join: int, defer: bool, options: dict[str, object],
) -> None:  # fmt: skip
    """`_key_head_window_kernel` on `ring_args(...)`, grid `(B, H)`: `block_v` rows per state tile (at least 16, the
    dots' least), `stages` its loop's `STAGES`, `block_k` the columns per chunk of the keys' side."""
    bk = triton.next_power_of_2(K)
    bv = min(max(16, block_v), max(16, triton.next_power_of_2(V)))
    _key_head_window_kernel[(B, H)](
        *args, T=T, L=L, H=H, HV=HV, K=K, V=V, BK=bk, BKC=max(16, min(block_k, bk)), BV=bv, BX=WINDOW_BLOCK,
        BH=history_block(L), G=HV // H, NV=triton.cdiv(V, bv), DOT_PRECISION=dot_precision, STAGES=stages, JOIN=join,
        DEFER=defer, num_warps=num_warps, **options,
    )  # fmt: skip
