"""What the guard says about a profile: one `Finding` per rule, gathered in a `GuardReport`.

Findings are values, never exceptions: the caller decides what a refusal means (exit 3 for
`warden check`, no launch for `warden run`). A rule that could not be evaluated is `unknown`,
never `pass`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["refuse", "warn"]
Status = Literal["pass", "fail", "unknown", "not-applicable"]
SEVERITIES: tuple[Severity, ...] = ("refuse", "warn")


@dataclass(frozen=True)
class Finding:
    rule: str
    status: Status
    severity: Severity | None  # None when the rule does not apply to the platform
    reason: str
    remedy: str
    evidence: str
    platforms: tuple[str, ...]
    waived: bool = False
    waiver_reason: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    @property
    def refuses(self) -> bool:
        """A failing `refuse` rule that no waiver covers: the run must not start."""
        return self.status == "fail" and self.severity == "refuse" and not self.waived

    @property
    def warns(self) -> bool:
        return self.status == "fail" and self.severity == "warn" and not self.waived

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(
            rule=data["rule"],
            status=data["status"],
            severity=data["severity"],
            reason=data["reason"],
            remedy=data["remedy"],
            evidence=data["evidence"],
            platforms=tuple(data["platforms"]),
            waived=data["waived"],
            waiver_reason=data["waiver_reason"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status,
            "severity": self.severity,
            "waived": self.waived,
            "waiver_reason": self.waiver_reason,
            "reason": self.reason,
            "remedy": self.remedy,
            "evidence": self.evidence,
            "platforms": list(self.platforms),
        }


@dataclass(frozen=True)
class GuardReport:
    profile: str
    platform: str
    findings: tuple[Finding, ...]
    engine_args_status: str = "parsed"
    engine_args_error: str | None = None

    @property
    def refused(self) -> bool:
        return any(f.refuses for f in self.findings)

    @property
    def refusals(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.refuses)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.warns)

    @property
    def waived(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.failed and f.waived)

    @property
    def unknown(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "unknown")

    @property
    def passed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "pass")

    def finding(self, rule: str) -> Finding:
        for f in self.findings:
            if f.rule == rule:
                return f
        raise KeyError(rule)

    def counts(self) -> dict[str, int]:
        return {
            "refuse": len(self.refusals),
            "warn": len(self.warnings),
            "waived": len(self.waived),
            "unknown": len(self.unknown),
            "pass": len(self.passed),
            "not_applicable": sum(1 for f in self.findings if f.status == "not-applicable"),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GuardReport:
        return cls(
            profile=data["profile"],
            platform=data["platform"],
            findings=tuple(Finding.from_json(f) for f in data["findings"]),
            engine_args_status=data["engine_args"]["status"],
            engine_args_error=data["engine_args"]["error"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "platform": self.platform,
            "refused": self.refused,
            "counts": self.counts(),
            "engine_args": {"status": self.engine_args_status, "error": self.engine_args_error},
            "findings": [f.to_json() for f in self.findings],
        }
