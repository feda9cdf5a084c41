"""`(S0 k, S0 q)` of a decode program's state tile, the two row reductions every decode kernel starts from: a
whole `[BV, BK]` tile (`tile_projections`), a bf16 tile read as int32 pairs (`pair_projections`), or column chunks
(`chunked_projections`)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import L2NORM_EPS


@triton.jit
def tile_projections(b_h, b_k, b_q):
    """`(S0 k, S0 q)` `[BV]` of a `[BV, BK]` state tile: row reductions, two vectors being not worth a dot
    (H200 run 13: two dots per history chunk, and a `[K / 16, BV, 16]` tile with shorter row sums, were
    slower)."""
    return tl.sum(b_h * b_k[None, :], axis=1), tl.sum(b_h * b_q[None, :], axis=1)


@triton.jit
def pair_projections(b_pairs, b_k, b_q):
    """`tile_projections` of a bf16 state tile loaded as `[BV, BK / 2]` int32 pairs (`PAIRED_STATE`): element
    `2j` is a pair's low half, `2j + 1` its high half, and a bf16 is the top 16 bits of a float32, so each half
    becomes a float32 with one shift or mask. The pairs keep the fp32 tile's layout, where the compiler gives a
    `[BV, BK]` bf16 tile the ring keys' (sm_90, Triton 3.6: more shared-memory traffic and byte permutes)."""
    b_lo = (b_pairs << 16).to(tl.float32, bitcast=True)
    b_hi = (b_pairs & -65536).to(tl.float32, bitcast=True)
    b_k_lo, b_k_hi = tl.split(tl.reshape(b_k, (b_k.shape[0] // 2, 2)))
    b_q_lo, b_q_hi = tl.split(tl.reshape(b_q, (b_q.shape[0] // 2, 2)))
    return (
        tl.sum(b_lo * b_k_lo[None, :] + b_hi * b_k_hi[None, :], axis=1),
        tl.sum(b_lo * b_q_lo[None, :] + b_hi * b_q_hi[None, :], axis=1),
    )


@triton.jit
def norm_denominator(b_x):
    """`sqrt(|x|^2 + eps)` of a float32 vector (masked elements zero): `l2norm`'s denominator."""
    return tl.sqrt(tl.sum(b_x * b_x, axis=0) + L2NORM_EPS)


@triton.jit
def _chunk_sums(  # noqa: PLR0917 (Triton passes arguments positionally)
    b_acc_k, b_acc_q, p_h, p_k, p_q, o_v, mask_v, b_den_k, b_den_q, scale, b_gain, desc, slot, i_hv,
    v0, K: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, GAIN: tl.constexpr, TMA: tl.constexpr,
    LATE_NORMS: tl.constexpr = False,
):  # fmt: skip
    """Row sums `[BV]` of `acc + sum over column chunks of S0 x` (`chunked_projections`), x the token's key and
    query, each times `b_gain` with `GAIN`. The chunks come from `p_h`, or with `TMA` from `desc`, the state pool's
    tensor descriptor (`[N, HV, V, K]`, box `[1, 1, BV, KC]`: `_descriptors.state_descriptor`), at slot `slot`,
    value head `i_hv` and rows `o_v` from `v0`; the box puts zeros past V and K, as the masks do. With `LATE_NORMS`
    (not with `GAIN`) the chunks take the raw key and query, and the two row sums are divided by their norms (and
    the query's times `scale`) once: `S0 (x / |x|) = (S0 x) / |x|` up to rounding, without a division per element
    of every chunk."""
    tl.static_assert(not (LATE_NORMS and GAIN), "late norms leave the records' terms in `acc` unscaled")
    for c in tl.static_range(BK // KC):
        o_c = c * KC + tl.arange(0, KC)
        m_c = o_c < K
        if TMA:
            b_h = desc.load([slot.to(tl.int32), i_hv, v0, c * KC]).reshape([o_v.shape[0], KC])
        else:
            b_h = tl.load(p_h + o_v[:, None] * K + o_c[None, :], mask=mask_v[:, None] & m_c[None, :], other=0)
        b_h = b_h.to(tl.float32)
        # each branch writes its loads out: with the division after the conversion in one expression the
        # elementwise builds keep the op order, and the sm_90 SASS, that H200 runs 27-41 timed
        if LATE_NORMS:
            b_k = tl.load(p_k + o_c, mask=m_c, other=0).to(tl.float32)
            b_q = tl.load(p_q + o_c, mask=m_c, other=0).to(tl.float32)
        else:
            b_k = tl.load(p_k + o_c, mask=m_c, other=0).to(tl.float32) / b_den_k
            b_q = tl.load(p_q + o_c, mask=m_c, other=0).to(tl.float32) / b_den_q * scale
        if GAIN:
            b_k = b_k * b_gain
            b_q = b_q * b_gain
        b_acc_k += b_h * b_k[None, :]
        b_acc_q += b_h * b_q[None, :]
    if LATE_NORMS:
        return tl.sum(b_acc_k, axis=1) / b_den_k, tl.sum(b_acc_q, axis=1) * (scale / b_den_q)
    return tl.sum(b_acc_k, axis=1), tl.sum(b_acc_q, axis=1)


@triton.jit
def chunked_projections(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_h, p_k, p_q, o_v, mask_v, b_den_k, b_den_q, scale, desc, slot, i_hv, v0, K: tl.constexpr,
    BK: tl.constexpr, KC: tl.constexpr, TMA: tl.constexpr, LATE_NORMS: tl.constexpr = False,
):  # fmt: skip
    """`(S0 k, S0 q)` `[BV]` of the state rows `o_v` at `p_h` (`[V, K]`, any float dtype), read as `BK / KC` column
    chunks `[BV, KC]` and summed elementwise before one row sum. A whole `[BV, BK]` tile puts 32 lanes along K,
    so each row sum takes five shuffle levels; a `[BV, 32]` chunk has 8 lanes along K and three (sm_90, Triton
    3.6: the key-head decode's shuffles 857 -> 265). `p_k`, `p_q`: the token's raw key and query, normalised here
    by their `norm_denominator`s `b_den_k`, `b_den_q`. `desc`, `slot`, `i_hv`, `v0`, `TMA`, `LATE_NORMS`: as
    `_chunk_sums`."""
    b_zeros = tl.zeros([o_v.shape[0], KC], tl.float32)
    return _chunk_sums(b_zeros, b_zeros, p_h, p_k, p_q, o_v, mask_v, b_den_k, b_den_q, scale, 1.0, desc, slot, i_hv,
                       v0, K, BK, KC, False, TMA, LATE_NORMS)  # fmt: skip


@triton.jit
def chunked_history_projections(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_h, p_k, p_q, o_v, mask_v, b_den_k, b_den_q, scale, b_gain, b_u, b_wk, b_wq, desc, slot, i_hv, v0,
    K: tl.constexpr, BK: tl.constexpr, KC: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """`(S_w k, S_w q)` `[BV]` = `gain S0 x + sum_c u_c w_c` for x = k, q in one row sum each: the records' `[BV, KC]`
    tile `b_u` (a record per column, `KC` of them, masked ones zero) times their weights `b_wk`, `b_wq` `[KC]`
    starts the chunks' elementwise sums (`chunked_projections`), and `b_gain` (the history's decay) scales the
    token's key and query. The records' own row sums, which cross warps, and their conversion are gone."""
    return _chunk_sums(b_u * b_wk[None, :], b_u * b_wq[None, :], p_h, p_k, p_q, o_v, mask_v, b_den_k, b_den_q, scale,
                       b_gain, desc, slot, i_hv, v0, K, BK, KC, True, TMA)  # fmt: skip
