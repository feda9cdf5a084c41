"""The supervisor's state machine with real processes standing in for the engine.

The spawner seam replaces vLLM's argv with a small Python script (same environment, same new
session, same signals); the readiness probe is scripted. Everything else is the real loop: real
process exits, real process-group signals, real reaping through /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
from prometheus_client import CollectorRegistry
from support import wait_for

from preflight.platforms import ConcretePlatform
from service.profile import LoadedProfile, parse_profile
from service.supervisor.launcher import ProcessHandle
from service.supervisor.lifecycle import Dependencies, Placement, Supervisor
from service.supervisor.metrics import SupervisorMetrics
from service.supervisor.procfs import ProcFS
from service.supervisor.readiness import ProbeResult
from service.supervisor.states import SignalReceived, State

STUB = str(Path(__file__).with_name("stub_engine.py"))


def profile(tmp_path: Path, **supervisor: object) -> LoadedProfile:
    data = {
        "name": "t",
        "model": {"path": "m"},
        "platform": "cpu",
        "supervisor": {"stop_grace_s": 0.5, "reap_timeout_s": 10, "probe_interval_s": 0.05, **supervisor},
    }
    return parse_profile(data, tmp_path / "p.yaml")


def stub_spawner(*stub_args: str) -> Callable[[list[str], dict[str, str], Path, IO[bytes]], ProcessHandle]:
    """Spawns the stand-in instead of vLLM, with the environment, folder and session warden chose."""

    def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: IO[bytes]) -> ProcessHandle:
        return subprocess.Popen(
            [sys.executable, STUB, *stub_args],
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    return spawn


class Harness:
    def __init__(self, sup: Supervisor, registry: CollectorRegistry) -> None:
        self.sup = sup
        self.registry = registry
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.exit_code = self.sup.run()

    def state_becomes(self, state: State, timeout_s: float = 30) -> None:
        wait_for(lambda: self.sup.state is state, timeout_s=timeout_s, what=f"state {state.value}")

    def finish(self, timeout_s: float = 30) -> int:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"supervisor still running in state {self.sup.state}"
        assert self.exit_code is not None
        return self.exit_code

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        assert value is not None, name
        return value


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(
        loaded: LoadedProfile,
        spawner: Callable[..., ProcessHandle],
        probe: Callable[[str, str, LoadedProfile], ProbeResult],
    ) -> Harness:
        registry = CollectorRegistry()
        platform: ConcretePlatform = "cpu"
        sup = Supervisor(
            loaded,
            Placement(platform, None, 1),
            tmp_path / "state",
            SupervisorMetrics(registry),
            Dependencies(spawner=spawner, probe=probe),
            tick_s=0.02,
        )
        h = Harness(sup, registry)
        made.append(h)
        h.thread.start()
        return h

    yield make
    for h in made:  # never leave a stand-in engine behind, even when a test fails
        if h.thread.is_alive():
            h.sup.post(SignalReceived(signal.SIGTERM))
            h.thread.join(30)


def always(ok: bool, reason: str = "scripted") -> Callable[[str, str, LoadedProfile], ProbeResult]:
    return lambda url, name, loaded: ProbeResult(ok, "ready" if ok else "health", reason)


def test_sigterm_ends_the_whole_session_including_a_stubborn_orphan(tmp_path: Path, harness) -> None:
    """1. engine starts and leaves an orphan that ignores SIGTERM  2. ready  3. SIGTERM.
    Result: SIGTERM then SIGKILL, no process of the session left, exit 0."""
    flag = tmp_path / "orphan-pid"
    h = harness(profile(tmp_path), stub_spawner("orphan", str(flag)), always(True))
    h.state_becomes(State.READY)
    engine = h.sup.engine
    assert engine is not None
    sid = engine.sid
    wait_for(flag.exists, timeout_s=20, what="the orphan to start")
    orphan = ProcFS().read(int(flag.read_text()))
    assert orphan is not None and orphan.sid == sid and orphan.ppid != engine.pid
    h.sup.post(SignalReceived(signal.SIGTERM))
    assert h.finish() == 0
    assert h.sup.state is State.STOPPED
    assert [p for p in ProcFS().session_members(sid) if not p.is_zombie] == []
    stop = h.sup.snapshot()["last_stop"]
    assert stop["reason"] == "requested"
    assert stop["signals"] == ["SIGTERM", "SIGKILL"]
    assert stop["survivors"] == []
    assert h.metric("warden_engine_exits_total", reason="requested") == 1
    assert h.metric("warden_state", state="stopped") == 1
    assert h.metric("warden_engine_up") == 0


def test_stop_also_ends_a_process_that_left_the_session_but_carries_the_launchs_marker(tmp_path: Path, harness) -> None:
    """vLLM's workers stay in the engine's session, but a process that calls setsid() leaves it: the launch's marker
    in its environment still names it as the engine's."""
    flag = tmp_path / "escapee-pid"
    h = harness(profile(tmp_path), stub_spawner("escape", str(flag)), always(True))
    h.state_becomes(State.READY)
    assert h.sup.engine is not None
    wait_for(flag.exists, timeout_s=20, what="the escapee to start")
    escapee = ProcFS().read(int(flag.read_text()))
    assert escapee is not None and escapee.sid != h.sup.engine.sid
    try:
        h.sup.post(SignalReceived(signal.SIGTERM))
        assert h.finish() == 0
        assert not ProcFS().is_same_process(escapee.pid, escapee.start_ticks)
        assert h.sup.snapshot()["last_stop"]["signals"] == ["SIGTERM", "SIGKILL"]  # it ignores SIGTERM
    finally:
        if ProcFS().is_same_process(escapee.pid, escapee.start_ticks):
            os.kill(escapee.pid, signal.SIGKILL)  # a failed test leaves nothing behind


