"""The preflight report: per device, the collective, the placement; JSON and a text rendering.

JSON keys (schema `warden.preflight/1`): durations are `duration_s` (seconds), bus bandwidth is
`busbw_gbps` (1e9 bytes/s, as nccl-tests prints it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from preflight.health import Action, CheckResult, Health, plural, worst
from preflight.levels import FUNCTIONAL_PROBES

SCHEMA = "warden.preflight/1"


@dataclass(frozen=True)
class DeviceReport:
    index: int
    name: str
    health: Health
    reason: str
    action: Action = Action.NONE
    failure: str | None = None  # a `Failure` value when unhealthy
    probes: tuple[CheckResult, ...] = ()
    duration_s: float | None = None
    startup_s: float | None = None
    quarantined: bool = False
    probed: bool = True

    @property
    def usable(self) -> bool:
        return self.health in (Health.HEALTHY, Health.DEGRADED) and not self.quarantined

    def with_result(self, result: CheckResult) -> DeviceReport:
        """This report with one more result (a collective finding), health and reason recomputed."""
        probes = (*self.probes, result)
        health, reason, action, failure = summarize(probes)
        return replace(self, probes=probes, health=health, reason=reason, action=action, failure=failure)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "health": self.health.value,
            "reason": self.reason,
            "action": self.action.value,
            "failure": self.failure,
            "quarantined": self.quarantined,
            "probed": self.probed,
            "duration_s": _round(self.duration_s),
            "startup_s": _round(self.startup_s),
            "probes": [p.to_dict() for p in self.probes],
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize(results: Sequence[CheckResult]) -> tuple[Health, str, Action, str | None]:
    """A device's health from its probe results (and collective findings).

    Any unhealthy result makes the device unhealthy (its reason wins); degraded results make it
    degraded; it is healthy only when every functional check that was expected ran and passed.
    Informational checks (counters) that could not read anything leave it healthy but say so.
    """
    unhealthy = [r for r in results if r.health is Health.UNHEALTHY]
    if unhealthy:
        first = unhealthy[0]
        failure = first.evidence.get("failure")
        return Health.UNHEALTHY, first.reason, first.action, None if failure is None else str(failure)
    degraded = [r for r in results if r.health is Health.DEGRADED]
    functional = [r for r in results if r.check in FUNCTIONAL_PROBES or r.check in ("startup", "collective")]
    unknown_functional = [r for r in functional if r.health is Health.UNKNOWN]
    if unknown_functional:
        first = unknown_functional[0]
        return Health.UNKNOWN, f"{first.check}: {first.reason}", first.action, None
    if not functional:
        return Health.UNKNOWN, "no functional check ran", Action.RETRY, None
    if degraded:
        action = next((r.action for r in degraded if r.action is not Action.NONE), Action.NONE)
        return Health.DEGRADED, "; ".join(f"{r.check}: {r.reason}" for r in degraded), action, None
    passed = len(functional)
    seconds = sum(r.duration_s or 0.0 for r in results)
    reason = f"{passed} of {passed} checks passed in {seconds:.2f} s"
    missing = [r for r in results if r.health is Health.UNKNOWN]
    if missing:
        reason += "; " + "; ".join(f"{r.check}: {r.reason}" for r in missing)
    return Health.HEALTHY, reason, Action.NONE, None


@dataclass(frozen=True)
class GroupOutcome:
    """One all-reduce over a group of devices, judged: correct, finished in time, fast enough."""

    devices: tuple[int, ...]
    ok: bool
    reason: str
    failure: str | None = None
    busbw_gbps: float | None = None
    duration_s: float | None = None
    ranks: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "ok": self.ok,
            "reason": self.reason,
            "failure": self.failure,
            "busbw_gbps": _round(self.busbw_gbps, 4),
            "duration_s": _round(self.duration_s),
            "ranks": [dict(r) for r in self.ranks],
        }


@dataclass(frozen=True)
class BisectionReport:
    bad: tuple[int, ...]
    cleared: tuple[int, ...]
    unresolved: tuple[int, ...]
    steps: tuple[GroupOutcome, ...]
    reasons: dict[int, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bad": list(self.bad),
            "cleared": list(self.cleared),
            "unresolved": list(self.unresolved),
            "reasons": {str(k): v for k, v in self.reasons.items()},
            "steps": [s.to_dict() for s in self.steps],
        }


@dataclass(frozen=True)
class CollectiveReport:
    backend: str
    devices: tuple[int, ...]
    ok: bool | None  # None: not run (fewer than two devices, or disabled)
    health: Health
    reason: str
    busbw_gbps: float | None = None
    min_busbw_gbps: float | None = None
    duration_s: float | None = None
    run: GroupOutcome | None = None
    bisection: BisectionReport | None = None
    confirm: GroupOutcome | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "devices": list(self.devices),
            "ok": self.ok,
            "health": self.health.value,
            "reason": self.reason,
            "busbw_gbps": _round(self.busbw_gbps, 4),
            "min_busbw_gbps": self.min_busbw_gbps,
            "duration_s": _round(self.duration_s),
            "run": None if self.run is None else self.run.to_dict(),
            "bisection": None if self.bisection is None else self.bisection.to_dict(),
            "confirm": None if self.confirm is None else self.confirm.to_dict(),
        }


@dataclass(frozen=True)
class PlacementReport:
    ok: bool
    devices: tuple[int, ...]
    tensor_parallel: int | None
    reason: str
    valid_sizes: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "devices": list(self.devices),
            "tensor_parallel": self.tensor_parallel,
            "reason": self.reason,
            "valid_sizes": None if self.valid_sizes is None else list(self.valid_sizes),
        }


@dataclass(frozen=True)
class PreflightReport:
    platform: str
    level: str
    devices: tuple[DeviceReport, ...]
    collective: CollectiveReport
    placement: PlacementReport
    discovery: dict[str, Any]
    quarantine: dict[str, Any]
    duration_s: float
    phases: dict[str, float]
    started_at: str
    has_model: bool
    identity: dict[str, Any] = field(default_factory=dict)

    @property
    def health(self) -> Health:
        """The host's health for this run: the worst of the devices probed and the collective."""
        if not self.devices:
            return Health.UNHEALTHY  # zero devices is not an empty success
        healths: Iterable[Health] = [d.health for d in self.devices]
        if self.collective.ok is not None:
            healths = [*healths, self.collective.health]
        return worst(healths)

    def exit_code(self) -> int:
        """0 placed; 3 refused. Without a model, 3 unless every device and the collective are healthy."""
        if self.has_model:
            return 0 if self.placement.ok else 3
        return 0 if self.placement.ok and self.health is Health.HEALTHY else 3

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "platform": self.platform,
            "level": self.level,
            "health": self.health.value,
            "started_at": self.started_at,
            "duration_s": _round(self.duration_s),
            "phases": {k: _round(v) for k, v in self.phases.items()},
            "discovery": self.discovery,
            "devices": [d.to_dict() for d in self.devices],
            "collective": self.collective.to_dict(),
            "placement": self.placement.to_dict(),
            "quarantine": self.quarantine,
            "identity": self.identity,
        }


