"""Benchmark: how long a preflight takes, stamped with the run identity.

    python -m preflight.bench --platform sim --devices 8 --level quick --repeat 3
    PYTHONPATH=. python -m preflight.bench --platform cuda --level quick --level full --repeat 3 --out DIR

Prints the identity (host, cores, python, torch, warden, git commit, platform, devices), then one
line per run (wall time, phases, slowest worker start, slowest probe set, bus bandwidth) and the
median. With `--out`, writes the last report of each level as `preflight-<platform>-<level>.json`
and every timing as `bench-<platform>.json`. Quarantine is never read or written here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from preflight.commands import run_command
from preflight.devices import Timeouts
from preflight.levels import LEVELS, Level
from preflight.orchestrate import PreflightOptions, run_preflight
from preflight.platforms import resolve_platform
from preflight.report import PreflightReport, render_text


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    result = run_command(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], 5.0)
    if not result.ok:
        return None
    dirty = run_command(["git", "-C", str(here), "status", "--porcelain", "--", str(here)], 5.0)
    return result.stdout.strip() + ("+dirty" if dirty.ok and dirty.stdout.strip() else "")


def timings(report: PreflightReport) -> dict[str, Any]:
    starts = [d.startup_s for d in report.devices if d.startup_s is not None]
    checks = [sum(p.duration_s or 0.0 for p in d.probes) for d in report.devices if d.probed]
    return {
        "total_s": round(report.duration_s, 3),
        "phases_s": {k: round(v, 3) for k, v in report.phases.items()},
        "max_worker_startup_s": round(max(starts), 3) if starts else None,
        "max_device_checks_s": round(max(checks), 3) if checks else None,
        "busbw_gbps": report.collective.busbw_gbps,
        "health": report.health.value,
        "devices": {str(d.index): d.health.value for d in report.devices},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preflight.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("auto", "cuda", "xpu", "cpu", "sim"), default="sim")
    parser.add_argument("--devices", type=int, default=8, help="sim: how many devices (default 8)")
    parser.add_argument("--level", action="append", choices=LEVELS, help="repeatable; default quick")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-collective", action="store_true")
    parser.add_argument("--out", type=Path, help="folder for the reports and timings (JSON)")
    parser.add_argument("--show", action="store_true", help="print each report as text too")
    args = parser.parse_args(argv)
    platform = resolve_platform(args.platform)
    levels: list[Level] = args.level or ["quick"]
    runs: list[dict[str, Any]] = []
    last: dict[Level, PreflightReport] = {}
    identity: dict[str, Any] = {}
    for level in levels:
        for attempt in range(args.repeat):
            options = PreflightOptions(
                platform=platform,
                level=level,
                sim_devices=args.devices,
                collective=not args.no_collective,
                timeouts=Timeouts(),
            )
            wall = time.monotonic()
            report = run_preflight(options)
            wall = time.monotonic() - wall
            last[level] = report
            identity = identity or {
                **report.identity,
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "git": _git_commit(),
                "devices": [f"{d.index}:{d.name}" for d in report.devices],
            }
            row = {"level": level, "attempt": attempt, "wall_s": round(wall, 3), **timings(report)}
            runs.append(row)
            if args.show:
                print(render_text(report), file=sys.stderr)
    print("identity: " + json.dumps(identity, sort_keys=True))
    for row in runs:
        phases = " ".join(f"{k}={v:.2f}" for k, v in row["phases_s"].items() if k != "total")
        busbw = "-" if row["busbw_gbps"] is None else f"{row['busbw_gbps']:.3g}"
        print(
            f"{row['level']:5} #{row['attempt']} wall {row['wall_s']:6.2f} s  {phases}  "
            f"worker start ≤{row['max_worker_startup_s']} s  checks ≤{row['max_device_checks_s']} s  "
            f"busbw {busbw} GB/s  {row['health']}"
        )
    for level in levels:
        walls = [r["wall_s"] for r in runs if r["level"] == level]
        count = len(last[level].devices)
        median, fastest = statistics.median(walls), min(walls)
        print(f"{level}: median {median:.2f} s, min {fastest:.2f} s over {len(walls)} runs, {count} {platform} devices")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for level, report in last.items():
            (args.out / f"preflight-{platform}-{level}.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        (args.out / f"bench-{platform}.json").write_text(
            json.dumps({"identity": identity, "runs": runs}, indent=2) + "\n"
        )
    return 0 if all(r.placement.ok for r in last.values()) else 3


if __name__ == "__main__":
    sys.exit(main())
