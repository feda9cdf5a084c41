"""Probing one device from the parent: a worker masked to that device, each probe under a deadline.

The worker reports `begin` before and `result` after each probe. The parent allows
`startup_timeout_s` for process start and `import torch`, then `probe_timeout_s` per probe; when a
deadline passes it kills the worker's group, records the running probe as hung and the rest as not
run. A worker that dies is judged from its exit status and its stderr (a DEVICE_LOST line names
the failure).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from preflight.backends import Backend, DeviceInfo
from preflight.child import Child, Clock, Ended, Timeout, worker_argv, worker_env
from preflight.failures import ACTIONS, Failure, classify_text, first_matching_line
from preflight.health import Action, CheckResult, Health
from preflight.levels import Level, probes_for
from preflight.report import DeviceReport, summarize

STARTUP = "startup"


@dataclass(frozen=True)
class Timeouts:
    startup_s: float = 120.0  # process start + import torch (a few seconds; generous on busy hosts)
    probe_s: float = 20.0  # one probe, including runtime init on the first (cuInit, zeInit)
    collective_s: float = 60.0  # init_process_group + warm-up + timed all-reduces + checks


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def ended_result(check: str, code: int | None, stderr: str, reaped: bool = True) -> CheckResult:
    """What a worker's death during `check` means; stderr decides device-lost over a plain crash."""
    if check == STARTUP:
        last = (stderr.strip().splitlines() or ["no output"])[-1][:300]
        return CheckResult(
            check,
            Health.UNKNOWN,
            f"the probe worker failed before reaching the device (status {code}): {last}",
            Action.CHECK_SOFTWARE,
            evidence={"failure": Failure.ERROR.value, "returncode": code},
        )
    named = classify_text(stderr)
    line = first_matching_line(stderr)
    failure: Failure
    if named is Failure.DEVICE_LOST:
        failure, reason = named, f"device lost during {check}: {line}"
    elif code is not None and code < 0:
        failure, reason = Failure.CRASH, f"the probe worker crashed with {signal_name(code)} during {check}"
    elif named is Failure.ALLOC_FAIL:
        failure, reason = named, f"allocation failed during {check}: {line}"
    else:
        last = (stderr.strip().splitlines() or ["no output"])[-1][:300]
        failure, reason = Failure.ERROR, f"the probe worker exited with status {code} during {check}: {last}"
    return CheckResult(
        check,
        Health.UNHEALTHY,
        reason,
        ACTIONS[failure],
        evidence={"failure": failure.value, "returncode": code, "stderr_tail": stderr[-2000:]},
    )


def hung_result(check: str, waited_s: float, reaped: bool | None, stalled_s: float | None = None) -> CheckResult:
    """`waited_s`: the deadline it was given; `stalled_s`: how long it actually went without an answer."""
    if check == STARTUP:
        return CheckResult(
            check,
            Health.UNKNOWN,
            f"the probe worker did not start within {waited_s:.0f} s (process start and import torch)",
            Action.RETRY,
            evidence={"failure": Failure.HANG.value},
        )
    stuck = "" if reaped else "; it could not be reaped (stuck in the driver: reset or reboot)"
    return CheckResult(
        check,
        Health.UNHEALTHY,
        f"{check} did not finish within {waited_s:g} s; the probe worker was killed{stuck}",
        ACTIONS[Failure.HANG],
        evidence={"failure": Failure.HANG.value, "reaped": reaped, "stalled_s": stalled_s},
    )


def not_run(check: str, why: str) -> CheckResult:
    return CheckResult(check, Health.UNKNOWN, f"not run: {why}", Action.NONE)


def _follow(
    child: Child, checks: Sequence[str], timeouts: Timeouts, clock: Clock
) -> tuple[list[CheckResult], float | None, str | None]:
    """Read a device worker's events until it is done, dead or past a deadline (then kill it).

    Returns the results, the worker's start-up time, and why it stopped early (None: it finished).
    """
    results: list[CheckResult] = []
    current = STARTUP
    allowed = timeouts.startup_s
    deadline = child.started_at + allowed
    since = child.started_at
    startup_s: float | None = None
    stopped: str | None = None
    while True:
        event = child.next_event(deadline)
        if isinstance(event, Timeout):
            stalled = clock() - since
            results.append(hung_result(current, allowed, child.kill(), stalled))
            return results, startup_s, f"{current} hung first"
        if isinstance(event, Ended):
            code = child.wait_exit(5.0)
            if code is None:
                child.kill()
                code = child.proc.returncode
            results.append(ended_result(current, code, child.stderr_tail()))
            return results, startup_s, f"the worker died during {current}"
        kind = event.get("event")
        if kind == "ready":
            startup_s = float(event.get("startup_s") or 0.0)
            current, allowed = checks[0] if checks else STARTUP, timeouts.probe_s
            since = clock()
            deadline = since + allowed
        elif kind == "begin":
            current, allowed = str(event["check"]), timeouts.probe_s
            since = clock()
            deadline = since + allowed
        elif kind == "result":
            result = CheckResult.from_dict(event)
            results.append(result)
            if result.health is Health.UNHEALTHY:
                stopped = f"{result.check} failed first"
        elif kind == "fatal":
            child.kill()
            evidence = {"failure": Failure.ERROR.value}
            reason = str(event.get("reason"))
            results.append(CheckResult(STARTUP, Health.UNKNOWN, reason, Action.CHECK_SOFTWARE, evidence=evidence))
            return results, startup_s, "the worker could not start"
        elif kind == "done":
            child.finish(5.0)
            return results, startup_s, stopped


def probe_device(
    backend: Backend,
    device: DeviceInfo,
    *,
    level: Level,
    timeouts: Timeouts,
    extra_env: Mapping[str, str] | None = None,
    probes: Sequence[str] | None = None,
    clock: Clock = time.monotonic,
) -> DeviceReport:
    checks = list(probes or probes_for(backend.name))
    argv = worker_argv(
        "device",
        "--platform",
        backend.name,
        "--index",
        str(device.index),
        "--level",
        level,
        "--probes",
        ",".join(checks),
        "--expect-name",
        device.name,
        *backend.worker_args(),
    )
    env = worker_env({**(extra_env or {}), **backend.device_environment([device.index])})
    child = Child(argv, env, f"device {device.index}", clock)
    results, startup_s, stopped = _follow(child, checks, timeouts, clock)
    done = {r.check for r in results}
    for check in checks:
        if check not in done:
            results.append(not_run(check, stopped or "the worker stopped"))
    health, reason, action, failure = summarize(results)
    return DeviceReport(
        index=device.index,
        name=str(results[0].evidence.get("name") or device.name) if results else device.name,
        health=health,
        reason=reason,
        action=action,
        failure=failure,
        probes=tuple(results),
        duration_s=clock() - child.started_at,
        startup_s=startup_s,
    )
