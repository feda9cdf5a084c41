"""Non-flush ReplaySSM rows as their own kernel: stream the checkpoint tile once, write only the records.

`_replay.py` launches this kernel after `_flush_kernel` (`_flush.py`); each program reads its row's cursors
and returns at once when the row belongs to the other kernel. Splitting the two paths lets this kernel keep
its own tile (2 warps, `[BV, BKC]` chunks of K): a kernel's register count is the maximum over all its
branches, and a flush holds a whole `[BV, K]` fp32 tile, which capped the occupancy of the non-flush rows.

Per program (V tile, row, value head), with `x` the window's T keys and T queries (rows of a 16-row tile):

- one pass over K in chunks of `BKC`, loads pipelined: `S0 x^T` `[BV, 16]`, the history keys' products
  `K_hist x^T` `[BH, 16]` (all committed records at once, `BH >= L`), `x x^T` `[16, 16]` and the squared
  norms, all on raw inputs; the l2 normalisation becomes a scale of rows and columns afterwards.
  `RAW_KEY_DOTS`: 0, the keys converted to float32 for TF32 dots, squares summed on the CUDA cores; 1, the
  key products as dots in the input dtype, the squared norms the diagonals of `x x^T` and of the history
  keys' Gram matrix; 2, as 1 but the history keys' squares summed on the CUDA cores (no Gram matrix);
- `P = exp(G) S0 x^T + (U_hist * w) (K_hist x^T)`, one dot for the whole history;
- `U = R (I + A)^-T` with the inverse of the unit lower-triangular `I + A` as a product of
  `(I - A)(I + A^2)(I + A^4)` (`A` is nilpotent, `A^T = 0` for T tokens, T <= 8), dense `[16, 16]` dots;
- outputs `O = P E + U W` with `E` the query columns scaled by `exp(G_s)` and `W_js = exp(G_s - G_j) k_j . q_s`;
  with `QUERY_COLUMNS` (`_replay.window_query_columns`) query s's output is computed in its row's column T + s,
  where `P` holds `S_w q_s` and `x x^T` holds `k_j . q_s`: `P E` becomes a scale of columns and `W` a mask of
  `x x^T`, two `[16, 16]` dots fewer, and the outputs are stored from those columns.

With `PRODUCTS` (`_replay.WINDOW_KEY_PRODUCTS`) the keys' side of the K pass (everything but `S0 x^T`) comes
from `_key_products_kernel`, run once per row and key head before this kernel, through a float32 scratch. That is
the default of the 64x2 tile; the wide tile, whose program covers the whole of V, keeps the keys' side in its own K
pass (`_replay.WIDE_WINDOW_KEY_PRODUCTS`), so only a key head's two value heads repeat it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import L2NORM_EPS, flushes, gates, record_writers, ring_rows, steps_row
from ._flush import flush_row

WINDOW_BLOCK = 16  # rows of the window tile: T keys then T queries, 2 T <= 16
# V rows per program from `_replay.WINDOW_PRODUCTS_MIN_BATCH` rows, with the key products' pre-pass. H200 run
# 16 (bench_parts, non-flush rows), 64x2 against 32x2: T = 4 59.3 / 207.8 against 65.9 / 232.8 us at B = 64 /
# 256, T = 2 56.8 / 194.9 against 59.1 / 210.4, T = 8 70.1 / 251.0 against ~75 / 268.6; 64x4, 32x2 with 4
# stages, 64-column K chunks slower. (Before the pre-pass, run 8, 32x2 beat 64x4, 32x4 and 64x8.)
WINDOW_BLOCK_V = 64
# The whole of V in one program of 4 warps, for the windows `_replay.WIDE_WINDOW_TOKENS` names (there the
# pre-pass runs with 4 warps too). H200 run 17 (`h200-parts-17b/17c-window-tiles`, non-flush rows at
# `default_ring_len(T)`), 64x2 against 128x4, B = 64 / 256: T = 3 67.1 / 241.4 against 64.7 / 223.4 us, T = 4
# 66.2 / 239.0 against 64.2 / 218.4; slower at T = 2 (55.8 / 194.0 against 60.1 / 211.5) and T = 8 (89.2 /
# 309.4 against 93.8 / 336.6, at a ring of 128; faster at 64, run 33c); 128x8 slower everywhere it ran (T = 4, 8).
WIDE_WINDOW_BLOCK_V = 128
WIDE_WINDOW_WARPS = 4
SMALL_WINDOW_BLOCK_V = 32  # below WINDOW_PRODUCTS_MIN_BATCH rows, and when preloading
SMALL_WINDOW_WARPS = 2
WINDOW_BLOCK_K = 32  # K columns per chunk of the streaming pass
WINDOW_WARPS = 2
WINDOW_STAGES = 3
MAX_HISTORY_BLOCK = 128  # longest ring spec verify supports (the whole history is one tile)


def history_block(ring_len: int) -> int:
    """Rows of the history tile: every committed record of a ring of `ring_len` fits in one tile."""
    return max(16, triton.next_power_of_2(ring_len))


@triton.jit
def _side_loads(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_g, p_u, a, b, mixed_qkv, o_hpos, m_c, o_v, mask_v, o_x, m_tok, o_tok, m_x, i_b, i_hv, stride_a, stride_b,
    stride_x, T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    """The loads outside the K pass: history gates and `u` records, the window's gate inputs (at every window row
    `m_x`, the token `o_tok`: query s's row T + s too) and raw values."""
    b_gh = tl.load(p_g + o_hpos, mask=m_c, other=0)
    b_uh = tl.load(p_u + o_hpos[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_c[None, :], other=0)
    b_a = tl.load(a + (i_b * T + o_tok) * stride_a + i_hv, mask=m_x, other=0)
    b_b = tl.load(b + (i_b * T + o_tok) * stride_b + i_hv, mask=m_x, other=0)
    p_v_win = mixed_qkv + (i_b * T + o_x)[None, :] * stride_x + 2 * H * K + i_hv * V + o_v[:, None]
    b_v_raw = tl.load(p_v_win, mask=mask_v[:, None] & m_tok[None, :], other=0)  # [BV, BX]
    return b_gh, b_uh, b_a, b_b, b_v_raw


@triton.jit
def _gate_loads(p_g, a, b, o_hpos, m_c, o_tok, m_x, i_b, i_hv, stride_a, stride_b, T: tl.constexpr):  # noqa: PLR0917
    """The side loads of a few registers: the history's gates `[BH]` and the window's gate inputs `[BX]`
    (`EARLY_GATES`; `_side_loads` keeps its own order of the same loads, so the other builds compile as before)."""
    b_gh = tl.load(p_g + o_hpos, mask=m_c, other=0)
    b_a = tl.load(a + (i_b * T + o_tok) * stride_a + i_hv, mask=m_x, other=0)
    b_b = tl.load(b + (i_b * T + o_tok) * stride_b + i_hv, mask=m_x, other=0)
    return b_gh, b_a, b_b


@triton.jit
def _tile_loads(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_u, mixed_qkv, o_hpos, m_c, o_v, mask_v, o_x, m_tok, i_b, i_hv, stride_x, T: tl.constexpr, H: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr,
):  # fmt: skip
    """The side loads of whole tiles: the history's `u` records `[BV, BH]` and the window's raw values `[BV, BX]`."""
    b_uh = tl.load(p_u + o_hpos[None, :] * V + o_v[:, None], mask=mask_v[:, None] & m_c[None, :], other=0)
    p_v_win = mixed_qkv + (i_b * T + o_x)[None, :] * stride_x + 2 * H * K + i_hv * V + o_v[:, None]
    b_v_raw = tl.load(p_v_win, mask=mask_v[:, None] & m_tok[None, :], other=0)  # [BV, BX]
    return b_uh, b_v_raw


@triton.jit
def _state_dot(b_h, b_x, DOT_PRECISION: tl.constexpr, RAW: tl.constexpr):
    """`S x^T` `[BV, BX]` of a state chunk `[BV, BKC]` and window rows `[BX, BKC]` as loaded. `RAW` (a state and inputs
    of one 2-byte float type, `_replay.window_raw_state_dot`): a dot in that type, with float32 sums; its products
    are exact, as are the TF32 ones of the same values, and the state needs no conversion (sm_90: the wide tile
    1808 -> 1680 instructions on a bf16 state). Else float32 operands at `DOT_PRECISION` (TF32)."""
    if RAW:
        tl.static_assert(b_h.dtype == b_x.dtype, "a raw state dot needs the state and the inputs in one dtype")
        return tl.dot(b_h, tl.trans(b_x), out_dtype=tl.float32)
    return tl.dot(b_h.to(tl.float32), tl.trans(b_x.to(tl.float32)), input_precision=DOT_PRECISION)


def key_products_size(ring_len: int) -> int:
    """Floats per (row, key head) in the scratch of `_key_products_kernel`: `K_hist x^T` `[BH, BX]`, then
    `x x^T` `[BX, BX]`, then the columns' scales `[BX]`."""
    bh = history_block(ring_len)
    return bh * WINDOW_BLOCK + WINDOW_BLOCK * WINDOW_BLOCK + WINDOW_BLOCK


@triton.jit
def _key_chunk(  # noqa: PLR0917 (Triton passes arguments positionally)
    b_x_raw, b_kh_raw, b_kx, b_xx, b_ssx, b_ssk, b_kk, DOT_PRECISION: tl.constexpr, RAW_KEY_DOTS: tl.constexpr
):  # fmt: skip
    """One K chunk of the keys' side of the K pass (module docstring, `RAW_KEY_DOTS`): adds the window rows'
    `x` `[BX, BKC]` and the history keys `[BH, BKC]`, both raw, into `K_hist x^T`, `x x^T`, the squared norms
    and the history keys' Gram matrix `b_kk` (code 1); returns the five accumulators."""
    if RAW_KEY_DOTS:  # keys against keys in the input dtype
        b_xrt = tl.trans(b_x_raw)
        b_kx += tl.dot(b_kh_raw, b_xrt, input_precision=DOT_PRECISION)
        b_xx += tl.dot(b_x_raw, b_xrt, input_precision=DOT_PRECISION)
        if RAW_KEY_DOTS == 1:
            b_kk += tl.dot(b_kh_raw, tl.trans(b_kh_raw), input_precision=DOT_PRECISION)
        else:
            b_khf = b_kh_raw.to(tl.float32)
            b_ssk += tl.sum(b_khf * b_khf, axis=1)
    else:
        b_x = b_x_raw.to(tl.float32)
        b_xt = tl.trans(b_x)
        b_kh = b_kh_raw.to(tl.float32)
        b_kx += tl.dot(b_kh, b_xt, input_precision=DOT_PRECISION)
        b_xx += tl.dot(b_x, b_xt, input_precision=DOT_PRECISION)
        b_ssx += tl.sum(b_x * b_x, axis=1)
        b_ssk += tl.sum(b_kh * b_kh, axis=1)
    return b_kx, b_xx, b_ssx, b_ssk, b_kk


@triton.jit
def _key_norms(b_xx, b_kk, b_ssx, b_ssk, RAW_KEY_DOTS: tl.constexpr):
    """The squared norms after the K pass: with raw key dots `x`'s are the diagonal of `x x^T`, and under
    code 1 the history keys' the diagonal of their Gram matrix; otherwise the sums `_key_chunk` kept."""
    if RAW_KEY_DOTS:
        o_xx = tl.arange(0, b_xx.shape[0])
        b_ssx = tl.sum(tl.where(o_xx[:, None] == o_xx[None, :], b_xx, 0.0), axis=1)
        if RAW_KEY_DOTS == 1:
            o_hh = tl.arange(0, b_kk.shape[0])
            b_ssk = tl.sum(tl.where(o_hh[:, None] == o_hh[None, :], b_kk, 0.0), axis=1)
    return b_ssx, b_ssk


@triton.jit
def _products_rows(products, i_b, i_h, H: tl.constexpr, BH: tl.constexpr, BX: tl.constexpr):  # noqa: PLR0917
    """Pointers to one (row, key head)'s part of the `_key_products_kernel` scratch (`key_products_size`):
    `K_hist x^T` `[BH, BX]`, `x x^T` `[BX, BX]`, the columns' scales `[BX]`."""
    p_kx = products + (i_b * H + i_h) * (BH * BX + BX * BX + BX)
    return p_kx, p_kx + BH * BX, p_kx + BH * BX + BX * BX


@triton.jit
def _key_products_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, write_pos, ring_base,
    state_indices, out, scale, stride_x, stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg,
    stride_rv, stride_rbeta, products, T: tl.constexpr, L: tl.constexpr, H: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BKC: tl.constexpr, BX: tl.constexpr, BH: tl.constexpr, DOT_PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr, RAW_KEY_DOTS: tl.constexpr, JOIN: tl.constexpr, DEFER: tl.constexpr,
):  # fmt: skip
    """The window kernel's key products once per (row, key head) instead of once per (V tile, value head)
    program (`_replay.WINDOW_KEY_PRODUCTS`): normalised `K_hist x^T`, `x x^T` and the columns' scales into
    `products` (`key_products_size` floats per row and key head); also appends the window's raw keys to the
    ring. Only the committed records' rows and the window's `2 T` columns are stored (`_product_masks`).
    Grid `(B, H)`."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:
        return
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    keep = steps_row(wp, write_pos, T, L, JOIN, DEFER)
    n_hist = tl.where(keep, wp, 0)
    o_x = tl.arange(0, BX)
    m_tok = o_x < T
    p_x = _window_rows(mixed_qkv, i_b, i_h, stride_x, T, H, K, BX)
    o_c = tl.arange(0, BH)
    m_c = o_c < n_hist
    p_k = ring_k + slot * stride_rk + i_h * L * K
    m_x = o_x < 2 * T
    p_kh = p_k + ((base + o_c) % L)[:, None] * K
    p_kw = p_k + ((base + wp + o_x) % L)[:, None] * K
    m_kw = o_x < T * keep.to(tl.int32)
    b_kx = tl.zeros([BH, BX], dtype=tl.float32)
    b_xx = tl.zeros([BX, BX], dtype=tl.float32)
    b_ssx = tl.zeros([BX], dtype=tl.float32)
    b_ssk = tl.zeros([BH], dtype=tl.float32)
    b_kk = tl.zeros([BH, BH], dtype=tl.float32)  # code 1 only
    for k0 in tl.range(0, BK, BKC, num_stages=NUM_STAGES):
        o_kc = k0 + tl.arange(0, BKC)
        m_kc = o_kc < K
        b_x_raw = tl.load(p_x + o_kc[None, :], mask=m_x[:, None] & m_kc[None, :], other=0)
        b_kh_raw = tl.load(p_kh + o_kc[None, :], mask=m_c[:, None] & m_kc[None, :], other=0)
        b_kx, b_xx, b_ssx, b_ssk, b_kk = _key_chunk(
            b_x_raw, b_kh_raw, b_kx, b_xx, b_ssx, b_ssk, b_kk, DOT_PRECISION, RAW_KEY_DOTS
        )
        tl.store(p_kw + o_kc[None, :], b_x_raw.to(ring_k.dtype.element_ty), mask=m_kw[:, None] & m_kc[None, :])
    b_ssx, b_ssk = _key_norms(b_xx, b_kk, b_ssx, b_ssk, RAW_KEY_DOTS)
    b_cx, b_kx, b_xx = _normalised_products(b_kx, b_xx, b_ssx, b_ssk, m_x, m_tok, m_c, scale)
    p_kx, p_xx, p_cx = _products_rows(products, i_b, i_h, H, BH, BX)
    m_kx, m_xx = _product_masks(m_c, m_x)
    tl.store(p_kx + o_c[:, None] * BX + o_x[None, :], b_kx, mask=m_kx)
    tl.store(p_xx + o_x[:, None] * BX + o_x[None, :], b_xx, mask=m_xx)
    tl.store(p_cx + o_x, b_cx)


@triton.jit
def _window_rows(mixed_qkv, i_b, i_h, stride_x, T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, BX: tl.constexpr):  # noqa: PLR0917
    """Pointers to column 0 of the window's `BX` rows of key head `i_h` in row `i_b`'s tokens: rows 0..T-1 the
    tokens' raw keys, T..2T-1 their raw queries (rows from 2T on point past the window: callers mask them)."""
    o_x = tl.arange(0, BX)
    m_tok = o_x < T
    o_tok = tl.where(m_tok, o_x, o_x - T)
    return mixed_qkv + (i_b * T + o_tok)[:, None] * stride_x + tl.where(m_tok, H * K + i_h * K, i_h * K)[:, None]


