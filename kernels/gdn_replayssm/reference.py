"""Pure-PyTorch reference for GDN decode and spec verify, recurrent and ReplaySSM; the oracle for the kernels.

Every function takes the same keyword-only arguments, in the same order, as its Triton counterpart and
updates the same tensors in place (`state`, `ring`, `cursors`, `out`). Arithmetic runs in float64 when the
state pool is float64 and in float32 otherwise; loads upcast, stores cast back to each tensor's dtype.

Math (per value head; `i_h = hv // (HV / H)` picks the key head):

    g_t  = -exp(A_log) * softplus(a_t + dt_bias)     softplus(x) = x for x > 20
    b_t  = sigmoid(b_t)                               (float32 or float64, never rounded)
    k_t  = k_t / sqrt(|k_t|^2 + 1e-6),  q_t = q_t / sqrt(|q_t|^2 + 1e-6) * K^-1/2
    S_t  = exp(g_t) S_{t-1};  u_t = b_t (v_t - S_t k_t);  S_t += u_t k_t^T;  o_t = S_t q_t

in that operation order (the "baseline op order"); the state `S` is `[V, K]` per head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._validate import (
    Geometry,
    check_num_accepted,
    check_recurrent_step,
    check_replayssm_step,
    check_state_indices,
)
from .ring import ReplayCursors, ReplayRing, flush_due, step_flushes

if TYPE_CHECKING:
    from .fold import ReplayLayers

SOFTPLUS_THRESHOLD = 20.0
L2NORM_EPS = 1e-6

__all__ = [
    "corrected_values_ref",
    "gdn_gates_ref",
    "gdn_output_ref",
    "gdn_step_ref",
    "l2norm_ref",
    "recurrent_ref",
    "replayssm_commit_ref",
    "replayssm_decode_ref",
    "replayssm_flush_ref",
    "replayssm_fold_ref",
    "replayssm_join_ref",
    "replayssm_plan_ref",
    "replayssm_reset_ref",
    "replayssm_verify_ref",
]


def _compute_dtype(state: torch.Tensor) -> torch.dtype:
    return torch.float64 if state.dtype == torch.float64 else torch.float32


def gdn_gates_ref(
    *, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-decay `g = -exp(A_log) softplus(a + dt_bias)` and `beta = sigmoid(b)`; a, b: `[..., HV]`."""
    x = a.to(dtype) + dt_bias.to(dtype)
    softplus = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log(1.0 + torch.exp(x)), x)
    g = -torch.exp(A_log.to(dtype)) * softplus
    beta = torch.sigmoid(b.to(dtype))
    return g, beta


