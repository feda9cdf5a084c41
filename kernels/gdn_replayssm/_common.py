"""Triton helpers shared by the baseline and the ReplaySSM kernels: one source for the baseline op order.

The baseline kernel and the ReplaySSM flush kernel run every recurrent token through `recurrent_token` and
get their inputs from `load_token` (or, for folded history records, `l2norm_rows` of the stored raw keys), so
the two kernels hold the same expressions, not two copies that could drift apart.

Every reduction on that path is an `exact_sum`, whose result does not depend on the register layout.
`tl.sum` adds in an order that follows the layout the compiler picks for the operand, and that choice depends
on the rest of the kernel (vector width, how a 1-D block is later broadcast), so two kernels with the same
expressions still rounded differently at K = 128. The kernels take the op order as one constexpr code,
`EXACT` (`_config.op_order`): the sum mode, plus flags for the fused update (`_config.FUSED_UPDATE`) and for
the state dots as FMA chains (`_config.CHAIN_BLOCKS`, `chain_dot`). Two sum modes (`_config.EXACT_SUM_MODE`):
- TREE_SUMS (the default): a fixed pairwise tree in float32 (`tree_sum`), one result whatever the layout by
  construction: every addition has two operands, and `a + b == b + a`;
- FLOAT64_SUMS: the float32 terms added in float64 and rounded once. The sum of K <= 256 float32 terms is then
  exact unless their magnitudes span more than about 2^20, and even then the order only moves bits ~2^-50
  below the float32 result, which survive the final rounding only when they straddle a float32 rounding
  boundary. It costs a float64 conversion per term, a slow instruction on the H200.
Either way the flush kernel is free to pick its own tile. The benchmark's baseline uses neither mode.
"""

import triton
import triton.language as tl

SOFTPLUS_THRESHOLD = tl.constexpr(20.0)
L2NORM_EPS = tl.constexpr(1e-6)


@triton.jit
def gates(b_a, b_b, b_A_log, b_dt_bias):
    """`g = -exp(A_log) softplus(a + dt_bias)` (threshold 20) and `beta = sigmoid(b)`, all float32."""
    b_x = b_a + b_dt_bias
    b_softplus = tl.where(b_x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(tl.minimum(b_x, SOFTPLUS_THRESHOLD))), b_x)
    b_g = -tl.exp(b_A_log) * b_softplus
    b_beta = tl.sigmoid(b_b)
    return b_g, b_beta


