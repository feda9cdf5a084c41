"""Start the engine in a session of its own, and end that session completely.

The engine (vLLM's API server) forks an EngineCore and workers; when the front process dies they
survive as orphans holding the devices. So the engine is started with `start_new_session=True`
and everything it leaves behind is found by its session id, then ended by pid after checking that
each pid still belongs to that session (`/proc/<pid>/stat`), never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from service.supervisor.engine_record import MARKER_ENV
from service.supervisor.procfs import ProcessInfo, ProcFS

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


class ProcessHandle(Protocol):
    pid: int

    def poll(self) -> int | None: ...


Spawner = Callable[[list[str], dict[str, str], Path, IO[bytes]], ProcessHandle]
Clock = Callable[[], float]
Sleeper = Callable[[float], None]


def spawn_in_new_session(argv: list[str], env: dict[str, str], cwd: Path, log_file: IO[bytes]) -> ProcessHandle:
    """The real spawner: an argv list (never a shell), in its own session, output to `log_file`."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )


def become_child_subreaper() -> bool:
    """Make orphaned descendants reparent to this process (Linux), so they can be reaped here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass
class EngineProcess:
    """A launched engine: its session leader's pid and creation time, and the log it writes."""

    handle: ProcessHandle
    start_ticks: int
    log_path: Path
    log_offset: int
    marker: str | None = None  # the launch's WARDEN_ENGINE_ID, inherited by every process the engine starts

    @property
    def pid(self) -> int:
        return self.handle.pid

    @property
    def sid(self) -> int:
        return self.handle.pid  # start_new_session: the leader's pid is the session id

    def poll(self) -> int | None:
        return self.handle.poll()


LOG_ROTATE_BYTES = 64 * 2**20


def rotate_log(log_path: Path, limit_bytes: int = LOG_ROTATE_BYTES) -> None:
    """Before a launch: a log over `limit_bytes` becomes `<name>.1` (replacing the previous one), so
    a supervisor that relaunches for weeks keeps at most two logs' worth of engine output."""
    try:
        if log_path.stat().st_size > limit_bytes:
            log_path.replace(log_path.with_name(log_path.name + ".1"))
    except FileNotFoundError:
        pass


def launch(
    command: EngineCommand,
    log_path: Path,
    *,
    spawner: Spawner = spawn_in_new_session,
    procfs: ProcFS | None = None,
    log_limit_bytes: int = LOG_ROTATE_BYTES,
) -> EngineProcess:
    procfs = procfs or ProcFS()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(log_path, log_limit_bytes)
    with log_path.open("ab") as log_file:
        offset = log_file.tell()
        handle = spawner(command.argv, command.env, command.cwd, log_file)
    info = procfs.read(handle.pid)
    start_ticks = info.start_ticks if info is not None else -1
    return EngineProcess(
        handle=handle,
        start_ticks=start_ticks,
        log_path=log_path,
        log_offset=offset,
        marker=command.env.get(MARKER_ENV),
    )


@dataclass
class StopReport:
    """How a session ended: which signal it took, how long, and anything that would not die."""

    signalled: list[str] = field(default_factory=list)  # "SIGTERM", "SIGKILL" in the order sent
    duration_s: float = 0.0
    survivors: list[ProcessInfo] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.survivors


def engine_members(
    procfs: ProcFS, *, not_before_ticks: int, sid: int | None = None, marker: str | None = None
) -> list[ProcessInfo]:
    """Live processes of an engine: in its session `sid`, or carrying its launch's `marker` (which also finds those
    that left the session). A process created before the engine's first one cannot be the engine's, whatever its
    session id or environment says. The one rule for a supervisor's own stop and for `warden reap`."""
    return [
        p
        for p in procfs.processes()
        if not p.is_zombie
        and p.start_ticks >= not_before_ticks
        and (p.sid == sid or (marker is not None and procfs.carries(p.pid, MARKER_ENV, marker)))
    ]


def _reap(engine: EngineProcess, procfs: ProcFS) -> None:
    """Collect exit statuses: the leader through its handle, adopted orphans by pid."""
    engine.poll()
    me = os.getpid()
    for member in procfs.session_members(engine.sid):
        if member.is_zombie and member.ppid == me and member.pid != engine.pid:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(member.pid, os.WNOHANG)


def _signal_members(engine: EngineProcess, members: list[ProcessInfo], sig: signal.Signals) -> None:
    leader_unreaped = engine.poll() is None
    if leader_unreaped:
        # The leader has not been reaped, so its pid (= the process group id) cannot have been
        # reused: signalling the group reaches exactly the engine's processes.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(engine.sid, sig)
    for member in members:
        if leader_unreaped and member.pgid == engine.sid:
            continue
        try:
            os.kill(member.pid, sig)
        except ProcessLookupError:
            continue
        except PermissionError as error:
            if error.errno != errno.EPERM:
                raise
            log.warning("no permission to signal pid %d (%s)", member.pid, member.comm)


def end_processes(
    live: Callable[[], list[ProcessInfo]],
    send: Callable[[list[ProcessInfo], signal.Signals], None],
    *,
    grace_s: float,
    reap_timeout_s: float,
    clock: Clock,
    sleep: Sleeper,
    poll_interval_s: float = 0.1,
) -> tuple[list[str], list[ProcessInfo]]:
    """SIGTERM what `live()` lists, wait `grace_s` for it to go, SIGKILL what is left, wait `reap_timeout_s`.

    `live()` is asked again at every poll, so it decides what still counts. Returns the signals sent, in order,
    and what was still alive at the last deadline (stuck in uninterruptible sleep inside a driver, say).
    """
    signalled: list[str] = []
    members = live()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, reap_timeout_s)):
        if not members:
            break
        send(members, sig)
        signalled.append(sig.name)
        deadline = clock() + wait_s
        members = live()
        while members and clock() < deadline:
            sleep(poll_interval_s)
            members = live()
    return signalled, members


def stop_session(
    engine: EngineProcess,
    *,
    grace_s: float,
    reap_timeout_s: float,
    procfs: ProcFS | None = None,
    clock: Clock,
    sleep: Sleeper,
    poll_interval_s: float = 0.1,
) -> StopReport:
    """SIGTERM the engine's session, wait `grace_s`, SIGKILL what is left, wait `reap_timeout_s`.

    Returns only when no live process of the session is left or the deadlines have passed; the
    report lists survivors (e.g. stuck in uninterruptible sleep inside a driver) for the caller
    to escalate.
    """
    procfs = procfs or ProcFS()
    started = clock()
    floor = engine.start_ticks if engine.start_ticks >= 0 else 0

    def live() -> list[ProcessInfo]:
        _reap(engine, procfs)
        return engine_members(procfs, not_before_ticks=floor, sid=engine.sid, marker=engine.marker)

    signalled, survivors = end_processes(
        live,
        lambda members, sig: _signal_members(engine, members, sig),
        grace_s=grace_s,
        reap_timeout_s=reap_timeout_s,
        clock=clock,
        sleep=sleep,
        poll_interval_s=poll_interval_s,
    )
    _reap(engine, procfs)
    return StopReport(signalled=signalled, duration_s=clock() - started, survivors=survivors)
