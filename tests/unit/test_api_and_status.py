"""The supervisor's HTTP API (real server on a free port) and `warden status` against it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support import free_port, http, http_json

from service.cli import main
from service.supervisor.api import ApiServer
from service.supervisor.metrics import SupervisorMetrics
from service.supervisor.states import State

SNAPSHOT: dict[str, Any] = {
    "state": "ready",
    "profile": "p",
    "served_model": "tiny",
    "engine": {"pid": 42, "log": "/x/engine.log"},
    "urls": {"engine": "http://127.0.0.1:8000"},
    "timings": {"time_to_ready_s": 21.5},
    "launches": 2,
    "restarts": 1,
    "consecutive_failures": 0,
    "last_failure": {"kind": "crashed", "reason": "engine pid 7 exited with code -9", "log_tail": ["boom"]},
    "last_stop": {"survivors": []},
    "placement": {"platform": "sim", "devices": [0, 1], "tensor_parallel": 2},
    "guard": {"counts": {"refuse": 0, "warn": 1, "waived": 0, "unknown": 0}},
    "preflight": {
        "level": "full",
        "health": "unhealthy",
        "devices": [{"index": 0, "health": "healthy"}, {"index": 3, "health": "unhealthy"}],
    },
}


@pytest.fixture
def api() -> Iterator[tuple[str, dict[str, Any], SupervisorMetrics]]:
    snap = dict(SNAPSHOT)
    metrics = SupervisorMetrics(CollectorRegistry())
    metrics.set_state(State.READY)
    restarts = snap.setdefault("restarts_asked", [])
    server = ApiServer("127.0.0.1", free_port(), snapshot=lambda: snap, metrics=metrics.exposition, token="s3cret",
                       actions={"restart": lambda: (restarts.append(1), (202, {"accepted": True}))[1]})  # fmt: skip
    server.start()
    yield f"http://127.0.0.1:{server.port}", snap, metrics
    server.close()


def test_routes(api: tuple[str, dict[str, Any], SupervisorMetrics]) -> None:
    url, snap, _ = api
    assert http_json(f"{url}/healthz") == (200, {"status": "ok"})
    assert http_json(f"{url}/readyz") == (200, {"ready": True, "state": "ready"})
    snap["state"] = "waiting_ready"
    assert http_json(f"{url}/readyz") == (503, {"ready": False, "state": "waiting_ready"})
    assert http_json(f"{url}/status")[1]["engine"]["pid"] == 42
    status, body = http(f"{url}/metrics")
    assert status == 200 and b'warden_state{state="ready"} 1.0' in body
    assert http_json(f"{url}/metrics/")[0] == 404  # explicit route, no redirect
    assert http_json(f"{url}/nope")[0] == 404


def test_actions_need_the_bearer_token(api: tuple[str, dict[str, Any], SupervisorMetrics]) -> None:
    url, snap, _ = api
    assert http_json(f"{url}/actions/restart", {})[0] == 401
    import urllib.request

    request = urllib.request.Request(
        f"{url}/actions/restart", data=b"{}", method="POST", headers={"Authorization": "Bearer s3cret"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 202
    assert snap["restarts_asked"] == [1]
    request.full_url = f"{url}/actions/reboot-the-host"
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert raised.value.code == 404  # authorised, but no such action


def test_actions_are_disabled_without_a_token() -> None:
    server = ApiServer("127.0.0.1", free_port(), snapshot=lambda: SNAPSHOT, metrics=lambda: b"")
    server.start()
    try:
        status, body = http_json(f"http://127.0.0.1:{server.port}/actions/restart", {})
        assert status == 403 and "token_file" in body["error"]
    finally:
        server.close()


def test_status_command(api: tuple[str, dict[str, Any], SupervisorMetrics], capsys: pytest.CaptureFixture[str]) -> None:
    url, snap, _ = api
    assert main(["status", "--url", url]) == 0
    out = capsys.readouterr().out
    assert "state     ready" in out and "pid 42" in out and "exited with code -9" in out and "| boom" in out
    assert "placement sim devices 0,1 TP2" in out
    assert "guard     0 refuse, 1 warn" in out
    assert "preflight full unhealthy (3 unhealthy)" in out
    snap["state"] = "failed"
    assert main(["status", "--url", url, "--json"]) == 3


def test_status_command_without_a_supervisor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--url", f"http://127.0.0.1:{free_port()}"]) == 1
    err = capsys.readouterr().err
    assert "no supervisor answers" in err and "remedy:" in err


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])  # noqa: S104 (the profile's, not a bind here)
def test_status_command_follows_the_profiles_api_address(
    api: tuple[str, dict[str, Any], SupervisorMetrics], bind: str, tmp_path: Path
) -> None:
    """What the GPU compose stacks' healthchecks run: the address comes from the profile, not a second copy of it."""
    url, snap, _ = api
    port = int(url.rsplit(":", 1)[1])
    profile = tmp_path / "p.yaml"
    profile.write_text(
        f"name: p\nmodel: {{path: {tmp_path}, served_name: tiny}}\napi: {{host: '{bind}', port: {port}}}\n"
        f"engine: {{port: {free_port()}}}\n"
    )
    assert main(["status", "--profile", str(profile)]) == 0
    snap["state"] = "waiting_ready"
    assert main(["status", "--profile", str(profile)]) == 3
    profile.write_text(profile.read_text().replace(f"port: {port}", f"port: {free_port()}", 1))
    assert main(["status", "--profile", str(profile)]) == 1


def test_status_command_takes_one_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--url", "http://127.0.0.1:1", "--profile", str(tmp_path / "p.yaml")])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["status", "--profile", str(tmp_path / "missing.yaml")]) == 1
    assert "missing.yaml" in capsys.readouterr().err


def write_token_profile(tmp_path: Path, port: int, token: str | None) -> Path:
    token_field = ""
    if token is not None:
        (tmp_path / "token").write_text(token + "\n")
        token_field = ", token_file: token"  # noqa: S105 (a file name)
    profile = tmp_path / "p.yaml"
    profile.write_text(
        f"name: p\nmodel: {{path: {tmp_path}}}\napi: {{port: {port}{token_field}}}\nengine: {{port: {free_port()}}}\n"
    )
    return profile


def test_restart_command_asks_with_the_profiles_token(
    api: tuple[str, dict[str, Any], SupervisorMetrics], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, snap, _ = api
    port = int(url.rsplit(":", 1)[1])
    assert main(["restart", "--profile", str(write_token_profile(tmp_path, port, "s3cret"))]) == 0
    assert snap["restarts_asked"] == [1] and "restart accepted" in capsys.readouterr().out
    assert main(["restart", "--profile", str(write_token_profile(tmp_path, port, "guess"))]) == 1
    err = capsys.readouterr().err
    assert "refused the restart (401)" in err and "does not match" in err and snap["restarts_asked"] == [1]
    assert main(["restart", "--profile", str(write_token_profile(tmp_path, port, None))]) == 1
    assert "has no api.token_file" in capsys.readouterr().err
    assert main(["restart", "--url", url]) == 1
    assert "--url needs --token-file" in capsys.readouterr().err
