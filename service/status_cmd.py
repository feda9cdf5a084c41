"""`warden status [--url | --profile]`: the supervisor's state in a few lines, for on-call."""

from __future__ import annotations

import urllib.error
from typing import Any

from service.errors import UserError
from service.profile import load_profile, reachable_url
from service.supervisor.readiness import request_json

DEFAULT_URL = "http://127.0.0.1:9400"


def api_url_of(profile_path: str) -> str:
    """The address the profile's supervisor serves its API on (a wildcard bind is reached on loopback).

    Lets a container healthcheck or a script follow the profile instead of repeating its port.
    """
    api = load_profile(profile_path).profile.api
    return reachable_url(api.host, api.port)


def fetch_status(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    if not url.startswith(("http://", "https://")):
        raise UserError(
            f"--url {url!r} is not an http(s) URL", "pass the supervisor's API address, e.g. " + DEFAULT_URL
        )
    try:
        status, data = request_json(f"{url.rstrip('/')}/status", timeout_s)
    except (urllib.error.URLError, OSError) as error:
        status, data = None, getattr(error, "reason", error)
    if status != 200 or not isinstance(data, dict):
        reason = data if status is None else f"GET /status answered {status}"
        raise UserError(
            f"no supervisor answers at {url}: {reason}",
            "check that `warden run` is running and the --url matches its api host/port",
        )
    return data


def render_status(snap: dict[str, Any]) -> str:
    lines = [f"state     {snap['state']}   (profile {snap['profile']}, model {snap['served_model']})"]
    engine = snap.get("engine")
    if engine:
        lines.append(f"engine    pid {engine['pid']}  log {engine['log']}  url {snap['urls']['engine']}")
    placement = snap.get("placement")
    if placement:
        devices = "all" if placement["devices"] is None else ",".join(str(d) for d in placement["devices"])
        lines.append(f"placement {placement['platform']} devices {devices} TP{placement['tensor_parallel']}")
    guard = snap.get("guard")
    if guard:
        counts = guard["counts"]
        lines.append(
            f"guard     {counts['refuse']} refuse, {counts['warn']} warn, {counts['waived']} waived, "
            f"{counts['unknown']} unknown"
        )
    preflight = snap.get("preflight")
    if preflight:
        bad = [f"{d['index']} {d['health']}" for d in preflight.get("devices", []) if d.get("health") != "healthy"]
        lines.append(f"preflight {preflight['level']} {preflight['health']}" + (f" ({', '.join(bad)})" if bad else ""))
    timings = snap.get("timings") or {}
    if timings.get("time_to_ready_s") is not None:
        lines.append(f"ready     {timings['time_to_ready_s']:.1f}s after launch")
    lines.append(
        f"launches  {snap['launches']}  restarts {snap['restarts']}  "
        f"consecutive failures {snap['consecutive_failures']}"
    )
    failure = snap.get("last_failure")
    if failure:
        lines.append(f"last failure ({failure['kind']}): {failure['reason']}")
        lines.extend(f"  | {line}" for line in failure.get("log_tail", [])[-5:])
    stop = snap.get("last_stop")
    if stop and stop.get("survivors"):
        lines.append(f"SURVIVORS of the last stop: {stop['survivors']}")
    return "\n".join(lines)
