"""A stand-in engine process for supervisor tests (real process, real signals, no vLLM).

stub_engine.py serve                   run until signalled
stub_engine.py orphan FLAG             leave a grandchild that ignores SIGTERM, then serve
stub_engine.py escape FLAG             start a child in a session of its own (as a worker calling setsid), then serve
stub_engine.py crash-once MARKER UP    exit 3 on the first launch; later launches write UP and serve
stub_engine.py exit CODE               print and exit with CODE
stub_engine.py device-lost            log a worker's UR_RESULT_ERROR_DEVICE_LOST (as vLLM on XPU does), then serve
stub_engine.py shadow-mismatch        log two ReplaySSM shadow-check ERROR lines, then serve
stub_engine.py core-dies               log an engine core's fatal traceback, the API server's EngineDeadError and
                                       40 lines of shutdown chatter, then exit 0 (as vLLM's server does)
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import subprocess
import sys
import time


class EngineDeadError(Exception):
    """vLLM's API server's exception when its engine core is gone."""


def serve() -> None:
    while True:
        time.sleep(3600)


def core_dies() -> None:
    logging.basicConfig(format="(EngineCore pid=%(process)d) %(levelname)s [core.py:1512] %(message)s",
                        stream=sys.stdout)  # fmt: skip
    try:
        raise RuntimeError("causal_conv1d_fwd_cpu: expect x to be transposed.")
    except RuntimeError:
        logging.exception("EngineCore encountered a fatal error.")
    try:
        raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
    except EngineDeadError:
        logging.exception("AsyncLLM output_handler failed.")
    for n in range(40):
        print(f" - leaked function {n}", flush=True)
    sys.exit(0)


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve()
    elif mode == "orphan":
        # The middle process exits at once, so the grandchild is orphaned but stays in the session.
        subprocess.Popen([sys.executable, __file__, "middle", *args]).wait()
        serve()
    elif mode == "escape":
        subprocess.Popen([sys.executable, __file__, "stubborn", *args], start_new_session=True)
        serve()
    elif mode == "middle":
        subprocess.Popen([sys.executable, __file__, "stubborn", *args])
    elif mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path(args[0]).write_text(str(os.getpid()))
        serve()
    elif mode == "crash-once":
        marker, up = pathlib.Path(args[0]), pathlib.Path(args[1])
        if not marker.exists():
            marker.write_text("crashed")
            sys.exit(3)
        up.write_text("up")
        serve()
    elif mode == "device-lost":
        print("(Worker_TP1 pid=4121) INFO loading weights", flush=True)
        print("(Worker_TP1 pid=4121) ERROR [gpu_model_runner.py:2210] RuntimeError: UR_RESULT_ERROR_DEVICE_LOST",
              flush=True)  # fmt: skip
        serve()  # an engine that keeps running after its device is gone, answering nothing useful
    elif mode == "shadow-mismatch":
        for call in (17, 18):
            print(f"(EngineCore pid=9) ERROR GDN ReplaySSM shadow check: verify outputs differ from vLLM's by 0.41 "
                  f"of the largest (tolerance 5e-02), call {call}", flush=True)  # fmt: skip
        serve()
    elif mode == "core-dies":
        core_dies()
    elif mode == "exit":
        print("boom", flush=True)
        sys.exit(int(args[0]))


if __name__ == "__main__":
    main()
