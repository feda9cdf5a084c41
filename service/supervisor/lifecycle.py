"""The supervisor: one state machine, driven by typed events from one queue.

Signal handlers, the readiness watcher and the HTTP server never change state themselves: they
post events (or read a snapshot). Only `Supervisor.run`'s loop mutates state, so every transition
happens in one place and in one order.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.guard.child import GuardOutcome
from service.profile import LoadedProfile, reachable_url
from service.supervisor.engine_command import build_engine_command
from service.supervisor.engine_log import EngineLogWatcher, first_exception
from service.supervisor.engine_record import (
    MARKER_ENV,
    RECORD_NAME,
    EngineRecord,
    new_marker,
    remove_record,
    write_record,
)
from service.supervisor.launcher import (
    Clock,
    EngineProcess,
    Sleeper,
    Spawner,
    StopReport,
    launch,
    spawn_in_new_session,
    stop_session,
)
from service.supervisor.metrics import ExitReason, SupervisorMetrics
from service.supervisor.placement import Placement
from service.supervisor.procfs import ProcFS
from service.supervisor.readiness import LivenessWatcher, ProbeResult, ReadinessWatcher, probe_engine
from service.supervisor.states import (
    TERMINAL,
    EngineLogMatched,
    Event,
    LivenessReported,
    ReadinessReported,
    RestartRequested,
    SignalReceived,
    State,
    Tick,
)

if TYPE_CHECKING:
    from preflight.report import PreflightReport
    from service.supervisor.planner import LaunchPlanner

log = logging.getLogger("warden.supervisor")

LOG_TAIL_LINES = 30
# where an operator's restart applies: an engine is running or about to be relaunched
RESTARTABLE = frozenset({State.WAITING_READY, State.READY, State.BACKOFF})


@dataclass
class Dependencies:
    """Everything the supervisor touches in the outside world, injectable for tests."""

    clock: Clock = time.monotonic
    wall_clock: Callable[[], float] = time.time
    sleep: Sleeper = time.sleep
    spawner: Spawner = spawn_in_new_session
    procfs: ProcFS = field(default_factory=ProcFS)
    probe: Callable[[str, str, LoadedProfile], ProbeResult] | None = None


def read_log_lines(path: Path, offset: int, limit_bytes: int = 1 << 20) -> list[str]:
    """The engine log's lines from `offset` (this launch's), the last `limit_bytes` of them at most."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, size - limit_bytes))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()


def default_probe(base_url: str, served_name: str, loaded: LoadedProfile) -> ProbeResult:
    sup = loaded.profile.supervisor
    return probe_engine(
        base_url,
        served_name,
        prompt=sup.canary_prompt,
        max_tokens=sup.canary_max_tokens,
        timeout_s=sup.request_timeout_s,
    )


