"""All-reduce across devices from the parent: start one worker per rank, hand each its rank, judge
the group (finished in time, correct on every rank, bus bandwidth above the floor).

Bus bandwidth is computed as nccl-tests does for all-reduce: `algbw = bytes / time` and
`busbw = algbw * 2(n-1)/n`, at one large message size, with the slowest rank's time.

Workers are pooled by their environment (the device mask). They can be started ahead of time
(`prestart`) so that `import torch` overlaps the device probes, and a worker whose group finished
cleanly (every rank reported, even if the sums were wrong or slow) goes back to the pool for the
next group. A pooled worker only serves a group whose mask is exactly its own: on cuda/xpu every
rank must see the whole group, so each group gets fresh workers; on cpu/sim there is no mask, and
bisection reuses the workers of the groups that finished. A worker of a group that hung or broke
is killed, never reused.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from preflight.backends import Backend
from preflight.child import Child, Clock, Ended, Timeout, worker_argv, worker_env
from preflight.devices import Timeouts, signal_name
from preflight.failures import Failure, classify_text, first_matching_line
from preflight.health import plural
from preflight.levels import MIB, Level, sizes_for
from preflight.report import GroupOutcome

GB = 1e9
FAILURE_GRACE_S = 1.0
DISMISS_GRACE_S = 2.0


def bus_bandwidth_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s: algbw * 2(n-1)/n."""
    if seconds <= 0 or ranks < 1:
        return 0.0
    return nbytes / seconds * (2 * (ranks - 1) / ranks) / GB


def _listing(devices: Sequence[int]) -> str:
    return ", ".join(str(d) for d in devices)


