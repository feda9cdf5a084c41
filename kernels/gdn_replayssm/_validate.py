"""Host-side argument checks shared by the reference and the Triton launchers.

Every check runs on shapes, dtypes, strides and devices only: nothing reads tensor values, so the
public functions stay free of host synchronisation and can be captured in CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ring import ReplayCursors, ReplayRing

MAX_TOKENS = 8
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class Geometry:
    """Sizes of one call: `B` rows of `T` tokens, `H` key heads, `HV` value heads, `N` state slots."""

    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int


def _fail(name: str, problem: str) -> ValueError:
    return ValueError(f"`{name}` {problem}")


def _check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise _fail(name, f"must be contiguous in its last dimension (strides {tuple(t.stride())})")


def check_inputs(  # noqa: PLR0912 (one early ValueError per malformed argument)
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    num_rows: int,
    out: torch.Tensor | None,
) -> Geometry:
    """Checks the arguments every GDN step shares and returns the call's geometry."""
    if state.ndim != 4:
        raise _fail("state", f"must be [N, HV, V, K], got shape {tuple(state.shape)}")
    if state.dtype not in STATE_DTYPES:
        raise _fail("state", f"must be float32, bfloat16, float16 or float64, got {state.dtype}")
    if not state[0].is_contiguous():
        raise _fail("state", "must be contiguous within a slot ([HV, V, K]); only the slot stride may vary")
    n, hv, v, k = state.shape
    if mixed_qkv.ndim != 2:
        raise _fail("mixed_qkv", f"must be [B * T, 2 * H * K + HV * V], got shape {tuple(mixed_qkv.shape)}")
    _check_last_dim_contiguous("mixed_qkv", mixed_qkv)
    rows, width = mixed_qkv.shape
    if num_rows < 1:
        raise _fail("state_indices", "must hold at least one row")
    if rows % num_rows != 0:
        raise _fail("mixed_qkv", f"has {rows} token rows, not a multiple of the {num_rows} rows in state_indices")
    t = rows // num_rows
    key_width = width - hv * v
    if key_width <= 0 or key_width % (2 * k) != 0:
        raise _fail(
            "mixed_qkv",
            f"width {width} is not 2 * H * K + HV * V for K={k}, HV={hv}, V={v} (state [N, HV, V, K] = "
            f"{tuple(state.shape)})",
        )
    h = key_width // (2 * k)
    if hv % h != 0:
        raise _fail("state", f"has HV={hv} value heads, not a multiple of the H={h} key heads in mixed_qkv")
    for name, gate in (("a", a), ("b", b)):
        if gate.ndim != 2 or tuple(gate.shape) != (rows, hv):
            raise _fail(name, f"must be [B * T, HV] = [{rows}, {hv}], got shape {tuple(gate.shape)}")
        _check_last_dim_contiguous(name, gate)
    for name, param in (("A_log", A_log), ("dt_bias", dt_bias)):
        if param.ndim != 1 or param.shape[0] != hv or not param.is_contiguous():
            raise _fail(name, f"must be a contiguous [HV] = [{hv}] tensor, got shape {tuple(param.shape)}")
    if out is not None:
        if tuple(out.shape) != (rows, hv, v):
            raise _fail("out", f"must be [B * T, HV, V] = [{rows}, {hv}, {v}], got shape {tuple(out.shape)}")
        if not out.is_contiguous():
            raise _fail("out", "must be contiguous")
    tensors = {"mixed_qkv": mixed_qkv, "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias}
    if out is not None:
        tensors["out"] = out
    check_same_device(state=state, **tensors)
    return Geometry(B=num_rows, T=t, H=h, HV=hv, K=k, V=v, N=n)


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_state_indices(state_indices: torch.Tensor, *, ndim: int) -> None:
    shape = "[B]" if ndim == 1 else "[B, T]"
    if state_indices.ndim != ndim:
        raise _fail("state_indices", f"must be {shape}, got shape {tuple(state_indices.shape)}")
    if state_indices.dtype not in INDEX_DTYPES:
        raise _fail("state_indices", f"must be int32 or int64, got {state_indices.dtype}")
    if not state_indices.is_contiguous():
        raise _fail("state_indices", "must be contiguous")


def check_num_accepted(num_accepted: torch.Tensor, *, num_rows: int) -> None:
    if num_accepted.ndim != 1 or num_accepted.shape[0] != num_rows:
        raise _fail("num_accepted", f"must be [B] = [{num_rows}], got shape {tuple(num_accepted.shape)}")
    if num_accepted.dtype not in INDEX_DTYPES:
        raise _fail("num_accepted", f"must be int32 or int64, got {num_accepted.dtype}")
    if not num_accepted.is_contiguous():
        raise _fail("num_accepted", "must be contiguous")


def check_tokens(geo: Geometry, *, decode: bool) -> None:
    if decode and geo.T != 1:
        raise _fail("mixed_qkv", f"must hold one token per row for decode (B={geo.B} rows, got T={geo.T})")
    if not decode and not 2 <= geo.T <= MAX_TOKENS:
        raise _fail(
            "mixed_qkv",
            f"must hold T = 1 + num_spec tokens per row with 2 <= T <= {MAX_TOKENS} for verify, got T={geo.T} "
            f"({geo.B * geo.T} rows for B={geo.B}); use the decode function for T = 1",
        )


def check_recurrent_step(
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None,
    out: torch.Tensor,
) -> Geometry:
    """The arguments of one recurrent-baseline step (kernel and reference alike)."""
    check_state_indices(state_indices, ndim=2)
    geo = check_inputs(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        num_rows=state_indices.shape[0],
        out=out,
    )
    if state_indices.shape[1] != geo.T:
        raise _fail("state_indices", f"must be [B, T] = [{geo.B}, {geo.T}], got {tuple(state_indices.shape)}")
    if num_accepted is not None:
        check_num_accepted(num_accepted, num_rows=geo.B)
    return geo


def check_replayssm_step(
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
    decode: bool,
) -> Geometry:
    """The arguments of one ReplaySSM decode or verify step (kernel and reference alike)."""
    check_state_indices(state_indices, ndim=1)
    geo = check_inputs(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        num_rows=state_indices.shape[0],
        out=out,
    )
    check_tokens(geo, decode=decode)
    check_ring(ring, cursors, geo, state=state)
    return geo


def check_kernel_state_dtype(state: torch.Tensor) -> None:
    if state.dtype == torch.float64:
        raise _fail("state", "must be float32, bfloat16 or float16 for the Triton kernels (float64 is reference-only)")


def check_cursors(cursors: ReplayCursors, *, num_slots: int, device: torch.device) -> None:
    for name in ("write_pos", "base"):
        t = getattr(cursors, name)
        if t.ndim != 1 or t.shape[0] != num_slots or t.dtype != torch.int32 or not t.is_contiguous():
            raise _fail(
                f"cursors.{name}",
                f"must be a contiguous int32 [N] = [{num_slots}] tensor, got {t.dtype} shape {tuple(t.shape)}",
            )
        if t.device != device:
            raise _fail(f"cursors.{name}", f"is on {t.device}, the state is on {device}")
    if cursors.ring_len < 1:
        raise _fail("cursors.ring_len", f"must be >= 1, got {cursors.ring_len}")
    if not isinstance(cursors.flush_join, int) or not 0 <= cursors.flush_join <= cursors.ring_len:
        raise _fail(
            "cursors.flush_join",
            f"must be an int in 0..ring_len = 0..{cursors.ring_len} (0: no coalesced flushes), "
            f"got {cursors.flush_join!r}",
        )


def check_ring(ring: ReplayRing, cursors: ReplayCursors, geo: Geometry, *, state: torch.Tensor) -> None:
    """Checks ring shapes against the geometry and the ring length against the window length."""
    check_cursors(cursors, num_slots=geo.N, device=state.device)
    ln = ring.ring_len
    if ln != cursors.ring_len:
        raise _fail("ring", f"has ring_len {ln} but cursors.ring_len is {cursors.ring_len}")
    if geo.T > 1 and ln < 2 * geo.T:
        raise _fail(
            "ring",
            f"has ring_len {ln} < 2 * T = {2 * geo.T}; spec verify needs ring_len >= 2T so that a window always "
            "fits behind the committed history (early-flush rule)",
        )
    expected = {
        "u": (geo.N, geo.HV, ln, geo.V),
        "k": (geo.N, geo.H, ln, geo.K),
        "g": (geo.N, geo.HV, ln),
        "v": (geo.N, geo.HV, ln, geo.V),
        "beta": (geo.N, geo.HV, ln),
    }
    if (ring.v is None) != (ring.beta is None):
        raise _fail("ring", "must have both `v` and `beta` (exact fold) or neither (open-loop fold)")
    for name, t in ring.tensors().items():
        if tuple(t.shape) != expected[name]:
            raise _fail(f"ring.{name}", f"must have shape {expected[name]}, got {tuple(t.shape)}")
        if not t[0].is_contiguous():
            raise _fail(f"ring.{name}", "must be contiguous within a slot; only the slot stride may vary")
        if t.device != state.device:
            raise _fail(f"ring.{name}", f"is on {t.device}, the state is on {state.device}")
        if name in ("g", "beta") and t.dtype not in (torch.float32, torch.float64):
            raise _fail(f"ring.{name}", f"must be float32 (or float64 for the reference), got {t.dtype}")
