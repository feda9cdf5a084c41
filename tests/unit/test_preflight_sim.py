"""Preflight on the sim platform: the real probe worker and real gloo all-reduces across real
processes, with the profile's faults injected. Each test starts a handful of `import torch`
processes (about 2 s of CPU each), so the suite keeps to few, meaningful runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from preflight.cli import main as standalone_main
from preflight.devices import Timeouts
from preflight.faults import Fault
from preflight.health import Health
from preflight.model_shape import ModelShape, read_model_shape
from preflight.orchestrate import PreflightOptions, run_preflight
from preflight.quarantine import Quarantine
from service.cli import main as warden_main
from service.models.qwen36 import write_qwen36_config


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory: pytest.TempPathFactory) -> ModelShape:
    return read_model_shape(write_qwen36_config(tmp_path_factory.mktemp("qwen36")))


def write_profile(folder: Path, **fields: Any) -> Path:
    """A sim profile for the real-dimension Qwen3.6-35B-A3B config (no weights)."""
    if not (folder / "model" / "config.json").exists():
        write_qwen36_config(folder / "model")
    data: dict[str, Any] = {
        "name": "sim-qwen36",
        "model": {"path": "model"},
        "platform": "sim",
        "preflight": {"probe_timeout_s": 20, "collective_timeout_s": 30, "quarantine_file": "quarantine.json"},
        **fields,
    }
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any]]:
    code = warden_main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {"text": out}


def test_every_probe_fault_is_detected_and_named_and_a_hanging_probe_is_killed_on_time(tmp_path: Path) -> None:
    probe_timeout = 3.0
    options = PreflightOptions(
        platform="sim",
        sim_devices=6,
        faults=(
            Fault(0, "crash"),
            Fault(1, "hang"),
            Fault(2, "wrong-result"),
            Fault(3, "device-lost"),
            Fault(4, "alloc-fail"),
        ),
        collective=False,  # this test is about the device probes; the collective ones follow
        timeouts=Timeouts(startup_s=120, probe_s=probe_timeout, collective_s=30),
        quarantine_file=tmp_path / "quarantine.json",
    )
    started = time.monotonic()
    report = run_preflight(options)
    elapsed = time.monotonic() - started
    device = {d.index: d for d in report.devices}

    assert [device[i].failure for i in range(6)] == [
        "crash",
        "hang",
        "wrong-result",
        "device-lost",
        "alloc-fail",
        None,
    ]
    assert [device[i].health for i in range(6)] == [Health.UNHEALTHY] * 5 + [Health.HEALTHY]
    assert device[0].reason == "the probe worker crashed with SIGSEGV during compute"
    assert device[1].reason == "allocate did not finish within 3 s; the probe worker was killed"
    assert device[2].reason.startswith("compute checksum: 1 of 16384 elements differ from the CPU result")
    assert device[3].reason == (
        "device lost during copy: RuntimeError: level_zero backend failed with error: 20 "
        "(UR_RESULT_ERROR_DEVICE_LOST) [simulated on sim device 3]"
    )
    assert device[4].reason.startswith("allocate allocation failed: RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY")
    assert [d.action.value for d in report.devices] == [
        "reset-device",
        "reset-device",
        "inspect-hardware",
        "reset-device",
        "inspect-hardware",
        "none",
    ]
    # The checks after a failure are reported as not run, never as passed.
    after_loss = {p.check: p for p in device[3].probes}
    assert after_loss["compute"].health is Health.UNKNOWN
    assert after_loss["compute"].reason == "not run: the worker died during copy"

    # The hung probe was killed at its deadline (its worker reaped), and preflight returned then.
    hung = next(p for p in device[1].probes if p.check == "allocate").evidence
    assert probe_timeout <= hung["stalled_s"] < probe_timeout + 1.5
    assert hung["reaped"] is True
    assert elapsed < max(d.duration_s or 0.0 for d in report.devices) + 5.0

    assert report.collective.ok is None
    assert [e.device for e in Quarantine(tmp_path / "quarantine.json").entries("sim")] == [0, 1, 2, 3, 4]


def test_qwen36_with_device_3_lost_is_placed_tp2_on_devices_0_and_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = write_profile(tmp_path, sim={"devices": 4, "faults": [{"device": 3, "fault": "device-lost"}]})
    code, report = run_json(capsys, ["preflight", "--profile", str(profile), "--json"])

    assert code == 0
    assert report["placement"]["devices"] == [0, 1]
    assert report["placement"]["tensor_parallel"] == 2  # 3 healthy devices, but never TP3
    assert report["placement"]["valid_sizes"] == [1, 2]
    assert [(d["index"], d["health"], d["failure"]) for d in report["devices"]] == [
        (0, "healthy", None),
        (1, "healthy", None),
        (2, "healthy", None),
        (3, "unhealthy", "device-lost"),
    ]
    collective = report["collective"]
    assert (collective["backend"], collective["devices"], collective["ok"]) == ("gloo", [0, 1, 2], True)
    assert collective["busbw_gbps"] > collective["min_busbw_gbps"]
    assert [e["device"] for e in report["quarantine"]["entries"]] == [3]
    for d in report["devices"]:
        assert d["duration_s"] > 0 and {p["check"] for p in d["probes"]} >= {"enumerate", "allocate", "copy", "compute"}


def test_quarantine_persists_across_runs_until_cleared_by_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = write_profile(tmp_path, devices=[3], sim={"devices": 4, "faults": [{"device": 3, "fault": "device-lost"}]})
    code, first = run_json(capsys, ["preflight", "--profile", str(lost), "--json"])
    assert code == 3  # the one device the profile allows is lost: nothing to place on
    assert first["devices"][0]["failure"] == "device-lost"

    # The fault is gone (say, after a reboot), but the device stays out until an operator clears it.
    healed = write_profile(tmp_path, devices=[3], sim={"devices": 4})
    code, second = run_json(capsys, ["preflight", "--profile", str(healed), "--json"])
    assert code == 3
    (device,) = second["devices"]
    assert (device["quarantined"], device["probed"], device["health"]) == (True, False, "unhealthy")
    assert device["reason"].startswith("quarantined since ")
    assert device["reason"].endswith("clear with `warden preflight --clear 3`")
    assert second["placement"]["reason"].startswith("no tensor-parallel size fits 0 usable devices")

    code, cleared = run_json(capsys, ["preflight", "--profile", str(healed), "--clear", "3", "--json"])
    assert code == 0 and [e["device"] for e in cleared["cleared"]] == [3]

    code, third = run_json(capsys, ["preflight", "--profile", str(healed), "--json"])
    assert code == 0
    assert third["devices"][0]["health"] == "healthy"
    assert (third["placement"]["devices"], third["placement"]["tensor_parallel"]) == ([3], 1)
    assert third["quarantine"]["entries"] == []


def test_a_hanging_rank_in_the_collective_is_named_by_bisection(tmp_path: Path, qwen36: ModelShape) -> None:
    options = PreflightOptions(
        platform="sim",
        sim_devices=3,
        faults=(Fault(2, "hang", "collective"),),
        model_shape=qwen36,
        timeouts=Timeouts(startup_s=120, probe_s=20, collective_s=4),
        quarantine_file=tmp_path / "quarantine.json",
    )
    report = run_preflight(options)
    collective = report.collective
    assert collective.ok is False and collective.run is not None and collective.run.failure == "hang"
    assert "gave no result within 4 s and were killed" in collective.run.reason
    # The pair (0, 1) passes; the odd device out then meets a known-good device and hangs again.
    assert collective.bisection is not None and collective.bisection.bad == (2,)
    assert [(s.devices, s.ok) for s in collective.bisection.steps] == [((0, 1), True), ((0, 2), False)]
    assert collective.reason.endswith("bisection named 1 bad device: 2")
    device = {d.index: d for d in report.devices}
    assert device[2].failure == "hang" and device[2].quarantined
    assert device[2].reason.startswith("named by bisection: failed with known-good device 0: all-reduce across ")
    assert device[0].health is Health.HEALTHY and device[1].health is Health.HEALTHY
    assert (report.placement.devices, report.placement.tensor_parallel) == ((0, 1), 2)


def test_a_corrupting_rank_and_a_slow_link_are_both_named_by_bisection(tmp_path: Path, qwen36: ModelShape) -> None:
    options = PreflightOptions(
        platform="sim",
        sim_devices=4,
        faults=(Fault(1, "wrong-result", "collective"), Fault(2, "slow-link")),
        model_shape=qwen36,
        timeouts=Timeouts(startup_s=120, probe_s=20, collective_s=30),
        quarantine_file=tmp_path / "quarantine.json",
    )
    report = run_preflight(options)
    collective = report.collective
    assert collective.ok is False and collective.bisection is not None
    # Both first-round pairs fail, so a second pairing finds the good devices 0 and 3 first.
    assert [s.devices for s in collective.bisection.steps] == [(0, 1), (2, 3), (0, 3), (1, 2), (1, 3), (0, 2)]
    assert collective.bisection.bad == (1, 2)
    device = {d.index: d for d in report.devices}
    assert (device[1].failure, device[2].failure) == ("wrong-result", "slow-link")
    assert "returned wrong sums" in device[1].reason
    assert "is slow: bus bandwidth" in device[2].reason and "below the floor of 0.05 GB/s" in device[2].reason
    assert (report.placement.devices, report.placement.tensor_parallel) == ((0, 3), 2)


def test_the_cpu_platform_standalone_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = standalone_main(["--platform", "cpu", "--no-quarantine", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [(d["index"], d["health"]) for d in report["devices"]] == [(0, "healthy")]
    assert report["collective"]["ok"] is None
    assert report["placement"] == {
        "ok": True,
        "devices": [0],
        "tensor_parallel": None,
        "reason": "1 usable (no model to size for)",
        "valid_sizes": None,
    }
