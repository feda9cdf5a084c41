"""Simulated faults: a first-class dependency of the probe and collective code, not a mock.

The `sim` platform runs the real probe worker on CPU memory and hands it a fault plan on its
command line (`DEVICE:KIND:DURING`). The worker calls the injector's hooks at the points where a
real device fails: allocation, the `torch.from_numpy(...).to(device)` copy, the compute kernel, and
every all-reduce. On real platforms the plan is empty and every hook does nothing.

Where a fault strikes by default (`during=auto`):

| kind         | probe stage                                   | collective stage                     |
|--------------|-----------------------------------------------|--------------------------------------|
| crash        | SIGSEGV in the compute probe                  | only with `during=collective`        |
| hang         | sleeps forever in the allocate probe          | only with `during=collective`        |
| wrong-result | corrupts the compute checksum                 | corrupts its all-reduce contribution |
| device-lost  | DEVICE_LOST message + exit 1 in the copy probe | only with `during=collective`        |
| slow-link    | —                                             | delays each of its all-reduces       |
| alloc-fail   | out-of-memory error in the allocate probe     | only with `during=collective`        |
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

FaultKind = Literal["crash", "hang", "wrong-result", "device-lost", "slow-link", "alloc-fail"]
Stage = Literal["probe", "collective"]
During = Literal["auto", "probe", "collective"]

FAULT_KINDS: tuple[FaultKind, ...] = ("crash", "hang", "wrong-result", "device-lost", "slow-link", "alloc-fail")
_DEFAULT_STAGES: dict[str, frozenset[str]] = {
    "crash": frozenset({"probe"}),
    "hang": frozenset({"probe"}),
    "wrong-result": frozenset({"probe", "collective"}),
    "device-lost": frozenset({"probe"}),
    "slow-link": frozenset({"collective"}),
    "alloc-fail": frozenset({"probe"}),
}
# Where in the probe sequence each kind strikes.
PROBE_SITES: dict[str, str] = {
    "crash": "compute",
    "hang": "allocate",
    "wrong-result": "compute",
    "device-lost": "copy",
    "alloc-fail": "allocate",
}
# A slow link moves 25 MB/s: each all-reduce first waits bytes / 25 MB/s, so its bus bandwidth is
# below 25 MB/s * 2(n-1)/n < 0.05 GB/s, the sim floor, at any size and rank count (healthy gloo on
# a busy 2-core host: 0.18 GB/s with 8 ranks, 0.3-1.4 GB/s with 2-4).
SLOW_LINK_BYTES_PER_S = 25e6


@dataclass(frozen=True)
class Fault:
    device: int
    kind: FaultKind
    during: During = "auto"

    def strikes(self, stage: Stage) -> bool:
        if self.during == "auto":
            return stage in _DEFAULT_STAGES[self.kind]
        return self.during == stage

    def encode(self) -> str:
        return f"{self.device}:{self.kind}:{self.during}"

    @classmethod
    def parse(cls, text: str) -> Fault:
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[0].isdigit():
            raise ValueError(f"fault {text!r} is not DEVICE:KIND[:DURING]")
        kind = parts[1]
        during = parts[2] if len(parts) == 3 else "auto"
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {', '.join(FAULT_KINDS)}")
        if during not in ("auto", "probe", "collective"):
            raise ValueError(f"fault stage {during!r} is not auto, probe or collective")
        if kind == "slow-link" and during == "probe":
            raise ValueError("a slow link shows only in a collective: use during auto or collective")
        return cls(int(parts[0]), kind, during)  # type: ignore[arg-type]  # both checked against their Literals above


def faults_for(faults: Iterable[Fault], device: int) -> tuple[Fault, ...]:
    return tuple(f for f in faults if f.device == device)


def _hang_forever() -> None:
    threading.Event().wait()


class Injector:
    """Worker-side hooks for one device's faults; with no faults every hook is a no-op."""

    def __init__(self, faults: Sequence[Fault], device: int, stage: Stage) -> None:
        self.device = device
        self.stage: Stage = stage
        self.kinds = {f.kind for f in faults if f.device == device and f.strikes(stage)}

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def _fires(self, kind: str, site: str | None) -> bool:
        if kind not in self.kinds:
            return False
        return self.stage == "collective" or site is None or PROBE_SITES.get(kind) == site

    def at(self, site: str | None) -> None:
        """Called when the worker reaches `site` (a probe name, or None for the collective)."""
        if self._fires("hang", site):
            _hang_forever()
        if self._fires("crash", site):
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGSEGV)
        if self._fires("device-lost", site):
            # What the Unified Runtime prints when a Level Zero device is lost, then the process dies.
            print(
                f"RuntimeError: level_zero backend failed with error: 20 (UR_RESULT_ERROR_DEVICE_LOST) "
                f"[simulated on sim device {self.device}]",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)
        if self._fires("alloc-fail", site):
            raise RuntimeError(
                f"UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY: out of memory allocating on sim device {self.device} "
                "[simulated]"
            )

    def corrupt(self, tensor: Any, site: str | None) -> None:
        """Flip one element of a result (compute) or of a contribution (all-reduce)."""
        if self._fires("wrong-result", site):
            tensor.view(-1)[0] += 1

    def link_delay(self, nbytes: int) -> float:
        if "slow-link" in self.kinds and self.stage == "collective":
            return nbytes / SLOW_LINK_BYTES_PER_S
        return 0.0