def l2norm_ref(x: torch.Tensor) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + eps)` over the last dimension (eps inside the square root)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def gdn_step_ref(
    S: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrent token in the baseline op order; returns the new state and `u`.

    Args:
        S: state `[..., V, K]`.
        k: normalised key `[..., K]`.
        v: value `[..., V]`.
        g, beta: `[...]`.
    """
    S = S * torch.exp(g)[..., None, None]
    u = v - (S * k[..., None, :]).sum(-1)
    u = u * beta[..., None]
    S = S + u[..., :, None] * k[..., None, :]
    return S, u


def gdn_output_ref(S: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`o = S q` for `S [..., V, K]`, `q [..., K]`."""
    return (S * q[..., None, :]).sum(-1)


class _Window:
    """One call's inputs split per token and per value head, in the compute dtype."""

    def __init__(
        self,
        geo: Geometry,
        *,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        scale: float,
        dtype: torch.dtype,
    ) -> None:
        B, T, H, HV, K, V = geo.B, geo.T, geo.H, geo.HV, geo.K, geo.V
        x = mixed_qkv.view(B, T, -1)
        group = HV // H
        self.k_raw = x[..., H * K : 2 * H * K].unflatten(-1, (H, K))  # [B, T, H, K], input dtype
        self.v_raw = x[..., 2 * H * K :].unflatten(-1, (HV, V))  # [B, T, HV, V], input dtype
        q = x[..., : H * K].unflatten(-1, (H, K)).to(dtype)
        self.q = (l2norm_ref(q) * scale).repeat_interleave(group, dim=2)  # [B, T, HV, K]
        self.k = l2norm_ref(self.k_raw.to(dtype)).repeat_interleave(group, dim=2)  # [B, T, HV, K]
        self.v = self.v_raw.to(dtype)
        g, beta = gdn_gates_ref(a=a, b=b, A_log=A_log, dt_bias=dt_bias, dtype=dtype)
        self.g = g.view(B, T, HV)
        self.beta = beta.view(B, T, HV)


def _scale(scale: float | None, head_k_dim: int) -> float:
    return head_k_dim**-0.5 if scale is None else scale


def recurrent_ref(
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    out: torch.Tensor,
    scale: float | None = None,
) -> None:
    """The recurrent baseline (what vLLM does today): one state written per token.

    Row `i` starts from slot `state_indices[i, num_accepted[i] - 1]` (column 0 when `num_accepted` is None)
    and writes the state after token `t` into slot `state_indices[i, t]`. Rows whose column-0 slot is
    `<= 0` (padding, null slot 0) get zero outputs and touch no state.

    Args:
        mixed_qkv: `[B * T, 2 * H * K + HV * V]`, q | k | v packed per token.
        a, b: `[B * T, HV]`.
        A_log, dt_bias: `[HV]`.
        state: `[N, HV, V, K]` pool, updated in place.
        state_indices: `[B, T]` slots.
        num_accepted: `[B]`, tokens accepted in the previous step (1..T), or None.
        out: `[B * T, HV, V]`, written.
        scale: query scale, default `K ** -0.5`.
    """
    geo = check_recurrent_step(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        state_indices=state_indices,
        num_accepted=num_accepted,
        out=out,
    )
    dtype = _compute_dtype(state)
    w = _Window(
        geo, mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=_scale(scale, geo.K), dtype=dtype
    )
    slots = state_indices.tolist()
    accepted = [1] * geo.B if num_accepted is None else num_accepted.tolist()
    T = geo.T
    for i in range(geo.B):
        if slots[i][0] <= 0:
            out[i * T : (i + 1) * T] = 0
            continue
        S = state[slots[i][min(max(accepted[i], 1), T) - 1]].to(dtype)
        for t in range(T):
            S, _ = gdn_step_ref(S, w.k[i, t], w.v[i, t], w.g[i, t], w.beta[i, t])
            out[i * T + t] = gdn_output_ref(S, w.q[i, t]).to(out.dtype)
            if slots[i][t] > 0:
                state[slots[i][t]] = S.to(state.dtype)


def _history(ring: ReplayRing, slot: int, positions: list[int], group: int, dtype: torch.dtype) -> dict:
    """Committed records of one slot, per value head: k `[HV, C, K]`, g `[HV, C]`, u/v `[HV, C, V]`."""
    idx = torch.tensor(positions, dtype=torch.long, device=ring.g.device)
    hist = {
        "k": l2norm_ref(ring.k[slot][:, idx].to(dtype)).repeat_interleave(group, dim=0),
        "g": ring.g[slot][:, idx].to(dtype),
        "u": ring.u[slot][:, idx].to(dtype),
    }
    if ring.v is not None and ring.beta is not None:
        hist["v"] = ring.v[slot][:, idx].to(dtype)
        hist["beta"] = ring.beta[slot][:, idx].to(dtype)
    return hist


def corrected_values_ref(*, state: torch.Tensor, ring: ReplayRing) -> None:
    """Rewrites every record's corrected value `u` (all slots, physical rows from 0 on: `base = 0`) as the
    recurrence from `state` through the ring's raw records gives it, in place: a ring filled with arbitrary
    records becomes a trajectory. Needs the raw records (`ring.v`, `ring.beta`). Why: a non-flush window
    reconstructs from the stored `u` where the exact fold replays the raw records, and the two agree only on a
    trajectory (tests and benchmarks that fill rings at random call this before comparing the two)."""
    if ring.v is None or ring.beta is None:
        raise ValueError('corrected_values_ref needs the raw records (ring.v, ring.beta): allocate with fold="exact"')
    group = ring.u.shape[1] // ring.k.shape[1]
    S = state.to(_compute_dtype(state))
    for c in range(ring.ring_len):
        k = l2norm_ref(ring.k[:, :, c].to(S.dtype)).repeat_interleave(group, dim=1)
        v, g, beta = (t[:, :, c].to(S.dtype) for t in (ring.v, ring.g, ring.beta))
        S, u = gdn_step_ref(S, k, v, g, beta)
        ring.u[:, :, c] = u.to(ring.u.dtype)


def _open_loop_fold(S0: torch.Tensor, hist: dict) -> torch.Tensor:
    """`S = exp(G) S0 + sum_c exp(G - G_c) u_c k_c^T` with `G_c` the inclusive prefix sum of the history's g."""
    if hist["g"].shape[1] == 0:
        return S0
    G = hist["g"].cumsum(-1)  # [HV, C]
    total = G[:, -1]
    weights = torch.exp(total[:, None] - G)  # [HV, C]
    return torch.exp(total)[:, None, None] * S0 + torch.einsum("hc,hcv,hck->hvk", weights, hist["u"], hist["k"])


def _exact_fold(S0: torch.Tensor, hist: dict) -> torch.Tensor:
    """Closed-loop fold: replays the raw records one by one in the baseline op order."""
    S = S0
    for c in range(hist["g"].shape[1]):
        S, _ = gdn_step_ref(S, hist["k"][:, c], hist["v"][:, c], hist["g"][:, c], hist["beta"][:, c])
    return S


def _window_outputs(
    *, S_w: torch.Tensor, k: torch.Tensor, q: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Window outputs and `u` from the committed state through the chunked `(I + A)^-1` (UT) transform.

    With `G_s` the inclusive cumulative sum of the window's g (per head):

        R_s    = beta_s (v_s - exp(G_s) S_w k_s)
        A_sj   = beta_s exp(G_s - G_j) (k_s . k_j)                 for j < s
        U      = (I + A)^-1 R
        o_s    = exp(G_s) S_w q_s + sum_{j <= s} exp(G_s - G_j) (k_j . q_s) u_j

    Args:
        S_w: `[HV, V, K]`; k, q: `[HV, T, K]`; v: `[HV, T, V]`; g, beta: `[HV, T]`.
    Returns:
        o and u, both `[HV, T, V]`.
    """
    T = g.shape[-1]
    G = g.cumsum(-1)
    diff = G[:, :, None] - G[:, None, :]  # [HV, s, j] = G_s - G_j
    lower = torch.ones(T, T, dtype=torch.bool, device=g.device).tril()
    strict = lower.clone().fill_diagonal_(False)
    decay = torch.where(lower, torch.exp(torch.where(lower, diff, 0.0)), 0.0)
    R = beta[..., None] * (v - torch.exp(G)[..., None] * torch.einsum("hvk,htk->htv", S_w, k))
    A = torch.where(strict, beta[..., None] * decay * (k @ k.transpose(-1, -2)), 0.0)
    eye = torch.eye(T, dtype=g.dtype, device=g.device)
    U = torch.linalg.solve_triangular(eye + A, R, upper=False, unitriangular=True)
    W = decay * (q @ k.transpose(-1, -2))  # [HV, s, j] = exp(G_s - G_j) (q_s . k_j), j <= s
    outputs = torch.exp(G)[..., None] * torch.einsum("hvk,htk->htv", S_w, q) + W @ U
    return outputs, U


def _replayssm_ref(
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
    scale: float | None,
    decode: bool,
) -> None:
    geo = check_replayssm_step(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        ring=ring,
        cursors=cursors,
        state_indices=state_indices,
        out=out,
        decode=decode,
    )
    dtype = _compute_dtype(state)
    w = _Window(
        geo, mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=_scale(scale, geo.K), dtype=dtype
    )
    T, ring_len, group = geo.T, ring.ring_len, geo.HV // geo.H
    write_pos, bases = cursors.write_pos.tolist(), cursors.base.tolist()
    flushes = step_flushes(cursors, state_indices.tolist(), T)
    for i, slot in enumerate(state_indices.tolist()):
        rows = slice(i * T, (i + 1) * T)
        if slot <= 0:
            out[rows] = 0
            continue
        wp, base = write_pos[slot], bases[slot]
        hist = _history(ring, slot, [(base + c) % ring_len for c in range(wp)], group, dtype)
        S0 = state[slot].to(dtype)
        if flushes[i]:
            S = _exact_fold(S0, hist) if ring.fold == "exact" else _open_loop_fold(S0, hist)
            if decode:  # the token is committed already: fold it too and keep the ring empty
                S, _ = gdn_step_ref(S, w.k[i, 0], w.v[i, 0], w.g[i, 0], w.beta[i, 0])
                out[i] = gdn_output_ref(S, w.q[i, 0]).to(out.dtype)
                state[slot] = S.to(state.dtype)
                continue
            state[slot] = S.to(state.dtype)  # checkpoint = committed history; the window may be rolled back
            us = []
            for t in range(T):
                S, u = gdn_step_ref(S, w.k[i, t], w.v[i, t], w.g[i, t], w.beta[i, t])
                out[i * T + t] = gdn_output_ref(S, w.q[i, t]).to(out.dtype)
                us.append(u)
            U = torch.stack(us, dim=1)  # [HV, T, V]
        else:
            S_w = _open_loop_fold(S0, hist)  # output-only reconstruction: never stored
            window_out, U = _window_outputs(
                S_w=S_w,
                k=w.k[i].transpose(0, 1),
                q=w.q[i].transpose(0, 1),
                v=w.v[i].transpose(0, 1),
                g=w.g[i].transpose(0, 1),
                beta=w.beta[i].transpose(0, 1),
            )
            out[rows] = window_out.transpose(0, 1).to(out.dtype)
        for t in range(T):  # append the window's records behind the committed history
            pos = (base + wp + t) % ring_len
            ring.u[slot, :, pos] = U[:, t].to(ring.u.dtype)
            ring.k[slot, :, pos] = w.k_raw[i, t].to(ring.k.dtype)
            ring.g[slot, :, pos] = w.g[i, t].to(ring.g.dtype)
            if ring.v is not None and ring.beta is not None:
                ring.v[slot, :, pos] = w.v_raw[i, t].to(ring.v.dtype)
                ring.beta[slot, :, pos] = w.beta[i, t].to(ring.beta.dtype)


def replayssm_decode_ref(
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
    scale: float | None = None,
) -> None:
    """ReplaySSM decode step (T = 1); same arguments as `gdn_replayssm.replayssm_decode`.

    Non-flush rows reconstruct the output from the checkpoint plus the committed records and append the
    token's record; flush rows (`write_pos == L - 1`) fold the history and the token into the checkpoint
    and leave the ring empty after `replayssm_commit_ref`.
    """
    _replayssm_ref(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        ring=ring,
        cursors=cursors,
        state_indices=state_indices,
        out=out,
        scale=scale,
        decode=True,
    )


def replayssm_verify_ref(
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
    scale: float | None = None,
) -> None:
    """ReplaySSM spec-verify step (T = 1 + num_spec); same arguments as `gdn_replayssm.replayssm_verify`.

    Every row writes its window's records at logical positions `wp .. wp + T - 1`. Flush rows first fold
    the committed history into the checkpoint and store it, then run the window recurrently from it.
    """
    _replayssm_ref(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        ring=ring,
        cursors=cursors,
        state_indices=state_indices,
        out=out,
        scale=scale,
        decode=False,
    )


def replayssm_commit_ref(
    *,
    cursors: ReplayCursors,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    num_tokens: int,
) -> None:
    """Moves the cursors after a step of `num_tokens` tokens per row; same as `replayssm_commit`.

    Per row with slot > 0 and `n = clamp(num_accepted, 1, T)` (1 when None):
    flush rows: decode (T = 1) empties the ring (`wp = 0`); verify makes the window the ring's head
    (`base += wp`, `wp = n`). Other rows: `wp += n`. Rejected records are never read again. With coalesced
    flushes it clears the step's plan (`replayssm_plan_ref`).
    """
    check_state_indices(state_indices, ndim=1)
    if num_accepted is not None:
        check_num_accepted(num_accepted, num_rows=state_indices.shape[0])
    T, L = num_tokens, cursors.ring_len
    accepted = [1] * state_indices.shape[0] if num_accepted is None else num_accepted.tolist()
    flushes = step_flushes(cursors, state_indices.tolist(), T)
    for i, slot in enumerate(state_indices.tolist()):
        if slot <= 0:
            continue
        n = min(max(accepted[i], 1), T)
        wp, base = int(cursors.write_pos[slot]), int(cursors.base[slot])
        if flushes[i]:
            if T == 1:
                wp = 0
            else:
                base, wp = (base + wp) % L, n
        else:
            wp += n
        cursors.write_pos[slot] = wp
        cursors.base[slot] = base
    if cursors.flush_join:
        cursors.write_pos[0] = 0  # the step's plan is spent


def replayssm_plan_ref(*, cursors: ReplayCursors, state_indices: torch.Tensor, num_tokens: int) -> None:
    """The step's plan for coalesced flushes, as `replayssm_plan`: with `flush_join > 0`, `write_pos[0] = 1` when
    some live row of the step is due (`flush_due`), else 0; nothing without."""
    check_state_indices(state_indices, ndim=1)
    if cursors.flush_join == 0:
        return
    L = cursors.ring_len
    due = [flush_due(write_pos=int(cursors.write_pos[s]), num_tokens=num_tokens, ring_len=L)
           for s in state_indices.tolist() if s > 0]  # fmt: skip
    cursors.write_pos[0] = int(any(due))


def replayssm_fold_ref(
    *, layers: ReplayLayers, cursors: ReplayCursors, state_indices: torch.Tensor, num_tokens: int
) -> None:
    """As `replayssm_fold`: the reference folds every layer's flushing rows in line, in its decode and verify
    steps, so there is nothing left to fold; a model runner calls it in the same place (after the last GDN
    layer, before the commit) either way."""
    check_state_indices(state_indices, ndim=1)
    del layers, cursors, num_tokens


def replayssm_join_ref(*, cursors: ReplayCursors) -> None:
    """As `replayssm_join`: the reference folds in line, so there is nothing to wait for."""
    del cursors


def replayssm_reset_ref(*, cursors: ReplayCursors, state_indices: torch.Tensor) -> None:
    """Empties the rings of the listed slots (slot > 0): call after prefill has written their checkpoint."""
    check_state_indices(state_indices, ndim=1)
    for slot in state_indices.tolist():
        if slot > 0:
            cursors.write_pos[slot] = 0
            cursors.base[slot] = 0


def replayssm_flush_ref(
    *, state: torch.Tensor, ring: ReplayRing, cursors: ReplayCursors, state_indices: torch.Tensor
) -> None:
    """Folds the committed history of the listed slots (slot > 0) into their checkpoints and empties their rings.

    For a row that leaves the ReplaySSM path: a recurrent or prefill kernel reads the checkpoint directly, so
    whatever the ring still holds must be in it first (research/replayssm.md 6.6). The fold is the ring's
    (`ring.fold`): exact replays the raw records in the baseline op order."""
    check_state_indices(state_indices, ndim=1)
    dtype = _compute_dtype(state)
    group = ring.u.shape[1] // ring.k.shape[1]
    ring_len = ring.ring_len
    for slot in state_indices.tolist():
        if slot <= 0:
            continue
        wp, base = int(cursors.write_pos[slot]), int(cursors.base[slot])
        if wp > 0:
            hist = _history(ring, slot, [(base + c) % ring_len for c in range(wp)], group, dtype)
            S0 = state[slot].to(dtype)
            S = _exact_fold(S0, hist) if ring.fold == "exact" else _open_loop_fold(S0, hist)
            state[slot] = S.to(state.dtype)
        cursors.write_pos[slot] = 0
        cursors.base[slot] = 0
