"""Which engine log lines mean the device or the collective is gone, and the watcher that finds them in a growing
log (a real file, written in pieces as an engine writes it)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from support import wait_for

from service.supervisor.engine_log import EngineLogWatcher, LogMatch, first_exception, match_line


@pytest.mark.parametrize(
    ("line", "kind", "rank"),
    [
        ("(Worker_TP3 pid=4121) ERROR ... RuntimeError: UR_RESULT_ERROR_DEVICE_LOST", "device_lost", 3),
        ("(EngineCore_DP0 pid=88) level_zero failed: 20 (ZE_RESULT_ERROR_DEVICE_LOST)", "device_lost", None),
        ("(VllmWorker TP1 pid=9) CUDA error: an illegal memory access was encountered", "device_lost", 1),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "device_lost", None),
        ("[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)", "collective", None),
        ("(Worker_TP0 pid=5) torch.distributed.DistBackendError: NCCL error in: ... ncclSystemError", "collective", 0),
    ],
)
def test_lines_that_mean_the_device_or_collective_is_gone(line: str, kind: str, rank: int | None) -> None:
    found = match_line(line)
    assert found is not None and (found.kind, found.rank) == (kind, rank)


@pytest.mark.parametrize(
    "line",
    [
        "(APIServer pid=1) INFO: Started server process",
        "NCCL INFO Channel 00/32 : 0 1 2 3",
        "(Worker_TP1 pid=2) WARNING device memory is low",
        "ERROR: CUDA error: out of memory",  # the engine's own OOM: vLLM reports it, the device is fine
    ],
)
def test_other_lines_do_not_match(line: str) -> None:
    assert match_line(line) is None


def test_the_first_traceback_s_exception_is_why_the_engine_died() -> None:
    """vLLM's API server reports EngineDeadError after its core died, sometimes before the core's own traceback
    reaches the log; warnings before any traceback that name an error are not it either."""
    lines = [
        "(APIServer pid=1) WARNING [system_utils.py:255] ... `OSError: [Errno 24] Too many open files`. Consider ...",
        "(APIServer pid=1) ERROR [async_llm.py:906] Traceback (most recent call last):",
        "(APIServer pid=1) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore died.",
        "(EngineCore pid=2) ERROR [core.py:1512] Traceback (most recent call last):",
        '(EngineCore pid=2) ERROR [core.py:1512]     raise ValueError(f"bad {x}: y")',
        "(EngineCore pid=2) ERROR [core.py:1512] RuntimeError: tensormust be contiguous at last dimension",
        "ValueError: a later one",
        " - leaked function 3",
    ]
    assert first_exception(lines) == "RuntimeError: tensormust be contiguous at last dimension"
    assert first_exception(lines[:3] + lines[6:]) == "ValueError: a later one"
    assert first_exception(["OSError: before any traceback", "INFO shutting down"]) is None
    assert first_exception(["Traceback (most recent call last):", "torch.OutOfMemoryError: CPU OOM"]) == (
        "torch.OutOfMemoryError: CPU OOM"
    )


@pytest.mark.parametrize(
    "line",
    [
        "(EngineCore pid=9) ERROR 12-04 [vllm_cpu_shadow.py:63] GDN ReplaySSM shadow check: verify outputs differ "
        "from vLLM's by 0.41 of the largest (tolerance 5e-02), call 17",
        "(EngineCore pid=9) ERROR GDN ReplaySSM shadow check: the checkpoints of 2 rows leaving the spec path differ "
        "from vLLM's by 0.3 of the largest (tolerance 2e-02)",
    ],
)
def test_replayssm_shadow_mismatches_are_counted_not_fatal(line: str) -> None:
    found = match_line(line)
    assert found is not None and found.kind == "replayssm_shadow" and not found.fatal
    summary = ("(EngineCore pid=9) INFO GDN ReplaySSM shadow check: 64 verify calls, 0 decode calls, 0 over "
               "tolerance; largest output deviation 0.0146 (tolerance 5e-02)")  # fmt: skip
    assert match_line(summary) is None


def test_the_watcher_reports_every_mismatch_and_stops_at_a_fatal_line(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"")
    found: list[LogMatch] = []
    done = threading.Event()

    def report(match: LogMatch) -> None:
        found.append(match)
        if match.fatal:
            done.set()

    mismatch = b"ERROR GDN ReplaySSM shadow check: verify outputs differ from vLLM's by 0.4 (tolerance 5e-02)\n"
    log.write_bytes(mismatch + mismatch + b"(Worker_TP0 pid=1) UR_RESULT_ERROR_DEVICE_LOST\n" + mismatch)
    watcher = EngineLogWatcher(log, 0, report=report, interval_s=0.01)
    watcher.start()
    try:
        assert done.wait(10)
        wait_for(lambda: not watcher.is_alive(), timeout_s=5, what="the watcher to stop after the fatal line")
    finally:
        watcher.cancel()
        watcher.join(5)
    assert [m.kind for m in found] == ["replayssm_shadow", "replayssm_shadow", "device_lost"]


def test_the_worker_rank_names_the_device_of_the_placement() -> None:
    found = LogMatch("device_lost", "UR_RESULT_ERROR_DEVICE_LOST", 1)
    assert found.describe([2, 3]) == "device_lost on device 3 (TP rank 1): UR_RESULT_ERROR_DEVICE_LOST"
    assert found.describe(None) == "device_lost on TP rank 1: UR_RESULT_ERROR_DEVICE_LOST"
    assert LogMatch("collective", "x", None).describe([0, 1]) == "collective: x"


def test_the_watcher_reads_from_its_launch_and_across_split_writes(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"an earlier launch: (Worker_TP0 pid=1) UR_RESULT_ERROR_DEVICE_LOST\n")
    offset = log.stat().st_size
    found: list[LogMatch] = []
    reported = threading.Event()
    watcher = EngineLogWatcher(log, offset, report=lambda m: (found.append(m), reported.set()), interval_s=0.01)
    watcher.start()
    try:
        with log.open("ab") as out:
            out.write(b"(Worker_TP2 pid=7) loading\n(Worker_TP2 pid=7) ERROR UR_RESULT_ERR")
            out.flush()
            assert not reported.wait(0.2)  # half a line is not a line yet (and the earlier launch's is not read)
            out.write(b"OR_DEVICE_LOST\n")
        assert reported.wait(10)
        assert [(m.kind, m.rank) for m in found] == [("device_lost", 2)]
    finally:
        watcher.cancel()
        watcher.join(5)
    assert not watcher.is_alive()


def test_a_cancelled_watcher_stops(tmp_path: Path) -> None:
    watcher = EngineLogWatcher(tmp_path / "not-yet.log", 0, report=lambda m: None, interval_s=0.01)
    watcher.start()
    watcher.cancel()
    wait_for(lambda: not watcher.is_alive(), timeout_s=5, what="the watcher to stop")
