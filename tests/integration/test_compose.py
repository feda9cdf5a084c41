"""The compose stack (`compose.yaml`) on a real Docker engine: built from the Dockerfile, warden serves the tiny model
with the real vLLM CPU engine, Prometheus scrapes warden and vLLM with warden's alerts loaded, Docker's healthcheck
says healthy, and a stop ends warden cleanly (exit 0).

Needs a Docker engine with compose v2 and a base image (`ops/scripts/docker-engine` sets them up, as root). Without
them the test skips, unless `WARDEN_REQUIRE_DOCKER=1` (`.ci/run` sets it), where it fails. The first build installs
vLLM into the image: minutes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import yaml
from support import (
    docker_or_skip,
    free_port,
    http,
    http_json,
    prometheus_alerts,
    prometheus_query,
    reachable,
    wait_for,
)

# The first test's setup builds both images (vLLM into one): minutes on 2 cores, more than the suite's 600 s per test
# leaves room for on a slow network.
pytestmark = pytest.mark.timeout(1800)
REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("WARDEN_BASE_IMAGE", "local/debian-py:bookworm")


@dataclass
class Stack:
    compose: list[str]
    env: dict[str, str]
    api: str
    engine: str
    prometheus: str

    def run(self, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.compose, *args], env=self.env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        output = result.stdout[-3000:] + result.stderr[-3000:]
        assert result.returncode == 0, f"docker compose {' '.join(args)}: {output}"
        return result


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    docker = docker_or_skip(BASE_IMAGE)
    ports = {name: free_port() for name in ("WARDEN_API_PORT", "WARDEN_ENGINE_PORT", "WARDEN_PROMETHEUS_PORT")}
    env = {**os.environ, "WARDEN_BASE_IMAGE": BASE_IMAGE, **{name: str(port) for name, port in ports.items()}}
    compose = [docker, "compose", "--project-directory", str(REPO), "-f", str(REPO / "compose.yaml"),
               "-p", f"warden-test-{os.getpid()}"]  # fmt: skip
    stack = Stack(
        compose,
        env,
        api=f"http://127.0.0.1:{ports['WARDEN_API_PORT']}",
        engine=f"http://127.0.0.1:{ports['WARDEN_ENGINE_PORT']}",
        prometheus=f"http://127.0.0.1:{ports['WARDEN_PROMETHEUS_PORT']}",
    )
    stack.run("build", timeout_s=1800)
    try:
        stack.run("up", "--detach")
        yield stack
    finally:
        logs = subprocess.run([*compose, "logs", "--no-color", "--tail", "40"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        print(logs.stdout[-6000:])
        stack.run("down", "--volumes", "--timeout", "90", timeout_s=300)


def settled_state(api: str) -> str | None:
    """warden's state once it is `ready` or has given up (`failed`), else None (starting, or not answering yet)."""
    try:
        status, body = http_json(f"{api}/status", timeout_s=5)
    except OSError:
        return None
    state = body.get("state") if status == 200 and isinstance(body, dict) else None
    return state if state in ("ready", "failed") else None


def wait_ready(stack: Stack) -> None:
    state = wait_for(lambda: settled_state(stack.api), timeout_s=600, interval_s=1, what="warden ready or failed")
    assert state == "ready", http_json(f"{stack.api}/status")[1]
    assert http(f"{stack.api}/readyz")[0] == 200


def test_compose_up_serves_and_prometheus_scrapes_both(stack: Stack) -> None:
    wait_ready(stack)
    completion = {"model": "tiny", "prompt": "Devices fail in quiet ways", "max_tokens": 4, "temperature": 0}
    status, body = http_json(f"{stack.engine}/v1/completions", completion, timeout_s=60)
    assert status == 200 and body["usage"]["completion_tokens"] == 4, body

    wait_for(lambda: reachable(f"{stack.prometheus}/-/ready"), timeout_s=120, interval_s=1, what="prometheus ready")
    # Scrapes come every 15 s: the first of warden may predate its ready state, so each of these is polled.
    for promql, what in [
        ('sum(up{job=~"warden|vllm"}) == 2', "both jobs up"),
        ('warden_state{job="warden", state="ready"} == 1', "warden ready as scraped"),
        ('{__name__=~"vllm:.+", job="vllm"}', "vLLM's own metrics scraped"),
    ]:
        wait_for(partial(prometheus_query, stack.prometheus, promql), timeout_s=180, interval_s=1, what=what)
    # every vLLM metric warden's Grafana dashboard reads, but speculation's (this engine does not speculate)
    dashboard = json.loads((REPO / "ops" / "grafana" / "dashboards" / "warden.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    read = {name for expr in exprs for name in re.findall(r"vllm:[a-z_]+", expr)}
    status, names = http_json(f"{stack.prometheus}/api/v1/label/__name__/values")
    assert status == 200, names
    missing = {m for m in read if not m.startswith("vllm:spec_decode_")} - set(names["data"])
    assert not missing, f"the dashboard reads vLLM metrics this vLLM does not export: {sorted(missing)}"

    status, rules = http_json(f"{stack.prometheus}/api/v1/rules")
    assert status == 200, rules
    [group] = rules["data"]["groups"]
    alerts = yaml.safe_load((REPO / "ops" / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    assert group["name"] == "warden" and [r["name"] for r in group["rules"]] == [a["alert"] for a in alerts]
    assert [a for a in prometheus_alerts(stack.prometheus) if a["state"] == "firing"] == []


def health(stack: Stack, container: str) -> str | None:
    """Docker's verdict from the healthcheck once it has one (`healthy` or `unhealthy`), else None."""
    result = subprocess.run([stack.compose[0], "inspect", "--format", "{{.State.Health.Status}}", container],
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    verdict = result.stdout.strip()
    return verdict if verdict in ("healthy", "unhealthy") else None


def test_compose_stop_ends_warden_and_its_engine_cleanly(stack: Stack) -> None:
    wait_ready(stack)
    [container] = stack.run("ps", "--quiet", "warden").stdout.split()
    # the healthcheck (`warden status --profile`) agrees with the API: checks come every 10 s
    verdict = wait_for(partial(health, stack, container), timeout_s=120, interval_s=1, what="a health verdict")
    assert verdict == "healthy"
    stack.run("stop", "warden", timeout_s=180)  # SIGTERM, then 90 s before Docker would SIGKILL
    inspect = subprocess.run(
        [stack.compose[0], "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}",
         container], capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert inspect.stdout.split() == ["exited", "0", "false"]
    logs = stack.run("logs", "--no-color", "warden").stdout
    assert "-> stopping" in logs and "-> stopped" in logs, logs[-3000:]
