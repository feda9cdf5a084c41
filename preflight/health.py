"""Health results as values: one shape for every probe, device, collective and placement answer.

Absence of data is never healthy: a probe that did not run, a counter that could not be read or a
device that was not found is `unknown`, and callers decide what `unknown` means for them (placement
never uses an `unknown` device).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class Action(StrEnum):
    """The closed set of things an operator (or the supervisor) can do about a result."""

    NONE = "none"
    RETRY = "retry"  # transient or unexplained: run preflight again
    REAP_PROCESSES = "reap-processes"  # other processes hold the device: `warden reap`
    RESET_DEVICE = "reset-device"  # lost, hung or crashed: reset the device or reboot the host
    INSPECT_HARDWARE = "inspect-hardware"  # wrong results, memory errors, slow links
    CHECK_SOFTWARE = "check-software"  # driver, runtime or torch missing or broken


# Worst first; `unknown` ranks below `degraded` when results are combined, because a failed check
# outweighs a missing one, but `unknown` still never counts as healthy.
_SEVERITY = {Health.UNHEALTHY: 3, Health.DEGRADED: 2, Health.UNKNOWN: 1, Health.HEALTHY: 0}


def worst(healths: Iterable[Health]) -> Health:
    """The most severe health of several; no input at all is `unknown`."""
    found = list(healths)
    if not found:
        return Health.UNKNOWN
    return max(found, key=lambda h: _SEVERITY[h])


@dataclass(frozen=True)
class CheckResult:
    """One probe's answer: what was checked, how healthy, why (a sentence with counts), what to do."""

    check: str
    health: Health
    reason: str
    action: Action = Action.NONE
    duration_s: float | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "health": self.health.value,
            "reason": self.reason,
            "action": self.action.value,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 4),
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckResult:
        duration = data.get("duration_s")
        return cls(
            check=str(data["check"]),
            health=Health(data["health"]),
            reason=str(data["reason"]),
            action=Action(data.get("action", Action.NONE.value)),
            duration_s=None if duration is None else float(duration),
            evidence=dict(data.get("evidence") or {}),
        )


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 device`, `3 devices`: reasons carry counts, and counts need the right noun."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
