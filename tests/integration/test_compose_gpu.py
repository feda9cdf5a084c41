"""The accelerator stacks (`compose.cuda.yaml`, `compose.xpu.yaml`) and the Dockerfile's `cuda` and `xpu` targets.

No GPU, XPU or vLLM accelerator image can reach these machines, so: compose's own rendering of each file (what a
host's `docker compose up` would ask the engine for), and a real build of each target on a stand-in base, an image
whose python3 imports vllm (the `cpu` image's vLLM with warden taken out), whose container must then vouch for the
shipped profile and refuse to launch, cleanly, without the devices it names. That is the same layer of the image a
user builds on vLLM's own; the base is the one part not built here.

The rendering tests need the docker CLI with compose v2; the builds a Docker engine and the base image too
(`ops/scripts/docker-engine`). Without them the tests skip, unless `WARDEN_REQUIRE_DOCKER=1` (`.ci/run`), where they
fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import docker_or_skip, fails, skip_unless_required

# The stand-in base comes from the `cpu` image, which a first build makes (vLLM installed into it: minutes).
pytestmark = pytest.mark.timeout(1800)
REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("WARDEN_BASE_IMAGE", "local/debian-py:bookworm")
ENV_WITHOUT_WARDEN = {k: v for k, v in os.environ.items() if not k.startswith(("WARDEN_", "COMPOSE_"))}


def compose_cli_or_skip() -> str:
    docker = shutil.which("docker")
    if docker is None or fails(docker, "compose", "version"):
        reason = "docker compose v2 not found: ops/scripts/docker-engine installs it"
        skip_unless_required(reason, "WARDEN_REQUIRE_DOCKER")
    assert docker is not None
    return docker


def compose_config(file: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`docker compose config` of `file` as JSON, with no WARDEN_* variable but `env` (the user's defaults)."""
    argv = [compose_cli_or_skip(), "compose", "-f", str(REPO / file), "config", "--format", "json"]
    env = {**ENV_WITHOUT_WARDEN, **env}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def rendered(file: str, **env: str) -> dict[str, Any]:
    result = compose_config(file, **env)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["services"])