def test_a_device_lost_line_in_the_engine_log_ends_the_engine_at_once(tmp_path: Path, harness) -> None:
    """The engine keeps running (and the probe keeps passing) after it logged that its device is lost: warden ends
    it on the log line, not minutes later on failed canaries, and says which worker saw it."""
    h = harness(
        profile(tmp_path, restart={"max_restarts": 0}, liveness_interval_s=3600),
        stub_spawner("device-lost"),
        always(True),
    )
    assert h.finish(timeout_s=60) == 1
    failure = h.sup.snapshot()["last_failure"]
    assert failure["kind"] == "device_error"
    assert "the engine logged device_lost on TP rank 1: (Worker_TP1 pid=4121) ERROR" in failure["reason"]
    assert "UR_RESULT_ERROR_DEVICE_LOST" in failure["reason"]
    assert h.metric("warden_engine_exits_total", reason="device_error") == 1
    assert h.sup.snapshot()["last_stop"]["survivors"] == []


def test_replayssm_shadow_mismatches_are_counted_and_the_engine_keeps_serving(tmp_path: Path, harness) -> None:
    """The shadow check's ERROR lines are for on-call to judge (a metric and an alert), not a reason to end an
    engine that serves."""
    h = harness(profile(tmp_path), stub_spawner("shadow-mismatch"), always(True))
    h.state_becomes(State.READY)
    wait_for(lambda: h.metric("warden_replayssm_shadow_mismatches_total") == 2, timeout_s=20, what="both counted")
    assert h.sup.state is State.READY and h.sup.launches == 1
    assert h.metric("warden_engine_exits_total", reason="device_error") == 0
    h.sup.post(SignalReceived(signal.SIGTERM))
    assert h.finish() == 0


