"""The guard: rules that refuse capture-unsafe and known-bad engine configs before a device is touched.

facts = build_facts(loaded, placement=..., quarantined=...)   # one normalized view
report = evaluate(facts)                                       # findings as values
report.refused, report.to_json()
"""

from service.guard.engine_args import EngineArgsFacts, FactUnavailable, normalize_engine_args
from service.guard.evaluate import evaluate, guard_profile, rule_ids, rule_severities
from service.guard.facts import GuardFacts, ModelFacts, Placement, build_facts
from service.guard.findings import Finding, GuardReport, Severity, Status
from service.guard.rules import ALL_RULES, RULES_BY_ID, Rule

__all__ = [
    "ALL_RULES",
    "RULES_BY_ID",
    "EngineArgsFacts",
    "FactUnavailable",
    "Finding",
    "GuardFacts",
    "GuardReport",
    "ModelFacts",
    "Placement",
    "Rule",
    "Severity",
    "Status",
    "build_facts",
    "evaluate",
    "guard_profile",
    "normalize_engine_args",
    "rule_ids",
    "rule_severities",
]
