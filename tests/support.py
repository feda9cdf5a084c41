"""Small helpers shared by tests: polling with deadlines (never sleeps for synchronisation)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import pytest

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], *, timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def http(url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def http_json(url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> tuple[int, Any]:
    status, raw = http(url, body, timeout_s)
    with contextlib.suppress(json.JSONDecodeError):
        return status, json.loads(raw)
    return status, raw.decode(errors="replace")


def skip_unless_required(reason: str, env_var: str) -> NoReturn:
    """Skip a test whose outside part is missing, or fail it where `env_var`=1 says that part must be here (CI)."""
    if os.environ.get(env_var) == "1":
        pytest.fail(f"{reason}; {env_var}=1 says it must be here")
    pytest.skip(reason)


def reachable(url: str) -> bool:
    """Whether `url` answers 200 now (a refused or timed-out connection is a no, not an error)."""
    try:
        return http(url, timeout_s=2)[0] == 200
    except OSError:
        return False


def prometheus_query(url: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector a PromQL query returns from the Prometheus at `url` (empty when nothing matches)."""
    status, body = http_json(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout_s=5)
    assert status == 200, body
    return list(body["data"]["result"])


def prometheus_alerts(url: str) -> list[dict[str, Any]]:
    """Every alert the Prometheus at `url` holds, pending and firing."""
    status, body = http_json(f"{url}/api/v1/alerts", timeout_s=5)
    assert status == 200, body
    return list(body["data"]["alerts"])


def fails(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode != 0


def docker_or_skip(base_image: str) -> str:
    """The `docker` CLI, where it has compose v2, an engine answers and `base_image` is there; else skip (or fail
    where WARDEN_REQUIRE_DOCKER=1)."""
    docker = shutil.which("docker")
    reason = None
    if docker is None:
        reason = "docker not found"
    elif fails(docker, "compose", "version"):
        reason = "docker compose v2 not found"
    elif fails(docker, "info"):
        reason = "no Docker engine answers"
    elif fails(docker, "image", "inspect", base_image):
        reason = f"no base image {base_image} (WARDEN_BASE_IMAGE)"
    if reason is not None:
        skip_unless_required(reason + ": ops/scripts/docker-engine sets up the engine, compose and the base image",
                             "WARDEN_REQUIRE_DOCKER")  # fmt: skip
    assert docker is not None
    return docker
