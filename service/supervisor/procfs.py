"""Read process facts from a `/proc` tree (injected, so tests can use a checked-in fake one)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessInfo:
    """One process as `/proc/<pid>/stat` describes it. `start_ticks` is its creation time in clock
    ticks since boot: together with the pid it identifies a process even after the pid is reused."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    start_ticks: int

    @property
    def is_zombie(self) -> bool:
        return self.state in {"Z", "X", "x"}


def parse_stat(text: str) -> ProcessInfo:
    """Parse the one line of `/proc/<pid>/stat`. The command name sits in parentheses and may itself
    contain spaces and parentheses, so split at the last `)`."""
    head, _, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = tail.split()
    # fields[0] is stat field 3 (state); starttime is stat field 22.
    return ProcessInfo(
        pid=int(pid_text),
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        start_ticks=int(fields[19]),
    )


class ProcFS:
    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def read(self, pid: int) -> ProcessInfo | None:
        """The process now holding `pid`, or None when there is none."""
        try:
            return parse_stat((self.root / str(pid) / "stat").read_text(encoding="utf-8", errors="replace"))
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            return None

    def cmdline(self, pid: int) -> list[str]:
        try:
            raw = (self.root / str(pid) / "cmdline").read_bytes()
        except OSError:
            return []
        return [part.decode(errors="replace") for part in raw.split(b"\0") if part]

    def carries(self, pid: int, name: str, value: str) -> bool:
        """Whether the process was started with `name=value` in its environment (`/proc/<pid>/environ`:
        readable for one's own processes, or as root; a zombie's is empty)."""
        try:
            raw = (self.root / str(pid) / "environ").read_bytes()
        except OSError:
            return False
        return f"{name}={value}".encode() in raw.split(b"\0")

    def boot_id(self) -> str | None:
        """This boot's random id: a record from before a reboot names processes that are all gone."""
        try:
            return (self.root / "sys" / "kernel" / "random" / "boot_id").read_text(encoding="ascii").strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def pids(self) -> Iterator[int]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            if name.isdigit():
                yield int(name)

    def processes(self) -> Iterator[ProcessInfo]:
        for pid in self.pids():
            info = self.read(pid)
            if info is not None:
                yield info

    def session_members(self, sid: int) -> list[ProcessInfo]:
        """Every process of session `sid`, zombies included, ordered by pid."""
        return sorted((p for p in self.processes() if p.sid == sid), key=lambda p: p.pid)

    def is_same_process(self, pid: int, start_ticks: int) -> bool:
        info = self.read(pid)
        return info is not None and info.start_ticks == start_ticks and not info.is_zombie
