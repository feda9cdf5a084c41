"""The parent's side of one probe worker: start it, read its events against deadlines, kill it.

A worker runs in its own session and speaks JSON lines on stdout (one event per line) and takes
commands as JSON lines on stdin. Every read has a deadline; when a deadline passes the whole
process group is killed and the reap is waited for (bounded), so a worker wedged in the driver
can stall a probe but never the caller.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from preflight.commands import REAP_TIMEOUT_S, kill_group

Clock = Callable[[], float]
STDERR_TAIL_LINES = 200
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class Timeout:
    """No event before the deadline."""


@dataclass(frozen=True)
class Ended:
    """The worker closed its output: it exited (or is about to)."""


Event = dict[str, Any]


def worker_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "preflight.probe", *args]


def worker_env(extra: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment, the device mask on top, and this package importable in the child."""
    env = dict(os.environ if base is None else base)
    env.update(extra)
    path = env.get("PYTHONPATH", "")
    if _PACKAGE_ROOT not in path.split(os.pathsep):
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    return env


class Child:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        label: str,
        clock: Clock = time.monotonic,
        wakeup: threading.Event | None = None,
    ) -> None:
        """`wakeup`, if given, is set whenever this worker has a new event (one waiter for many)."""
        self.argv = list(argv)
        self.label = label
        self._clock = clock
        self._wakeup = wakeup
        self._events: queue.Queue[Event | Ended] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.started_at = clock()
        self.proc = subprocess.Popen(
            self.argv,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read_events, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(self.proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.killed = False
        self.reaped: bool | None = None
        self.ready = False  # it said `ready` (torch imported); set by whoever read that event

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_events(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                self._stderr.append(f"(stdout) {line}")
                continue
            if isinstance(event, dict):
                self._put(event)
        self._put(Ended())

    def _put(self, item: Event | Ended) -> None:
        self._events.put(item)
        if self._wakeup is not None:
            self._wakeup.set()

    def _read_stderr(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._stderr.append(raw.decode(errors="replace").rstrip())

    def next_event(self, deadline: float) -> Event | Timeout | Ended:
        remaining = deadline - self._clock()
        try:
            if remaining <= 0:
                return self._events.get_nowait()
            return self._events.get(timeout=remaining)
        except queue.Empty:
            return Timeout()

    def set_wakeup(self, wakeup: threading.Event) -> None:
        """Route this worker's future events to `wakeup` too (and wake it for any already queued)."""
        self._wakeup = wakeup
        if not self._events.empty():
            wakeup.set()

    def send(self, message: Mapping[str, Any]) -> bool:
        """Write one command line to the worker; False if it is gone."""
        stdin = self.proc.stdin
        if stdin is None:
            return False
        try:
            stdin.write((json.dumps(dict(message)) + "\n").encode())
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return False
        return True

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return None

    def kill(self, reap_timeout_s: float = REAP_TIMEOUT_S) -> bool:
        """Kill the worker's whole group and wait for the reap; False if it could not be reaped."""
        self.killed = True
        if self.proc.returncode is None:  # not reaped yet, so its pid (= group id) cannot have been reused
            kill_group(self.proc.pid)
        self.reaped = self.wait_exit(reap_timeout_s) is not None
        self.close_stdin()
        return self.reaped

    def finish(self, timeout_s: float) -> int | None:
        """Let a worker that said it is done exit; kill it if it lingers."""
        self.close_stdin()
        code = self.wait_exit(timeout_s)
        if code is None:
            self.kill()
            return self.proc.returncode
        self.reaped = True
        return code

    def close_stdin(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()

    def stderr_tail(self, lines: int = 40) -> str:
        # The reader thread may still be draining after the exit; give it a moment.
        self._readers[1].join(timeout=0.5)
        return "\n".join(list(self._stderr)[-lines:])

    def returncode(self) -> int | None:
        return self.proc.poll()
