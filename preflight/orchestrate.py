"""One preflight run: discover, probe every candidate device at once, all-reduce across the healthy
ones, bisect on failure, place the model, quarantine what failed.

Nothing here imports torch, pydantic, yaml or prometheus_client: the profile adapter
(`preflight.profiles`) and the metrics (`preflight.metrics`) sit on top.
"""

from __future__ import annotations

import platform as _platform
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from preflight.backends import DEFAULT_MIN_BUSBW_GBPS, Backend, DeviceInfo, Discovery, make_backend
from preflight.bisection import bisect, failure_of
from preflight.collective import Collectives
from preflight.devices import Timeouts, probe_device
from preflight.failures import ACTIONS, Failure
from preflight.faults import Fault
from preflight.health import Action, CheckResult, Health, plural
from preflight.levels import Level
from preflight.model_shape import ModelShape
from preflight.placement import PlacementRequest, place
from preflight.platforms import ConcretePlatform
from preflight.quarantine import Entry, Quarantine
from preflight.report import CollectiveReport, DeviceReport, PlacementReport, PreflightReport

# Failures that put a device in quarantine. `error` (an unrecognised exception) asks for a retry
# instead; a device that is merely held by other processes needs `warden reap`, not quarantine.
QUARANTINED_FAILURES = frozenset(
    f.value
    for f in (
        Failure.CRASH,
        Failure.HANG,
        Failure.WRONG_RESULT,
        Failure.DEVICE_LOST,
        Failure.SLOW_LINK,
        Failure.ALLOC_FAIL,
    )
)


@dataclass(frozen=True)
class PreflightOptions:
    platform: ConcretePlatform
    level: Level = "quick"
    devices: Literal["auto"] | tuple[int, ...] = "auto"
    tensor_parallel: Literal["auto"] | int = "auto"
    model_shape: ModelShape | None = None
    model_problem: str | None = None  # the model folder could not be read: placement refuses
    sim_devices: int = 4
    faults: tuple[Fault, ...] = ()
    timeouts: Timeouts = field(default_factory=Timeouts)
    min_busbw_gbps: float | None = None  # None: the platform's default floor
    collective: bool = True
    prestart_collective: bool = True  # start collective workers while the device probes run
    quarantine_file: Path | None = None  # None: no quarantine is read or written
    extra_env: Mapping[str, str] = field(default_factory=dict)  # NCCL_*/CCL_*/... from the profile

    @property
    def has_model(self) -> bool:
        return self.model_shape is not None or self.model_problem is not None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def missing_report(index: int, discovery: Discovery) -> DeviceReport:
    count = len(discovery.devices)
    return DeviceReport(
        index=index,
        name="(not present)",
        health=Health.UNKNOWN,
        reason=f"device {index} is not present: {discovery.source} found {plural(count, 'device')}"
        + (f" ({'; '.join(discovery.notes)})" if discovery.notes else ""),
        action=ACTIONS[Failure.MISSING],
        failure=Failure.MISSING.value,
        probed=False,
    )


def quarantined_report(device: DeviceInfo, entry: Entry) -> DeviceReport:
    failure = Failure(entry.failure) if entry.failure in {f.value for f in Failure} else Failure.ERROR
    return DeviceReport(
        index=device.index,
        name=device.name,
        health=Health.UNHEALTHY,
        reason=f"quarantined since {entry.since}: {entry.reason}; clear with `warden preflight --clear {device.index}`",
        action=ACTIONS[failure],
        failure=entry.failure,
        quarantined=True,
        probed=False,
    )


def _identity(reports: Sequence[DeviceReport], backend: Backend) -> dict[str, Any]:
    torch_version = next(
        (p.evidence.get("torch") for r in reports for p in r.probes if p.check == "enumerate" and p.evidence), None
    )
    warden_version: str | None
    try:
        from service import __version__ as warden_version
    except ImportError:  # the standalone preflight runs without the service package's dependencies
        warden_version = None
    return {
        "host": socket.gethostname(),
        "python": _platform.python_version(),
        "torch": torch_version,
        "warden": warden_version,
        "platform": backend.name,
        "collective_backend": backend.collective_backend,
    }


def _collective_phase(
    *,
    options: PreflightOptions,
    backend: Backend,
    coll: Collectives,
    candidates: list[int],
    reports: dict[int, DeviceReport],
) -> tuple[CollectiveReport, list[frozenset[int]]]:
    """Run the all-reduce; on failure bisect and fold the verdicts into the device reports."""
    base = CollectiveReport(
        backend.collective_backend, tuple(candidates), None, Health.UNKNOWN, "", min_busbw_gbps=coll.min_busbw_gbps
    )
    if not options.collective:
        return replace(base, reason="disabled (preflight.collective is false)"), []
    if len(candidates) < 2:
        return replace(base, reason=f"{plural(len(candidates), 'usable device')}: no all-reduce to run"), []
    started = coll.clock()
    run = coll.run(candidates)
    if run.ok:
        return replace(
            base,
            ok=True,
            health=Health.HEALTHY,
            reason=run.reason,
            busbw_gbps=run.busbw_gbps,
            duration_s=coll.clock() - started,
            run=run,
        ), [frozenset(candidates)]
    bis = bisect(candidates, coll.run_many)
    for device in bis.bad:
        failure = failure_of(bis, device) or Failure.ERROR.value
        reports[device] = reports[device].with_result(
            CheckResult(
                "collective",
                Health.UNHEALTHY,
                f"named by bisection: {bis.reasons[device]}",
                ACTIONS[Failure(failure)],
                evidence={"failure": failure},
            )
        )
    for device in bis.unresolved:
        reports[device] = reports[device].with_result(
            CheckResult("collective", Health.UNKNOWN, bis.reasons[device], Action.RETRY)
        )
    if bis.bad:
        verdict = f"; bisection named {plural(len(bis.bad), 'bad device')}: {', '.join(map(str, bis.bad))}"
    elif bis.unresolved:
        verdict = "; bisection found no known-good device, so it could not name the bad one"
    else:
        verdict = "; every pair passed in bisection, so no single device is to blame"
    verified = [frozenset(step.devices) for step in bis.steps if step.ok]
    return replace(
        base,
        ok=False,
        health=Health.UNHEALTHY,
        reason=run.reason + verdict,
        busbw_gbps=run.busbw_gbps,
        duration_s=coll.clock() - started,
        run=run,
        bisection=bis,
    ), verified


