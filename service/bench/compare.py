"""`warden bench compare A B [--vary FIELD ...]`: two decode benchmarks side by side, only when they are comparable.

Comparable means the same run identity, the same placement and the same request, except for the fields named with
`--vary` (a dotted identity path such as `speculative` or `engine_args.max_num_seqs`, or `placement`): a change is
measured by naming it, and everything else that differs is a reason to refuse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.bench.decode import FORMAT
from service.errors import UserError
from service.identity import Difference, diff_identities

# what a run did, not what it measured under: these may differ
_RUN_ONLY_PARAMS = ("runs", "warmup")


def load_bench(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"{path} cannot be read: {error.strerror}", "pass files `warden bench --out` wrote") from None
    except json.JSONDecodeError as error:
        raise UserError(
            f"{path} is not JSON ({error.msg}, line {error.lineno})", "pass files `warden bench --out` wrote"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("summary"), dict):
        raise UserError(f"{path} is not a warden benchmark ({FORMAT})", "pass files `warden bench --out` wrote")
    return data


def _named(field: str, vary: list[str]) -> bool:
    return any(field == v or field.startswith(v + ".") for v in vary)


@dataclass(frozen=True)
class Comparison:
    comparable: bool
    reason: str
    allowed: list[Difference]  # differences named by --vary
    blocking: list[Difference]  # differences that make the numbers incomparable


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[Difference]:
    """Identity, placement and request fields that differ, by dotted path."""

    def request(data: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in (data.get("params") or {}).items() if k not in _RUN_ONLY_PARAMS}

    return [
        *diff_identities(a["identity"]["identity"], b["identity"]["identity"]),
        *diff_identities({"placement": a.get("placement")}, {"placement": b.get("placement")}),
        *diff_identities({"params": request(a)}, {"params": request(b)}),
    ]


def compare(a: dict[str, Any], b: dict[str, Any], vary: list[str]) -> Comparison:
    for name, data in (("A", a), ("B", b)):
        identity = data.get("identity")
        if not isinstance(identity, dict) or not isinstance(identity.get("identity"), dict):
            return Comparison(
                False, f"{name} has no run identity (it was measured without a supervisor's /identity)", [], []
            )
    found = differences(a, b)
    allowed = [d for d in found if _named(d.field, vary)]
    blocking = [d for d in found if not _named(d.field, vary)]
    if blocking:
        return Comparison(
            False, f"A and B differ in {len(blocking)} field(s) that --vary does not name", allowed, blocking
        )
    what = f"differ only in what --vary names ({len(allowed)} field(s))" if allowed else "share one identity"
    return Comparison(True, f"A and B {what}", allowed, [])


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _rate(data: dict[str, Any]) -> float:
    return float(data["summary"]["decode_tokens_per_s_median"])


def render(a_path: Path, a: dict[str, Any], b_path: Path, b: dict[str, Any], result: Comparison) -> str:
    lines = []
    for name, path, data in (("A", a_path, a), ("B", b_path, b)):
        fingerprint = (data.get("identity") or {}).get("fingerprint") or "no identity"
        summary = data["summary"]
        lines.append(
            f"{name}: {path}  {fingerprint[:12]}  decode {summary['decode_tokens_per_s_median']} tok/s "
            f"(median of {len(data.get('runs', []))}), first token {summary['ttft_s_median']} s"
        )
    for label, found in (("varies (--vary)", result.allowed), ("differs", result.blocking)):
        lines.extend(f"  {label}: {d.field}: {_shown(d.a)} -> {_shown(d.b)}" for d in found)
    if result.comparable:
        lines.append(f"{result.reason}: B/A decode {_rate(b) / _rate(a):.3f}x" if _rate(a) > 0 else result.reason)
    else:
        lines.append(f"not comparable: {result.reason}")
        lines.append(
            "  remedy: measure both in one identity, or name what is meant to differ (--vary FIELD, a dotted path "
            "from `warden identity diff`)"
        )
    return "\n".join(lines)