@triton.jit
def tree_sum(b_x):
    """Row sums `[R]` of a `[R, N]` block, N a power of two <= 256, as a fixed pairwise tree that halves the
    row at each level: `x[j] + x[j + N/2]` for `j < N/2`, and so on. Each addition has two operands, and
    `a + b == b + a`, so the result does not depend on the register layout. Halving, not adjacent pairs:
    Triton's layouts give a thread columns that repeat with a stride of a power of two, so the top levels
    add within a thread and only the levels inside one stride cross lanes, as `tl.sum` does (sm_90: the
    fold's adjacent-pair tree needed 490 shuffles, the halving tree 142, float64 sums 116)."""
    for _ in tl.static_range(8):
        if b_x.shape[1] > 1:
            b_x = tl.sum(tl.reshape(b_x, (b_x.shape[0], 2, b_x.shape[1] // 2)), axis=1)
    return tl.reshape(b_x, (b_x.shape[0],))


@triton.jit
def exact_sum(b_x, EXACT: tl.constexpr):
    """Row sums `[R]` of a `[R, N]` float32 block. `EXACT` is the op-order code (`_config.op_order`), whose
    sum mode is `EXACT % 4`: 1 (or True), added in float64 and rounded once (module docstring); 2, `tree_sum`
    in float32; 0 (or False), `tl.sum` in float32, in the compiler's order. A 1-D block goes through as one
    row: `exact_sum(x[None, :], ...)`."""
    if EXACT % 4 == 2:
        return tree_sum(b_x)
    if EXACT % 4 == 1:
        return tl.sum(b_x.to(tl.float64), axis=1).to(tl.float32)
    return tl.sum(b_x, axis=1)


@triton.jit
def _halves(b_x):
    """`x[:, :N/2]` and `x[:, N/2:]` of a `[R, N]` block."""
    return tl.split(tl.permute(tl.reshape(b_x, (b_x.shape[0], 2, b_x.shape[1] // 2)), (0, 2, 1)))


@triton.jit
def _quarters(b_x):
    """The 4 blocks of N/4 columns of a `[R, N]` block, left to right."""
    b_0, b_1 = _halves(b_x)
    b_00, b_01 = _halves(b_0)
    b_10, b_11 = _halves(b_1)
    return b_00, b_01, b_10, b_11


@triton.jit
def _eighths(b_x):
    """The 8 blocks of N/8 columns of a `[R, N]` block, left to right."""
    b_0, b_1, b_2, b_3 = _quarters(b_x)
    b_00, b_01 = _halves(b_0)
    b_10, b_11 = _halves(b_1)
    b_20, b_21 = _halves(b_2)
    b_30, b_31 = _halves(b_3)
    return b_00, b_01, b_10, b_11, b_20, b_21, b_30, b_31


@triton.jit
def chain_dot(b_h, b_x, EXACT: tl.constexpr):
    """Row dots `[R]` of a `[R, N]` block with a `[N]` vector over `n = 2 ** (EXACT // 8 % 4)` column blocks
    (`_config.CHAIN_BLOCKS`), N a power of two >= 2n: with block `i` the columns `i N/n .. (i + 1) N/n - 1`,
    `acc = h_0 x_0`, then `acc = fma(h_i, x_i, acc)` for i = 1..n-1, each rounded once, then `exact_sum` of
    `acc` (the tree, or float64 sums). Every operation is elementwise in a fixed order, so the result does not
    depend on the register layout. The blocks are the column index's top bits, which Triton's layouts keep
    within a thread (see `tree_sum`), so the chain needs no shuffles; the vector's blocks still take a layout
    conversion (sm_90: twice the fold loop's shared loads, H200 run 30). With 2 blocks it is the tree with its
    first level fused into the products."""
    tl.static_assert(b_h.shape[1] >= 2 ** (EXACT // 8 % 4 + 1), "chain_dot needs at least two columns a block")
    if EXACT // 8 % 4 == 1:
        h0, h1 = _halves(b_h)
        x0, x1 = _halves(b_x[None, :])
        b_acc = tl.fma(h1, x1, h0 * x0)
    elif EXACT // 8 % 4 == 2:
        h0, h1, h2, h3 = _quarters(b_h)
        x0, x1, x2, x3 = _quarters(b_x[None, :])
        b_acc = h0 * x0
        b_acc = tl.fma(h1, x1, b_acc)
        b_acc = tl.fma(h2, x2, b_acc)
        b_acc = tl.fma(h3, x3, b_acc)
    else:
        h0, h1, h2, h3, h4, h5, h6, h7 = _eighths(b_h)
        x0, x1, x2, x3, x4, x5, x6, x7 = _eighths(b_x[None, :])
        b_acc = h0 * x0
        b_acc = tl.fma(h1, x1, b_acc)
        b_acc = tl.fma(h2, x2, b_acc)
        b_acc = tl.fma(h3, x3, b_acc)
        b_acc = tl.fma(h4, x4, b_acc)
        b_acc = tl.fma(h5, x5, b_acc)
        b_acc = tl.fma(h6, x6, b_acc)
        b_acc = tl.fma(h7, x7, b_acc)
    return exact_sum(b_acc, EXACT)


@triton.jit
def exact_dot(b_h, b_x, EXACT: tl.constexpr):
    """Row dots `[R]` of a `[R, N]` state tile with a `[N]` vector in the op order `EXACT`: `chain_dot` when the
    code has a chain field (`_config.chain_code`), else `exact_sum` of the products."""
    if EXACT // 8 % 4 > 0:
        return chain_dot(b_h, b_x, EXACT)
    return exact_sum(b_h * b_x[None, :], EXACT)


@triton.jit
def l2norm(b_x, EXACT: tl.constexpr):
    """`x / sqrt(sum(x^2) + eps)` of a 1-D block (division form, eps inside the square root)."""
    return b_x / tl.sqrt(tl.sum(exact_sum((b_x * b_x)[None, :], EXACT), axis=0) + L2NORM_EPS)


@triton.jit
def l2norm_rows(b_x, EXACT: tl.constexpr):
    """`l2norm` of every row of a 2-D block (with `EXACT`, bit-identical to `l2norm` of each row alone)."""
    return b_x / tl.sqrt(exact_sum(b_x * b_x, EXACT) + L2NORM_EPS)[:, None]


@triton.jit
def delta_step(b_h, b_k, b_v, b_g, b_beta, EXACT: tl.constexpr):  # noqa: PLR0917 (positional in Triton)
    """One recurrent token on a `[BV, BK]` state tile in the baseline op order; returns the tile and `u`.
    With the `_config.FMA_FLAG` bit in `EXACT` the update is one fused multiply-add per element."""
    b_h = b_h * tl.exp(b_g)
    b_v = b_v - exact_dot(b_h, b_k, EXACT)
    b_v = b_v * b_beta
    if EXACT // 4 % 2 == 1:  # noqa: SIM108 (a constexpr branch reads better in Triton)
        b_h = tl.fma(b_v[:, None], b_k[None, :], b_h)
    else:
        b_h = b_h + b_v[:, None] * b_k[None, :]
    return b_h, b_v


@triton.jit
def recurrent_token(b_h, b_q, b_k, b_v, b_g, b_beta, EXACT: tl.constexpr):  # noqa: PLR0917 (positional in Triton)
    """One token of the baseline: the state update, then `o = S q`; returns the tile, `u` and `o` `[BV]`."""
    b_h, b_u = delta_step(b_h, b_k, b_v, b_g, b_beta, EXACT)
    b_o = exact_dot(b_h, b_q, EXACT)
    return b_h, b_u, b_o


@triton.jit
def load_token(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
    mixed_qkv,
    a,
    b,
    i_tok,
    i_h,
    i_hv,
    o_k,
    o_v,
    mask_k,
    mask_v,
    b_A_log,
    b_dt_bias,
    scale,
    stride_x,
    stride_a,
    stride_b,
    H: tl.constexpr,
    K: tl.constexpr,
    HV: tl.constexpr,
    V: tl.constexpr,
    EXACT: tl.constexpr,
):
    """One token's normalised q (scaled), normalised k, raw k, raw v, g and beta for one value head."""
    p_x = mixed_qkv + i_tok * stride_x
    b_q = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k_raw = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0)
    b_v_raw = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0)
    b_a = tl.load(a + i_tok * stride_a + i_hv).to(tl.float32)
    b_b = tl.load(b + i_tok * stride_b + i_hv).to(tl.float32)
    b_g, b_beta = gates(b_a, b_b, b_A_log, b_dt_bias)
    b_q = l2norm(b_q, EXACT) * scale
    b_k = l2norm(b_k_raw.to(tl.float32), EXACT)
    return b_q, b_k, b_k_raw, b_v_raw, b_g, b_beta


@triton.jit
def chunk_rows(c0, wp, base, o_c, L: tl.constexpr):
    """Logical records `c0 + o_c` of a ring, which of them are committed (`< wp`), and their physical rows."""
    o_r = c0 + o_c
    return o_r, o_r < wp, (base + o_r) % L


@triton.jit
def ring_rows(  # noqa: PLR0917 (Triton passes arguments positionally)
    ring_u, ring_k, ring_g, ring_v, ring_beta, slot, i_h, i_hv, stride_ru, stride_rk, stride_rg, stride_rv,
    stride_rbeta, L: tl.constexpr, K: tl.constexpr, V: tl.constexpr, EXACT_FOLD: tl.constexpr,
):  # fmt: skip
    """Pointers to record 0 of one slot's ring rows: `u`, `g`, `v`, `beta` of value head `i_hv`, `k` of its key
    head `i_h`. Without `EXACT_FOLD` the ring has no `v` / `beta`; their pointers are then `u`'s and `g`'s,
    never stored through."""
    p_u = ring_u + slot * stride_ru + i_hv * L * V
    p_k = ring_k + slot * stride_rk + i_h * L * K
    p_g = ring_g + slot * stride_rg + i_hv * L
    if EXACT_FOLD:
        p_v = ring_v + slot * stride_rv + i_hv * L * V
        p_beta = ring_beta + slot * stride_rbeta + i_hv * L
    else:
        p_v = p_u
        p_beta = p_g
    return p_u, p_k, p_g, p_v, p_beta


@triton.jit
def record_writers(i_v, i_hv, HV: tl.constexpr, H: tl.constexpr):
    """`(n_head, n_key)`: 1 for the program that writes the records a value head's V tiles share (`g`, `beta`)
    and for the one that writes its key head's keys, else 0. Integer flags compared against index ranges
    keep every mask a tensor comparison."""
    n_head = (i_v == 0).to(tl.int32)
    return n_head, n_head * (i_hv % (HV // H) == 0).to(tl.int32)


@triton.jit
def append_record(  # noqa: PLR0917 (Triton passes arguments positionally)
    p_u, p_k, p_g, p_v, p_beta, pos, b_u, b_k_raw, b_g, b_v_raw, b_beta, o_k, o_v, mask_v, n_head, n_key,
    K: tl.constexpr, V: tl.constexpr, EXACT_FOLD: tl.constexpr,
):  # fmt: skip
    """Store one token's record at physical ring row `pos` (pointers from `ring_rows`, flags from
    `record_writers`): `u`, raw `k`, `g`, and for the exact fold raw `v` and `beta`."""
    tl.store(p_u + pos * V + o_v, b_u.to(p_u.dtype.element_ty), mask=mask_v)
    tl.store(p_k + pos * K + o_k, b_k_raw.to(p_k.dtype.element_ty), mask=o_k < K * n_key)
    tl.store(p_g + pos, b_g, mask=n_head > 0)
    if EXACT_FOLD:
        tl.store(p_v + pos * V + o_v, b_v_raw.to(p_v.dtype.element_ty), mask=mask_v)
        tl.store(p_beta + pos, b_beta, mask=n_head > 0)


@triton.jit
def step_has_due_row(write_pos, state_indices, B, T: tl.constexpr, L: tl.constexpr, BLOCK: tl.constexpr):  # noqa: PLR0917
    """1 when some live row (slot > 0) of the step's `B` rows is due (`wp + 2T > L`), else 0."""
    found = tl.zeros([BLOCK], dtype=tl.int32)
    for b0 in range(0, B, BLOCK):
        o_b = b0 + tl.arange(0, BLOCK)
        m_b = o_b < B
        slots = tl.load(state_indices + o_b, mask=m_b, other=0).to(tl.int64)
        live = m_b & (slots > 0)
        wps = tl.load(write_pos + slots, mask=live, other=0)
        found = tl.maximum(found, (live & (wps + 2 * T > L)).to(tl.int32))
    return tl.max(found, axis=0)


@triton.jit
def flush_rule(wp, any_due, T: tl.constexpr, L: tl.constexpr, JOIN: tl.constexpr):
    """`ring.flushing_rows`' rule for a row (or rows) with history `wp`, given the step's plan (`any_due`: some
    row of the step is due, `replayssm_plan`; unused without `JOIN`): due, or past `L - JOIN` while some row is
    due. With `JOIN == 0` it is the test the kernels had before coalesced flushes."""
    flush = wp + 2 * T > L
    if JOIN > 0:
        flush = flush | ((wp + 2 * T > L - JOIN) & (any_due > 0))
    return flush


@triton.jit
def flushes(wp, write_pos, T: tl.constexpr, L: tl.constexpr, JOIN: tl.constexpr):
    """`flush_rule` for a row (a scalar `wp`) or rows. With `JOIN > 0` the step's plan is one load: `write_pos[0]`,
    the null slot's entry, which `replayssm_plan` sets before the step's layers and the commit clears. No
    program scans the step's cursors any more: with the scan the decode build took 154 registers against 128
    (sm_90), and a B = 256 decode with a join was 11-12 % slower (H200 run 20)."""
    step_due = 0
    if JOIN > 0:
        step_due = tl.load(write_pos)
    return flush_rule(wp, step_due, T, L, JOIN)


@triton.jit
def keeps(wp, write_pos, T: tl.constexpr, L: tl.constexpr, JOIN: tl.constexpr):
    """`not flushes(...)`, written so that with `JOIN == 0` it compiles to the original `wp + 2T <= L`."""
    keep = wp + 2 * T <= L
    if JOIN > 0:
        keep = flushes(wp, write_pos, T, L, JOIN) == 0
    return keep


@triton.jit
def steps_row(wp, write_pos, T: tl.constexpr, L: tl.constexpr, JOIN: tl.constexpr, DEFER: tl.constexpr):  # noqa: PLR0917
    """Whether a non-flush kernel does a row's step: every row with a deferred fold (`_replay.deferred_fold`:
    the flush launch then only folds), else the rows that `keeps`."""
    keep = keeps(wp, write_pos, T, L, JOIN)
    if DEFER:
        keep = wp >= 0
    return keep
