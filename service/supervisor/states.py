"""The supervisor's states and the events that move it between them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.supervisor.engine_log import LogMatch
from service.supervisor.readiness import ProbeResult


class State(StrEnum):
    STARTING = "starting"  # profile loaded, nothing launched yet
    PREFLIGHT = "preflight"  # guard, device and collective checks, placement
    LAUNCHING = "launching"  # building the command and spawning the engine
    WAITING_READY = "waiting_ready"  # engine running, readiness not yet proven
    READY = "ready"  # canary passed; serving
    RECOVERING = "recovering"  # engine failed; ending what is left of its session
    BACKOFF = "backoff"  # engine failed; waiting before the next launch
    STOPPING = "stopping"  # ending the engine's session on request
    STOPPED = "stopped"  # stopped on request (exit 0)
    FAILED = "failed"  # gave up (exit 1), or refused before launch (exit 3)


TERMINAL = frozenset({State.STOPPED, State.FAILED})


@dataclass(frozen=True)
class Tick:
    """Time passed; lets the loop notice engine exits and backoff deadlines."""


@dataclass(frozen=True)
class SignalReceived:
    signum: int


@dataclass(frozen=True)
class ReadinessReported:
    launch: int  # which launch the result belongs to; stale results are ignored
    result: ProbeResult


@dataclass(frozen=True)
class LivenessReported:
    launch: int
    result: ProbeResult


@dataclass(frozen=True)
class EngineLogMatched:
    launch: int
    match: LogMatch


@dataclass(frozen=True)
class RestartRequested:
    """An operator asked for a fresh engine (POST /actions/restart): after a full preflight, at once."""

    why: str


Event = Tick | SignalReceived | ReadinessReported | LivenessReported | EngineLogMatched | RestartRequested