def test_an_operators_restart_ends_the_engine_and_launches_a_fresh_one(tmp_path: Path, harness) -> None:
    """POST /actions/restart (request_restart): the engine's whole session ends, a new engine starts at once, and it
    counts as no failure."""
    h = harness(profile(tmp_path), stub_spawner("serve"), always(True))
    h.state_becomes(State.READY)
    first = h.sup.engine
    assert first is not None
    assert h.sup.request_restart() == (202, {"accepted": True, "state": "ready"})
    wait_for(lambda: h.sup.launches == 2 and h.sup.state is State.READY, timeout_s=30, what="the fresh engine ready")
    assert [p for p in ProcFS().session_members(first.sid) if not p.is_zombie] == []
    snap = h.sup.snapshot()
    assert snap["last_stop"]["reason"] == "restart" and snap["last_failure"] is None
    assert (snap["restarts"], snap["consecutive_failures"]) == (0, 0)
    assert h.metric("warden_engine_exits_total", reason="restart") == 1
    assert h.metric("warden_engine_restarts_total") == 0  # relaunches after failures only
    h.sup.post(SignalReceived(signal.SIGTERM))
    assert h.finish() == 0
    assert h.sup.request_restart()[0] == 409  # nothing to restart once stopped


def test_crash_before_ready_backs_off_and_relaunches(tmp_path: Path, harness) -> None:
    """1. first launch exits 3  2. backoff  3. second launch serves. Result: ready, one restart."""
    marker, up = tmp_path / "crashed-once", tmp_path / "up"
    probe = lambda url, name, loaded: ProbeResult(up.exists(), "ready" if up.exists() else "health", "scripted")  # noqa: E731
    loaded = profile(tmp_path, restart={"max_restarts": 2, "backoff_initial_s": 0.05})
    h = harness(loaded, stub_spawner("crash-once", str(marker), str(up)), probe)
    h.state_becomes(State.READY)
    snap = h.sup.snapshot()
    assert snap["launches"] == 2 and snap["restarts"] == 1 and snap["consecutive_failures"] == 0
    assert snap["last_failure"]["kind"] == "crashed"
    assert "exited with code 3" in snap["last_failure"]["reason"]
    assert [t["to"] for t in snap["history"]] == [
        "launching",
        "waiting_ready",
        "recovering",
        "backoff",
        "launching",
        "waiting_ready",
        "ready",
    ]
    assert h.metric("warden_engine_exits_total", reason="crashed") == 1
    assert h.metric("warden_engine_restarts_total") == 1
    assert h.metric("warden_engine_ready_duration_seconds_count") == 1
    h.sup.post(SignalReceived(signal.SIGINT))
    assert h.finish() == 0


def test_a_crash_names_the_error_its_log_gives_not_only_the_exit_code(tmp_path: Path, harness) -> None:
    """vLLM's server exits 0 when its engine core died, and the log's last lines are shutdown chatter: the failure
    says which exception ended it."""
    loaded = profile(tmp_path, restart={"max_restarts": 0})
    h = harness(loaded, stub_spawner("core-dies"), always(False))
    assert h.finish() == 1
    failure = h.sup.snapshot()["last_failure"]
    assert failure["kind"] == "crashed"
    assert failure["reason"].endswith(
        "exited with code 0; first error in its log: RuntimeError: causal_conv1d_fwd_cpu: expect x to be transposed."
    )
    assert failure["error"] == "RuntimeError: causal_conv1d_fwd_cpu: expect x to be transposed."
    assert not any("RuntimeError" in line for line in failure["log_tail"])  # the tail alone would not say


def test_crash_loop_gives_up_after_max_restarts(tmp_path: Path, harness) -> None:
    loaded = profile(tmp_path, restart={"max_restarts": 2, "backoff_initial_s": 0.05})
    h = harness(loaded, stub_spawner("exit", "1"), always(False))
    assert h.finish() == 1
    snap = h.sup.snapshot()
    assert snap["state"] == "failed"
    assert snap["launches"] == 3
    assert "gave up after 3 consecutive failures" in snap["history"][-1]["reason"]
    assert "boom" in snap["last_failure"]["log_tail"] and snap["last_failure"]["error"] is None
    assert h.metric("warden_engine_exits_total", reason="crashed") == 3


