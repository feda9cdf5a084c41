"""Which platform a profile runs on, and how a process is restricted to chosen devices."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

ConcretePlatform = Literal["cuda", "xpu", "cpu", "sim"]


def resolve_platform(requested: str, dev_root: Path = Path("/dev")) -> ConcretePlatform:
    """`auto` means cuda when an NVIDIA driver is present, else cpu. Intel XPU hosts say `xpu`
    explicitly: integrated Intel GPUs are too common for their presence to mean "serve on XPU"."""
    if requested == "auto":
        return "cuda" if (dev_root / "nvidiactl").exists() else "cpu"
    if requested in ("cuda", "xpu", "cpu", "sim"):
        return requested  # type: ignore[return-value]
    raise ValueError(f"unknown platform {requested!r}")


def device_environment(platform: ConcretePlatform, devices: Sequence[int] | None) -> dict[str, str]:
    """Environment variables that make only `devices` visible to a process (None: leave as is).

    XPU sets both the Level Zero mask and the oneAPI selector, as the lab's working identities do.
    """
    if devices is None:
        return {}
    joined = ",".join(str(d) for d in devices)
    if platform == "cuda":
        return {"CUDA_VISIBLE_DEVICES": joined}
    if platform == "xpu":
        return {"ZE_AFFINITY_MASK": joined, "ONEAPI_DEVICE_SELECTOR": f"level_zero:{joined}"}
    return {}
