"""The shipped Prometheus config and alerts (`ops/prometheus/`) against a real Prometheus (Debian's `prometheus`).

promtool checks the config and runs the alerts' unit tests; every metric an alert reads is one warden exports; and a
real Prometheus, started from the shipped config pointed at a real warden API, scrapes it and fires an alert when a
metric says so. Without Debian's `prometheus` package these tests skip, unless `WARDEN_REQUIRE_PROMETHEUS=1`
(`.ci/run` sets it after installing the package), where they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from prometheus_client import CollectorRegistry
from support import (
    free_port,
    http_json,
    prometheus_alerts,
    prometheus_query,
    reachable,
    skip_unless_required,
    wait_for,
)

from preflight.metrics import PreflightMetrics
from service.guard.metrics import GuardMetrics
from service.supervisor.api import ApiServer
from service.supervisor.metrics import SupervisorMetrics
from service.supervisor.states import State

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "ops" / "prometheus"
DASHBOARD = PROMETHEUS_DIR.parent / "grafana" / "dashboards" / "warden.json"
CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERT_TESTS = PROMETHEUS_DIR / "alerts_test.yml"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} not found: install Debian's prometheus package (apt-get install prometheus)"
        skip_unless_required(reason, "WARDEN_REQUIRE_PROMETHEUS")
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=60, check=False)


def test_promtool_accepts_the_config_and_its_alerts() -> None:
    result = promtool("check", "config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10 rules found" in result.stdout  # the config loads alerts.yml, every rule of it


def test_the_alerts_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def exported_metric_names() -> set[str]:
    """Every series name warden's registries expose: the supervisor's, preflight's and the guard's."""
    registry = CollectorRegistry()
    SupervisorMetrics(registry)
    PreflightMetrics(registry)
    GuardMetrics(registry)
    names = set()
    for family in registry.collect():  # a labelled series that was never set has no sample yet: name it by family
        names |= {sample.name for sample in family.samples}
        names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


def test_every_alert_reads_metrics_warden_exports() -> None:
    """A renamed metric would leave its alert silently never firing; promtool cannot see that."""
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    read = {name for rule in rules for name in re.findall(r"\bwarden_[a-z_]+", rule["expr"])}
    assert read, "the alerts read warden's metrics"
    assert read <= exported_metric_names(), f"not exported: {sorted(read - exported_metric_names())}"
    assert all(rule["labels"]["severity"] in {"page", "ticket"} for rule in rules)
    assert all(rule["annotations"]["runbook"] == "ops/runbook.md#alerts" for rule in rules)
    runbook = (PROMETHEUS_DIR.parent / "runbook.md").read_text()
    assert "\n## Alerts\n" in runbook
    assert all(f"`{rule['alert']}`" in runbook for rule in rules), "the runbook says what to do for every alert"


@pytest.fixture
def warden_api() -> Iterator[tuple[int, SupervisorMetrics]]:
    metrics = SupervisorMetrics(CollectorRegistry())
    metrics.set_state(State.READY)
    metrics.ready.set(1)
    server = ApiServer("127.0.0.1", free_port(), snapshot=lambda: {"state": "ready"}, metrics=metrics.exposition)
    server.start()
    yield server.port, metrics
    server.close()


@pytest.fixture
def prometheus(tmp_path: Path, warden_api: tuple[int, SupervisorMetrics]) -> Iterator[str]:
    """A real Prometheus from the shipped config: the warden job pointed at the test's API, the vLLM job dropped
    (no engine here), scrapes and rule evaluations every second."""
    config = yaml.safe_load(CONFIG.read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == ["warden", "vllm"]
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(ALERTS)]
    warden = config["scrape_configs"][0]
    warden["static_configs"] = [{"targets": [f"127.0.0.1:{warden_api[0]}"]}]
    config["scrape_configs"] = [warden]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        tool("prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: reachable(f"{url}/-/ready") or process.poll() is not None, timeout_s=60, what="prometheus")
        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)


def firing(url: str) -> set[str]:
    return {alert["labels"]["alertname"] for alert in prometheus_alerts(url) if alert["state"] == "firing"}


def test_prometheus_scrapes_warden_and_fires_an_alert(
    prometheus: str, warden_api: tuple[int, SupervisorMetrics]
) -> None:
    _, metrics = warden_api
    wait_for(lambda: prometheus_query(prometheus, 'warden_state{job="warden", state="ready"} == 1'), timeout_s=60,
             what="the warden job scraped")  # fmt: skip
    [up] = prometheus_query(prometheus, 'up{job="warden"}')
    assert up["value"][1] == "1"
    assert firing(prometheus) == set()  # a ready supervisor raises nothing
    metrics.stop_survivors.set(2)  # what the supervisor sets when processes outlive SIGKILL
    wait_for(lambda: "WardenStopSurvivors" in firing(prometheus), timeout_s=60, what="WardenStopSurvivors firing")
    [alert] = [a for a in prometheus_alerts(prometheus) if a["labels"]["alertname"] == "WardenStopSurvivors"]
    assert alert["labels"]["severity"] == "page", json.dumps(alert)
    assert alert["annotations"]["summary"].endswith(": 2 (they may hold the devices)")


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the shipped Grafana dashboard, Grafana's range macro filled in."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]
    assert len(queries) >= 20, "the dashboard's panels carry their queries"
    return [(title, expr.replace("$__rate_interval", "1m")) for title, expr in queries]


def test_the_dashboard_reads_only_metrics_warden_exports() -> None:
    """A renamed metric would leave its panel empty; vLLM's names are checked against a real engine's scrape in
    test_compose.py (and the speculative ones by the MTP test in test_run_tiny_cpu.py)."""
    read = {name for _, expr in dashboard_queries() for name in re.findall(r"\bwarden_[a-z_]+", expr)}
    assert read <= exported_metric_names(), f"not exported: {sorted(read - exported_metric_names())}"
    assert {"warden_state", "warden_engine_stop_survivors", "warden_preflight_device_health"} <= read


def test_every_dashboard_query_runs_on_a_real_prometheus(
    prometheus: str, warden_api: tuple[int, SupervisorMetrics]
) -> None:
    wait_for(lambda: prometheus_query(prometheus, 'warden_state{job="warden", state="ready"} == 1'), timeout_s=60,
             what="the warden job scraped")  # fmt: skip
    for title, expr in dashboard_queries():
        status, body = http_json(f"{prometheus}/api/v1/query?query={quote(expr)}", timeout_s=5)
        assert status == 200 and body["status"] == "success", f"{title}: {expr}: {body}"
    [state] = prometheus_query(prometheus, dict(dashboard_queries())["State"])
    assert state["metric"] == {"state": "ready"}
