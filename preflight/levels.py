"""Preflight levels: which probes run and how hard they push.

`quick` runs on every start and stays small (the checks themselves take well under a second per
device; the cost is process start and `import torch`). `full` runs after a crash: bigger buffers,
repeated kernels, a longer all-reduce at one large message size (anchors: 256 MB, no sweep).
Simulated and CPU devices live in host memory on shared cores, so they use smaller sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["quick", "full"]
LEVELS: tuple[Level, ...] = ("quick", "full")
DeviceClass = Literal["accelerator", "host"]

MIB = 1 << 20

# The explicit list of device probes, in the order a worker runs them. `counters` runs before the
# first allocation so that the processes it lists are not this worker.
DEVICE_PROBES: tuple[str, ...] = ("enumerate", "counters", "allocate", "copy", "compute", "graph")
# Probes whose failure stops the worker (a lost or hung device poisons everything after it).
FUNCTIONAL_PROBES: frozenset[str] = frozenset({"enumerate", "allocate", "copy", "compute", "graph"})
ACCELERATOR_ONLY: frozenset[str] = frozenset({"graph"})


@dataclass(frozen=True)
class Sizes:
    alloc_bytes: int
    copy_bytes: int
    matmul_n: int
    compute_iterations: int
    graph_replays: int
    collective_bytes: int
    collective_iters: int
    collective_warmup: int


SIZES: dict[tuple[Level, DeviceClass], Sizes] = {
    ("quick", "accelerator"): Sizes(64 * MIB, 16 * MIB, 512, 2, 3, 64 * MIB, 5, 1),
    ("full", "accelerator"): Sizes(1024 * MIB, 256 * MIB, 2048, 10, 20, 256 * MIB, 20, 2),
    ("quick", "host"): Sizes(16 * MIB, 4 * MIB, 128, 1, 0, 4 * MIB, 5, 1),
    ("full", "host"): Sizes(128 * MIB, 32 * MIB, 256, 4, 0, 16 * MIB, 10, 1),
}


def device_class(platform: str) -> DeviceClass:
    return "accelerator" if platform in ("cuda", "xpu") else "host"


def sizes_for(level: Level, platform: str) -> Sizes:
    return SIZES[(level, device_class(platform))]


def probes_for(platform: str) -> tuple[str, ...]:
    accelerator = device_class(platform) == "accelerator"
    return tuple(p for p in DEVICE_PROBES if accelerator or p not in ACCELERATOR_ONLY)
