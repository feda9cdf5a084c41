"""Where the engine runs: platform, devices (None: no device mask) and tensor-parallel size."""

from __future__ import annotations

from dataclasses import dataclass

from preflight.platforms import ConcretePlatform, resolve_platform
from service.profile import LoadedProfile


@dataclass(frozen=True)
class Placement:
    platform: ConcretePlatform
    devices: list[int] | None
    tensor_parallel: int


def placement_for(loaded: LoadedProfile) -> Placement:
    """What the profile itself asks for, before preflight has seen the devices (`auto` TP -> 1)."""
    profile = loaded.profile
    platform = resolve_platform(profile.platform)
    devices = None if profile.devices == "auto" else list(profile.devices)
    tensor_parallel = 1 if profile.tensor_parallel == "auto" else profile.tensor_parallel
    return Placement(platform=platform, devices=devices, tensor_parallel=tensor_parallel)
