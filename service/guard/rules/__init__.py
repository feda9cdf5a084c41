"""Every guard rule, in the order reports list them. Rule ids are a contract: never rename one."""

from __future__ import annotations

from service.guard.rules import capture, cpu, engine, moe, placement, replayssm, speculation
from service.guard.rules._base import ALL_PLATFORMS, Rule, Verdict, fail, ok, rule

ALL_RULES: tuple[Rule, ...] = (
    *engine.RULES,
    *capture.RULES,
    *moe.RULES,
    *speculation.RULES,
    *replayssm.RULES,
    *placement.RULES,
    *cpu.RULES,
)

RULES_BY_ID: dict[str, Rule] = {r.id: r for r in ALL_RULES}
if len(RULES_BY_ID) != len(ALL_RULES):  # pragma: no cover - a programming error caught at import
    raise RuntimeError("two guard rules share an id")

__all__ = ["ALL_PLATFORMS", "ALL_RULES", "RULES_BY_ID", "Rule", "Verdict", "fail", "ok", "rule"]
