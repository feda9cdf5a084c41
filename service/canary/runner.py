"""Run canary suites against an engine and judge every answer: against the reference run's tokens when there is one,
else against the suite's first repeat of the same case (determinism). Results are values; nothing here exits."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from service.canary.suites import Case
from service.supervisor.readiness import request_json

Post = Callable[[str, dict[str, Any]], tuple[int, Any]]


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    text: str
    finish_reason: str | None


@dataclass(frozen=True)
class Mismatch:
    case: str
    repeat: int
    reason: str  # one sentence: the first differing token, an invalid answer, or the engine's error


@dataclass
class SuiteResult:
    suite: str
    against: str  # "reference" | "first repeat"
    total: int = 0
    matched: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    answers: dict[str, list[int]] = field(default_factory=dict)  # each case's first answer: a reference's content

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.matched == self.total

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "against": self.against,
            "matched": self.matched,
            "total": self.total,
            "ok": self.ok,
            "mismatches": [{"case": m.case, "repeat": m.repeat, "reason": m.reason} for m in self.mismatches],
        }


class EngineError(Exception):
    """The engine could not be asked at all (not reachable): the canary has no verdict."""


def http_post(base_url: str, timeout_s: float) -> Post:
    def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        try:
            return request_json(f"{base_url}{path}", timeout_s, body)
        except (urllib.error.URLError, OSError) as error:
            raise EngineError(f"engine not reachable at {base_url}: {getattr(error, 'reason', error)}") from None

    return post


def ask(post: Post, case: Case, model: str) -> Answer | str:
    """The engine's answer, or why there is none (an HTTP error, a malformed body)."""
    status, body = post("/v1/completions", case.request(model))
    if status != 200 or not isinstance(body, dict):
        return f"POST /v1/completions answered {status}: {str(body)[:200]}"
    try:
        choice = body["choices"][0]
        return Answer([int(t) for t in choice["token_ids"]], str(choice["text"]), choice.get("finish_reason"))
    except (KeyError, IndexError, TypeError, ValueError):
        return "the completion has no choices[0].token_ids (an engine without return_token_ids?)"


def first_difference(expected: list[int], got: list[int]) -> str:
    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), min(len(expected), len(got)))
    want = expected[at] if at < len(expected) else "the end"
    have = got[at] if at < len(got) else "the end"
    return f"token {at} is {have}, expected {want} ({len(got)} tokens against {len(expected)})"


def judge(case: Case, answer: Answer, expected: list[int] | None) -> str | None:
    if case.regex is not None and answer.finish_reason == "stop":
        try:
            json.loads(answer.text)
        except json.JSONDecodeError:
            return f"the answer is not JSON: {answer.text[:80]!r}"
    if expected is not None and answer.tokens != expected:
        return first_difference(expected, answer.tokens)
    return None


def run_suite(
    post: Post,
    suite: str,
    cases: list[Case],
    *,
    model: str,
    repeats: int,
    reference: dict[str, list[int]] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> SuiteResult:
    """Every case `repeats` times, one request at a time, in case order within each repeat (so that a drift
    over the run shows as a repeat index, as the seeds' mismatch at repeat 6 did)."""
    result = SuiteResult(suite, "reference" if reference is not None else "first repeat")
    for repeat in range(repeats):
        for case in cases:
            answer = ask(post, case, model)
            result.total += 1
            expected = reference[case.name] if reference is not None else result.answers.get(case.name)
            reason = answer if isinstance(answer, str) else judge(case, answer, expected)
            if isinstance(answer, Answer):
                result.answers.setdefault(case.name, answer.tokens)
            if reason is None:
                result.matched += 1
            else:
                result.mismatches.append(Mismatch(case.name, repeat, reason))
                progress(f"{suite} {case.name} repeat {repeat}: {reason}")
    return result
