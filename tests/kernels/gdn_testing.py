"""Shared helpers for the GDN ReplaySSM tests: problem builder, naive oracle, tolerance check."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from gdn_replayssm import ReplayCursors, ReplayRing, flush_due
from gdn_replayssm.reference import replayssm_plan_ref
from gdn_replayssm.ring import step_flushes

SENTINEL = 1e30


@dataclass(frozen=True)
class Case:
    """One parametrization: sizes, dtypes, fold and device. `str(case)` is its readable pytest id."""

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    L: int
    x_dtype: torch.dtype = torch.float32
    state_dtype: torch.dtype = torch.float32
    u_dtype: torch.dtype | None = None
    fold: str = "exact"
    device: str = "cpu"
    steps: int = 0  # 0: enough to wrap the ring twice, and to flush even if every step accepts one token
    join: int = 0  # `ReplayCursors.flush_join`: coalesced flushes

    def __str__(self) -> str:
        dt = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}
        ring = dt[self.u_dtype or self.x_dtype]
        return (
            f"B{self.B}-T{self.T}-H{self.H}-HV{self.HV}-K{self.K}-V{self.V}-L{self.L}-x{dt[self.x_dtype]}-"
            f"s{dt[self.state_dtype]}-u{ring}-{self.fold}{f'-J{self.join}' * bool(self.join)}-{self.device}"
        )

    @property
    def num_steps(self) -> int:
        # a row flushes once write_pos + 2T > L; with one accepted token per step that takes L - 2T + 2 steps
        return self.steps or max(4, 2 * self.L // self.T + 2, self.L - 2 * self.T + 3)

    def param(self) -> object:
        marks = [pytest.mark.gpu] if self.device == "cuda" else []
        return pytest.param(self, id=str(self), marks=marks)


def require_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU kernel tests need TRITON_INTERPRET=1 (set by conftest when there is no CUDA)")


@dataclass
class Problem:
    """A state pool, rings and cursors with sentinel-filled unused slots, plus the step's fixed tensors."""

    case: Case
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    state: torch.Tensor
    ring: ReplayRing
    cursors: ReplayCursors
    state_indices: torch.Tensor  # [B]: distinct live slots, some rows padded (0 or -1)
    live: list[int] = field(default_factory=list)
    generator: torch.Generator = field(default_factory=torch.Generator)

    @property
    def num_slots(self) -> int:
        return int(self.state.shape[0])

    def clone_storage(self) -> tuple[torch.Tensor, ReplayRing, ReplayCursors]:
        return self.state.clone(), self.ring.clone(), self.cursors.clone()

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """mixed_qkv `[B * T, D]` (rows strided inside a wider buffer) and gates `a`, `b` `[B * T, HV]`."""
        c = self.case
        rows, width = c.B * c.T, 2 * c.H * c.K + c.HV * c.V
        g, dev = self.generator, c.device
        wide = torch.randn(rows, width + 24, generator=g).to(device=dev, dtype=c.x_dtype)
        ab = torch.randn(rows, 2 * c.HV + 3, generator=g)
        ab[:, : c.HV].mul_(1.5)
        ab[0, 0] = 25.0  # above the softplus threshold
        ab = ab.to(device=dev, dtype=c.x_dtype)
        return wide[:, 3 : 3 + width], ab[:, : c.HV], ab[:, c.HV + 1 : 2 * c.HV + 1]

    def out(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        c = self.case
        return torch.empty(c.B * c.T, c.HV, c.V, dtype=dtype or c.x_dtype, device=c.device)

    def untouched(self) -> list[int]:
        return [s for s in range(self.num_slots) if s not in self.live]

    def baseline_columns(self, pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrent baseline's `[B, T]` state columns and its pool: column 0 is the row's ReplaySSM slot,
        columns 1.. fresh slots past `pool`, which comes back extended by zeroed slots for them (padding rows
        keep their index in every column)."""
        c, idx = self.case, self.state_indices
        cols = idx[:, None].repeat(1, c.T)
        if c.T > 1:
            extra = self.num_slots + torch.arange(c.B * (c.T - 1), dtype=torch.int32, device=idx.device)
            cols[:, 1:] = torch.where(idx[:, None] > 0, extra.view(c.B, c.T - 1), idx[:, None])
            pool = torch.cat([pool, torch.zeros_like(pool[:1]).expand(c.B * (c.T - 1), -1, -1, -1)])
        return cols, pool

    def flushing(self, cursors: ReplayCursors | None = None, state_indices: torch.Tensor | None = None) -> list[bool]:
        """Per row: whether the next step, planned (`replayssm_plan`), flushes it (a live slot, by
        `flushing_rows`), read from `cursors` and `state_indices` (default: the problem's)."""
        idx = self.state_indices if state_indices is None else state_indices
        planned = (cursors or self.cursors).clone()
        replayssm_plan_ref(cursors=planned, state_indices=idx, num_tokens=self.case.T)
        return step_flushes(planned, idx.tolist(), self.case.T)

    def joining(self, cursors: ReplayCursors | None = None, state_indices: torch.Tensor | None = None) -> list[bool]:
        """Per row: whether the next step flushes it only because it joins another row's flush."""
        wp, c = (cursors or self.cursors).write_pos.tolist(), self.case
        slots = (self.state_indices if state_indices is None else state_indices).tolist()
        flushing = self.flushing(cursors, state_indices)
        due = [s > 0 and flush_due(write_pos=wp[s], num_tokens=c.T, ring_len=c.L) for s in slots]
        return [f and not d for f, d in zip(flushing, due, strict=True)]


def make_problem(case: Case, *, seed: int = 0, pad_rows: bool = True) -> Problem:
    c = case
    g = torch.Generator().manual_seed(seed)
    num_slots = 2 * c.B + 3
    perm = (torch.randperm(num_slots - 1, generator=g) + 1)[: c.B]  # slot 0 is the null slot
    rows = perm.tolist()
    if pad_rows and c.B >= 3:
        rows[1] = 0  # null slot
        rows[-1] = -1  # PAD_SLOT_ID
    live = [s for s in rows if s > 0]
    state = torch.full((num_slots, c.HV, c.V, c.K), _sentinel(c.state_dtype), dtype=c.state_dtype)
    for s in live:
        state[s] = (0.3 * torch.randn(c.HV, c.V, c.K, generator=g)).to(c.state_dtype)
    ring = ReplayRing.allocate(
        num_slots=num_slots,
        num_k_heads=c.H,
        num_v_heads=c.HV,
        head_k_dim=c.K,
        head_v_dim=c.V,
        ring_len=c.L,
        dtype=c.x_dtype,
        u_dtype=c.u_dtype,
        fold="exact" if c.fold == "exact" else "open_loop",
    )
    for t in ring.tensors().values():  # unused slots and never-written records hold sentinels
        t.fill_(_sentinel(t.dtype))
    cursors = ReplayCursors.allocate(num_slots=num_slots, ring_len=c.L, flush_join=c.join)
    cursors.write_pos.fill_(7777)
    cursors.base.fill_(7777)
    for s in live:
        cursors.write_pos[s] = 0
        cursors.base[s] = 0
    dev = c.device
    # decays close to 1 so the history matters: g = -exp(A_log) softplus(a + dt_bias) ~ -0.005 .. -0.3
    A_log = torch.empty(c.HV).uniform_(math.log(0.05), math.log(0.5), generator=g).to(dev)
    dt_bias = (torch.randn(c.HV, generator=g) * 0.3 - 1.0).to(dev)
    return Problem(
        case=c,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state.to(dev),
        ring=ReplayRing(**{k: t.to(dev) for k, t in ring.tensors().items()}),
        cursors=ReplayCursors(
            write_pos=cursors.write_pos.to(dev), base=cursors.base.to(dev), ring_len=c.L, flush_join=c.join
        ),
        state_indices=torch.tensor(rows, dtype=torch.int32, device=dev),
        live=live,
        generator=g,
    )


def _sentinel(dtype: torch.dtype) -> float:
    return min(SENTINEL, torch.finfo(dtype).max) if dtype.is_floating_point else 0


def acceptance(pattern: str, *, B: int, T: int, generator: torch.Generator) -> torch.Tensor:
    """Accepted tokens per row (bonus included): "none" -> 1, "all" -> T, "random" -> uniform 1..T."""
    if pattern == "none":
        n = torch.ones(B, dtype=torch.int32)
    elif pattern == "all":
        n = torch.full((B,), T, dtype=torch.int32)
    else:
        n = torch.randint(1, T + 1, (B,), generator=generator, dtype=torch.int32)
    return n


def rel_rms(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref64, got64 = ref.double(), got.double()
    denom = ref64.pow(2).mean().sqrt().item()
    return (ref64 - got64).pow(2).mean().sqrt().item() / max(denom, 1e-30)


def assert_close(name: str, ref: torch.Tensor, got: torch.Tensor, tol: float) -> None:
    """Relative RMS error `rms(got - ref) / rms(ref) <= tol`; NaN/inf anywhere fails. Never a warning."""
    assert ref.shape == got.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    if ref.numel() == 0:
        return
    assert torch.isfinite(got).all(), f"{name}: non-finite values in the result"
    assert torch.isfinite(ref).all(), f"{name}: non-finite values in the reference"
    err = rel_rms(ref, got)
    max_abs = (ref.double() - got.double()).abs().max().item()
    assert err <= tol, f"{name}: relative RMS error {err:.3e} > {tol:.1e} (max abs diff {max_abs:.3e})"


def assert_untouched(problem: Problem, state: torch.Tensor, ring: ReplayRing, cursors: ReplayCursors) -> None:
    """Slots not in the batch (null slot 0 included) must be bit-identical sentinels, but for the null slot's
    `write_pos` entry with coalesced flushes, which holds the step's plan (`replayssm_plan`)."""
    idle = torch.tensor(problem.untouched(), dtype=torch.long, device=state.device)
    assert torch.equal(state[idle], torch.full_like(state[idle], _sentinel(state.dtype))), "idle state slots changed"
    for name, t in ring.tensors().items():
        assert torch.equal(t[idle], torch.full_like(t[idle], _sentinel(t.dtype))), f"idle ring.{name} slots changed"
    planned = idle[idle != 0] if cursors.flush_join else idle  # write_pos[0] holds the step's plan then
    assert (cursors.write_pos[planned] == 7777).all(), "idle write_pos changed"
    assert (cursors.base[idle] == 7777).all(), "idle base changed"


def naive_step(
    S: torch.Tensor,
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: float,
    b: float,
    A_log: float,
    dt_bias: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Straightforward GDN token for one head in float64: `S [V, K]`, q/k `[K]`, v `[V]`; returns (S, o)."""
    x = a + dt_bias
    softplus = x if x > 20.0 else math.log1p(math.exp(x))
    alpha = math.exp(-math.exp(A_log) * softplus)
    beta = 1.0 / (1.0 + math.exp(-b))
    k_hat = k / math.sqrt(float(k @ k) + 1e-6)
    q_hat = q / math.sqrt(float(q @ q) + 1e-6) / math.sqrt(k.shape[0])
    S = alpha * S
    u = beta * (v - S @ k_hat)
    S = S + torch.outer(u, k_hat)
    return S, S @ q_hat


class NaiveOracle:
    """Token-by-token float64 oracle: per row and head, the committed state and the window's outputs."""

    def __init__(self, problem: Problem) -> None:
        c = problem.case
        self.case = c
        self.A_log = problem.A_log.double().cpu().tolist()
        self.dt_bias = problem.dt_bias.double().cpu().tolist()
        idx = problem.state_indices.tolist()
        self.slots = idx
        self.committed = {s: problem.state[s].double().cpu().clone() for s in idx if s > 0}

    def step(
        self, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, num_accepted: torch.Tensor | None
    ) -> torch.Tensor:
        """Outputs `[B * T, HV, V]` of the window; then commits `num_accepted` tokens (all when None)."""
        c = self.case
        x, a64, b64 = mixed_qkv.double().cpu(), a.double().cpu(), b.double().cpu()
        out = torch.zeros(c.B * c.T, c.HV, c.V, dtype=torch.float64)
        group = c.HV // c.H
        for i, slot in enumerate(self.slots):
            if slot <= 0:
                continue
            n = c.T if num_accepted is None else int(num_accepted[i])
            new_state = self.committed[slot].clone()
            for hv in range(c.HV):
                h = hv // group
                S = self.committed[slot][hv].clone()
                for t in range(c.T):
                    row = x[i * c.T + t]
                    q = row[h * c.K : (h + 1) * c.K]
                    k = row[c.H * c.K + h * c.K : c.H * c.K + (h + 1) * c.K]
                    v = row[2 * c.H * c.K + hv * c.V : 2 * c.H * c.K + (hv + 1) * c.V]
                    tok = i * c.T + t
                    S, o = naive_step(
                        S,
                        q=q,
                        k=k,
                        v=v,
                        a=float(a64[tok, hv]),
                        b=float(b64[tok, hv]),
                        A_log=self.A_log[hv],
                        dt_bias=self.dt_bias[hv],
                    )
                    out[tok, hv] = o
                    if t == n - 1:
                        new_state[hv] = S
            self.committed[slot] = new_state
        return out


class LaunchSpy:
    """Stands in for a `@triton.jit` kernel: records each launch's grid and keyword arguments, then launches
    the real kernel."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.launches: list[tuple[tuple[int, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.launches.append((grid, kwargs))
            return self.real[grid](*args, **kwargs)

        return launch
