"""Preflight metrics on a registry the caller owns (nothing registers at import time).

    metrics = PreflightMetrics(registry)   # e.g. SupervisorMetrics().registry
    metrics.observe(report)                # after every preflight run

Series (labels are bounded: device index, one of four healths, level, phase, failure kind):

- `warden_preflight_device_health{device,health}`: 1 for the device's health in the last run, 0 for the others
- `warden_preflight_device_quarantined{device}`: 1 while the device is quarantined
- `warden_preflight_quarantined_devices`: how many devices are quarantined on this platform
- `warden_preflight_collective_busbw_bytes_per_second`: bus bandwidth of the last all-reduce (NaN until one ran)
- `warden_preflight_collective_ok`: 1 if the last all-reduce was correct and fast enough, 0 if not (NaN until one ran)
- `warden_preflight_duration_seconds{level,phase}`: histogram of run and phase durations
- `warden_preflight_runs_total{level,outcome}`: runs, placed or refused
- `warden_preflight_device_failures_total{failure}`: devices found unhealthy, by failure kind
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from preflight.failures import Failure
from preflight.health import Health
from preflight.levels import LEVELS
from preflight.report import PreflightReport

PHASES = ("discovery", "devices", "collective", "total")
OUTCOMES = ("placed", "refused")
# Quick runs target <=10 s for 8 devices (anchors allow 30 s); full runs take about 2 min; a
# bisection adds collective timeouts (60 s each by default). Buckets span that, roughly doubling.
DURATION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class PreflightMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        r = registry
        self.device_health = Gauge(
            "warden_preflight_device_health",
            "1 for each device's health in the last preflight, 0 for the other healths",
            ["device", "health"],
            registry=r,
        )
        self.device_quarantined = Gauge(
            "warden_preflight_device_quarantined", "1 while the device is quarantined", ["device"], registry=r
        )
        self.quarantined_devices = Gauge(
            "warden_preflight_quarantined_devices", "devices in quarantine on this platform", registry=r
        )
        self.busbw = Gauge(
            "warden_preflight_collective_busbw_bytes_per_second",
            "all-reduce bus bandwidth of the last preflight (nccl-tests busbw), bytes per second",
            registry=r,
        )
        self.collective_ok = Gauge(
            "warden_preflight_collective_ok", "1 if the last all-reduce was correct and fast enough", registry=r
        )
        self.duration = Histogram(
            "warden_preflight_duration_seconds",
            "preflight wall time, whole run and per phase",
            ["level", "phase"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.runs = Counter(
            "warden_preflight_runs_total", "preflight runs by outcome", ["level", "outcome"], registry=r
        )
        self.failures = Counter(
            "warden_preflight_device_failures_total",
            "devices found unhealthy, by failure kind",
            ["failure"],
            registry=r,
        )
        # Nothing measured yet is not a measurement of zero.
        self.busbw.set(float("nan"))
        self.collective_ok.set(float("nan"))
        for level in LEVELS:
            for outcome in OUTCOMES:
                self.runs.labels(level, outcome)
        for failure in Failure:
            self.failures.labels(failure.value)
        self._devices: set[str] = set()

    def observe(self, report: PreflightReport) -> None:
        for device in report.devices:
            label = str(device.index)
            self._devices.add(label)
            for health in Health:
                self.device_health.labels(label, health.value).set(1 if device.health is health else 0)
            if device.probed and device.health is Health.UNHEALTHY and device.failure is not None:
                self.failures.labels(device.failure).inc()
        quarantined = {str(e["device"]) for e in report.quarantine.get("entries", [])}
        for label in self._devices | quarantined:
            self._devices.add(label)
            self.device_quarantined.labels(label).set(1 if label in quarantined else 0)
        self.quarantined_devices.set(len(quarantined))
        collective = report.collective
        if collective.ok is not None:
            self.collective_ok.set(1 if collective.ok else 0)
            if collective.busbw_gbps is not None:
                self.busbw.set(collective.busbw_gbps * 1e9)
        for phase in PHASES:
            if phase in report.phases:
                self.duration.labels(report.level, phase).observe(report.phases[phase])
        self.runs.labels(report.level, "placed" if report.placement.ok else "refused").inc()
