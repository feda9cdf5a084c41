"""`warden reap [--profile P | --state-dir DIR] [--dry-run] [--json]`: end what supervisors that died left running.

Reads the engine records under the state root (every profile's) or one profile's, and ends only processes that carry
a record's launch marker (service/supervisor/engine_record.py); a record whose supervisor still runs is left alone.
Exit 0 when nothing of a dead supervisor's engine is left running; 3 when a dry run found some; 1 when some could not
be ended or a record is unusable.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from preflight.quarantine import default_state_root
from service.profile import SupervisorSection, load_profile
from service.supervisor.engine_record import RECORD_NAME
from service.supervisor.orphans import ReapResult, reap_record, records_under
from service.supervisor.procfs import ProcFS


def reap(args: argparse.Namespace, procfs: ProcFS | None = None) -> list[ReapResult]:
    if args.profile:
        from service.supervisor.run import state_dir_for

        loaded = load_profile(args.profile)
        records, sup = [state_dir_for(loaded) / RECORD_NAME], loaded.profile.supervisor
    else:
        root = Path(args.state_dir) if args.state_dir else default_state_root()
        records, sup = list(records_under(root)), SupervisorSection()
    procfs = procfs or ProcFS()
    return [
        reap_record(
            path,
            dry_run=args.dry_run,
            grace_s=sup.stop_grace_s,
            reap_timeout_s=sup.reap_timeout_s,
            procfs=procfs,
            clock=time.monotonic,
            sleep=time.sleep,
        )
        for path in records
    ]


def render(results: list[ReapResult], where: str) -> str:
    if not results:
        return f"no engine records under {where}: nothing to reap"
    lines = []
    for result in results:
        lines.append(f"{result.profile or result.record.parent.name}: {result.verdict}: {result.reason}")
        if result.remedy and not result.ok:
            lines.append(f"  remedy: {result.remedy}")
    return "\n".join(lines)


def run_reap(args: argparse.Namespace) -> int:
    results = reap(args)
    where = args.profile or args.state_dir or str(default_state_root())
    print(json.dumps([r.to_json() for r in results], indent=1) if args.json else render(results, where))
    if any(r.verdict in ("survivors", "unreadable", "foreign") for r in results):
        return 1
    return 3 if any(r.verdict == "found" for r in results) else 0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "reap",
        help="end engine processes that a warden which died left running (only those; exit 3: a dry run found some)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--profile", help="only this profile's engine (its supervisor.state_dir)")
    where.add_argument("--state-dir", help="state root to search (default $WARDEN_STATE_DIR, ~/.local/state/warden)")
    parser.add_argument("--dry-run", action="store_true", help="list them, signal nothing")
    parser.add_argument("--json", action="store_true", help="one object per engine record")
    parser.set_defaults(func=run_reap)
