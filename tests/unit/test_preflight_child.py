"""The parent's hold on child processes: a hanging child is killed with its whole group at its
deadline and the caller returns on time; external commands run under a timeout. Cheap children
(no torch), so these run in well under a second each."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from preflight.child import Child, Ended, Timeout
from preflight.commands import run_command

HANGS_WITH_A_GRANDCHILD = """
import json, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"event": "begin", "check": "allocate", "grandchild": grandchild.pid}), flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for a reaper that is not us."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until(predicate, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_a_hanging_child_is_killed_with_its_group_at_the_deadline_and_the_caller_returns_on_time() -> None:
    child = Child([sys.executable, "-c", HANGS_WITH_A_GRANDCHILD], {}, "hang")
    first = child.next_event(child.started_at + 20.0)
    assert isinstance(first, dict) and first["event"] == "begin"
    grandchild = int(first["grandchild"])

    timeout_s = 0.5
    started = time.monotonic()
    result = child.next_event(started + timeout_s)
    waited = time.monotonic() - started
    assert isinstance(result, Timeout)
    assert timeout_s <= waited < timeout_s + 2.0  # generous: the host is shared

    started = time.monotonic()
    assert child.kill(reap_timeout_s=5.0) is True
    assert time.monotonic() - started < 5.0
    assert child.returncode() == -9
    assert wait_until(lambda: gone(grandchild), 5.0), "the grandchild in the same group must die too"
    assert isinstance(child.next_event(time.monotonic() + 5.0), Ended)


def test_events_stderr_and_exit_status_of_a_child_that_dies() -> None:
    code = (
        "import json, sys\n"
        'print(json.dumps({"event": "ready"}), flush=True)\n'
        'print("boom", file=sys.stderr)\n'
        "sys.exit(4)\n"
    )
    child = Child([sys.executable, "-c", code], {}, "dies")
    assert child.next_event(time.monotonic() + 20.0) == {"event": "ready"}
    assert isinstance(child.next_event(time.monotonic() + 20.0), Ended)
    assert child.wait_exit(5.0) == 4
    assert child.stderr_tail().strip() == "boom"


def test_external_commands_time_out_and_missing_tools_say_so() -> None:
    started = time.monotonic()
    slow = run_command([sys.executable, "-c", "import time; time.sleep(600)"], 0.5)
    assert slow.timed_out and slow.returncode is None
    assert time.monotonic() - started < 10.0
    assert "did not answer within" in slow.describe()
    missing = run_command(["warden-no-such-tool-anywhere"], 1.0)
    assert missing.error is not None and not missing.ok
    assert missing.describe().startswith("warden-no-such-tool-anywhere could not run")
    fine = run_command([sys.executable, "-c", "print('hi')"], 10.0)
    assert fine.ok and fine.stdout.strip() == "hi"