@triton.jit
def _product_masks(m_c, m_x):
    """The parts of `K_hist x^T` and `x x^T` that the scratch holds: the committed records' rows and the window's
    `2 T` columns. Every other product is zero, and the window kernel's masked loads supply those zeros, so
    neither kernel moves them: at ring 64 and T = 4 at most 64 x 8 of the 64 x 16 floats, ~28 x 8 at half a ring,
    read by every value head's program. H200 run 33c (`bench_parts`, non-flush rows, 128x4, B = 64 / 256): T = 4
    63.9 / 214.2 -> 62.7 / 209.1 us, T = 8 66.7 / 217.1 -> 65.5 / 212.8."""
    return m_c[:, None] & m_x[None, :], m_x[:, None] & m_x[None, :]


@triton.jit
def _normalised_products(b_kx, b_xx, b_ssx, b_ssk, m_x, m_tok, m_c, scale):  # noqa: PLR0917 (positional)
    """l2 normalisation as scales: the columns of `x` (queries also by `scale`) and the history keys' rows;
    returns the columns' scales and the scaled `K_hist x^T` and `x x^T`."""
    b_cx = tl.where(m_x, 1.0 / tl.sqrt(b_ssx + L2NORM_EPS), 0.0) * tl.where(m_tok, 1.0, scale)
    b_ck = tl.where(m_c, 1.0 / tl.sqrt(b_ssk + L2NORM_EPS), 0.0)
    return b_cx, b_kx * b_ck[:, None] * b_cx[None, :], b_xx * b_cx[:, None] * b_cx[None, :]


