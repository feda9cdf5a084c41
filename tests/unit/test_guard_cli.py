"""`warden check`, the ops profiles, and the guard's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from service.cli import main
from service.guard import ALL_RULES, guard_profile
from service.guard.engine_args import vllm_available
from service.guard.facts import build_facts
from service.guard.metrics import GuardMetrics
from service.identity import RunIdentity
from service.models.qwen36 import write_qwen36_config
from service.profile import parse_profile


@pytest.fixture(autouse=True, scope="module")
def _needs_vllm() -> None:
    """Imports vLLM on first use (once per test process), not at collection."""
    if not vllm_available():
        pytest.skip("vLLM is not importable here")


PROFILES = Path(__file__).resolve().parents[2] / "ops" / "profiles"
QWEN36_PROFILES = sorted(PROFILES.glob("qwen36-*.yaml"))
TINY_CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"],
    "model_type": "qwen3_5_moe_text",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "num_experts": 4,
    "dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen36")
    return {
        "plain": write_qwen36_config(root / "plain"),
        "mtp": write_qwen36_config(root / "mtp", mtp_weights=True),
    }


def _with_model(profile: Path, model: Path) -> tuple[dict[str, Any], Path]:
    data = yaml.safe_load(profile.read_text())
    data["model"]["path"] = str(model)
    return data, profile


def test_there_are_four_seed_profiles() -> None:
    names = {p.stem for p in QWEN36_PROFILES}
    assert names == {"qwen36-xpu-tp4-safe", "qwen36-xpu-tp2-no-async", "qwen36-xpu-tp4-replayssm-mtp", "qwen36-cuda"}
    for path in QWEN36_PROFILES:
        assert path.read_text().startswith("# "), f"{path.name} needs its comment header"


@pytest.mark.parametrize("profile", QWEN36_PROFILES, ids=lambda p: p.stem)
def test_seed_profiles_pass_the_seed_rules_with_a_qwen36_model(profile: Path, qwen36: dict[str, Path]) -> None:
    model = qwen36["mtp"] if "mtp" in profile.stem else qwen36["plain"]
    loaded = parse_profile(*_with_model(profile, model))
    report = guard_profile(loaded, quarantined={}, base_env={})
    # the seeds' rules all pass; ReplaySSM's layer swap exists for the CPU build only (README, kernels)
    expected_refusals = ["replayssm-layer-swap-not-built"] if "replayssm" in profile.stem else []
    assert [f.rule for f in report.refusals] == expected_refusals, [f.reason for f in report.refusals]
    assert not report.unknown, [f.reason for f in report.unknown]
    expected_warnings = {"mtp-draft-full-moe"} if "mtp" in profile.stem else set()
    assert {f.rule for f in report.warnings} == expected_warnings


def test_seed_profiles_as_shipped_need_a_model(tmp_path: Path) -> None:
    """Shipped with a placeholder model path: check refuses until model.path points at a checkpoint."""
    loaded = parse_profile(yaml.safe_load((PROFILES / "qwen36-xpu-tp2-no-async.yaml").read_text()), tmp_path / "p.yaml")
    report = guard_profile(loaded, quarantined={}, base_env={})
    assert [f.rule for f in report.refusals] == ["model-unreadable"]


def test_tp4_safe_profile_refuses_when_device_3_is_quarantined(qwen36: dict[str, Path]) -> None:
    loaded = parse_profile(*_with_model(PROFILES / "qwen36-xpu-tp4-safe.yaml", qwen36["plain"]))
    report = guard_profile(loaded, quarantined={3: "XCCL all-reduce hung"}, base_env={})
    assert [f.rule for f in report.refusals] == ["unhealthy-device-selected"]
    assert "device 3: XCCL all-reduce hung" in report.refusals[0].reason


def test_inherited_environment_is_guarded(qwen36: dict[str, Path]) -> None:
    """A capture-unsafe flag exported in the supervisor's environment reaches the engine too."""
    loaded = parse_profile(*_with_model(PROFILES / "qwen36-xpu-tp2-no-async.yaml", qwen36["plain"]))
    env = {"VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET": "1", "HOME": "/root"}
    report = guard_profile(loaded, quarantined={}, base_env=env)
    assert [f.rule for f in report.refusals] == ["fused-prologue-capture"]


