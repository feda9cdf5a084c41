"""Reading /proc: stat parsing and session membership, against a fake /proc tree."""

from __future__ import annotations

from pathlib import Path

from service.supervisor.procfs import ProcFS, parse_stat


def stat_line(pid: int, comm: str, state: str, ppid: int, pgid: int, sid: int, start: int) -> str:  # noqa: PLR0917
    # Fields 3.. of /proc/<pid>/stat; starttime is field 22.
    rest = [state, str(ppid), str(pgid), str(sid)] + ["0"] * 15 + [str(start)] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


def fake_proc(root: Path, *procs: tuple[int, str, str, int, int, int, int]) -> ProcFS:
    for pid, comm, state, ppid, pgid, sid, start in procs:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(stat_line(pid, comm, state, ppid, pgid, sid, start))
    (root / "self").mkdir()  # non-numeric entries are ignored
    return ProcFS(root)


def test_parse_stat_handles_spaces_and_parentheses_in_the_name() -> None:
    info = parse_stat(stat_line(42, "VLLM::Worker (TP 0)", "S", 1, 40, 40, 12345))
    assert (info.pid, info.comm, info.state) == (42, "VLLM::Worker (TP 0)", "S")
    assert (info.ppid, info.pgid, info.sid, info.start_ticks) == (1, 40, 40, 12345)


def test_session_members_and_identity(tmp_path: Path) -> None:
    procfs = fake_proc(
        tmp_path,
        (100, "python", "S", 1, 100, 100, 5000),
        (101, "VLLM::EngineCor", "S", 1, 100, 100, 5100),  # orphan reparented to init
        (102, "setsid child", "S", 101, 102, 100, 5200),  # other group, same session
        (103, "defunct", "Z", 100, 100, 100, 5300),
        (200, "unrelated", "R", 1, 200, 200, 100),
    )
    members = procfs.session_members(100)
    assert [p.pid for p in members] == [100, 101, 102, 103]
    assert [p.pid for p in members if p.is_zombie] == [103]
    assert procfs.is_same_process(101, 5100)
    assert not procfs.is_same_process(101, 9999)  # pid reused by another process
    assert not procfs.is_same_process(103, 5300)  # a zombie is not running
    assert procfs.read(999) is None