@dataclass
class _Gathered:
    """What the ranks of one all-reduce reported, as it comes in."""

    pending: set[int]
    finished: dict[int, dict[str, Any]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    died: dict[int, tuple[int | None, str]] = field(default_factory=dict)

    @property
    def broken(self) -> bool:
        return bool(self.failed or self.died)

    def drain(self, rank: int, child: Child) -> None:
        """Take every event `child` has queued, without waiting."""
        while rank in self.pending:
            event = child.next_event(deadline=float("-inf"))
            if isinstance(event, Timeout):
                return
            if isinstance(event, Ended):
                code = child.wait_exit(2.0)
                if rank not in self.finished and rank not in self.failed:
                    self.died[rank] = (code, child.stderr_tail())
                self.pending.discard(rank)
            elif event.get("event") == "result":
                if event.get("health") == "healthy":
                    self.finished[rank] = dict(event.get("evidence") or {})
                else:
                    self.failed[rank] = str(event.get("reason"))
                self.pending.discard(rank)


class Collectives:
    def __init__(
        self,
        backend: Backend,
        *,
        level: Level,
        timeouts: Timeouts,
        min_busbw_gbps: float | None,
        extra_env: Mapping[str, str] | None = None,
        clock: Clock = time.monotonic,
        workdir: Path | None = None,
    ) -> None:
        self.backend = backend
        self.level = level
        self.timeouts = timeouts
        self.min_busbw_gbps = min_busbw_gbps
        self.extra_env = dict(extra_env or {})
        self.clock = clock
        self.workdir = workdir
        self.sizes = sizes_for(level, backend.name)
        self._idle: dict[tuple[tuple[str, str], ...], list[Child]] = {}
        self._lock = threading.Lock()

    def _env(self, devices: Sequence[int]) -> dict[str, str]:
        return {**self.extra_env, **self.backend.device_environment(devices)}

    def _spawn(self, devices: Sequence[int], count: int) -> list[Child]:
        argv = worker_argv(
            "collective", "--platform", self.backend.name, "--level", self.level, *self.backend.worker_args()
        )
        env = worker_env(self._env(devices))
        return [Child(argv, env, f"rank {rank}", self.clock) for rank in range(count)]

    def _key(self, devices: Sequence[int]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self._env(devices).items()))

    def prestart(self, devices: Sequence[int]) -> None:
        """Start the workers for an all-reduce over `devices` now; `run` picks them up."""
        spawned = self._spawn(devices, len(devices))
        with self._lock:
            self._idle.setdefault(self._key(devices), []).extend(spawned)

    def _take(self, devices: Sequence[int]) -> list[Child]:
        with self._lock:
            idle = self._idle.get(self._key(devices), [])
            alive = [c for c in idle if c.returncode() is None]
            taken, rest = alive[: len(devices)], alive[len(devices) :]
            self._idle[self._key(devices)] = rest
        return taken + self._spawn(devices, len(devices) - len(taken))

    def close(self) -> None:
        """Let every idle worker go (EOF on stdin: it exits without touching a device)."""
        with self._lock:
            idle = [c for children in self._idle.values() for c in children]
            self._idle.clear()
        for child in idle:
            child.close_stdin()
        deadline = self.clock() + DISMISS_GRACE_S
        for child in idle:
            if child.wait_exit(deadline - self.clock()) is None:
                child.kill()  # still importing torch: it has not touched a device, so just end it

    def run(self, devices: Sequence[int]) -> GroupOutcome:
        devices = tuple(devices)
        started = self.clock()
        children = self._take(devices)
        workdir = Path(tempfile.mkdtemp(prefix="warden-allreduce-", dir=self.workdir))
        clean = False
        try:
            outcome, clean = self._run(devices, children, workdir)
        finally:
            if clean:
                with self._lock:
                    self._idle.setdefault(self._key(devices), []).extend(children)
            else:
                for child in children:
                    if child.returncode() is None:
                        child.kill()
            shutil.rmtree(workdir, ignore_errors=True)
        return replace(outcome, duration_s=self.clock() - started)

    def run_many(self, groups: Sequence[Sequence[int]]) -> list[GroupOutcome]:
        """Groups on disjoint devices, all at once."""
        if not groups:
            return []
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            return list(pool.map(self.run, groups))

    def _wait_ready(self, devices: tuple[int, ...], children: list[Child]) -> GroupOutcome | None:
        for rank, child in enumerate(children):
            if child.ready:
                continue
            deadline = child.started_at + self.timeouts.startup_s
            while True:
                event = child.next_event(deadline)
                if isinstance(event, Timeout):
                    why = f"did not start within {self.timeouts.startup_s:.0f} s"
                elif isinstance(event, Ended):
                    why = f"failed to start: {child.stderr_tail(1)}"
                elif event.get("event") == "fatal":
                    why = f"failed to start: {event.get('reason')}"
                elif event.get("event") == "ready":
                    child.ready = True
                    break
                else:
                    continue
                reason = f"the worker for rank {rank} (device {devices[rank]}) {why}"
                return GroupOutcome(devices, False, reason, Failure.ERROR.value)
        return None

    def _command(self, devices: tuple[int, ...], rank: int, store: Path) -> dict[str, Any]:
        masked = bool(self.backend.device_environment(devices))
        return {
            "cmd": "all_reduce",
            "rank": rank,
            "world": len(devices),
            "device": devices[rank],
            "local_index": rank if masked else 0,  # every rank sees the whole group, in order
            "backend": self.backend.collective_backend,
            "store": str(store),
            "bytes": self.sizes.collective_bytes,
            "iters": self.sizes.collective_iters,
            "warmup": self.sizes.collective_warmup,
            "timeout_s": self.timeouts.collective_s,
        }

    def _run(self, devices: tuple[int, ...], children: list[Child], workdir: Path) -> tuple[GroupOutcome, bool]:
        """The judged outcome, and whether every worker finished cleanly (and may serve again)."""
        not_started = self._wait_ready(devices, children)
        if not_started is not None:
            return not_started, False
        for rank, child in enumerate(children):
            child.send(self._command(devices, rank, workdir / "store"))
        deadline = self.clock() + self.timeouts.collective_s
        wakeup = threading.Event()
        for child in children:
            child.set_wakeup(wakeup)
        got = _Gathered(pending=set(range(len(children))))
        # One rank that dies or fails sinks the group: wait only a short grace for the others (so
        # the first cause is on record, not just its echo in the peers), then stop them.
        grace_until: float | None = None
        while got.pending:
            wakeup.clear()
            for rank in sorted(got.pending):
                got.drain(rank, children[rank])
            if got.broken and grace_until is None:
                grace_until = min(deadline, self.clock() + FAILURE_GRACE_S)
            remaining = (deadline if grace_until is None else grace_until) - self.clock()
            if not got.pending or remaining <= 0:
                break
            wakeup.wait(remaining)
        return self._judge(devices, got), not (got.pending or got.broken)

    def _failed(self, devices: tuple[int, ...], got: _Gathered) -> GroupOutcome:
        parts: list[str] = []
        kinds: list[Failure] = []
        for rank, (code, stderr) in sorted(got.died.items()):
            named = classify_text(stderr)
            if named is Failure.DEVICE_LOST:
                parts.append(f"rank {rank} (device {devices[rank]}) lost its device: {first_matching_line(stderr)}")
            elif code is not None and code < 0:
                named = Failure.CRASH
                parts.append(f"rank {rank} (device {devices[rank]}) crashed with {signal_name(code)}")
            else:
                parts.append(f"rank {rank} (device {devices[rank]}) exited with status {code}")
            kinds.append(named or Failure.ERROR)
        for rank, reason in sorted(got.failed.items()):
            parts.append(f"rank {rank} (device {devices[rank]}) failed: {reason[:200]}")
            kinds.append(classify_text(reason) or Failure.ERROR)
        left = _listing([devices[r] for r in sorted(got.pending)])
        if got.pending and got.broken:
            parts.append(f"the other ranks (devices {left}) were stopped")
        elif got.pending:
            parts.append(
                f"{plural(len(got.pending), 'rank')} (devices {left}) gave no result within "
                f"{self.timeouts.collective_s:g} s and were killed"
            )
            kinds.append(Failure.HANG)
        order = [Failure.DEVICE_LOST, Failure.CRASH, Failure.ALLOC_FAIL, Failure.HANG, Failure.ERROR]
        failure = next(k for k in order if k in kinds)
        what = f"all-reduce across devices {_listing(devices)}"
        return GroupOutcome(devices, False, f"{what} failed: " + "; ".join(parts), failure.value)

    def _judge(self, devices: tuple[int, ...], got: _Gathered) -> GroupOutcome:
        if got.broken or got.pending:
            return self._failed(devices, got)
        n = len(devices)
        what = f"all-reduce across devices {_listing(devices)}"
        ranks = tuple({"rank": r, **got.finished[r]} for r in range(n))
        wrong = sum(int(r.get("wrong_elements", 0)) for r in ranks)
        checked = sum(int(r.get("checked_elements", 0)) for r in ranks)
        seconds = max(float(r.get("time_s", 0.0)) for r in ranks)
        nbytes = int(ranks[0].get("bytes", 0))
        busbw = bus_bandwidth_gbps(nbytes, seconds, n)
        size = f"{nbytes / MIB:g} MiB"
        if wrong:
            bad = [devices[int(r["rank"])] for r in ranks if r.get("wrong_elements")]
            reason = (
                f"{what} returned wrong sums: {wrong} of {checked} checked elements differ "
                f"(on {plural(len(bad), 'rank')}: devices {_listing(bad)})"
            )
            return GroupOutcome(devices, False, reason, Failure.WRONG_RESULT.value, busbw, ranks=ranks)
        floor = self.min_busbw_gbps
        if floor and busbw < floor:
            reason = f"{what} is slow: bus bandwidth {busbw:.3g} GB/s at {size} is below the floor of {floor:g} GB/s"
            return GroupOutcome(devices, False, reason, Failure.SLOW_LINK.value, busbw, ranks=ranks)
        reason = (
            f"{what} correct on {plural(n, 'rank')} ({checked} elements checked); "
            f"bus bandwidth {busbw:.3g} GB/s at {size}"
        )
        return GroupOutcome(devices, True, reason, None, busbw, ranks=ranks)
