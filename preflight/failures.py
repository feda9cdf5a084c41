"""Failure kinds: the names preflight gives to what went wrong, and how they are recognised.

The kinds match the simulator's fault kinds one to one (a simulated `device-lost` must be detected
and named `device-lost`), plus `error` for anything else and `missing` for a device that is not
there. A closed set keeps the `reason` label of the metrics bounded.
"""

from __future__ import annotations

import re
from enum import StrEnum

from preflight.health import Action


class Failure(StrEnum):
    CRASH = "crash"
    HANG = "hang"
    WRONG_RESULT = "wrong-result"
    DEVICE_LOST = "device-lost"
    SLOW_LINK = "slow-link"
    ALLOC_FAIL = "alloc-fail"
    ERROR = "error"
    MISSING = "missing"


ACTIONS: dict[Failure, Action] = {
    Failure.CRASH: Action.RESET_DEVICE,
    Failure.HANG: Action.RESET_DEVICE,
    Failure.WRONG_RESULT: Action.INSPECT_HARDWARE,
    Failure.DEVICE_LOST: Action.RESET_DEVICE,
    Failure.SLOW_LINK: Action.INSPECT_HARDWARE,
    Failure.ALLOC_FAIL: Action.INSPECT_HARDWARE,
    Failure.ERROR: Action.RETRY,
    Failure.MISSING: Action.CHECK_SOFTWARE,
}

# What runtimes print when a device is gone: Level Zero / Unified Runtime on XPU, CUDA and NVML.
_DEVICE_LOST = re.compile(
    r"DEVICE_LOST|device lost|device-lost|GPU is lost|fallen off the bus|"
    r"uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE",
    re.IGNORECASE,
)
_OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|OUT_OF_DEVICE_MEMORY|allocation failed", re.IGNORECASE)


def classify_text(text: str) -> Failure | None:
    """The failure kind a runtime's error text names, if it names one we know."""
    if _DEVICE_LOST.search(text):
        return Failure.DEVICE_LOST
    if _OUT_OF_MEMORY.search(text):
        return Failure.ALLOC_FAIL
    return None


def first_matching_line(text: str) -> str | None:
    """The first line of `text` that names a known failure, to quote in a reason."""
    for line in text.splitlines():
        if classify_text(line) is not None:
            return line.strip()[:300]
    return None
