"""Where and whether to launch: guard, then preflight, then placement — at start and before relaunch.

Order matters. The guard reads only files and the quarantine record, so it runs first and refuses
before anything touches a device. Preflight then probes the devices and places the model on the
healthy ones; when that placement differs from what the guard saw (tensor-parallel `auto`, fewer
healthy devices after a crash), the guard runs again on the final placement, which is also the
placement the run identity records.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from preflight.metrics import PreflightMetrics
from preflight.profiles import preflight_for_profile, quarantine_path_for, quarantined_devices
from preflight.quarantine import QuarantineError
from preflight.report import PreflightReport, render_text
from service.errors import UserError
from service.guard.child import GuardOutcome, GuardUnavailable, evaluate_in_child
from service.guard.cli import format_report
from service.guard.metrics import GuardMetrics
from service.profile import LoadedProfile
from service.supervisor.placement import Placement, placement_for

log = logging.getLogger("warden.planner")


@dataclass(frozen=True)
class Plan:
    """A decision: launch on `placement`, or not at all (`refusal` says why)."""

    placement: Placement | None
    refusal: str | None
    guard: GuardOutcome | None
    preflight: PreflightReport | None

    @property
    def ok(self) -> bool:
        return self.placement is not None


class LaunchPlanner:
    def __init__(self, loaded: LoadedProfile, registry: CollectorRegistry) -> None:
        self.loaded = loaded
        self.guard_metrics = GuardMetrics(registry)
        self.preflight_metrics = PreflightMetrics(registry)
        self.quarantine_path = quarantine_path_for(loaded)

    def _quarantined(self, platform: str) -> dict[int, str]:
        try:
            return quarantined_devices(self.loaded, platform)
        except QuarantineError as error:
            raise UserError(
                f"the quarantine record {self.quarantine_path} cannot be read: {error}",
                "fix or remove the file (`warden preflight --clear` rewrites it), then start again",
                exit_code=3,
            ) from None

    def _guard(self, placement: Placement, quarantined: dict[int, str]) -> GuardOutcome:
        try:
            outcome = evaluate_in_child(
                self.loaded.source,
                placement={
                    "platform": placement.platform,
                    "devices": placement.devices,
                    "tensor_parallel": placement.tensor_parallel,
                },
                quarantined=quarantined,
            )
        except GuardUnavailable as error:
            raise UserError(
                f"the guard could not check profile {self.loaded.source}: {error}",
                f"run `warden check {self.loaded.source}` to see the failure; nothing was launched",
                exit_code=3,
            ) from None
        self.guard_metrics.observe(outcome.report)
        if outcome.identity is not None:
            self.guard_metrics.set_identity(outcome.identity)
        report = outcome.report
        if report.refused or report.warnings or report.waived or report.unknown:
            for line in format_report(report).splitlines():
                (log.error if report.refused else log.warning)("guard | %s", line)
        return outcome

    def plan(
        self, *, level: str, current: GuardOutcome | None = None, current_placement: Placement | None = None
    ) -> Plan:
        """Guard (unless `current` already covers the profile), preflight at `level`, placement.

        Before a relaunch pass the guard outcome and placement in force: the guard runs again only
        if preflight moves the model to a different placement.
        """
        requested = current_placement or placement_for(self.loaded)
        guard = current
        if guard is None:
            guard = self._guard(requested, self._quarantined(requested.platform))
        if guard.report.refused:
            rules = ", ".join(f.rule for f in guard.report.refusals)
            return Plan(None, f"the guard refused the profile ({rules})", guard, None)

        try:
            report = preflight_for_profile(self.loaded, level=level, metrics=self.preflight_metrics)  # type: ignore[arg-type]
        except QuarantineError as error:
            raise UserError(
                f"the quarantine record {self.quarantine_path} cannot be read: {error}",
                "fix or remove the file, then start again",
                exit_code=3,
            ) from None
        for line in render_text(report).splitlines():
            log.info("preflight | %s", line)
        placement = report.placement
        if not placement.ok or placement.tensor_parallel is None:
            return Plan(None, f"preflight cannot place the model: {placement.reason}", guard, report)

        final = Placement(
            platform=requested.platform,
            # The CPU engine has no device mask; every other platform runs on exactly the devices placed.
            devices=None if requested.platform == "cpu" else list(placement.devices),
            tensor_parallel=placement.tensor_parallel,
        )
        if final != requested:
            guard = self._guard(final, self._quarantined(final.platform))
            if guard.report.refused:
                rules = ", ".join(f.rule for f in guard.report.refusals)
                return Plan(None, f"the guard refused the placement {final} ({rules})", guard, report)
        return Plan(final, None, guard, report)
