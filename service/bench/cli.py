"""`warden bench`: identity-stamped single-request decode benchmark; `warden bench compare A B` sets two side by side
only when they are comparable (exit 3 otherwise)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from service.argtypes import count_at_least
from service.bench.compare import compare, load_bench, render
from service.bench.decode import run_bench
from service.canary.cli import served_model
from service.errors import UserError
from service.profile import load_profile, reachable_url

DEFAULT_URL = "http://127.0.0.1:8000"
USAGE = (
    "warden bench [--profile P | --url URL [--api URL]] [--model NAME] [--max-tokens N] [--runs N] [--warmup N]\n"
    "                    [--out FILE] [--json]\n"
    "       warden bench compare A B [--vary FIELD ...] [--json]"
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "bench", help="identity-stamped single-request decode benchmark; `bench compare A B`", usage=USAGE
    )
    parser.add_argument("items", nargs="*", metavar="compare A B", help="compare two `--out` files")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help=f"the engine's server (default {DEFAULT_URL})")
    where.add_argument("--profile", help="the engine, its model name and the supervisor's API from this profile")
    parser.add_argument("--api", help="the supervisor whose /identity stamps the result (with --url)")
    parser.add_argument("--model", help="served model name (default: the profile's, else the first listed)")
    counts = [
        ("--max-tokens", 2, 128, "tokens per request, 2 or more (default %(default)s)"),
        ("--runs", 1, 5, "measured requests (default %(default)s)"),
        ("--warmup", 0, 1, "unmeasured requests first (default %(default)s)"),
    ]
    for flag, least, default, text in counts:
        parser.add_argument(flag, type=count_at_least(least), default=default, help=text)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request (default %(default)s)")
    parser.add_argument("--out", type=Path, help="write the result (JSON), for `bench compare`")
    parser.add_argument("--vary", action="append", default=[], metavar="FIELD",
                        help="compare: a field A and B may differ in (dotted identity path, or placement)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="the result as JSON")
    parser.set_defaults(func=run_bench_command)


def _compare(args: argparse.Namespace) -> int:
    a_path, b_path = Path(args.items[1]), Path(args.items[2])
    a, b = load_bench(a_path), load_bench(b_path)
    result = compare(a, b, args.vary)
    if args.json:
        print(json.dumps({
            "comparable": result.comparable,
            "reason": result.reason,
            "varies": [d.to_json() for d in result.allowed],
            "differs": [d.to_json() for d in result.blocking],
            "a": {"file": str(a_path), "summary": a["summary"]},
            "b": {"file": str(b_path), "summary": b["summary"]},
        }, indent=1))  # fmt: skip
    else:
        print(render(a_path, a, b_path, b, result))
    return 0 if result.comparable else 3


def run_bench_command(args: argparse.Namespace) -> int:
    if args.items:
        if args.items[0] != "compare" or len(args.items) != 3:
            raise UserError(f"warden bench takes options, or `compare A B`; got {args.items}", USAGE, exit_code=2)
        return _compare(args)
    if args.profile:
        loaded = load_profile(args.profile)
        profile = loaded.profile
        url = reachable_url(profile.engine.host, profile.engine.port)
        api: str | None = reachable_url(profile.api.host, profile.api.port)
        model = args.model or loaded.served_name
    else:
        url, api, model = (args.url or DEFAULT_URL).rstrip("/"), args.api, args.model
        for flag, value in (("--url", url), ("--api", api)):
            if value is not None and not value.startswith(("http://", "https://")):
                raise UserError(f"{flag} {value!r} is not an http(s) URL", f"e.g. {DEFAULT_URL}", exit_code=2)
    result = run_bench(
        url,
        model or served_model(url, 30.0),
        api=api.rstrip("/") if api else None,
        max_tokens=args.max_tokens,
        runs=args.runs,
        warmup=args.warmup,
        timeout_s=args.timeout_s,
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        fingerprint = (result["identity"] or {}).get("fingerprint") or "none (no supervisor named: --profile or --api)"
        print(f"engine {url} model {result['engine']['model']}; identity {fingerprint}")
        for i, run in enumerate(result["runs"]):
            print(f"run {i}: first token {run['ttft_s']} s, {run['tokens']} tokens, {run['decode_tokens_per_s']} tok/s")
        summary = result["summary"]
        print(
            f"decode {summary['decode_tokens_per_s_median']} tok/s median ({summary['decode_tokens_per_s_min']}-"
            f"{summary['decode_tokens_per_s_max']}), first token {summary['ttft_s_median']} s median"
        )
    return 0
