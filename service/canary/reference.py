"""Reference files: one run's answers (token ids per case), kept to judge another identity's run against, as the seeds
judged speculative decoding against no-spec. A reference holds each case's prompt, token budget and shape too, so a
run is never judged against answers to other questions."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from service.canary.suites import SUITES, Case
from service.errors import UserError

FORMAT = "warden-canary/1"
REMEDY = "make a new reference from the identity you trust: `warden canary ... --out FILE`"


def _case_fields(case: Case) -> dict[str, Any]:
    return {"prompt": case.prompt, "max_tokens": case.max_tokens, "regex": case.regex}


def reference_json(model: str, answers: dict[str, dict[str, list[int]]]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "model": model,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "suites": {
            suite: {case.name: {**_case_fields(case), "tokens": by_case[case.name]} for case in SUITES[suite]}
            for suite, by_case in answers.items()
        },
    }


def write_reference(path: Path, model: str, answers: dict[str, dict[str, list[int]]]) -> None:
    path.write_text(json.dumps(reference_json(model, answers), indent=1) + "\n", encoding="utf-8")


def load_reference(path: Path, suites: list[str]) -> dict[str, dict[str, list[int]]]:
    """Each requested suite's expected tokens per case; UserError naming the file and the field otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"--reference {path} cannot be read: {error.strerror}", REMEDY) from None
    except json.JSONDecodeError as error:
        raise UserError(f"--reference {path} is not JSON ({error.msg}, line {error.lineno})", REMEDY) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"--reference {path} is not a warden canary reference (format {FORMAT})", REMEDY)
    stored = data.get("suites")
    expected: dict[str, dict[str, list[int]]] = {}
    for suite in suites:
        cases = stored.get(suite) if isinstance(stored, dict) else None
        if not isinstance(cases, dict):
            raise UserError(f"--reference {path} has no suite {suite!r}", f"run --suite with what it has, or {REMEDY}")
        expected[suite] = {}
        for case in SUITES[suite]:
            entry = cases.get(case.name)
            where = f"--reference {path}: suite {suite!r} case {case.name!r}"
            if not isinstance(entry, dict) or not isinstance(entry.get("tokens"), list):
                raise UserError(f"{where} is missing or has no tokens", REMEDY)
            changed = [name for name, value in _case_fields(case).items() if entry.get(name) != value]
            if changed:
                raise UserError(f"{where} was made with another {', '.join(changed)} than this warden's", REMEDY)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in entry["tokens"]):
                raise UserError(f"{where}: tokens are not all integers", REMEDY)
            expected[suite][case.name] = entry["tokens"]
    return expected