def test_engine_that_never_becomes_ready_is_stopped_at_the_startup_deadline(tmp_path: Path, harness) -> None:
    loaded = profile(tmp_path, startup_timeout_s=0.5, restart={"max_restarts": 0})
    h = harness(loaded, stub_spawner("serve"), always(False, "GET /health answered 503"))
    assert h.finish() == 1
    snap = h.sup.snapshot()
    assert snap["last_failure"]["kind"] == "not_ready"
    assert "not ready after 0.5s (supervisor.startup_timeout_s)" in snap["last_failure"]["reason"]
    assert "GET /health answered 503" in snap["last_failure"]["reason"]
    assert snap["last_stop"]["signals"] == ["SIGTERM"]
    assert h.metric("warden_engine_exits_total", reason="not_ready") == 1


class _SlowPlanner:
    """A planner whose preflight is interrupted by a stop request (posted while it runs)."""

    def __init__(self, on_plan: Callable[[], None]) -> None:
        self.on_plan = on_plan
        self.calls = 0

    def plan(self, **_: object) -> object:
        from service.supervisor.placement import Placement as Where
        from service.supervisor.planner import Plan

        self.calls += 1
        self.on_plan()
        return Plan(Where("cpu", None, 1), None, None, None)


def test_stop_requested_during_preflight_launches_nothing(tmp_path: Path) -> None:
    spawned: list[list[str]] = []

    def spawner(argv: list[str], env: dict[str, str], cwd: Path, log: IO[bytes]) -> ProcessHandle:
        spawned.append(argv)
        raise AssertionError("nothing may be launched")

    registry = CollectorRegistry()
    sup = Supervisor(
        profile(tmp_path),
        None,
        tmp_path / "state",
        SupervisorMetrics(registry),
        Dependencies(spawner=spawner, probe=always(True)),
        tick_s=0.02,
    )
    planner = _SlowPlanner(lambda: sup.post(SignalReceived(signal.SIGTERM)))
    sup.planner = planner  # type: ignore[assignment]
    assert sup.run() == 0
    assert planner.calls == 1 and spawned == []
    assert [t["to"] for t in sup.snapshot()["history"]] == ["preflight", "stopping", "stopped"]


def test_engine_that_stops_answering_is_declared_hung_and_relaunched(tmp_path: Path, harness) -> None:
    """1. ready  2. the canary fails `liveness_failures` times in a row (a wedged engine whose process
    lives on)  3. Result: the session is ended, exit reason `hung`, the engine relaunched and ready again."""
    answers = {"ok": True}

    def probe(url: str, name: str, loaded: LoadedProfile) -> ProbeResult:
        return ProbeResult(answers["ok"], "ready" if answers["ok"] else "canary", "scripted")

    loaded = profile(
        tmp_path, liveness_interval_s=0.05, liveness_failures=2, restart={"max_restarts": 1, "backoff_initial_s": 0.05}
    )
    h = harness(loaded, stub_spawner("serve"), probe)
    h.state_becomes(State.READY)
    first = h.sup.engine
    assert first is not None
    wait_for(lambda: h.metric("warden_liveness_checks_total", result="ok") >= 2, timeout_s=20, what="canaries")
    answers["ok"] = False
    wait_for(lambda: h.sup.state is State.BACKOFF or h.sup.launches == 2, timeout_s=20, what="the hang verdict")
    snap = h.sup.snapshot()
    assert snap["last_failure"]["kind"] == "hung"
    assert "2 consecutive canaries failed" in snap["last_failure"]["reason"]
    assert [p for p in ProcFS().session_members(first.sid) if not p.is_zombie] == []
    answers["ok"] = True
    wait_for(lambda: h.sup.launches == 2 and h.sup.state is State.READY, timeout_s=20, what="the relaunch")
    assert h.metric("warden_engine_exits_total", reason="hung") == 1
    assert h.metric("warden_liveness_checks_total", result="failed") == 2
    h.sup.post(SignalReceived(signal.SIGTERM))
    assert h.finish() == 0
