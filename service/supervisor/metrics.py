"""warden's own metrics, on one registry the supervisor owns (nothing registers at import time)."""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from service import __version__
from service.supervisor.states import State

ExitReason = Literal["requested", "crashed", "not_ready", "hung", "device_error", "restart"]
EXIT_REASONS: tuple[ExitReason, ...] = ("requested", "crashed", "not_ready", "hung", "device_error", "restart")

# Launch-to-ready: the tiny CPU model is ready in ~20 s, a 35B MoE on four cards in minutes, and
# the startup budget tops out at 20-30 min; buckets cover that range roughly doubling.
READY_BUCKETS = (5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
# Stopping a session: a clean SIGTERM takes ~2 s, the grace is 10 s, the reap budget 60 s.
STOP_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 70.0)


class SupervisorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Gauge("warden_build_info", "warden build; value is always 1", ["version"], registry=r)
        self.info.labels(__version__).set(1)
        self.state = Gauge(
            "warden_state", "1 for the supervisor's current state, 0 for the others", ["state"], registry=r
        )
        for state in State:
            self.state.labels(state.value)
        self.engine_up = Gauge("warden_engine_up", "1 while an engine process is running", registry=r)
        self.ready = Gauge("warden_ready", "1 while the engine is ready (canary passed)", registry=r)
        self.engine_starts = Counter("warden_engine_starts_total", "engine launches", registry=r)
        self.engine_exits = Counter(
            "warden_engine_exits_total", "engine sessions ended, by reason", ["reason"], registry=r
        )
        for reason in EXIT_REASONS:
            self.engine_exits.labels(reason)
        self.liveness_checks = Counter(
            "warden_liveness_checks_total",
            "liveness canaries sent to a ready engine, by result",
            ["result"],
            registry=r,
        )
        for result in ("ok", "failed"):
            self.liveness_checks.labels(result)
        self.restarts = Counter("warden_engine_restarts_total", "relaunches after a failure", registry=r)
        self.ready_duration = Histogram(
            "warden_engine_ready_duration_seconds",
            "launch to ready (health, model listed, canary completion)",
            buckets=READY_BUCKETS,
            registry=r,
        )
        self.stop_duration = Histogram(
            "warden_engine_stop_duration_seconds",
            "signal to no process of the engine's session left",
            buckets=STOP_BUCKETS,
            registry=r,
        )
        self.stop_survivors = Gauge(
            "warden_engine_stop_survivors", "processes of the last engine session still alive after SIGKILL", registry=r
        )

        self.replayssm_shadow_mismatches = Counter(
            "warden_replayssm_shadow_mismatches_total",
            "decode and verify calls and resumed checkpoints where ReplaySSM and vLLM's own ops disagreed beyond "
            "tolerance (the engine log's shadow check lines; replayssm.shadow_check)",
            registry=r,
        )

        # A gauge, not a counter: it is set before the first scrape, and a counter that starts above zero shows no
        # increase() to Prometheus.
        self.orphans_ended = Gauge(
            "warden_orphans_ended_at_start",
            "processes a previous supervisor of this profile left running when it died, ended when this one started",
            registry=r,
        )

    def set_state(self, current: State) -> None:
        for state in State:
            self.state.labels(state.value).set(1 if state is current else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