def mounts(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {volume["target"]: volume for volume in service["volumes"]}


def assert_host_network_stack(services: dict[str, Any], target: str, profile: str) -> None:
    """What both accelerator stacks share: the host's network (the profiles bind its loopback), the profiles and models
    mounted read-only where the profiles' relative model paths point, state on a volume, Prometheus on loopback."""
    warden, prometheus = services["warden"], services["prometheus"]
    assert warden["build"]["target"] == target
    assert warden["command"] == ["run", f"/opt/warden/ops/profiles/{profile}"]
    assert warden["network_mode"] == "host" and warden["ipc"] == "host"
    volumes = mounts(warden)
    assert volumes["/opt/warden/ops/profiles"]["source"] == str(REPO / "ops" / "profiles")
    assert volumes["/opt/warden/models"]["source"] == str(REPO / "models")
    assert volumes["/opt/warden/ops/profiles"]["read_only"] and volumes["/opt/warden/models"]["read_only"]
    assert volumes["/var/lib/warden"]["type"] == "volume"
    assert warden["stop_grace_period"] == "1m30s"
    # healthy follows the profile's own api address, whichever profile the user serves
    health = ["CMD", "warden", "status", "--profile", f"/opt/warden/ops/profiles/{profile}"]
    assert warden["healthcheck"]["test"] == health
    assert prometheus["build"]["target"] == "prometheus" and prometheus["network_mode"] == "host"
    assert prometheus["command"] == ["--web.listen-address=127.0.0.1:9090"]
    assert "ports" not in warden and "ports" not in prometheus  # the host's network: nothing to publish


def test_cuda_stack_passes_every_gpu_on_the_hosts_network() -> None:
    services = rendered("compose.cuda.yaml")
    assert_host_network_stack(services, "cuda", "qwen36-cuda.yaml")
    warden = services["warden"]
    assert warden["build"]["args"] == {"CUDA_BASE_IMAGE": "vllm/vllm-openai:v0.33.0"}
    # every GPU, so that preflight can probe each and place the model on the healthy ones
    assert warden["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}
    ]


def test_cuda_stack_takes_the_users_profile_models_and_port() -> None:
    env = {"WARDEN_PROFILE": "mine.yaml", "WARDEN_MODELS_DIR": "/srv/models", "WARDEN_PROMETHEUS_PORT": "9091"}
    services = rendered("compose.cuda.yaml", **env)
    assert services["warden"]["command"] == ["run", "/opt/warden/ops/profiles/mine.yaml"]
    assert services["warden"]["healthcheck"]["test"][-1] == "/opt/warden/ops/profiles/mine.yaml"
    assert mounts(services["warden"])["/opt/warden/models"]["source"] == "/srv/models"
    assert services["prometheus"]["command"] == ["--web.listen-address=127.0.0.1:9091"]


@pytest.mark.parametrize("file", ["compose.yaml", "compose.cuda.yaml", "compose.xpu.yaml"])
def test_grafana_is_opt_in_and_finds_prometheus(file: str) -> None:
    env = {"WARDEN_XPU_BASE_IMAGE": "lab/vllm-xpu:b70"}
    assert "grafana" not in rendered(file, **env)  # `docker compose up` starts no Grafana
    grafana = compose_grafana(file, **env)
    volumes = mounts(grafana)
    assert volumes["/etc/grafana/provisioning"]["source"] == str(REPO / "ops" / "grafana" / "provisioning")
    assert volumes["/var/lib/grafana/dashboards"]["source"] == str(REPO / "ops" / "grafana" / "dashboards")
    assert volumes["/etc/grafana/provisioning"]["read_only"] and volumes["/var/lib/grafana"]["type"] == "volume"
    if file == "compose.yaml":  # its own namespace on the stack's network; Prometheus is in warden's
        assert grafana["environment"]["WARDEN_PROMETHEUS_URL"] == "http://warden:9090"
        assert [(p["host_ip"], p["target"]) for p in grafana["ports"]] == [("127.0.0.1", 3000)]
    else:  # the host's network, on its loopback, beside Prometheus
        assert grafana["network_mode"] == "host" and not grafana.get("ports")
        assert grafana["environment"]["WARDEN_PROMETHEUS_URL"] == "http://127.0.0.1:9090"
        assert grafana["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    datasource = yaml.safe_load((REPO / "ops/grafana/provisioning/datasources/warden.yml").read_text())
    assert datasource["datasources"][0]["url"] == "${WARDEN_PROMETHEUS_URL}"


def compose_grafana(file: str, **env: str) -> dict[str, Any]:
    argv = [compose_cli_or_skip(), "compose", "-f", str(REPO / file), "--profile", "grafana", "config"]
    argv += ["--format", "json"]
    result = subprocess.run(argv, env={**ENV_WITHOUT_WARDEN, **env}, capture_output=True, text=True, timeout=60,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout)["services"]["grafana"])


def test_xpu_stack_refuses_without_its_base_image_named() -> None:
    result = compose_config("compose.xpu.yaml")
    assert result.returncode != 0
    assert "WARDEN_XPU_BASE_IMAGE" in result.stderr and "vLLM XPU image" in result.stderr


def test_xpu_stack_passes_the_cards_on_the_hosts_network() -> None:
    services = rendered("compose.xpu.yaml", WARDEN_XPU_BASE_IMAGE="lab/vllm-xpu:b70")
    assert_host_network_stack(services, "xpu", "qwen36-xpu-tp4-safe.yaml")
    warden = services["warden"]
    assert warden["build"]["args"] == {"XPU_BASE_IMAGE": "lab/vllm-xpu:b70"}
    assert [(d["source"], d["target"]) for d in warden["devices"]] == [("/dev/dri", "/dev/dri")]
    assert mounts(warden)["/dev/dri/by-path"]["source"] == "/dev/dri/by-path"


def docker(*args: str, timeout_s: float = 300, check: bool = True, stdin: str | None = None, **env: str) -> str:
    """Output of `docker ARGS` (with `env` added), or with `check=False` "rc=N" and a newline before it."""
    result = subprocess.run([shutil.which("docker") or "docker", *args], input=stdin, capture_output=True, text=True,
                            timeout=timeout_s, check=False, env={**os.environ, **env})  # fmt: skip
    output = result.stdout + result.stderr
    assert not check or result.returncode == 0, f"docker {' '.join(args[:4])}: {output[-3000:]}"
    return output if check else f"rc={result.returncode}\n{output}"


@pytest.fixture(scope="module")
def vllm_base() -> Iterator[str]:
    """An image whose python3 imports vllm and has no warden: the `cpu` image (built by compose, cached when
    test_compose built it) with warden uninstalled (a plain build: this CLI has BuildKit only through compose)."""
    docker_or_skip(BASE_IMAGE)
    docker("compose", "-f", str(REPO / "compose.yaml"), "build", "warden", timeout_s=1800, WARDEN_BASE_IMAGE=BASE_IMAGE)
    tag = f"warden-test-vllm-base:{os.getpid()}"
    stand_in = "FROM warden:cpu\nRUN pip uninstall --yes --quiet warden\n"
    docker("build", "--tag", tag, "-", stdin=stand_in, DOCKER_BUILDKIT="0")
    try:
        yield tag
    finally:
        docker("image", "rm", "--force", tag, check=False)


def pip_freeze(image: str) -> set[str]:
    """The image's Python packages, a line each (`name==version`, or `name @ url` for a local install)."""
    return set(docker("run", "--rm", "--entrypoint", "python3", image, "-m", "pip", "freeze", "--all").splitlines())


@pytest.mark.parametrize(("target", "profile"), [("cuda", "qwen36-cuda.yaml"), ("xpu", "qwen36-xpu-tp4-safe.yaml")])
def test_image_vouches_for_the_profile_and_refuses_without_devices(
    target: str, profile: str, vllm_base: str, tmp_path: Path
) -> None:
    image = f"warden-test-{target}:{os.getpid()}"
    variable = f"WARDEN_{target.upper()}"
    build_env = {f"{variable}_BASE_IMAGE": vllm_base, f"{variable}_IMAGE": image, "WARDEN_BASE_IMAGE": BASE_IMAGE}
    docker("compose", "-f", str(REPO / f"compose.{target}.yaml"), "build", "warden", timeout_s=900, **build_env)
    try:
        # warden went in beside vLLM and moved nothing of the base's packages
        added = pip_freeze(image) - pip_freeze(vllm_base)
        names = {re.split(r"==| @ ", line)[0].lower() for line in added}
        assert "warden" in names and names <= {"warden", "nvidia-ml-py"}, sorted(added)

        # the profile's model, at real dimensions, where compose mounts the host's models
        model = Path(yaml.safe_load((REPO / "ops" / "profiles" / profile).read_text())["model"]["path"]).name
        models = tmp_path / "models"
        cli = [sys.executable, "-m", "service.cli", "model", "config", "qwen36-35b-a3b", str(models / model)]
        subprocess.run(cli, check=True, capture_output=True, timeout=120)
        mount = ["--volume", f"{models}:/opt/warden/models:ro"]

        checked = docker("run", "--rm", *mount, image, "check", f"/opt/warden/ops/profiles/{profile}")
        assert f"on {target}" in checked and "result: ok" in checked, checked[-3000:]

        # the image's own command: guard, then preflight finds none of the profile's devices and launches nothing
        ran = docker("run", "--rm", *mount, image, check=False, timeout_s=300)
        assert ran.startswith("rc=3\n"), ran[-3000:]
        assert "preflight cannot place the model" in ran and "device 0 is not present" in ran, ran[-3000:]
        assert "Traceback" not in ran

        # the stack's healthcheck command, with no supervisor up: unhealthy, at the address the profile names
        health = docker("run", "--rm", *mount, image, "status", "--profile", f"/opt/warden/ops/profiles/{profile}",
                        check=False)  # fmt: skip
        assert health.startswith("rc=1\n") and "no supervisor answers at http://127.0.0.1:9400" in health, health
    finally:
        docker("image", "rm", "--force", image, check=False)
