"""Launch bookkeeping: the engine log is appended per launch and rotated when it grows too large."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import IO

from service.supervisor.launcher import EngineCommand, ProcessHandle, launch, rotate_log


def test_rotate_log_keeps_one_previous_file(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    rotate_log(log, limit_bytes=10)  # absent: nothing to do
    log.write_bytes(b"x" * 5)
    rotate_log(log, limit_bytes=10)
    assert log.read_bytes() == b"x" * 5
    log.write_bytes(b"first launch" * 2)
    rotate_log(log, limit_bytes=10)
    assert not log.exists() and (tmp_path / "engine.log.1").read_bytes() == b"first launch" * 2
    log.write_bytes(b"second launch" * 2)
    rotate_log(log, limit_bytes=10)
    assert (tmp_path / "engine.log.1").read_bytes() == b"second launch" * 2


def test_launch_appends_and_records_where_this_launch_starts(tmp_path: Path) -> None:
    log = tmp_path / "state" / "engine.log"
    log.parent.mkdir()
    log.write_bytes(b"earlier launch\n")

    def spawner(argv: list[str], env: dict[str, str], cwd: Path, out: IO[bytes]) -> ProcessHandle:
        return subprocess.Popen(
            [sys.executable, "-c", "print('hello from the engine')"], stdout=out, start_new_session=True
        )

    engine = launch(EngineCommand(argv=[], env={}, cwd=tmp_path), log, spawner=spawner)
    assert engine.handle.wait(timeout=30) == 0  # type: ignore[attr-defined]
    assert engine.log_offset == len(b"earlier launch\n")
    assert log.read_bytes()[engine.log_offset :] == b"hello from the engine\n"