def render_text(report: PreflightReport) -> str:
    lines = [
        f"preflight {report.level} on {report.platform}: {report.health.value} "
        f"({plural(len(report.devices), 'device')}, {report.duration_s:.1f} s)"
    ]
    for device in report.devices:
        tag = " [quarantined]" if device.quarantined else ""
        took = "" if device.duration_s is None else f" {device.duration_s:.1f}s"
        lines.append(f"  device {device.index} {device.name}: {device.health.value}{tag}{took} — {device.reason}")
        if device.action is not Action.NONE:
            lines.append(f"      action: {device.action.value}")
    c = report.collective
    state = "not run" if c.ok is None else ("ok" if c.ok else "FAILED")
    devices = ",".join(map(str, c.devices)) or "-"
    lines.append(f"  collective {c.backend} [{devices}]: {state} — {c.reason}")
    if c.bisection is not None:
        for step in c.bisection.steps:
            lines.append(f"      bisect {list(step.devices)}: {'ok' if step.ok else 'failed'} — {step.reason}")
    p = report.placement
    if p.ok:
        tp = "?" if p.tensor_parallel is None else str(p.tensor_parallel)
        lines.append(f"  placement: TP{tp} on devices {list(p.devices)} — {p.reason}")
    else:
        lines.append(f"  placement: REFUSED — {p.reason}")
    q = report.quarantine
    if q.get("entries"):
        listed = ", ".join(f"{e['device']} ({e['reason']})" for e in q["entries"])
        lines.append(f"  quarantined ({q.get('path')}): {listed}")
    return "\n".join(lines)
