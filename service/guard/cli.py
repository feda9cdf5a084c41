"""`warden check` and `warden identity`: the guard's and the run identity's command line.

Exit codes follow the CLI contract: 0 ok, 1 error, 2 usage, 3 refused (check) or the identities
differ (identity diff).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from preflight.platforms import resolve_platform
from preflight.profiles import quarantined_devices
from preflight.quarantine import QuarantineError
from service.errors import UserError
from service.guard.evaluate import guard_profile
from service.guard.facts import build_facts
from service.guard.findings import Finding, GuardReport
from service.identity import IdentityUnavailable, RunIdentity, build_identity, diff_identities, fingerprint
from service.profile import LoadedProfile, load_profile

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_REFUSED = 3


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser("check", help="guard a profile: refuse capture-unsafe and known-bad engine configs")
    check.add_argument("profile", help="profile YAML")
    check.add_argument("--json", action="store_true", help="print the findings as JSON")
    check.set_defaults(func=cmd_check)

    identity = commands.add_parser(
        "identity",
        help="canonical run identity and its fingerprint; `identity diff A B` lists the fields that differ",
        usage="warden identity PROFILE [--json]\n       warden identity diff A B [--json]",
    )
    identity.add_argument(
        "items", nargs="+", metavar="PROFILE", help="a profile, or `diff A B` (profiles or identity JSON files)"
    )
    identity.add_argument("--json", action="store_true", help="print JSON")
    identity.set_defaults(func=cmd_identity)


# ---- check --------------------------------------------------------------------------------

_LABELS = {"refuse": "REFUSE", "warn": "WARN"}


def _finding_lines(finding: Finding) -> list[str]:
    if finding.status == "unknown":
        label = "UNKNOWN"
    elif finding.waived:
        label = "WAIVED"
    else:
        label = _LABELS[finding.severity or "warn"]
    lines = [f"{label:<8} {finding.rule}: {finding.reason}"]
    indent = " " * 9
    if finding.waived:
        lines.append(f"{indent}waived: {finding.waiver_reason}")
    if finding.status == "fail":
        lines.append(textwrap.fill(f"remedy: {finding.remedy}", 118, initial_indent=indent, subsequent_indent=indent))
        lines.append(
            textwrap.fill(f"evidence: {finding.evidence}", 118, initial_indent=indent, subsequent_indent=indent)
        )
    return lines


def format_report(report: GuardReport) -> str:
    lines = [f"warden check: profile {report.profile} on {report.platform}"]
    if report.engine_args_status != "parsed":
        lines.append(f"engine.args not normalized ({report.engine_args_status}): {report.engine_args_error}")
    for group in (report.refusals, report.warnings, report.waived, report.unknown):
        for finding in group:
            lines.extend(_finding_lines(finding))
    counts = report.counts()
    summary = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.items())
    lines.append(f"result: {'REFUSED' if report.refused else 'ok'} ({summary})")
    return "\n".join(lines)


def _recorded_quarantine(loaded: LoadedProfile) -> dict[int, str]:
    """The host's quarantine record (no device is touched), for `unhealthy-device-selected`."""
    try:
        return quarantined_devices(loaded, resolve_platform(loaded.profile.platform))
    except QuarantineError as error:
        raise UserError(
            str(error), "fix or remove the file, or clear devices with `warden preflight --clear`"
        ) from None


def cmd_check(args: argparse.Namespace) -> int:
    loaded = load_profile(args.profile)
    report = guard_profile(loaded, quarantined=_recorded_quarantine(loaded))
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=False))
    else:
        print(format_report(report))
    return EXIT_REFUSED if report.refused else EXIT_OK


# ---- identity -----------------------------------------------------------------------------


def profile_identity(path: str) -> RunIdentity:
    try:
        return build_identity(build_facts(load_profile(path)))
    except IdentityUnavailable as error:
        raise UserError(
            f"no run identity for {path}: {error}",
            "run warden where vLLM is installed, and fix engine.args until `warden check` accepts them",
        ) from None


def _identity_fields(path: str) -> dict[str, Any]:
    """A profile's identity, or one read from a JSON file `warden identity --json` wrote."""
    if not path.endswith(".json"):
        return dict(profile_identity(path).fields)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"cannot read identity {path}: {error}", "pass `warden identity --json` output") from None
    if isinstance(data, dict) and isinstance(data.get("identity"), dict):
        data = data["identity"]
    if not isinstance(data, dict):
        raise UserError(f"{path} holds no identity object", "pass `warden identity --json` output")
    return data


def _cmd_identity_diff(a: str, b: str, as_json: bool) -> int:
    left, right = _identity_fields(a), _identity_fields(b)
    differences = diff_identities(left, right)
    if as_json:
        print(
            json.dumps(
                {
                    "identical": not differences,
                    "a": {"source": a, "fingerprint": fingerprint(left)},
                    "b": {"source": b, "fingerprint": fingerprint(right)},
                    "differences": [d.to_json() for d in differences],
                },
                indent=2,
            )
        )
    elif not differences:
        print(f"identical: {fingerprint(left)}")
    else:
        print(f"a: {a} {fingerprint(left)}\nb: {b} {fingerprint(right)}")
        for d in differences:
            print(f"{d.field}: {json.dumps(d.a, sort_keys=True)} != {json.dumps(d.b, sort_keys=True)}")
    return EXIT_OK if not differences else EXIT_REFUSED


def cmd_identity(args: argparse.Namespace) -> int:
    items: list[str] = args.items
    if items[0] == "diff" and len(items) == 3:
        return _cmd_identity_diff(items[1], items[2], args.json)
    if len(items) != 1:
        raise UserError(
            f"warden identity takes one profile or `diff A B`, got {items}",
            "run `warden identity PROFILE` or `warden identity diff A B`",
            exit_code=EXIT_USAGE,
        )
    identity = profile_identity(items[0])
    if args.json:
        print(json.dumps(identity.to_json(), indent=2, sort_keys=True))
    else:
        print(f"fingerprint: {identity.fingerprint}")
        print(json.dumps(identity.fields, indent=2, sort_keys=True))
    return EXIT_OK
