"""Run the guard in a child process, so the supervisor never imports vLLM.

Normalizing engine arguments imports vLLM's parser (~10 s, ~0.5 GB); the supervisor runs for
weeks and needs neither. `evaluate_in_child` starts `python -m service.guard.child`, sends the
request as JSON on stdin and reads the report and identity back; the child exits right after.

Request:  {"profile": PATH, "placement": {"platform", "devices", "tensor_parallel"} | null,
           "quarantined": {"3": "reason"} | null}
Response: {"report": GuardReport JSON, "identity": RunIdentity JSON | null, "identity_error": str | null}
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.guard.findings import GuardReport
from service.identity import RunIdentity


class GuardUnavailable(Exception):
    """The guard itself could not run (crashed, timed out, garbled output)."""


@dataclass(frozen=True)
class GuardOutcome:
    report: GuardReport
    identity: RunIdentity | None
    identity_error: str | None


def evaluate_in_child(
    profile_path: Path,
    *,
    placement: Mapping[str, Any] | None,
    quarantined: Mapping[int, str] | None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 180.0,
    python: str = sys.executable,
) -> GuardOutcome:
    request = {
        "profile": str(profile_path),
        "placement": dict(placement) if placement is not None else None,
        "quarantined": None if quarantined is None else {str(k): v for k, v in quarantined.items()},
    }
    try:
        done = subprocess.run(
            [python, "-m", "service.guard.child"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=None if env is None else dict(env),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GuardUnavailable(f"the guard did not finish within {timeout_s:.0f}s") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise GuardUnavailable(f"the guard exited with code {done.returncode}: {tail}")
    try:
        response = json.loads(done.stdout.strip().splitlines()[-1])
        identity = response["identity"]
        return GuardOutcome(
            report=GuardReport.from_json(response["report"]),
            identity=None if identity is None else RunIdentity(fields=identity["identity"]),
            identity_error=response["identity_error"],
        )
    except (IndexError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise GuardUnavailable(f"the guard's answer could not be read: {error!r}") from None


def _respond(request: dict[str, Any]) -> dict[str, Any]:
    # Imported here: the parent process only needs the JSON side of this module.
    from service.guard.evaluate import evaluate
    from service.guard.facts import Placement, build_facts
    from service.identity import IdentityUnavailable, build_identity
    from service.profile import load_profile

    raw = request.get("placement")
    placement = (
        None
        if raw is None
        else Placement(
            platform=raw["platform"],
            devices=None if raw["devices"] is None else tuple(raw["devices"]),
            tensor_parallel=int(raw["tensor_parallel"]),
        )
    )
    quarantined = request.get("quarantined")
    facts = build_facts(
        load_profile(request["profile"]),
        placement=placement,
        quarantined=None if quarantined is None else {int(k): str(v) for k, v in quarantined.items()},
    )
    report = evaluate(facts)
    try:
        identity: dict[str, Any] | None = build_identity(facts).to_json()
        identity_error = None
    except IdentityUnavailable as error:
        identity, identity_error = None, str(error)
    return {"report": report.to_json(), "identity": identity, "identity_error": identity_error}


def main() -> int:
    response = _respond(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(response) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