class Supervisor:
    def __init__(
        self,
        loaded: LoadedProfile,
        placement: Placement | None,
        state_dir: Path,
        metrics: SupervisorMetrics,
        deps: Dependencies | None = None,
        *,
        guard: GuardOutcome | None = None,
        preflight: PreflightReport | None = None,
        planner: LaunchPlanner | None = None,
        tick_s: float = 0.2,
    ) -> None:
        self.loaded = loaded
        self.guard = guard
        self.preflight = preflight
        self.planner = planner
        self.placement = placement
        self.state_dir = state_dir
        self.metrics = metrics
        self.deps = deps or Dependencies()
        self.tick_s = tick_s
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()  # put() is safe in signal handlers
        self._lock = threading.Lock()
        self.state = State.STARTING
        self.engine: EngineProcess | None = None
        self.launches = 0
        self.consecutive_failures = 0
        self.restarts = 0
        self._runtime_dir: Path | None = None
        self._watcher: ReadinessWatcher | None = None
        self._liveness: LivenessWatcher | None = None
        self._log_watcher: EngineLogWatcher | None = None
        self._liveness_failures = 0
        self._launched_at: float | None = None
        self._relaunch_at: float | None = None
        self._timings: dict[str, float | None] = {"launched_at": None, "ready_at": None, "time_to_ready_s": None}
        self._last_failure: dict[str, Any] | None = None
        self._last_stop: dict[str, Any] | None = None
        self._ready_detail: dict[str, Any] | None = None
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self._exit_code = 0
        metrics.set_state(self.state)

    # -- outside world posts here ---------------------------------------------------------------

    def post(self, event: Event) -> None:
        self.events.put(event)

    @property
    def engine_url(self) -> str:
        engine = self.loaded.profile.engine
        return reachable_url(engine.host, engine.port)

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> int:
        if self.placement is None and not self._plan_first_launch():
            return self._exit_code
        self._handle_pending()  # a stop requested during preflight wins over the launch
        if self.state not in TERMINAL:
            self._launch()
        while self.state not in TERMINAL:
            try:
                event: Event = self.events.get(timeout=self.tick_s)
            except queue.Empty:
                event = Tick()
            self.handle(event)
            self._check_engine_exit()
        return self._exit_code

    def _handle_pending(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self.handle(event)

    def handle(self, event: Event) -> None:
        if isinstance(event, SignalReceived):
            if self.state not in TERMINAL and self.state is not State.STOPPING:
                self._stop(f"received {signal.Signals(event.signum).name}")
        elif isinstance(event, ReadinessReported):
            self._on_readiness(event)
        elif isinstance(event, LivenessReported):
            if event.launch == self.launches and self.state is State.READY:
                self._on_liveness(event.result)
        elif isinstance(event, EngineLogMatched):
            self._on_engine_log(event)
        elif isinstance(event, RestartRequested):
            if self.state in RESTARTABLE:
                self._restart(event.why)
        elif (
            isinstance(event, Tick)
            and self.state is State.BACKOFF
            and self._relaunch_at is not None
            and self.deps.clock() >= self._relaunch_at
        ):
            self._launch()

    def _on_readiness(self, event: ReadinessReported) -> None:
        if event.launch != self.launches or self.state is not State.WAITING_READY:
            return  # a result for an engine that is already gone
        if event.result.ok:
            self._on_ready(event.result)
        else:
            self._fail("not_ready", event.result.reason)

    def _on_engine_log(self, event: EngineLogMatched) -> None:
        if event.launch != self.launches:
            return  # a line from an engine that is already gone
        if not event.match.fatal:
            self.metrics.replayssm_shadow_mismatches.inc()
            log.warning("the engine's ReplaySSM shadow check: %s", event.match.line)
        elif self.state in (State.WAITING_READY, State.READY):
            devices = self.placement.devices if self.placement is not None else None
            self._fail("device_error", f"the engine logged {event.match.describe(devices)}")

    # -- transitions ------------------------------------------------------------------------------

    def _transition(self, new: State, reason: str) -> None:
        with self._lock:
            old, self.state = self.state, new
            self._history.append(
                {"at": round(self.deps.wall_clock(), 3), "from": old.value, "to": new.value, "reason": reason}
            )
        self.metrics.set_state(new)
        self.metrics.ready.set(1 if new is State.READY else 0)
        log.info("state %s -> %s: %s", old.value, new.value, reason)

    def _launch(self) -> None:
        assert self.placement is not None
        self._transition(State.LAUNCHING, f"launch {self.launches + 1}")
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="warden-"))
        try:
            command = build_engine_command(
                self.loaded,
                platform=self.placement.platform,
                devices=self.placement.devices,
                tensor_parallel=self.placement.tensor_parallel,
                runtime_dir=self._runtime_dir,
                replayssm_ring_len=self._replayssm_ring_len(),
            )
            marker = new_marker()
            command = replace(command, env={**command.env, MARKER_ENV: marker})
            log_path = self.state_dir / "engine.log"
            engine = launch(command, log_path, spawner=self.deps.spawner, procfs=self.deps.procfs)
        except OSError as error:
            self._cleanup_runtime_dir()
            self._give_up(f"could not start the engine: {error}")
            return
        self._write_record(engine, marker)
        with self._lock:
            self.launches += 1
            self.engine = engine
            self._launched_at = self.deps.clock()
            self._timings = {"launched_at": round(self.deps.wall_clock(), 3), "ready_at": None, "time_to_ready_s": None}
        self.metrics.engine_starts.inc()
        self.metrics.engine_up.set(1)
        log.info("engine pid %d started; log %s", engine.pid, engine.log_path)
        self._transition(State.WAITING_READY, f"engine pid {engine.pid} started")
        self._start_watcher()
        launch_number = self.launches
        self._log_watcher = EngineLogWatcher(
            engine.log_path, engine.log_offset, report=lambda match: self.post(EngineLogMatched(launch_number, match))
        )
        self._log_watcher.start()

    def _replayssm_ring_len(self) -> int | None:
        """The ring length the guard resolved into the run identity (it knows --max-num-seqs); None without one."""
        identity = self.guard.identity if self.guard is not None else None
        if identity is None:
            return None
        ring_len = identity.fields.get("replayssm", {}).get("ring_len")
        return ring_len if isinstance(ring_len, int) else None

    @property
    def record_path(self) -> Path:
        return self.state_dir / RECORD_NAME

    def _write_record(self, engine: EngineProcess, marker: str) -> None:
        """What a later warden needs to end this engine should this one die without stopping it."""
        me = self.deps.procfs.read(os.getpid())
        record = EngineRecord(
            profile=self.loaded.profile.name,
            marker=marker,
            engine_pid=engine.pid,
            engine_start_ticks=engine.start_ticks,
            supervisor_pid=os.getpid(),
            supervisor_start_ticks=me.start_ticks if me is not None else -1,
            boot_id=self.deps.procfs.boot_id() or "",
            launched_at=round(self.deps.wall_clock(), 3),
            uid=os.geteuid(),
        )
        try:
            write_record(self.record_path, record)
        except OSError as error:
            log.warning(
                "cannot write the engine record %s (%s): a warden that replaces this one after a crash "
                "will not find this engine's processes",
                self.record_path,
                error.strerror,
            )

    def _probe_fn(self) -> Callable[[], ProbeResult]:
        probe_fn = self.deps.probe or default_probe
        loaded, url, name = self.loaded, self.engine_url, self.loaded.served_name
        return lambda: probe_fn(url, name, loaded)

    def _start_liveness(self) -> None:
        launch_number = self.launches
        self._liveness_failures = 0
        self._liveness = LivenessWatcher(
            self._probe_fn(),
            interval_s=self.loaded.profile.supervisor.liveness_interval_s,
            report=lambda result: self.post(LivenessReported(launch_number, result)),
        )
        self._liveness.start()

    def _on_liveness(self, result: ProbeResult) -> None:
        self.metrics.liveness_checks.labels("ok" if result.ok else "failed").inc()
        if result.ok:
            self._liveness_failures = 0
            return
        self._liveness_failures += 1
        limit = self.loaded.profile.supervisor.liveness_failures
        log.warning("liveness canary failed (%d/%d): %s", self._liveness_failures, limit, result.reason)
        if self._liveness_failures >= limit:
            self._fail("hung", f"engine stopped answering: {limit} consecutive canaries failed; last: {result.reason}")

    def _start_watcher(self) -> None:
        launch_number = self.launches
        sup = self.loaded.profile.supervisor
        self._watcher = ReadinessWatcher(
            self._probe_fn(),
            interval_s=sup.probe_interval_s,
            deadline_s=sup.startup_timeout_s,
            report=lambda result: self.post(ReadinessReported(launch_number, result)),
            clock=self.deps.clock,
        )
        self._watcher.start()

    def _on_ready(self, result: ProbeResult) -> None:
        assert self._launched_at is not None
        elapsed = self.deps.clock() - self._launched_at
        with self._lock:
            self._timings["ready_at"] = round(self.deps.wall_clock(), 3)
            self._timings["time_to_ready_s"] = round(elapsed, 3)
            self._ready_detail = result.detail
            self.consecutive_failures = 0
        self.metrics.ready_duration.observe(elapsed)
        self._transition(State.READY, f"{result.reason}; ready {elapsed:.1f}s after launch")
        self._start_liveness()

    def _check_engine_exit(self) -> None:
        engine = self.engine
        if engine is None or self.state not in (State.WAITING_READY, State.READY):
            return
        code = engine.poll()
        if code is not None:
            self._fail("crashed", f"engine pid {engine.pid} exited with code {code}")

    def _end_session(self, reason: ExitReason) -> StopReport | None:
        """Cancel readiness, end the engine's whole session, reap, record how it went."""
        for watcher in (self._watcher, self._liveness, self._log_watcher):
            if watcher is not None:
                watcher.cancel()
        self._watcher = self._liveness = self._log_watcher = None
        engine = self.engine
        if engine is None:
            return None
        sup = self.loaded.profile.supervisor
        report = stop_session(
            engine,
            grace_s=sup.stop_grace_s,
            reap_timeout_s=sup.reap_timeout_s,
            procfs=self.deps.procfs,
            clock=self.deps.clock,
            sleep=self.deps.sleep,
        )
        self.metrics.engine_up.set(0)
        self.metrics.engine_exits.labels(reason).inc()
        self.metrics.stop_duration.observe(report.duration_s)
        self.metrics.stop_survivors.set(len(report.survivors))
        if not report.survivors:
            remove_record(self.record_path)  # kept otherwise: `warden reap` can try again later
        stop = {
            "reason": reason,
            "signals": report.signalled,
            "duration_s": round(report.duration_s, 3),
            "returncode": engine.poll(),
            "survivors": [{"pid": p.pid, "comm": p.comm, "state": p.state} for p in report.survivors],
        }
        with self._lock:
            self._last_stop = stop
            self.engine = None
        if report.survivors:
            log.error(
                "%d process(es) of engine session %d survived SIGKILL (stuck in the driver?): %s",
                len(report.survivors),
                engine.sid,
                ", ".join(f"{p.pid} {p.comm} state {p.state}" for p in report.survivors),
            )
        self._cleanup_runtime_dir()
        return report

    def _cleanup_runtime_dir(self) -> None:
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None

    def _fail(self, reason: ExitReason, what: str) -> None:
        engine = self.engine
        lines = read_log_lines(engine.log_path, engine.log_offset) if engine is not None else []
        tail, error = lines[-LOG_TAIL_LINES:], first_exception(lines)
        if reason == "crashed" and error is not None:  # the tail is often shutdown chatter: say why it died
            what = f"{what}; first error in its log: {error}"
        log.error("engine failed: %s", what)
        for line in tail[-10:]:
            log.error("  engine log | %s", line)
        self._transition(State.RECOVERING, what)
        report = self._end_session(reason)
        with self._lock:
            self._last_failure = {
                "at": round(self.deps.wall_clock(), 3),
                "kind": reason,
                "reason": what,
                "log_tail": tail,
                "error": error,  # the exception the engine log's first traceback ends with, if any
                "survivors": len(report.survivors) if report else 0,
            }
            self.consecutive_failures += 1
        restart = self.loaded.profile.supervisor.restart
        if report is not None and report.survivors:
            self._give_up(f"{what}; {len(report.survivors)} engine process(es) could not be ended")
        elif self.consecutive_failures > restart.max_restarts:
            self._give_up(
                f"{what}; gave up after {self.consecutive_failures} consecutive failures "
                f"(supervisor.restart.max_restarts = {restart.max_restarts})"
            )
        elif not self._replan(what):
            return
        else:
            delay = min(restart.backoff_initial_s * 2 ** (self.consecutive_failures - 1), restart.backoff_max_s)
            self._relaunch_at = self.deps.clock() + delay
            self.restarts += 1
            self.metrics.restarts.inc()
            self._transition(State.BACKOFF, f"{what}; relaunch in {delay:.1f}s")

    def _plan_first_launch(self) -> bool:
        """Guard, preflight and placement before the first launch; False (exit 3) when refused."""
        assert self.planner is not None, "a supervisor without a placement needs a planner"
        self._transition(State.PREFLIGHT, "guard and preflight before launch")
        plan = self.planner.plan(level="quick")
        with self._lock:
            self.guard, self.preflight, self.placement = plan.guard, plan.preflight, plan.placement
        if plan.placement is None:
            self._give_up(f"not launching: {plan.refusal}", exit_code=3)
            return False
        return True

    def _replan(self, what: str) -> bool:
        """Before a relaunch: full preflight, possibly a smaller placement; False when nothing fits."""
        if self.planner is None:
            return True
        plan = self.planner.plan(level="full", current=self.guard, current_placement=self.placement)
        with self._lock:
            self.preflight = plan.preflight or self.preflight
            self.guard = plan.guard or self.guard
            if plan.placement is not None:
                if plan.placement != self.placement:
                    log.warning("relaunching on a new placement: %s (was %s)", plan.placement, self.placement)
                self.placement = plan.placement
        if plan.placement is None:
            self._give_up(f"{what}; no relaunch: {plan.refusal}")
            return False
        return True

    def _give_up(self, what: str, exit_code: int = 1) -> None:
        self._exit_code = exit_code
        self._transition(State.FAILED, what)

    def request_restart(self) -> tuple[int, dict[str, Any]]:
        """POST /actions/restart, on the API's thread: only posts the event; the loop does the work."""
        state = self.state
        if state not in RESTARTABLE:
            return 409, {"error": f"cannot restart in state {state.value}", "state": state.value}
        self.post(RestartRequested("POST /actions/restart"))
        return 202, {"accepted": True, "state": state.value}

    def _restart(self, why: str) -> None:
        """End the engine as a stop would, then preflight in full and launch again now: an operator's fresh start
        (after clearing a quarantine, say), so it counts as no failure and resets the failure count."""
        self._transition(State.RECOVERING, f"restart requested ({why})")
        report = self._end_session("restart")
        if report is not None and report.survivors:
            self._give_up(f"restart requested; {len(report.survivors)} engine process(es) could not be ended")
            return
        with self._lock:
            self.consecutive_failures = 0
            self._relaunch_at = None
        if self._replan(f"restart requested ({why})"):
            self._launch()

    def _stop(self, why: str) -> None:
        self._transition(State.STOPPING, why)
        self._end_session("requested")
        self._transition(State.STOPPED, "engine session ended")

    # -- what /status and /identity show ----------------------------------------------------------

    def identity(self) -> dict[str, Any] | None:
        if self.guard is None or self.guard.identity is None:
            return None
        return self.guard.identity.to_json()

    def _guard_summary(self) -> dict[str, Any] | None:
        if self.guard is None:
            return None
        report = self.guard.report
        noteworthy = [f.to_json() for f in report.findings if f.status in ("fail", "unknown")]
        return {"refused": report.refused, "counts": report.counts(), "findings": noteworthy}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            engine = self.engine
            return {
                "state": self.state.value,
                "profile": self.loaded.profile.name,
                "profile_path": str(self.loaded.source),
                "served_model": self.loaded.served_name,
                "model_path": str(self.loaded.model_dir),
                "placement": None
                if self.placement is None
                else {
                    "platform": self.placement.platform,
                    "devices": self.placement.devices,
                    "tensor_parallel": self.placement.tensor_parallel,
                },
                "engine": None
                if engine is None
                else {
                    "pid": engine.pid,
                    "session": engine.sid,
                    "start_ticks": engine.start_ticks,
                    "log": str(engine.log_path),
                },
                "urls": {"engine": self.engine_url},
                "timings": dict(self._timings),
                "launches": self.launches,
                "restarts": self.restarts,
                "consecutive_failures": self.consecutive_failures,
                "canary": self._ready_detail,
                "guard": self._guard_summary(),
                "preflight": None if self.preflight is None else self.preflight.to_dict(),
                "identity": None
                if self.guard is None
                else {
                    "fingerprint": self.guard.identity.fingerprint if self.guard.identity else None,
                    "error": self.guard.identity_error,
                },
                "last_failure": self._last_failure,
                "last_stop": self._last_stop,
                "history": list(self._history),
            }
