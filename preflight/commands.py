"""External commands (nvidia-smi, xpu-smi) under a hard timeout, and ending a process group.

Some device tools are known to hang (xpu-smi RAS reads the driver never answers), so every call
runs in its own session and the whole group is killed when the timeout expires. The runner is a
plain function type so backends take it as a dependency and tests hand in canned output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_COMMAND_TIMEOUT_S = 10.0  # anchors: at most 10 s per sysman / xpu-smi / nvidia-smi call
REAP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None: it did not finish (timeout) or could not start
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    error: str | None = None  # why it could not start (not installed, permission)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe(self) -> str:
        """One sentence about how the call ended, for reasons."""
        name = self.argv[0] if self.argv else "command"
        if self.error is not None:
            return f"{name} could not run: {self.error}"
        if self.timed_out:
            return f"{name} did not answer within {self.duration_s:.0f} s and was killed"
        if self.returncode != 0:
            last = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or [""]
            return f"{name} exited with status {self.returncode}: {last[0][:200]}"
        return f"{name} succeeded"


CommandRunner = Callable[[Sequence[str], float], CommandResult]


def kill_group(pid: int) -> None:
    """SIGKILL a child's process group (it leads its own session); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_command(
    argv: Sequence[str], timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> CommandResult:
    """Run `argv` (never a shell), capture its output, and kill its group after `timeout_s`."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            env=None if env is None else dict(env),
            text=True,
            errors="replace",
        )
    except OSError as error:
        return CommandResult(tuple(argv), None, "", "", time.monotonic() - started, error=error.strerror or str(error))
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # unkillable (stuck in the driver): leave it, report it
            out, err = "", ""
        return CommandResult(tuple(argv), None, out or "", err or "", time.monotonic() - started, timed_out=True)
    return CommandResult(tuple(argv), proc.returncode, out, err, time.monotonic() - started)
