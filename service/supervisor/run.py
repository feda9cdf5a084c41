"""`warden run PROFILE`: validate, place, bind the API, then hand over to the supervisor's loop."""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry

from preflight.quarantine import default_state_root
from service.errors import UserError
from service.profile import LoadedProfile, load_profile
from service.supervisor.api import ApiServer
from service.supervisor.engine_command import validate_engine_settings
from service.supervisor.engine_record import RECORD_NAME
from service.supervisor.launcher import become_child_subreaper
from service.supervisor.lifecycle import Supervisor
from service.supervisor.metrics import SupervisorMetrics
from service.supervisor.orphans import ReapResult, reap_record
from service.supervisor.planner import LaunchPlanner
from service.supervisor.procfs import ProcFS
from service.supervisor.states import SignalReceived

log = logging.getLogger("warden")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def state_dir_for(loaded: LoadedProfile) -> Path:
    configured = loaded.profile.supervisor.state_dir
    root = loaded.resolve(configured) if configured is not None else default_state_root()
    return root / loaded.profile.name


def reap_before_start(loaded: LoadedProfile, state_dir: Path, procfs: ProcFS | None = None) -> ReapResult:
    """End what a previous supervisor of this profile left running when it died, before it costs this one the
    engine's port or its devices. Refuses (UserError) while that supervisor still runs, or when its processes
    cannot be ended."""
    sup = loaded.profile.supervisor
    result = reap_record(
        state_dir / RECORD_NAME,
        dry_run=False,
        grace_s=sup.stop_grace_s,
        reap_timeout_s=sup.reap_timeout_s,
        procfs=procfs or ProcFS(),
        clock=time.monotonic,
        sleep=time.sleep,
    )
    if result.verdict == "supervised":
        raise UserError(
            f"profile {loaded.profile.name} is already supervised: {result.reason}",
            f"stop that warden first (kill -TERM {result.supervisor_pid}), or give this profile another name",
        )
    if not result.ok:
        raise UserError(f"a previous engine of profile {loaded.profile.name}: {result.reason}", result.remedy or "")
    if result.verdict == "ended":
        log.warning("before launch: %s", result.reason)
    return result


def read_token_file(path: Path, field: str, remedy: str) -> str:
    """The bearer token in `path` (named `field` in messages), stripped; UserError when unreadable or empty."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise UserError(f"{field} {path} cannot be read: {error.strerror}", remedy) from None
    if not token:
        raise UserError(f"{field} {path} is empty", "write a random token into it") from None
    return token


def read_token(loaded: LoadedProfile) -> str | None:
    token_file = loaded.profile.api.token_file
    if token_file is None:
        return None
    return read_token_file(
        loaded.resolve(token_file), "api.token_file", "create the file with a random token, or remove api.token_file"
    )


def check_port_free(host: str, port: int, field: str) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise UserError(
                    f"{field} {port} on {host} is already in use by another process",
                    f"stop that process or choose another {field}",
                ) from None
            raise UserError(
                f"cannot listen on {host}:{port} ({field}): {error.strerror}",
                f"check the host in the profile's {field.split('.', maxsplit=1)[0]} section",
            ) from None


def check_model(loaded: LoadedProfile) -> None:
    config = loaded.model_dir / "config.json"
    if not config.is_file():
        raise UserError(
            f"model.path {loaded.model_dir} has no config.json",
            "build the tiny model with `warden model tiny DIR`, or point model.path at a model folder",
        )


@contextlib.contextmanager
def signals_posted_to(supervisor: Supervisor) -> Iterator[None]:
    """Signal handlers only post an event; the supervisor's loop does the work."""

    def handler(signum: int, frame: FrameType | None) -> None:
        supervisor.post(SignalReceived(signum))

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_profile(path: str) -> int:
    loaded = load_profile(path)
    profile = loaded.profile
    check_model(loaded)
    validate_engine_settings(loaded)  # argument mistakes are refused before anything starts
    token = read_token(loaded)
    state_dir = state_dir_for(loaded)
    state_dir.mkdir(parents=True, exist_ok=True)
    previous = reap_before_start(loaded, state_dir)  # its engine may still hold engine.port
    check_port_free(profile.engine.host, profile.engine.port, "engine.port")
    registry = CollectorRegistry(auto_describe=True)
    metrics = SupervisorMetrics(registry)
    if previous.verdict == "ended":
        metrics.orphans_ended.set(len(previous.processes))
    # No placement yet: the supervisor's first step is the guard and preflight (state `preflight`),
    # with the API already answering and signals already handled.
    supervisor = Supervisor(loaded, None, state_dir, metrics, planner=LaunchPlanner(loaded, registry))
    try:
        api = ApiServer(
            profile.api.host,
            profile.api.port,
            snapshot=supervisor.snapshot,
            metrics=metrics.exposition,
            identity=supervisor.identity,
            token=token,
            actions={"restart": supervisor.request_restart},
        )
    except OSError as error:
        raise UserError(
            f"cannot serve the API on {profile.api.host}:{profile.api.port}: {error.strerror}",
            "stop whatever holds api.port or choose another api.port",
        ) from None
    if not become_child_subreaper():
        log.warning("could not become a child subreaper; orphaned engine processes reparent to init")
    log.info(
        "profile %s: model %s, API on http://%s:%d",
        profile.name,
        loaded.model_dir,
        profile.api.host,
        api.port,
    )
    api.start()
    try:
        with signals_posted_to(supervisor):
            return supervisor.run()
    finally:
        api.close()