@triton.heuristics({"EXACT_FOLD": lambda args: args["ring_v"] is not None})
@triton.jit
def _window_kernel(  # noqa: PLR0912, PLR0915, PLR0917 (one linear recipe; Triton passes arguments positionally)
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
    products,
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
    NV: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EXACT_FOLD: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BC: tl.constexpr,
    FUSED_FLUSH: tl.constexpr,
    PRELOAD: tl.constexpr,
    EXACT: tl.constexpr,
    RAW_KEY_DOTS: tl.constexpr,
    PRODUCTS: tl.constexpr,
    JOIN: tl.constexpr,
    DEFER: tl.constexpr,
    QUERY_COLUMNS: tl.constexpr,
    EARLY_GATES: tl.constexpr,
    RAW_STATE_DOT: tl.constexpr = False,
):
    # grid (NV * HV, B): the V tiles and value heads of one row are neighbours, so the key-head records
    # that a GVA group and its V tiles share are read from L2 after the first program
    pid = tl.program_id(0)
    i_b = tl.program_id(1)
    i_v = pid % NV
    i_hv = pid // NV
    i_h = i_hv // (HV // H)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    o_x = tl.arange(0, BX)
    m_tok = o_x < T
    o_tok = tl.where(m_tok, o_x, o_x - T)  # window row -> token: key j at row j, query s at row T + s
    n_head, n_key = record_writers(i_v, i_hv, HV, H)

    slot = tl.load(state_indices + i_b).to(tl.int64)
    if slot <= 0:  # padding row or null slot: zero output, no state or ring traffic
        p_out = out + ((i_b * T + o_x)[None, :] * HV + i_hv) * V + o_v[:, None]
        b_zero = tl.zeros([BV, BX], dtype=tl.float32).to(out.dtype.element_ty)
        tl.store(p_out, b_zero, mask=mask_v[:, None] & m_tok[None, :])
        return
    wp = tl.load(write_pos + slot)
    base = tl.load(ring_base + slot)
    if FUSED_FLUSH:  # noqa: SIM102 (a constexpr test: the branch below exists only then)
        if flushes(wp, write_pos, T, L, JOIN):  # flush row: fold it here
            flush_row(
                mixed_qkv, a, b, A_log, dt_bias, state, ring_u, ring_k, ring_g, ring_v, ring_beta, out, scale,
                stride_x, stride_a, stride_b, stride_state, stride_ru, stride_rk, stride_rg, stride_rv, stride_rbeta,
                i_v, i_b, i_hv, slot, wp, base, T, L, H, HV, K, V, BK, BV, BC, DOT_PRECISION, EXACT_FOLD, EXACT,
            )  # fmt: skip
            return
    # No early return for the flush rows, whose work `_flush_kernel` does: behind such a branch the compiler
    # issued the `base` load and every K-pass load only after the cursor test (sm_90 SASS), one more memory
    # round trip before the stream starts. Flush rows (1 in L / 2T) run through on no history and store
    # nothing. H200 run 11 (B = 64 / 256, T = 4): 81 / 304 us against 86 / 324 us with the early return.
    # The decode kernel keeps its early return: there it measured faster (70 / 256 us against 78 / 286 us).
    keep = steps_row(wp, write_pos, T, L, JOIN, DEFER)
    n_hist = tl.where(keep, wp, 0)

    p_u, p_k, p_g, p_v, p_beta = ring_rows(
        ring_u, ring_k, ring_g, ring_v, ring_beta, slot, i_h, i_hv, stride_ru, stride_rk, stride_rg, stride_rv,
        stride_rbeta, L, K, V, EXACT_FOLD,
    )  # fmt: skip

    # window rows: 0..T-1 the tokens' keys, T..2T-1 their queries; history rows: committed records
    m_x = o_x < 2 * T
    p_x = _window_rows(mixed_qkv, i_b, i_h, stride_x, T, H, K, BX)
    o_c = tl.arange(0, BH)
    m_c = o_c < n_hist
    o_hpos = (base + o_c) % L
    p_kh = p_k + o_hpos[:, None] * K
    o_wpos = (base + wp + o_x) % L
    p_kw = p_k + o_wpos[:, None] * K
    m_kw = o_x < T * n_key * keep.to(tl.int32)
    p_h = state + slot * stride_state + i_hv * V * K + o_v[:, None] * K

    if PRELOAD:  # issued before the K pass, so that their latency hides behind it
        b_gh, b_uh, b_a, b_b, b_v_raw = _side_loads(
            p_g, p_u, a, b, mixed_qkv, o_hpos, m_c, o_v, mask_v, o_x, m_tok, o_tok, m_x, i_b, i_hv, stride_a, stride_b,
            stride_x, T, H, K, V,
        )  # fmt: skip
    elif EARLY_GATES:  # the gates only: a few registers across the K pass instead of a wait in the tail
        b_gh, b_a, b_b = _gate_loads(p_g, a, b, o_hpos, m_c, o_tok, m_x, i_b, i_hv, stride_a, stride_b, T)
    b_p = tl.zeros([BV, BX], dtype=tl.float32)
    b_kx = tl.zeros([BH, BX], dtype=tl.float32)
    b_xx = tl.zeros([BX, BX], dtype=tl.float32)
    b_ssx = tl.zeros([BX], dtype=tl.float32)
    b_ssk = tl.zeros([BH], dtype=tl.float32)
    b_kk = tl.zeros([BH, BH], dtype=tl.float32)  # the history keys' Gram matrix (RAW_KEY_DOTS code 1)
    if PRODUCTS:  # the keys' side comes from `_key_products_kernel`: the state's dot only
        for k0 in tl.range(0, BK, BKC, num_stages=NUM_STAGES):
            o_kc = k0 + tl.arange(0, BKC)
            m_kc = o_kc < K
            b_h = tl.load(p_h + o_kc[None, :], mask=mask_v[:, None] & m_kc[None, :], other=0)
            b_x = tl.load(p_x + o_kc[None, :], mask=m_x[:, None] & m_kc[None, :], other=0)
            b_p += _state_dot(b_h, b_x, DOT_PRECISION, RAW_STATE_DOT)
    else:
        for k0 in tl.range(0, BK, BKC, num_stages=NUM_STAGES):
            o_kc = k0 + tl.arange(0, BKC)
            m_kc = o_kc < K
            # the loads whose addresses do not depend on the cursors first (ptxas may still order them after the
            # cursors' first use; the measured gain of run 11 is the early return's removal)
            b_h = tl.load(p_h + o_kc[None, :], mask=mask_v[:, None] & m_kc[None, :], other=0)
            b_x_raw = tl.load(p_x + o_kc[None, :], mask=m_x[:, None] & m_kc[None, :], other=0)
            b_kh_raw = tl.load(p_kh + o_kc[None, :], mask=m_c[:, None] & m_kc[None, :], other=0)
            b_p += _state_dot(b_h, b_x_raw, DOT_PRECISION, RAW_STATE_DOT)
            b_kx, b_xx, b_ssx, b_ssk, b_kk = _key_chunk(
                b_x_raw, b_kh_raw, b_kx, b_xx, b_ssx, b_ssk, b_kk, DOT_PRECISION, RAW_KEY_DOTS
            )
            # the window's raw keys are the key head's records (one program per key head writes them)
            tl.store(p_kw + o_kc[None, :], b_x_raw.to(ring_k.dtype.element_ty), mask=m_kw[:, None] & m_kc[None, :])

    if PRODUCTS:
        p_kx, p_xx, p_cx = _products_rows(products, i_b, i_h, H, BH, BX)
        m_kx, m_xx = _product_masks(m_c, m_x)
        b_kx = tl.load(p_kx + o_c[:, None] * BX + o_x[None, :], mask=m_kx, other=0)
        b_xx = tl.load(p_xx + o_x[:, None] * BX + o_x[None, :], mask=m_xx, other=0)
        b_cx = tl.load(p_cx + o_x)
    else:
        b_ssx, b_ssk = _key_norms(b_xx, b_kk, b_ssx, b_ssk, RAW_KEY_DOTS)
        b_cx, b_kx, b_xx = _normalised_products(b_kx, b_xx, b_ssx, b_ssk, m_x, m_tok, m_c, scale)

    if EARLY_GATES and not PRELOAD:
        b_uh, b_v_raw = _tile_loads(
            p_u, mixed_qkv, o_hpos, m_c, o_v, mask_v, o_x, m_tok, i_b, i_hv, stride_x, T, H, K, V
        )  # fmt: skip
    elif not PRELOAD:
        b_gh, b_uh, b_a, b_b, b_v_raw = _side_loads(
            p_g, p_u, a, b, mixed_qkv, o_hpos, m_c, o_v, mask_v, o_x, m_tok, o_tok, m_x, i_b, i_hv, stride_a, stride_b,
            stride_x, T, H, K, V,
        )  # fmt: skip

    # history: P = exp(gamma) S0 x^T + sum_c exp(gamma - G_c) u_c (k_c . x)
    b_gamma = tl.sum(b_gh, axis=0)
    b_w = tl.where(m_c, tl.exp(b_gamma - tl.cumsum(b_gh, axis=0)), 0.0)
    b_uh = b_uh.to(tl.float32) * b_w[None, :]
    b_p = b_p * b_cx[None, :] * tl.exp(b_gamma) + tl.dot(b_uh, b_kx, input_precision=DOT_PRECISION)

    # window gates and values
    b_a = b_a.to(tl.float32)
    b_b = b_b.to(tl.float32)
    b_gx, b_beta = gates(b_a, b_b, tl.load(A_log + i_hv).to(tl.float32), tl.load(dt_bias + i_hv).to(tl.float32))
    b_g = tl.where(m_tok, b_gx, 0.0)
    b_beta = tl.where(m_tok, b_beta, 0.0)
    if QUERY_COLUMNS:  # G_j at key row j and (up to rounding) query row T + j: past T, less the keys' sum
        b_G = tl.cumsum(tl.where(m_x, b_gx, 0.0), axis=0) - tl.where(m_tok, 0.0, tl.sum(b_g, axis=0))
    else:
        b_G = tl.cumsum(b_g, axis=0)

    # UT transform, dense: U = R (I + A)^-T
    b_eye = tl.where(o_x[:, None] == o_x[None, :], 1.0, 0.0)
    b_r = tl.where(m_tok[None, :], b_beta[None, :] * (b_v_raw.to(tl.float32) - tl.exp(b_G)[None, :] * b_p), 0.0)
    if T > 1:
        m_lower = (o_x[:, None] > o_x[None, :]) & m_tok[:, None]
        b_dG = tl.where(m_lower, b_G[:, None] - b_G[None, :], 0.0)
        b_n = tl.where(m_lower, -(b_beta[:, None] * tl.exp(b_dG) * b_xx), 0.0)  # N = -A, strictly lower
        b_inv = b_eye + b_n  # (I + N)(I + N^2)(I + N^4) = sum_i N^i = (I + A)^-1 since N^T = 0
        if T > 2:
            b_n2 = tl.dot(b_n, b_n, input_precision=DOT_PRECISION)
            b_inv = tl.dot(b_inv, b_eye + b_n2, input_precision=DOT_PRECISION)
            if T > 4:
                b_n4 = tl.dot(b_n2, b_n2, input_precision=DOT_PRECISION)
                b_inv = tl.dot(b_inv, b_eye + b_n4, input_precision=DOT_PRECISION)
        b_u = tl.dot(b_r, tl.trans(b_inv), input_precision=DOT_PRECISION)
    else:
        b_u = b_r

    # outputs: o_s = exp(G_s) (S_w q_s) + sum_{j <= s} exp(G_s - G_j) (k_j . q_s) u_j
    m_rec = tl.where(keep, mask_v[:, None] & m_tok[None, :], False)  # (`& keep` trips the interpreter)
    if QUERY_COLUMNS:  # in query row s's column T + s, where P holds S_w q_s and x x^T holds k_j . q_s
        m_q = m_x & (o_x >= T)
        m_past = m_tok[:, None] & m_q[None, :] & (o_x[:, None] <= o_tok[None, :])  # [j, T + s], j <= s < T
        b_dGo = tl.where(m_past, b_G[None, :] - b_G[:, None], 0.0)
        b_wo = tl.where(m_past, tl.exp(b_dGo) * b_xx, 0.0)
        b_e = tl.where(m_q, tl.exp(b_G), 0.0)
        b_o = b_p * b_e[None, :] + tl.dot(b_u, b_wo, input_precision=DOT_PRECISION)
        m_o = tl.where(keep, mask_v[:, None] & m_q[None, :], False)
        p_out = out + ((i_b * T + o_tok)[None, :] * HV + i_hv) * V + o_v[:, None]
    else:
        m_out = (o_x[:, None] == o_x[None, :] + T) & m_tok[None, :]  # row T + s of P -> column s
        b_e = tl.where(m_out, tl.exp(b_G)[None, :], 0.0)
        m_past = (o_x[:, None] <= o_x[None, :]) & m_tok[None, :]  # [j, s], j <= s < T
        b_dGo = tl.where(m_past, b_G[None, :] - b_G[:, None], 0.0)
        b_xq = tl.dot(b_xx, tl.where(m_out, 1.0, 0.0), input_precision=DOT_PRECISION)  # [j, s] = k_j . q_s
        b_wo = tl.where(m_past, tl.exp(b_dGo) * b_xq, 0.0)
        b_o = tl.dot(b_p, b_e, input_precision=DOT_PRECISION) + tl.dot(b_u, b_wo, input_precision=DOT_PRECISION)
        m_o = m_rec
        p_out = out + ((i_b * T + o_x)[None, :] * HV + i_hv) * V + o_v[:, None]
    tl.store(p_out, b_o.to(out.dtype.element_ty), mask=m_o)

    # append the window's records behind the committed history (keys were written in the K pass)
    tl.store(p_u + o_wpos[None, :] * V + o_v[:, None], b_u.to(ring_u.dtype.element_ty), mask=m_rec)
    n_head = n_head * keep.to(tl.int32)
    tl.store(p_g + o_wpos, b_g, mask=o_x < T * n_head)
    if EXACT_FOLD:
        tl.store(p_v + o_wpos[None, :] * V + o_v[:, None], b_v_raw.to(p_v.dtype.element_ty), mask=m_rec)
        tl.store(p_beta + o_wpos, b_beta, mask=o_x < T * n_head)
