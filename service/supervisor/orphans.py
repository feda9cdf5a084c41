"""Find and end what a supervisor that died left running (`warden reap`, and `warden run` before it launches).

Each profile's state folder holds at most one engine record (engine_record.py). For each record the verdict is one
of: the supervisor that wrote it still runs (`supervised`: touch nothing); the host rebooted since (`stale`); none of
the engine's processes is left (`clean`); or some are, and they are listed (`found`, a dry run), ended (`ended`), or
outlived SIGKILL (`survivors`). A record goes away once nothing of its engine is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from service.supervisor.engine_record import (
    RECORD_NAME,
    EngineRecord,
    RecordError,
    read_record,
    remove_record,
)
from service.supervisor.launcher import Clock, Sleeper, end_processes, engine_members
from service.supervisor.procfs import ProcessInfo, ProcFS

log = logging.getLogger(__name__)

Verdict = Literal["supervised", "stale", "clean", "found", "ended", "survivors", "unreadable", "foreign"]


@dataclass(frozen=True)
class ReapResult:
    record: Path
    verdict: Verdict
    reason: str  # one sentence, with counts
    remedy: str | None = None
    profile: str | None = None
    supervisor_pid: int | None = None
    processes: list[ProcessInfo] = field(default_factory=list)  # the engine's processes found
    survivors: list[ProcessInfo] = field(default_factory=list)
    signalled: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Nothing of a dead supervisor's engine is left running (or, in a dry run, was found)."""
        return self.verdict in ("supervised", "stale", "clean", "ended")

    def to_json(self) -> dict[str, Any]:
        def listed(processes: list[ProcessInfo]) -> list[dict[str, Any]]:
            return [{"pid": p.pid, "comm": p.comm, "state": p.state} for p in processes]

        return {
            "record": str(self.record),
            "profile": self.profile,
            "verdict": self.verdict,
            "ok": self.ok,
            "reason": self.reason,
            "remedy": self.remedy,
            "supervisor_pid": self.supervisor_pid,
            "processes": listed(self.processes),
            "survivors": listed(self.survivors),
            "signals": self.signalled,
        }


def describe(processes: list[ProcessInfo]) -> str:
    return ", ".join(f"{p.pid} {p.comm}" for p in processes)


def engine_processes(record: EngineRecord, procfs: ProcFS) -> list[ProcessInfo]:
    """The live processes that carry the record's marker, created no earlier than the engine's first process (its
    session is not asked: once the leader is gone, the session id may be someone else's)."""
    return engine_members(procfs, not_before_ticks=record.engine_start_ticks, marker=record.marker)


def _send(procfs: ProcFS, members: list[ProcessInfo], sig: signal.Signals) -> None:
    for member in members:
        if not procfs.is_same_process(member.pid, member.start_ticks):
            continue  # gone since it was listed; its pid may be someone else's now
        try:
            os.kill(member.pid, sig)
        except ProcessLookupError:
            continue
        except PermissionError:
            log.warning("no permission to signal pid %d (%s)", member.pid, member.comm)


def reap_record(
    path: Path,
    *,
    dry_run: bool,
    grace_s: float,
    reap_timeout_s: float,
    procfs: ProcFS,
    clock: Clock,
    sleep: Sleeper,
    euid: int | None = None,
) -> ReapResult:
    try:
        record = read_record(path)
    except RecordError as error:
        return ReapResult(
            path,
            "unreadable",
            f"the engine record {path} is unusable: {error}",
            "look for the engine's processes by hand (its log is beside the record), end them, then delete the record",
        )
    if record is None:
        return ReapResult(path, "clean", f"no engine record at {path}")

    def result(
        verdict: Verdict,
        reason: str,
        remedy: str | None = None,
        *,
        processes: list[ProcessInfo] | None = None,
        survivors: list[ProcessInfo] | None = None,
        signalled: list[str] | None = None,
    ) -> ReapResult:
        return ReapResult(
            path,
            verdict,
            reason,
            remedy,
            record.profile,
            record.supervisor_pid,
            processes or [],
            survivors or [],
            signalled or [],
        )

    me = os.geteuid() if euid is None else euid
    if me not in (0, record.uid):  # another user's processes hide their environments: all would look gone
        return result(
            "foreign",
            f"the engine record {path} is uid {record.uid}'s, and uid {me} cannot see that user's processes",
            f"run this as uid {record.uid} (the user warden runs as) or as root",
        )
    boot = procfs.boot_id()
    if boot is not None and record.boot_id and record.boot_id != boot:
        return result("stale", "the host has rebooted since this engine was launched" + _drop(path, dry_run))
    if procfs.is_same_process(record.supervisor_pid, record.supervisor_start_ticks):
        return result(
            "supervised", f"warden pid {record.supervisor_pid} still supervises this engine (pid {record.engine_pid})"
        )
    found = engine_processes(record, procfs)
    if not found:
        return result("clean", "no process of this engine is left running" + _drop(path, dry_run))
    dead = f"warden pid {record.supervisor_pid} ended without stopping its engine"
    if dry_run:
        return result(
            "found",
            f"{dead}: {len(found)} of its process(es) still run: {describe(found)}",
            "`warden reap` ends them (or `warden run` of this profile does, before it launches)",
            processes=found,
        )
    signalled, survivors = end_processes(
        lambda: engine_processes(record, procfs),
        lambda members, sig: _send(procfs, members, sig),
        grace_s=grace_s,
        reap_timeout_s=reap_timeout_s,
        clock=clock,
        sleep=sleep,
    )
    if survivors:
        return result(
            "survivors",
            f"{dead}: {len(survivors)} of its {len(found)} process(es) outlived SIGKILL: {describe(survivors)}",
            "they are stuck in the driver and hold their devices: ops/runbook.md, 'Processes that would not die'",
            processes=found,
            survivors=survivors,
            signalled=signalled,
        )
    ended = f"{dead}: ended its {len(found)} process(es) ({', then '.join(signalled)}): {describe(found)}"
    return result("ended", ended + _drop(path, dry_run=False), processes=found, signalled=signalled)


def _drop(path: Path, dry_run: bool) -> str:
    """Remove a record whose engine is gone; what to add to the reason when that fails."""
    if dry_run:
        return ""
    try:
        remove_record(path)
    except OSError as error:
        return f" (the record could not be removed: {error.strerror}; delete {path} by hand)"
    return ""


def records_under(root: Path) -> Iterator[Path]:
    """Every profile's engine record under a state root (`<root>/<profile>/engine.json`), in name order."""
    with contextlib.suppress(OSError):
        for folder in sorted(root.iterdir()):
            if (folder / RECORD_NAME).is_file():
                yield folder / RECORD_NAME