def test_tiny_cpu_profile_passes_check(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    data, source = _with_model(PROFILES / "tiny-cpu.yaml", model)
    report = guard_profile(parse_profile(data, source), base_env={})
    assert not report.refused and not report.warnings and not report.unknown
    assert report.finding("cudagraph-none").status == "not-applicable"  # CPU eager is fine


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_check_cli_exit_codes_and_json(
    tmp_path: Path, qwen36: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    base = {
        "name": "cli",
        "model": {"path": str(qwen36["plain"])},
        "platform": "xpu",
        "devices": [0, 1],
        "tensor_parallel": 2,
        "engine": {"args": ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling", "--gpu-memory-utilization=0.9"]},
    }
    assert main(["check", str(_write(tmp_path, base)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["refused"] is False and report["counts"]["refuse"] == 0
    assert {f["rule"] for f in report["findings"]} >= {r.id for r in ALL_RULES}

    eager = {**base, "name": "eager", "engine": {"args": ["--enforce-eager", "--gpu-memory-utilization=0.9"]}}
    assert main(["check", str(_write(tmp_path, eager))]) == 3
    text = capsys.readouterr().out
    assert "REFUSE   cudagraph-none: --enforce-eager turns graph capture off" in text
    assert "remedy:" in text and "evidence:" in text and "result: REFUSED" in text

    waived = {**eager, "name": "waived", "guard": {"waive": {"cudagraph-none": "eager bisection, not a benchmark"}}}
    assert main(["check", str(_write(tmp_path, waived)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    finding = next(f for f in report["findings"] if f["rule"] == "cudagraph-none")
    assert finding["waived"] is True and finding["waiver_reason"] == "eager bisection, not a benchmark"
    assert report["counts"]["waived"] == 1


def test_check_cli_refuses_args_vllm_rejects(
    tmp_path: Path, qwen36: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    data = {
        "name": "bad",
        "model": {"path": str(qwen36["plain"])},
        "platform": "cpu",
        "engine": {"args": ["--enforce-eager=true"]},
    }
    assert main(["check", str(_write(tmp_path, data))]) == 3
    assert "REFUSE   engine-args-invalid" in capsys.readouterr().out


def test_check_cli_bad_profile_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmodel: {path: m}\nguard: {waive: {cudagraph-none: ''}}\n")
    assert main(["check", str(path)]) == 1
    assert "needs a reason" in capsys.readouterr().err


# ---- metrics ---------------------------------------------------------------------------------


def test_metrics_are_preinitialised_and_follow_reports(tmp_path: Path, qwen36: dict[str, Path]) -> None:
    registry = CollectorRegistry()
    metrics = GuardMetrics(registry)
    assert registry.get_sample_value("warden_guard_findings", {"rule": "cudagraph-none", "severity": "refuse"}) == 0
    assert (
        registry.get_sample_value("warden_guard_findings", {"rule": "spec-gdn-without-replayssm", "severity": "warn"})
        == 0
    )
    assert registry.get_sample_value("warden_guard_refusals_total") == 0

    data = {
        "name": "m",
        "model": {"path": str(qwen36["plain"])},
        "platform": "xpu",
        "devices": [0, 1],
        "tensor_parallel": 2,
        "engine": {
            "args": ["--enforce-eager", "--gpu-memory-utilization=0.9"],
            "env": {"VLLM_XPU_SHARED_EXPERTS_STREAM": "1"},
        },
        "guard": {"waive": {"shared-experts-stream": "measuring the regression"}},
    }
    report = guard_profile(parse_profile(data, tmp_path / "m.yaml"), base_env={})
    metrics.observe(report)
    assert registry.get_sample_value("warden_guard_findings", {"rule": "cudagraph-none", "severity": "refuse"}) == 1
    assert (
        registry.get_sample_value("warden_guard_findings", {"rule": "shared-experts-stream", "severity": "warn"}) == 1
    )
    assert registry.get_sample_value("warden_guard_waived_findings", {"rule": "shared-experts-stream"}) == 1
    assert registry.get_sample_value("warden_guard_unknown_rules", {"rule": "unhealthy-device-selected"}) == 1
    assert registry.get_sample_value("warden_guard_findings", {"rule": "tp-divisibility", "severity": "refuse"}) == 0
    assert registry.get_sample_value("warden_guard_refusals_total") == 1

    identity = RunIdentity(
        fields={
            "model": {"path": "/m"},
            "platform": "xpu",
            "tensor_parallel": 2,
            "vllm_version": "0.32.0",
            "warden": {"version": "0.1.0"},
        }
    )
    metrics.set_identity(identity)
    text = generate_latest(registry).decode()
    assert f'warden_identity_info{{fingerprint="{identity.fingerprint}"' in text
    assert 'platform="xpu"' in text
    metrics.set_identity(RunIdentity(fields={"platform": "cuda"}))
    assert generate_latest(registry).decode().count("warden_identity_info{") == 1


def test_two_metric_sets_on_two_registries_do_not_collide() -> None:
    GuardMetrics(CollectorRegistry())
    GuardMetrics(CollectorRegistry())


def test_check_cli_reads_the_quarantine_record(
    tmp_path: Path, qwen36: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`warden check` evaluates unhealthy-device-selected from the host's quarantine record (no device is
    touched): nothing recorded passes; device 3 recorded refuses a profile that selects it."""
    from preflight.quarantine import Quarantine

    record = tmp_path / "quarantine.json"
    profile = {
        "name": "tp4",
        "model": {"path": str(qwen36["plain"])},
        "platform": "xpu",
        "devices": [0, 1, 2, 3],
        "tensor_parallel": 4,
        "engine": {"args": ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling", "--gpu-memory-utilization=0.9"]},
        "preflight": {"quarantine_file": str(record)},
    }
    path = _write(tmp_path, profile)
    assert main(["check", str(path), "--json"]) == 0
    finding = next(
        f for f in json.loads(capsys.readouterr().out)["findings"] if f["rule"] == "unhealthy-device-selected"
    )
    assert finding["status"] == "pass"

    Quarantine(record).add("xpu", 3, "XCCL all-reduce hung", "hang")
    assert main(["check", str(path)]) == 3
    out = capsys.readouterr().out
    assert "REFUSE   unhealthy-device-selected" in out and "XCCL all-reduce hung" in out

    record.write_text("{not json")
    assert main(["check", str(path)]) == 1
    assert "remedy:" in capsys.readouterr().err


def test_tiny_cpu_mtp_replayssm_profile_passes_check_with_its_model(tmp_path: Path) -> None:
    """The shipped ReplaySSM demo profile, with the model its header says to build: nothing refused, no warning
    (warden's vLLM fixes are on), and the ring the identity will carry."""
    from service.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny-mtp", mtp=True, peaky=True, mtp_noise=3.5)
    data, source = _with_model(PROFILES / "tiny-cpu-mtp-replayssm.yaml", model)
    loaded = parse_profile(data, source)
    report = guard_profile(loaded, base_env={})
    assert not report.refused and not report.unknown, [f.reason for f in report.refusals + report.unknown]
    assert not report.warnings, [f.reason for f in report.warnings]
    assert build_facts(loaded).replayssm_ring_len == 64
