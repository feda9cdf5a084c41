"""What a supervisor that died leaves running, and `warden reap` / `warden run` ending it: real supervisors in processes
of their own (stub_supervisor.py) killed with SIGKILL, real stand-in engines, real signals, the real /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import wait_for

from service.cli import main
from service.errors import UserError
from service.profile import parse_profile
from service.supervisor.engine_record import MARKER_ENV, EngineRecord, read_record, write_record
from service.supervisor.orphans import engine_processes, reap_record
from service.supervisor.procfs import ProcessInfo, ProcFS
from service.supervisor.run import reap_before_start

HERE = Path(__file__).parent
PROCFS = ProcFS()


@dataclass
class Supervised:
    root: Path  # the state root; the profile's folder is root / "t"
    process: subprocess.Popen[bytes]
    record: EngineRecord
    engine: list[ProcessInfo]  # the engine's leader and its grandchild that ignores SIGTERM

    @property
    def record_path(self) -> Path:
        return self.root / "t" / "engine.json"

    def alive(self) -> list[int]:
        return [p.pid for p in self.engine if PROCFS.is_same_process(p.pid, p.start_ticks)]


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    """A real supervisor with its stand-in engine ready, its record written."""
    root, flag = tmp_path / "state-root", tmp_path / "stubborn-pid"
    process = subprocess.Popen([sys.executable, str(HERE / "stub_supervisor.py"), str(root / "t"), str(flag)])
    record_path = root / "t" / "engine.json"
    record: EngineRecord | None = None
    engine: list[ProcessInfo | None] = []
    try:
        wait_for(lambda: flag.exists() and record_path.exists(), timeout_s=30, what="the engine and its record")
        record = read_record(record_path)
        assert record is not None
        engine = [PROCFS.read(record.engine_pid), PROCFS.read(int(flag.read_text()))]
        assert all(p is not None for p in engine)
        # the stand-in's middle process exits once it has started the grandchild: then exactly these two are left
        wait_for(lambda: len(engine_processes(record, PROCFS)) == 2, timeout_s=30, what="the middle process to exit")
        yield Supervised(root, process, record, [p for p in engine if p is not None])
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        for process in engine_processes(record, PROCFS) if record is not None else []:
            os.kill(process.pid, signal.SIGKILL)  # a failed test leaves nothing behind (only what carries the marker)


def kill_supervisor(supervised: Supervised) -> None:
    supervised.process.kill()
    assert supervised.process.wait(timeout=30) == -signal.SIGKILL


def test_the_record_names_this_launch_and_a_clean_stop_removes_it(supervised: Supervised) -> None:
    record = supervised.record
    assert (record.profile, record.supervisor_pid) == ("t", supervised.process.pid)
    assert record.boot_id == PROCFS.boot_id() and record.uid == os.geteuid()
    for process in supervised.engine:  # the marker reached the engine and what it started
        assert PROCFS.carries(process.pid, MARKER_ENV, record.marker)
    supervised.process.send_signal(signal.SIGTERM)
    assert supervised.process.wait(timeout=30) == 0
    assert not supervised.record_path.exists()
    assert supervised.alive() == []


def test_reap_ends_what_a_killed_supervisor_left_and_nothing_else(
    supervised: Supervised, capsys: pytest.CaptureFixture[str]
) -> None:
    kill_supervisor(supervised)
    assert len(supervised.alive()) == 2  # what the seeds found after a crash: the engine still holds its devices
    # a process like the engine's, in a session of its own, with another launch's marker: never warden's to end
    other = subprocess.Popen([sys.executable, str(HERE / "stub_engine.py"), "serve"],
                             env={**os.environ, MARKER_ENV: "another-launch"}, start_new_session=True)  # fmt: skip
    try:
        root = str(supervised.root)
        assert main(["reap", "--state-dir", root, "--dry-run"]) == 3
        out = capsys.readouterr().out
        assert f"t: found: warden pid {supervised.process.pid} ended without stopping its engine" in out
        assert "2 of its process(es) still run" in out and "remedy: `warden reap` ends them" in out
        assert len(supervised.alive()) == 2 and supervised.record_path.exists()  # a dry run signals nothing

        assert main(["reap", "--state-dir", root, "--json"]) == 0
        [result] = json.loads(capsys.readouterr().out)
        assert result["verdict"] == "ended" and result["ok"]
        assert result["signals"] == ["SIGTERM", "SIGKILL"]  # the grandchild ignores SIGTERM
        assert sorted(p["pid"] for p in result["processes"]) == sorted(p.pid for p in supervised.engine)
        assert supervised.alive() == []
        assert not supervised.record_path.exists()
        assert other.poll() is None

        assert main(["reap", "--state-dir", root]) == 0
        assert "no engine records under" in capsys.readouterr().out
    finally:
        other.kill()
        other.wait(timeout=30)


def test_a_running_supervisors_engine_is_left_alone_and_its_profile_not_started_twice(
    supervised: Supervised, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reap", "--state-dir", str(supervised.root)]) == 0
    assert f"t: supervised: warden pid {supervised.process.pid} still supervises" in capsys.readouterr().out
    loaded = parse_profile({"name": "t", "model": {"path": "m"}}, supervised.root / "p.yaml")
    with pytest.raises(UserError) as refused:
        reap_before_start(loaded, supervised.root / "t")
    assert "already supervised" in str(refused.value) and f"kill -TERM {supervised.process.pid}" in str(refused.value)
    assert len(supervised.alive()) == 2 and supervised.record_path.exists()


def test_warden_run_ends_a_dead_supervisors_engine_before_it_launches(supervised: Supervised) -> None:
    kill_supervisor(supervised)
    quick = {"stop_grace_s": 0.5}  # the grandchild ignores SIGTERM: no need to wait the default 10 s for it
    loaded = parse_profile({"name": "t", "model": {"path": "m"}, "supervisor": quick}, supervised.root / "p.yaml")
    result = reap_before_start(loaded, supervised.root / "t")
    assert result.verdict == "ended" and len(result.processes) == 2, result
    assert supervised.alive() == [] and not supervised.record_path.exists()


def record(boot_id: str, marker: str = "m" * 32, uid: int = 1000) -> EngineRecord:
    return EngineRecord("t", marker, 1, 0, 1, 0, boot_id, 0.0, uid)


def test_a_record_from_before_a_reboot_is_dropped_without_signalling(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("boot-2\n")
    path = tmp_path / "state" / "t" / "engine.json"
    write_record(path, record("boot-1"))
    result = reap_record(path, dry_run=False, grace_s=1, reap_timeout_s=1, procfs=ProcFS(proc),
                         clock=lambda: 0.0, sleep=lambda s: None, euid=1000)  # fmt: skip
    assert (result.verdict, result.signalled) == ("stale", []) and not path.exists()


def test_another_users_record_is_left_to_that_user(tmp_path: Path) -> None:
    """Another user's processes hide their environments: to that user every engine process would look gone, and the
    record would be dropped while the engine runs on."""
    path = tmp_path / "state" / "t" / "engine.json"
    write_record(path, record(PROCFS.boot_id() or "", uid=1000))
    result = reap_record(path, dry_run=False, grace_s=1, reap_timeout_s=1, procfs=PROCFS,
                         clock=lambda: 0.0, sleep=lambda s: None, euid=1001)  # fmt: skip
    assert result.verdict == "foreign" and not result.ok and path.exists()
    assert "uid 1000's, and uid 1001 cannot see" in result.reason and result.remedy == (
        "run this as uid 1000 (the user warden runs as) or as root"
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [("{", "not JSON"), ('{"profile": "t"}', "field 'marker' is missing"), ("[]", "not a JSON object")],
)
def test_an_unusable_record_is_reported_with_a_remedy_and_kept(
    tmp_path: Path, content: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t" / "engine.json"
    path.parent.mkdir()
    path.write_text(content)
    assert main(["reap", "--state-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"t: unreadable: the engine record {path} is unusable" in out and says in out and "remedy:" in out
    assert path.read_text() == content
