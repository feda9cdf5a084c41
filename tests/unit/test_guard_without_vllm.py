"""Without vLLM importable, `warden check` still evaluates the rules that need no argument parsing
and reports the others as unknown, never as passed. Runs the CLI in a subprocess that hides vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from service.models.qwen36 import write_qwen36_config

_HIDE_VLLM = "import sys; sys.modules['vllm'] = None\nfrom service.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _run_without_vllm(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _HIDE_VLLM, *argv], capture_output=True, text=True, timeout=120, check=False
    )


def _profile(tmp_path: Path, name: str, **override: object) -> Path:
    model = write_qwen36_config(tmp_path / f"model-{name}")
    data = {
        "name": name,
        "model": {"path": str(model)},
        "platform": "xpu",
        "devices": [0, 1, 2, 3],
        "tensor_parallel": 4,
        "engine": {"args": ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling"]},
        **override,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_check_without_vllm_reports_argument_rules_unknown(tmp_path: Path) -> None:
    done = _run_without_vllm("check", str(_profile(tmp_path, "novllm")), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    status = {f["rule"]: f["status"] for f in report["findings"]}
    assert report["engine_args"]["status"] == "unavailable"
    for rule in ("engine-args-invalid", "cudagraph-mode-unset", "cudagraph-none", "async-scheduling-piecewise"):
        assert status[rule] == "unknown", rule
    for rule in ("tp-divisibility", "model-unreadable", "fused-prologue-capture", "device-mask-in-engine-env"):
        assert status[rule] == "pass", rule
    assert "pass" not in {status[r] for r in ("cudagraph-none", "gpu-memory-utilization-range")}


def test_check_without_vllm_still_refuses_what_needs_no_arguments(tmp_path: Path) -> None:
    done = _run_without_vllm("check", str(_profile(tmp_path, "tp3", tensor_parallel=3, devices=[0, 1, 2])))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "REFUSE   tp-divisibility" in done.stdout
    assert "UNKNOWN  cudagraph-none" in done.stdout


def test_identity_without_vllm_is_an_error(tmp_path: Path) -> None:
    done = _run_without_vllm("identity", str(_profile(tmp_path, "ident")))
    assert done.returncode == 1
    assert "vLLM is not importable" in done.stderr
