"""`warden canary [--url URL | --profile P] [--suite json|color|all] [--repeats N] [--reference FILE] [--out FILE]`.

Exit 0 when every answer matched (the reference's tokens, else the case's first repeat) and every JSON answer parsed;
3 when any did not; 1 when the engine cannot be reached or the reference is unusable (nothing is asked then).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
from pathlib import Path

from service.argtypes import count_at_least
from service.canary.reference import load_reference, write_reference
from service.canary.runner import EngineError, SuiteResult, http_post, run_suite
from service.canary.suites import DEFAULT_REPEATS, SUITES
from service.errors import UserError
from service.profile import load_profile, reachable_url
from service.supervisor.readiness import model_ids, request_json

DEFAULT_URL = "http://127.0.0.1:8000"
SHOWN_MISMATCHES = 5


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "canary", help="repeated greedy completions through the endpoint, judged for determinism or against a reference"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help=f"the engine's OpenAI-compatible server (default {DEFAULT_URL})")
    where.add_argument("--profile", help="take the engine's address and served model name from this profile")
    parser.add_argument("--model", help="served model name (default: the profile's, else the first /v1/models lists)")
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all", help="default %(default)s")
    parser.add_argument(
        "--repeats", type=count_at_least(1), default=DEFAULT_REPEATS, help="per case (default %(default)s)"
    )
    parser.add_argument("--reference", type=Path, help="judge against this run's answers (from --out) instead")
    parser.add_argument("--out", type=Path, help="write this run's answers as a reference (only if it was consistent)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per request (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="the results as JSON")
    parser.set_defaults(func=run_canary)


def _engine(args: argparse.Namespace) -> tuple[str, str | None]:
    if args.profile:
        loaded = load_profile(args.profile)
        engine = loaded.profile.engine
        return reachable_url(engine.host, engine.port), args.model or loaded.served_name
    url = (args.url or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url {url!r} is not an http(s) URL", f"pass the engine's address, e.g. {DEFAULT_URL}")
    return url, args.model


def served_model(url: str, timeout_s: float) -> str:
    """The first model the engine lists: what a single-model vLLM server serves."""
    try:
        status, body = request_json(f"{url}/v1/models", timeout_s)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UserError(
            f"engine not reachable at {url}: {reason}", "start the engine (`warden run PROFILE`) or pass its --url"
        ) from None
    models = model_ids(body) if status == 200 else []
    if not models:
        raise UserError(f"GET {url}/v1/models answered {status} with no model", "pass --model NAME")
    return str(models[0])


def render(results: list[SuiteResult], url: str, model: str) -> str:
    lines = [f"canary at {url} (model {model})"]
    for result in results:
        lines.append(f"{result.suite:<6} {result.matched}/{result.total} against the {result.against}")
        for mismatch in result.mismatches[:SHOWN_MISMATCHES]:
            lines.append(f"  {mismatch.case} repeat {mismatch.repeat}: {mismatch.reason}")
        if len(result.mismatches) > SHOWN_MISMATCHES:
            lines.append(f"  ... {len(result.mismatches) - SHOWN_MISMATCHES} more (--json lists all)")
    lines.append("result: " + ("ok" if all(r.ok for r in results) else "MISMATCH"))
    return "\n".join(lines)


def run_canary(args: argparse.Namespace) -> int:
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    reference = load_reference(args.reference, suites) if args.reference else None  # before asking anything
    url, model = _engine(args)
    model = model or served_model(url, args.timeout_s)
    post = http_post(url, args.timeout_s)
    results: list[SuiteResult] = []
    try:
        for suite in suites:
            expected = reference[suite] if reference is not None else None
            results.append(
                run_suite(
                    post,
                    suite,
                    SUITES[suite],
                    model=model,
                    repeats=args.repeats,
                    reference=expected,
                    progress=lambda line: print(f"mismatch: {line}", file=sys.stderr),
                )
            )
    except EngineError as error:
        raise UserError(f"{error} (after {sum(r.total for r in results)} answers)", "check the engine's log") from None
    ok = all(r.ok for r in results)
    if args.out is not None:
        if ok:
            write_reference(args.out, model, {r.suite: r.answers for r in results})
        else:
            print(f"warden: not writing {args.out}: this run did not agree with itself", file=sys.stderr)
    print(json.dumps([r.to_json() for r in results], indent=1) if args.json else render(results, url, model))
    return 0 if ok else 3
