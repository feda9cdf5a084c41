"""Is the engine ready? `/health` OK, `/v1/models` lists the model, and one real greedy completion.

`/health` and `/v1/models` stay green while an engine is wedged, so only a generated token counts.
The canary prompt is always several tokens long: a one-token prompt kills the CPU build's GDN path.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Stage = Literal["health", "models", "canary", "ready"]


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    stage: Stage
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)


def request_json(url: str, timeout_s: float, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """GET (or POST `body`) and return the status and the decoded JSON (text when it is not JSON).
    Connection failures raise (URLError, OSError); HTTP error statuses are returned, not raised."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"warden speaks HTTP only, not {url!r}")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")  # noqa: S310 (scheme checked above)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (scheme checked above)
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:500]
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")[:500]


def model_ids(models: Any) -> list[Any]:
    """The model ids a `GET /v1/models` body lists (none when it is not the OpenAI shape)."""
    return [m.get("id") for m in models.get("data", [])] if isinstance(models, dict) else []


def probe_engine(base_url: str, served_name: str, *, prompt: str, max_tokens: int, timeout_s: float) -> ProbeResult:
    """One pass over the three checks; the first that fails is the result."""
    try:
        status, _ = request_json(f"{base_url}/health", timeout_s)
        if status != 200:
            return ProbeResult(False, "health", f"GET /health answered {status}")
        status, models = request_json(f"{base_url}/v1/models", timeout_s)
        listed = model_ids(models)
        if status != 200 or served_name not in listed:
            return ProbeResult(
                False, "models", f"GET /v1/models answered {status} listing {listed}, not {served_name!r}"
            )
        started = time.monotonic()
        status, completion = request_json(
            f"{base_url}/v1/completions",
            timeout_s,
            {"model": served_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        )
        elapsed = time.monotonic() - started
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        return ProbeResult(False, "health", f"engine not reachable at {base_url}: {reason}")
    if status != 200 or not isinstance(completion, dict):
        return ProbeResult(False, "canary", f"POST /v1/completions answered {status}: {completion}")
    tokens = int(completion.get("usage", {}).get("completion_tokens", 0))
    choices = completion.get("choices") or [{}]
    if tokens < 1:
        return ProbeResult(False, "canary", "the canary completion generated no tokens")
    return ProbeResult(
        True,
        "ready",
        f"generated {tokens} tokens in {elapsed:.2f}s",
        {"completion_tokens": tokens, "text": choices[0].get("text", ""), "seconds": round(elapsed, 3)},
    )


class ReadinessWatcher(threading.Thread):
    """Polls the engine until it is ready, the deadline passes, or it is cancelled; reports once.

    It only reports (through `report`); the supervisor's loop decides what a result means.
    """

    def __init__(
        self,
        probe: Callable[[], ProbeResult],
        *,
        interval_s: float,
        deadline_s: float,
        report: Callable[[ProbeResult], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name="warden-readiness", daemon=True)
        self._probe = probe
        self._interval_s = interval_s
        self._deadline_s = deadline_s
        self._report = report
        self._clock = clock
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> None:
        deadline = self._clock() + self._deadline_s
        last = ProbeResult(False, "health", "not probed yet")
        while not self._cancelled.is_set():
            last = self._probe()
            if last.ok:
                self._report(last)
                return
            if self._clock() >= deadline:
                break
            self._cancelled.wait(self._interval_s)
        if not self._cancelled.is_set():
            self._report(
                ProbeResult(
                    False,
                    last.stage,
                    f"not ready after {self._deadline_s:g}s (supervisor.startup_timeout_s); last check: {last.reason}",
                )
            )


class LivenessWatcher(threading.Thread):
    """While the engine is ready: one probe (health, model listed, a real greedy completion) every
    `interval_s`, each result reported. A wedged engine keeps `/health` at 200 and stops generating;
    only the completion notices. The supervisor counts consecutive failures and decides."""

    def __init__(
        self,
        probe: Callable[[], ProbeResult],
        *,
        interval_s: float,
        report: Callable[[ProbeResult], None],
    ) -> None:
        super().__init__(name="warden-liveness", daemon=True)
        self._probe = probe
        self._interval_s = interval_s
        self._report = report
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> None:
        while not self._cancelled.wait(self._interval_s):
            result = self._probe()
            if not self._cancelled.is_set():
                self._report(result)
