"""Preflight for a loaded profile: the options it implies, the quarantine file it uses, one call.

This is the entry point `warden run` uses:

    report = preflight_for_profile(loaded, level="quick")      # "full" after a crash
    if not report.placement.ok: refuse (exit 3) with report.placement.reason
    devices, tp = report.placement.devices, report.placement.tensor_parallel
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from preflight.devices import Timeouts
from preflight.faults import Fault
from preflight.levels import Level
from preflight.model_shape import ModelShapeError, read_model_shape
from preflight.orchestrate import PreflightOptions, run_preflight
from preflight.platforms import resolve_platform
from preflight.quarantine import FILE_NAME, Quarantine, default_state_root
from preflight.report import PreflightReport

if TYPE_CHECKING:
    from service.profile import LoadedProfile

# Engine environment that changes how collectives behave; the preflight runs with it so that it
# tests the configuration the engine will use (NVSentinel copies the same families).
COLLECTIVE_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CCL_", "FI_", "UCX_", "GLOO_", "I_MPI_", "SYCL_", "UR_", "ZE_")
DEVICE_MASKS = frozenset({"CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR"})


class ReportObserver(Protocol):
    def observe(self, report: PreflightReport) -> None: ...


def collective_env(engine_env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in engine_env.items() if k.startswith(COLLECTIVE_ENV_PREFIXES) and k not in DEVICE_MASKS}


def quarantine_path_for(loaded: LoadedProfile) -> Path:
    """`preflight.quarantine_file`, else `<state root>/quarantine.json`, where the state root is
    `supervisor.state_dir`, else $WARDEN_STATE_DIR, else ~/.local/state/warden. The root, not the
    per-profile folder: quarantine is about physical devices, shared by every profile on the host."""
    profile = loaded.profile
    if profile.preflight.quarantine_file is not None:
        return loaded.resolve(profile.preflight.quarantine_file)
    state = profile.supervisor.state_dir
    root = loaded.resolve(state) if state is not None else default_state_root()
    return root / FILE_NAME


def quarantined_devices(loaded: LoadedProfile, platform: str) -> dict[int, str]:
    """Devices of `platform` recorded as failed on this host (device -> reason); {} when none is.
    Reads the record only, touches no device. Raises QuarantineError when it cannot be read."""
    return {entry.device: entry.reason for entry in Quarantine(quarantine_path_for(loaded)).entries(platform)}


def options_for_profile(
    loaded: LoadedProfile,
    *,
    level: Level = "quick",
    platform: str | None = None,
    quarantine_file: Path | None = None,
    use_quarantine: bool = True,
) -> PreflightOptions:
    profile = loaded.profile
    settings = profile.preflight
    concrete = resolve_platform(platform or profile.platform)
    try:
        shape, problem = read_model_shape(loaded.model_dir), None
    except ModelShapeError as error:
        shape, problem = None, f"model.path: {error}"
    faults = tuple(Fault(f.device, f.fault, f.during) for f in profile.sim.faults) if concrete == "sim" else ()
    quarantine = (quarantine_file or quarantine_path_for(loaded)) if use_quarantine else None
    return PreflightOptions(
        platform=concrete,
        level=level,
        devices="auto" if profile.devices == "auto" else tuple(profile.devices),
        tensor_parallel=profile.tensor_parallel,
        model_shape=shape,
        model_problem=problem,
        sim_devices=profile.sim.devices,
        faults=faults,
        timeouts=Timeouts(
            startup_s=settings.startup_timeout_s,
            probe_s=settings.probe_timeout_s,
            collective_s=settings.collective_timeout_s,
        ),
        min_busbw_gbps=settings.min_busbw_gbps,
        collective=settings.collective,
        quarantine_file=quarantine,
        extra_env=collective_env(profile.engine.env),
    )


def preflight_for_profile(
    loaded: LoadedProfile,
    *,
    level: Level = "quick",
    platform: str | None = None,
    quarantine_file: Path | None = None,
    metrics: ReportObserver | None = None,
) -> PreflightReport:
    """Run preflight for `loaded` and return the report; `report.placement` says where to launch.

    Raises `QuarantineError` if the quarantine file exists but is unreadable.
    """
    report = run_preflight(options_for_profile(loaded, level=level, platform=platform, quarantine_file=quarantine_file))
    if metrics is not None:
        metrics.observe(report)
    return report
