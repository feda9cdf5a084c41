"""The guard's metrics on a registry the caller owns (nothing registers at import time).

warden_guard_findings{rule,severity}   1 while the rule fails (waived or not), else 0
warden_guard_waived_findings{rule}     1 while a failing rule is waived
warden_guard_unknown_rules{rule}       1 while the rule could not be evaluated
warden_guard_refusals_total            guard runs that refused a launch
warden_identity_info{...}              the current run identity; value is always 1
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from service.guard.evaluate import rule_ids, rule_severities
from service.guard.findings import GuardReport
from service.identity import RunIdentity

IDENTITY_LABELS = ("fingerprint", "model", "platform", "tensor_parallel", "vllm_version", "warden_version")


class GuardMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.findings = Gauge(
            "warden_guard_findings",
            "1 while the guard rule fails on the current profile (waived findings included)",
            ["rule", "severity"],
            registry=registry,
        )
        for rule, severities in rule_severities().items():
            for severity in severities:
                self.findings.labels(rule, severity)
        self.waived = Gauge(
            "warden_guard_waived_findings",
            "1 while a failing guard rule is waived by the profile",
            ["rule"],
            registry=registry,
        )
        self.unknown = Gauge(
            "warden_guard_unknown_rules", "1 while a guard rule could not be evaluated", ["rule"], registry=registry
        )
        for rule in rule_ids():
            self.waived.labels(rule)
            self.unknown.labels(rule)
        self.refusals = Counter(
            "warden_guard_refusals", "guard evaluations that refused to launch the engine", registry=registry
        )
        self.identity = Gauge(
            "warden_identity_info", "the canonical run identity; value is always 1", IDENTITY_LABELS, registry=registry
        )

    def observe(self, report: GuardReport) -> None:
        """Set the gauges from `report`; count a refusal when it refuses. Call once per guard run."""
        pairs = rule_severities()
        for finding in report.findings:
            for severity in pairs.get(finding.rule, ()):
                failing = finding.failed and finding.severity == severity
                self.findings.labels(finding.rule, severity).set(1 if failing else 0)
            self.waived.labels(finding.rule).set(1 if finding.failed and finding.waived else 0)
            self.unknown.labels(finding.rule).set(1 if finding.status == "unknown" else 0)
        if report.refused:
            self.refusals.inc()

    def set_identity(self, identity: RunIdentity) -> None:
        fields = identity.fields
        model = fields.get("model") or {}
        self.identity.clear()
        self.identity.labels(
            identity.fingerprint,
            str(model.get("path", "")),
            str(fields.get("platform", "")),
            str(fields.get("tensor_parallel", "")),
            str(fields.get("vllm_version") or ""),
            str((fields.get("warden") or {}).get("version", "")),
        ).set(1)
