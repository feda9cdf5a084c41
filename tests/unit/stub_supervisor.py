"""A real supervisor over a stand-in engine, in a process of its own, for tests that kill it with SIGKILL.

stub_supervisor.py STATE_DIR FLAG    supervise `stub_engine.py orphan FLAG` (every probe passes) until SIGTERM

The engine leaves a grandchild that ignores SIGTERM and writes its pid to FLAG. Everything but the engine's argv and
the probe is warden's own: the state machine, the launch with its marker, the engine record.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry

from service.profile import parse_profile
from service.supervisor.launcher import ProcessHandle
from service.supervisor.lifecycle import Dependencies, Placement, Supervisor
from service.supervisor.metrics import SupervisorMetrics
from service.supervisor.readiness import ProbeResult
from service.supervisor.states import SignalReceived

STUB = str(Path(__file__).with_name("stub_engine.py"))


def main() -> int:
    state_dir, flag = Path(sys.argv[1]), sys.argv[2]
    supervisor = {"stop_grace_s": 0.5, "reap_timeout_s": 10, "probe_interval_s": 0.05}
    loaded = parse_profile(
        {"name": state_dir.name, "model": {"path": "m"}, "platform": "cpu", "supervisor": supervisor},
        state_dir.parent / "p.yaml",
    )

    def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: IO[bytes]) -> ProcessHandle:
        return subprocess.Popen([sys.executable, STUB, "orphan", flag], env=env, cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    sup = Supervisor(
        loaded,
        Placement("cpu", None, 1),
        state_dir,
        SupervisorMetrics(CollectorRegistry()),
        Dependencies(spawner=spawn, probe=lambda url, name, loaded: ProbeResult(True, "ready", "stand-in")),
        tick_s=0.02,
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: sup.post(SignalReceived(signum)))
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
