"""Run every rule over one `GuardFacts` and gather the findings, waivers applied.

A rule never takes the guard down: a missing fact (`FactUnavailable`) and any exception a rule
raises both become an `unknown` finding that says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.guard.engine_args import FactUnavailable
from service.guard.facts import GuardFacts, Placement, build_facts
from service.guard.findings import Finding, GuardReport, Severity, Status
from service.guard.rules import ALL_RULES
from service.guard.rules._base import ALL_PLATFORMS, Rule
from service.profile import LoadedProfile

WAIVER_RULE_ID = "waiver-unknown-rule"
WAIVER_REMEDY = "fix the rule id in guard.waive (see `warden check --json` for the ids)"
WAIVER_EVIDENCE = "a misspelt waiver waives nothing, while its author believes the rule is waived"


def _finding(rule: Rule, facts: GuardFacts) -> Finding:
    severity = rule.severity_on(facts.platform)
    status: Status
    if severity is None:
        status, reason = "not-applicable", f"applies to {', '.join(rule.platforms)}, not {facts.platform}"
    else:
        try:
            verdict = rule.check(facts)
        except FactUnavailable as missing:
            status, reason = "unknown", str(missing)
        except Exception as error:  # a rule bug must not take the guard down; it is reported instead
            status, reason = "unknown", f"the rule could not be evaluated: {type(error).__name__}: {error}"
        else:
            status, reason = ("fail" if verdict.failed else "pass"), verdict.reason
    waiver = facts.waivers.get(rule.id)
    return Finding(
        rule=rule.id,
        status=status,
        severity=severity,
        reason=reason,
        remedy=rule.remedy,
        evidence=rule.evidence,
        platforms=rule.platforms,
        waived=waiver is not None and status == "fail",
        waiver_reason=waiver,
    )


def _waiver_finding(facts: GuardFacts, known: set[str]) -> Finding:
    unknown = sorted(rule_id for rule_id in facts.waivers if rule_id not in known)
    reason = (
        f"guard.waive names rules that do not exist: {', '.join(unknown)}" if unknown else "every waiver names a rule"
    )
    return Finding(
        rule=WAIVER_RULE_ID,
        status="fail" if unknown else "pass",
        severity="warn",
        reason=reason,
        remedy=WAIVER_REMEDY,
        evidence=WAIVER_EVIDENCE,
        platforms=ALL_PLATFORMS,
    )


def evaluate(facts: GuardFacts, rules: Sequence[Rule] = ALL_RULES) -> GuardReport:
    findings = [_finding(rule, facts) for rule in rules]
    findings.append(_waiver_finding(facts, {rule.id for rule in rules}))
    return GuardReport(
        profile=facts.profile_name,
        platform=facts.platform,
        findings=tuple(findings),
        engine_args_status=facts.engine_args.status,
        engine_args_error=facts.engine_args.error,
    )


def guard_profile(
    loaded: LoadedProfile,
    *,
    placement: Placement | None = None,
    quarantined: Mapping[int, str] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> GuardReport:
    """Facts from `loaded` (and the caller's placement and quarantine), evaluated by every rule."""
    return evaluate(build_facts(loaded, placement=placement, quarantined=quarantined, base_env=base_env))


def rule_ids() -> tuple[str, ...]:
    return (*(r.id for r in ALL_RULES), WAIVER_RULE_ID)


def rule_severities() -> dict[str, tuple[Severity, ...]]:
    """Every (rule, severity) pair a report can contain: the label sets metrics pre-initialise."""
    out: dict[str, tuple[Severity, ...]] = {r.id: tuple(sorted(set(r.severities.values()))) for r in ALL_RULES}
    out[WAIVER_RULE_ID] = ("warn",)
    return out