def run_preflight(
    options: PreflightOptions,
    *,
    backend: Backend | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
) -> PreflightReport:
    started, started_at = clock(), _iso(wall_clock())
    backend = backend or make_backend(
        options.platform,
        sim_devices=options.sim_devices,
        faults=options.faults,
        discover_timeout_s=options.timeouts.startup_s,
        extra_env=options.extra_env,
    )
    quarantine = Quarantine(options.quarantine_file, wall_clock)
    held = {e.device: e for e in quarantine.entries(backend.name)}
    discovery = backend.discover()
    discovered_at = clock()
    known = {d.index: d for d in discovery.devices}
    wanted = sorted(known) if options.devices == "auto" else list(options.devices)

    reports: dict[int, DeviceReport] = {}
    to_probe: list[DeviceInfo] = []
    for index in wanted:
        if index not in known:
            reports[index] = missing_report(index, discovery)
        elif index in held:
            reports[index] = quarantined_report(known[index], held[index])
        else:
            to_probe.append(known[index])

    floor = options.min_busbw_gbps if options.min_busbw_gbps is not None else DEFAULT_MIN_BUSBW_GBPS[backend.name]
    coll = Collectives(
        backend,
        level=options.level,
        timeouts=options.timeouts,
        min_busbw_gbps=floor or None,
        extra_env=options.extra_env,
        clock=clock,
    )
    if options.collective and options.prestart_collective and len(to_probe) >= 2:
        coll.prestart([d.index for d in to_probe])
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(to_probe))) as executor:
            probed = executor.map(
                lambda d: probe_device(
                    backend, d, level=options.level, timeouts=options.timeouts, extra_env=options.extra_env, clock=clock
                ),
                to_probe,
            )
            for report in probed:
                reports[report.index] = report
        probed_at = clock()
        candidates = [d.index for d in to_probe if reports[d.index].usable]
        collective, verified = _collective_phase(
            options=options, backend=backend, coll=coll, candidates=candidates, reports=reports
        )
        placement = place(
            [i for i in wanted if reports[i].usable],
            options.model_shape,
            PlacementRequest(options.devices, options.tensor_parallel),
            {i: f"{reports[i].health.value}: {reports[i].reason}" for i in wanted if not reports[i].usable},
            options.model_problem,
        )
        placement, collective = _confirm(placement, collective, verified, coll, options)
    finally:
        coll.close()

    collective_at = clock()

    for index, report in list(reports.items()):
        if (
            report.probed
            and report.health is Health.UNHEALTHY
            and report.failure in QUARANTINED_FAILURES
            and report.action is not Action.REAP_PROCESSES
        ):
            quarantine.add(backend.name, index, report.reason, report.failure, report.name)
            if options.quarantine_file is not None:
                reports[index] = replace(report, quarantined=True)

    ordered = tuple(reports[i] for i in wanted)
    finished = clock()
    return PreflightReport(
        platform=backend.name,
        level=options.level,
        devices=ordered,
        collective=collective,
        placement=placement,
        discovery=discovery.to_dict(),
        quarantine=quarantine.describe(backend.name),
        duration_s=finished - started,
        phases={
            "discovery": discovered_at - started,
            "devices": probed_at - discovered_at,
            "collective": collective_at - probed_at,
            "total": finished - started,
        },
        started_at=started_at,
        has_model=options.has_model,
        identity=_identity(ordered, backend),
    )


def _confirm(
    placement: PlacementReport,
    collective: CollectiveReport,
    verified: list[frozenset[int]],
    coll: Collectives,
    options: PreflightOptions,
) -> tuple[PlacementReport, CollectiveReport]:
    """A chosen multi-device set that no passing all-reduce covered gets one of its own."""
    if not placement.ok or (placement.tensor_parallel or 1) < 2 or not options.collective:
        return placement, collective
    chosen = frozenset(placement.devices)
    if any(chosen <= group for group in verified):
        return placement, collective
    confirm = coll.run(placement.devices)
    collective = replace(collective, confirm=confirm)
    if confirm.ok:
        return placement, collective
    refused = PlacementReport(
        False,
        (),
        None,
        f"TP{placement.tensor_parallel} on devices {list(placement.devices)} fits the model, but {confirm.reason}",
        placement.valid_sizes,
    )
    return refused, collective
