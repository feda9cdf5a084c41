"""Choosing devices and a tensor-parallel size from the healthy devices and the model's shape.

The largest size the model can be sharded with (`valid_tensor_parallel_sizes`, shared with the
guard's `tp-divisibility` rule) that fits the usable devices; an explicit `tensor_parallel` or
`devices` in the profile is honoured; nothing valid means refuse. Pure: no processes, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from preflight.model_shape import ModelShape, tensor_parallel_problems, valid_tensor_parallel_sizes
from preflight.report import PlacementReport


@dataclass(frozen=True)
class PlacementRequest:
    devices: Literal["auto"] | tuple[int, ...] = "auto"
    tensor_parallel: Literal["auto"] | int = "auto"


def _listing(devices: Sequence[int]) -> str:
    return ", ".join(str(d) for d in devices) if devices else "none"


def _excluded(excluded: Mapping[int, str]) -> str:
    if not excluded:
        return ""
    return "; left out: " + "; ".join(f"device {d} ({why})" for d, why in sorted(excluded.items()))


def place(
    usable: Sequence[int],
    shape: ModelShape | None,
    request: PlacementRequest,
    excluded: Mapping[int, str] | None = None,
    model_problem: str | None = None,
) -> PlacementReport:
    """`usable`: devices that passed preflight, in preference order. `excluded`: device -> why not."""
    left_out = _excluded(excluded or {})
    pool = list(usable) if request.devices == "auto" else [d for d in request.devices if d in set(usable)]
    if model_problem is not None:
        return PlacementReport(False, (), None, f"cannot place: {model_problem}")
    if shape is None:
        # No model (preflight without a profile): report what is usable, choose no size.
        if not pool:
            return PlacementReport(False, (), None, f"no usable device{left_out}")
        return PlacementReport(True, tuple(pool), None, f"{len(pool)} usable (no model to size for){left_out}")
    wanted = request.tensor_parallel
    if wanted != "auto":
        problems = tensor_parallel_problems(shape, wanted)
        if problems:
            return PlacementReport(
                False, (), None, f"tensor_parallel {wanted} cannot shard this model: {'; '.join(problems)}"
            )
        if len(pool) < wanted:
            return PlacementReport(
                False,
                (),
                None,
                f"tensor_parallel {wanted} needs {wanted} usable devices, found {len(pool)} "
                f"({_listing(pool)}){left_out}",
                tuple(valid_tensor_parallel_sizes(shape, len(pool))),
            )
        return PlacementReport(
            True, tuple(pool[:wanted]), wanted, f"TP{wanted} as the profile asks{left_out}", (wanted,)
        )
    valid = valid_tensor_parallel_sizes(shape, len(pool))
    if not valid:
        return PlacementReport(
            False, (), None, f"no tensor-parallel size fits {len(pool)} usable devices ({_listing(pool)}){left_out}", ()
        )
    tp = valid[-1]
    why = (
        f"TP{tp}: the largest size that shards the model on {len(pool)} usable devices "
        f"(valid: {', '.join(map(str, valid))})"
    )
    return PlacementReport(True, tuple(pool[:tp]), tp, why + left_out, tuple(valid))
