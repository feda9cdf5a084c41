"""Watch the engine's log for the lines that mean its device or collective is gone.

After `UR_RESULT_ERROR_DEVICE_LOST` (the seeds' XPU wedges), a CUDA context fault or a dead collective, an engine
may exit, hang, or keep running and answer 500 to everything (intel/llm-scaler#595: `EngineDeadError` on every
request after a runtime DEVICE_LOST). Process exit and the liveness canary find all of these eventually; the log says
so at once and says which worker saw it. The patterns are deliberately few and unambiguous: a match ends the engine
and sends warden to a full preflight before it relaunches.

One kind is counted, not acted on: the ReplaySSM shadow check's ERROR lines (`replayssm.shadow_check`), where
ReplaySSM and vLLM's own ops disagreed beyond tolerance. The engine keeps serving; on-call decides.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ErrorKind = Literal["device_lost", "collective", "replayssm_shadow"]
FATAL_KINDS: frozenset[ErrorKind] = frozenset({"device_lost", "collective"})

PATTERNS: tuple[tuple[ErrorKind, re.Pattern[str]], ...] = (
    ("device_lost", re.compile(r"\b(UR|ZE)_RESULT_ERROR_DEVICE_LOST\b")),
    (
        "device_lost",
        re.compile(
            r"CUDA error: (an illegal memory access was encountered|unspecified launch failure"
            r"|uncorrectable ECC error encountered)"
        ),
    ),
    (
        "collective",
        re.compile(
            r"Watchdog caught collective operation timeout"
            r"|\b(ncclUnhandledCudaError|ncclSystemError|ncclInternalError|ncclRemoteError)\b"
        ),
    ),
    # gdn_replayssm.vllm_cpu_shadow's ERROR lines; its INFO summaries say "over tolerance", never "differ"
    ("replayssm_shadow", re.compile(r"GDN ReplaySSM shadow check: .* differ from vLLM's")),
)
# vLLM prefixes each worker's lines with its name, e.g. "(Worker_TP3 pid=4121)" or "(VllmWorker TP1 pid=88)"
_RANK = re.compile(r"Worker[ _]TP(\d+)\b")
MAX_LINE_CHARS = 300


@dataclass(frozen=True)
class LogMatch:
    kind: ErrorKind
    line: str  # the matching line, trimmed
    rank: int | None  # the tensor-parallel rank of the worker that logged it, when the line names one

    @property
    def fatal(self) -> bool:
        """Whether the line means the engine must end (its device or collective is gone)."""
        return self.kind in FATAL_KINDS

    def describe(self, devices: list[int] | None) -> str:
        """`device_lost on device 3 (TP rank 3): <line>`; the device only when the placement maps the rank."""
        where = ""
        if self.rank is not None:
            device = devices[self.rank] if devices is not None and self.rank < len(devices) else None
            where = f" on device {device} (TP rank {self.rank})" if device is not None else f" on TP rank {self.rank}"
        return f"{self.kind}{where}: {self.line}"


def match_line(line: str) -> LogMatch | None:
    for kind, pattern in PATTERNS:
        if pattern.search(line):
            rank = _RANK.search(line)
            return LogMatch(kind, line.strip()[:MAX_LINE_CHARS], int(rank.group(1)) if rank else None)
    return None


# The last line of a Python traceback, as vLLM logs it ("... [core.py:1512] RuntimeError: ...")
_EXCEPTION = re.compile(r"(?:^|[\s\]])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.*)$")
# the API server's word that its engine core is dead: a consequence, never the cause
_CONSEQUENCES = ("EngineDeadError",)


def first_exception(lines: Iterable[str]) -> str | None:
    """The exception the first traceback in `lines` ends with (skipping the API server's `EngineDeadError`): why
    the engine died, where the log's last lines are its shutdown chatter."""
    in_traceback = False
    for line in lines:
        if "Traceback (most recent call last)" in line:
            in_traceback = True
            continue
        found = _EXCEPTION.search(line) if in_traceback else None
        if found is not None and not found.group(1).endswith(_CONSEQUENCES):
            return f"{found.group(1)}: {found.group(2)}".strip()[:MAX_LINE_CHARS]
    return None


class EngineLogWatcher(threading.Thread):
    """Reads the log from `offset` as it grows and reports each matching line, up to and including the first fatal
    one, where it stops; stops when cancelled."""

    def __init__(self, path: Path, offset: int, *, report: Callable[[LogMatch], None], interval_s: float = 0.5) -> None:
        super().__init__(name="warden-engine-log", daemon=True)
        self._path = path
        self._offset = offset
        self._report = report
        self._interval_s = interval_s
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> None:
        partial = b""
        while not self._cancelled.is_set():
            try:
                with self._path.open("rb") as log:
                    log.seek(self._offset)
                    chunk = log.read(1 << 20)
            except OSError:
                chunk = b""
            self._offset += len(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            if len(partial) > 1 << 16:  # a line that never ends is not one of ours; keep its tail only
                partial = partial[-MAX_LINE_CHARS:]
            for raw in lines:
                found = match_line(raw.decode(errors="replace"))
                if found is not None:
                    self._report(found)
                    if found.fatal:
                        return
            if len(chunk) < 1 << 20:  # caught up: wait for more
                self._cancelled.wait(self._interval_s)
