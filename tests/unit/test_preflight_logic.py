"""Preflight logic without processes: bisection, placement, quarantine, bus bandwidth, health
summaries, health counters (canned tool output), fault plans, reports and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from preflight.backends import CudaBackend, parse_xpu_discovery
from preflight.bisection import bisect, round_robin
from preflight.collective import bus_bandwidth_gbps
from preflight.commands import CommandResult
from preflight.counters import (
    Counters,
    Holder,
    cuda_counters,
    judge,
    parse_xids,
    parse_xpu_health,
    xpu_counters,
)
from preflight.failures import Failure, classify_text
from preflight.faults import Fault, Injector
from preflight.health import Action, CheckResult, Health, worst
from preflight.metrics import PreflightMetrics
from preflight.model_shape import read_model_shape
from preflight.placement import PlacementRequest, place
from preflight.profiles import collective_env, options_for_profile, quarantine_path_for
from preflight.quarantine import Quarantine, QuarantineError
from preflight.report import (
    CollectiveReport,
    DeviceReport,
    GroupOutcome,
    PlacementReport,
    PreflightReport,
    summarize,
)
from service.models.qwen36 import write_qwen36_config
from service.profile import parse_profile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen_shape(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return read_model_shape(write_qwen36_config(tmp_path_factory.mktemp("qwen36")))


# --- bisection ----------------------------------------------------------------------------------


class FakeGroups:
    """A group passes unless it contains a bad device; records what was tested, round by round."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad
        self.rounds: list[list[tuple[int, ...]]] = []

    def __call__(self, groups: Sequence[tuple[int, ...]]) -> list[GroupOutcome]:
        self.rounds.append(list(groups))
        return [
            GroupOutcome(tuple(g), not (set(g) & self.bad), "ok" if not set(g) & self.bad else "hung", None)
            for g in groups
        ]


@pytest.mark.parametrize(
    ("devices", "bad"),
    [
        ([0, 1, 2, 3], {3}),
        ([0, 1, 2, 3], {0}),
        ([0, 1, 2, 3], {1, 2}),  # every first-round pair fails: a second pairing finds a good device
        ([0, 1, 2, 3, 4], {4}),  # the odd device out is tested against a known-good one
        ([0, 1, 2, 3, 4, 5, 6, 7], {2, 5}),
        ([0, 1, 2], set()),
    ],
)
def test_bisection_names_exactly_the_bad_devices(devices: list[int], bad: set[int]) -> None:
    fake = FakeGroups(bad)
    report = bisect(devices, fake)
    assert set(report.bad) == bad
    assert report.unresolved == ()
    assert set(report.cleared) | {d for s in report.steps if s.ok for d in s.devices} >= set(devices) - bad
    for group in (g for round_ in fake.rounds for g in round_):
        assert len(group) == 2


def test_bisection_first_round_is_disjoint_pairs_then_each_suspect_meets_a_good_device() -> None:
    fake = FakeGroups({3})
    report = bisect([0, 1, 2, 3], fake)
    assert fake.rounds == [[(0, 1), (2, 3)], [(0, 2), (1, 3)]]
    assert report.bad == (3,) and report.cleared == (2,)
    assert "failed with known-good device 1" in report.reasons[3]


def test_bisection_with_no_good_device_leaves_the_suspects_unresolved() -> None:
    report = bisect([0, 1], FakeGroups({0, 1}))
    assert report.bad == () and set(report.unresolved) == {0, 1}


def test_round_robin_meets_every_pair_once() -> None:
    rounds = round_robin([0, 1, 2, 3, 4])
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == sorted({(a, b) for a in range(5) for b in range(a + 1, 5)})
    for r in rounds:
        flat = [d for p in r for d in p]
        assert len(flat) == len(set(flat))


# --- placement ----------------------------------------------------------------------------------


def test_qwen36_on_three_healthy_devices_places_tp2_on_the_first_two_never_tp3(qwen_shape) -> None:  # type: ignore[no-untyped-def]
    placement = place([0, 1, 2], qwen_shape, PlacementRequest(), {3: "unhealthy: device lost"})
    assert placement.ok
    assert (placement.devices, placement.tensor_parallel) == ((0, 1), 2)
    assert placement.valid_sizes == (1, 2)
    assert "device 3 (unhealthy: device lost)" in placement.reason


def test_placement_honours_explicit_devices_and_tensor_parallel(qwen_shape) -> None:  # type: ignore[no-untyped-def]
    pinned = place([0, 1, 2, 3], qwen_shape, PlacementRequest(devices=(2, 3, 0, 1)))
    assert pinned.devices == (2, 3, 0, 1) and pinned.tensor_parallel == 4
    tp2 = place([0, 1, 2, 3], qwen_shape, PlacementRequest(tensor_parallel=2))
    assert tp2.devices == (0, 1) and tp2.tensor_parallel == 2
    subset = place([0, 1, 3], qwen_shape, PlacementRequest(devices=(1, 2, 3)))
    assert subset.devices == (1, 3) and subset.tensor_parallel == 2


def test_placement_refuses_what_cannot_be_placed(qwen_shape) -> None:  # type: ignore[no-untyped-def]
    short = place([0, 1, 2], qwen_shape, PlacementRequest(tensor_parallel=4), {3: "unhealthy: hung"})
    assert not short.ok
    assert short.reason == (
        "tensor_parallel 4 needs 4 usable devices, found 3 (0, 1, 2); left out: device 3 (unhealthy: hung)"
    )
    invalid = place([0, 1, 2], qwen_shape, PlacementRequest(tensor_parallel=3))
    assert not invalid.ok and invalid.reason.startswith("tensor_parallel 3 cannot shard this model")
    nothing = place([], qwen_shape, PlacementRequest())
    assert not nothing.ok and nothing.reason == "no tensor-parallel size fits 0 usable devices (none)"
    unreadable = place([0], None, PlacementRequest(), model_problem="model.path: /x has no config.json")
    assert not unreadable.ok


# --- quarantine ---------------------------------------------------------------------------------


def test_quarantine_persists_keeps_the_first_reason_and_clears(tmp_path: Path) -> None:
    path = tmp_path / "state" / "quarantine.json"
    first = Quarantine(path, wall_clock=lambda: 1_780_000_000.0)
    entry = first.add("xpu", 3, "device lost during copy", "device-lost", "Arc B70")
    assert entry.since == "2026-05-28T20:26:40Z"
    first.add("xpu", 3, "hung again", "hang")  # already there: first reason and time stay
    first.add("sim", 3, "simulated", "hang")
    later = Quarantine(path)
    assert [(e.platform, e.device, e.reason) for e in later.entries("xpu")] == [("xpu", 3, "device lost during copy")]
    assert later.clear("xpu", 3)[0].failure == "device-lost"
    assert later.entries("xpu") == [] and len(later.entries()) == 1
    assert later.clear(None, None)[0].platform == "sim"
    assert json.loads(path.read_text())["devices"] == []


def test_an_unreadable_quarantine_file_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    path = tmp_path / "quarantine.json"
    path.write_text("{not json")
    with pytest.raises(QuarantineError, match=r"cannot be read"):
        Quarantine(path).entries()
    assert Quarantine(None).entries() == []  # disabled: nothing read


# --- bus bandwidth, health, failures, faults ---------------------------------------------------


def test_bus_bandwidth_is_nccl_tests_all_reduce_busbw() -> None:
    # 256 MB in 1 ms is 256 GB/s algbw; 8 ranks move 2*7/8 of it over the bus.
    assert bus_bandwidth_gbps(256_000_000, 0.001, 8) == pytest.approx(448.0)
    assert bus_bandwidth_gbps(256_000_000, 0.001, 2) == pytest.approx(256.0)
    assert bus_bandwidth_gbps(1, 0.0, 2) == 0.0


def test_device_health_needs_data_and_the_first_failure_wins() -> None:
    ok = CheckResult("allocate", Health.HEALTHY, "fine", duration_s=0.25)
    no_counters = CheckResult("counters", Health.UNKNOWN, "a simulated device has no health counters")
    assert summarize([ok, no_counters]) == (
        Health.HEALTHY,
        "1 of 1 checks passed in 0.25 s; counters: a simulated device has no health counters",
        Action.NONE,
        None,
    )
    assert summarize([no_counters])[0] is Health.UNKNOWN  # no functional check: not healthy
    failure = {"failure": "device-lost"}
    lost = CheckResult("copy", Health.UNHEALTHY, "device lost", Action.RESET_DEVICE, evidence=failure)
    assert summarize([ok, lost, CheckResult("compute", Health.UNHEALTHY, "later")])[1:] == (
        "device lost",
        Action.RESET_DEVICE,
        "device-lost",
    )
    assert worst([]) is Health.UNKNOWN
    assert worst([Health.HEALTHY, Health.UNKNOWN]) is Health.UNKNOWN


def test_runtime_messages_name_their_failure() -> None:
    assert classify_text("UR_RESULT_ERROR_DEVICE_LOST") is Failure.DEVICE_LOST
    assert classify_text("RuntimeError: CUDA error: GPU is lost") is Failure.DEVICE_LOST
    assert classify_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") is Failure.ALLOC_FAIL
    assert classify_text("RuntimeError: something else") is None


def test_fault_plans_parse_and_strike_where_documented() -> None:
    assert Fault.parse("3:device-lost") == Fault(3, "device-lost", "auto")
    assert Fault.parse("1:hang:collective").encode() == "1:hang:collective"
    for bad in ("x:hang", "1:melt", "1:hang:later", "1:slow-link:probe"):
        with pytest.raises(ValueError):
            Fault.parse(bad)
    plan = [Fault(1, "wrong-result"), Fault(2, "slow-link"), Fault(3, "hang", "collective")]
    assert Injector(plan, 1, "probe").kinds == {"wrong-result"}
    assert Injector(plan, 1, "collective").kinds == {"wrong-result"}
    assert Injector(plan, 2, "probe").kinds == set() and Injector(plan, 2, "collective").link_delay(25_000_000) == 1.0
    assert not Injector(plan, 3, "probe") and Injector(plan, 3, "collective")
    assert not Injector(plan, 0, "collective")


# --- health counters ----------------------------------------------------------------------------


def canned(outputs: dict[str, CommandResult]):  # type: ignore[no-untyped-def]
    """A command runner that answers by the first argv element that names a query."""

    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        for key, result in outputs.items():
            if any(key in part for part in argv):
                return result
        return CommandResult(tuple(argv), None, "", "", 0.0, error="No such file or directory")

    return runner


def ok(stdout: str) -> CommandResult:
    return CommandResult(("tool",), 0, stdout, "", 0.01)


def test_counters_without_nvml_or_nvidia_smi_are_unknown_not_healthy() -> None:
    def no_nvml() -> None:
        raise ImportError("No module named 'pynvml'")

    counters = cuda_counters(
        0, uuid=None, pci_bus_id=None, runner=canned({}), nvml_loader=no_nvml, kernel_log=lambda: None
    )
    result = judge(counters)
    assert result.health is Health.UNKNOWN
    assert "NVML unavailable (nvidia-ml-py is not installed)" in result.reason
    assert "nvidia-smi could not run" in result.reason


def test_counters_from_nvidia_smi_with_an_other_process_and_a_fatal_xid() -> None:
    runner = canned(
        {
            "--query-gpu=": ok("0, No, No, No, 41\n"),
            "--query-compute-apps": ok("GPU-aaa, 4242, 30720, VLLM::Worker_TP0\nGPU-bbb, 7, 10, other\n"),
        }
    )
    log = ["NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.", "unrelated line"]

    def no_nvml() -> None:
        raise ImportError

    counters = cuda_counters(
        0, uuid="GPU-aaa", pci_bus_id="00000000:18:00.0", runner=runner, nvml_loader=no_nvml, kernel_log=lambda: log
    )
    assert counters.xids == [79]
    assert counters.holders == [Holder(4242, None, 30720 << 20, "VLLM::Worker_TP0")]
    result = judge(counters)
    assert result.health is Health.DEGRADED
    assert result.reason == (
        "1 fatal Xid in the kernel log since boot (79); 1 other process holds the device (30.0 GiB; pids 4242)"
    )


def test_counter_judgement_healthy_unhealthy_and_own_pid() -> None:
    healthy = Counters("NVML", ecc_uncorrected=0, temperature_c=40, holders=[Holder(99, 0)])
    result = judge(healthy, own_pids=[99])
    assert result.health is Health.HEALTHY
    assert result.reason == "3 counters read from NVML, none out of range; 5 of 8 counters unavailable"
    broken = judge(Counters("NVML", remap_failure=True))
    assert broken.health is Health.UNHEALTHY and broken.action is Action.INSPECT_HARDWARE


def test_xid_lines_are_matched_to_the_right_device() -> None:
    lines = ["NVRM: Xid (PCI:0000:18:00): 48, DBE", "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception"]
    assert parse_xids(lines, "00000000:18:00.0") == [48]
    assert parse_xids(lines, None) == [48, 13]


def test_xpu_smi_outputs_parse() -> None:
    health = {"device_id": 0, "core_temperature": {"status": "OK"}, "memory": {"status": "Critical"}}
    assert parse_xpu_health(json.dumps(health)) == "critical"
    assert parse_xpu_health("not json") is None
    listing = {"device_list": [{"device_id": 1, "device_name": "Intel(R) Arc(TM) Pro B70"}, {"device_id": 0}]}
    assert [d.index for d in parse_xpu_discovery(json.dumps(listing))] == [0, 1]


def test_xpu_counters_stop_at_a_hanging_xpu_smi_and_say_so() -> None:
    calls: list[list[str]] = []

    def hangs(argv: Sequence[str], timeout_s: float) -> CommandResult:
        calls.append(list(argv))
        return CommandResult(tuple(argv), None, "", "", timeout_s, timed_out=True)

    result = judge(xpu_counters(3, runner=hangs))
    assert calls == [["xpu-smi", "health", "-d", "3", "-j"]]  # no second call into a hanging tool
    assert result.health is Health.UNKNOWN
    assert "xpu-smi did not answer within 10 s and was killed" in result.reason
    healthy = canned({"health": ok(json.dumps({"memory": {"status": "OK"}})), "ps": ok(json.dumps([]))})
    assert judge(xpu_counters(0, runner=healthy)).health is Health.HEALTHY


def test_cuda_discovery_reads_nvidia_smi() -> None:
    backend = CudaBackend(runner=canned({"--query-gpu=index": ok("0, NVIDIA H200, GPU-aaa, 00000000:18:00.0\n")}))
    found = backend.discover()
    assert found.source == "nvidia-smi"
    assert [(d.index, d.name, d.uuid) for d in found.devices] == [(0, "NVIDIA H200", "GPU-aaa")]
    assert backend.device_environment([0, 1]) == {"CUDA_VISIBLE_DEVICES": "0,1"}


# --- report, metrics, profile adapter -----------------------------------------------------------


def _report(placed: bool, healths: Sequence[Health], has_model: bool = True) -> PreflightReport:
    devices = tuple(
        DeviceReport(i, f"sim{i}", h, "x", failure="device-lost" if h is Health.UNHEALTHY else None)
        for i, h in enumerate(healths)
    )
    return PreflightReport(
        platform="sim",
        level="quick",
        devices=devices,
        collective=CollectiveReport("gloo", (0, 1), True, Health.HEALTHY, "ok", busbw_gbps=1.5),
        placement=PlacementReport(placed, (0, 1) if placed else (), 2 if placed else None, "why"),
        discovery={},
        quarantine={"path": "q.json", "entries": [{"device": 2}]},
        duration_s=3.0,
        phases={"discovery": 0.0, "devices": 2.0, "collective": 1.0, "total": 3.0},
        started_at="2026-01-01T00:00:00Z",
        has_model=has_model,
    )


def test_exit_codes() -> None:
    assert _report(True, [Health.HEALTHY, Health.HEALTHY, Health.UNHEALTHY]).exit_code() == 0
    assert _report(False, [Health.UNHEALTHY]).exit_code() == 3
    assert _report(True, [Health.HEALTHY, Health.HEALTHY], has_model=False).exit_code() == 0
    assert _report(True, [Health.HEALTHY, Health.UNKNOWN], has_model=False).exit_code() == 3


def test_metrics_on_a_fresh_registry() -> None:
    registry = CollectorRegistry()
    metrics = PreflightMetrics(registry)
    assert registry.get_sample_value("warden_preflight_runs_total", {"level": "full", "outcome": "refused"}) == 0
    metrics.observe(_report(True, [Health.HEALTHY, Health.HEALTHY, Health.UNHEALTHY]))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("warden_preflight_device_health", device="2", health="unhealthy") == 1
    assert value("warden_preflight_device_health", device="2", health="healthy") == 0
    assert value("warden_preflight_device_quarantined", device="2") == 1
    assert value("warden_preflight_device_quarantined", device="0") == 0
    assert value("warden_preflight_quarantined_devices") == 1
    assert value("warden_preflight_collective_busbw_bytes_per_second") == 1.5e9
    assert value("warden_preflight_device_failures_total", failure="device-lost") == 1
    assert value("warden_preflight_duration_seconds_count", level="quick", phase="total") == 1
    assert value("warden_preflight_runs_total", level="quick", outcome="placed") == 1
    text = generate_latest(registry).decode()
    assert "# TYPE warden_preflight_duration_seconds histogram" in text


def test_profile_adapter_options_and_quarantine_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_qwen36_config(tmp_path / "model")
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path / "state-root"))
    data = {
        "name": "p",
        "model": {"path": "model"},
        "platform": "sim",
        "tensor_parallel": 2,
        "sim": {"devices": 4, "faults": [{"device": 3, "fault": "hang", "during": "collective"}]},
        "engine": {"env": {"NCCL_P2P_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/x"}},
        "preflight": {"probe_timeout_s": 5, "min_busbw_gbps": 100},
    }
    loaded = parse_profile(data, tmp_path / "p.yaml")
    assert quarantine_path_for(loaded) == tmp_path / "state-root" / "quarantine.json"
    options = options_for_profile(loaded, level="full")
    assert options.faults == (Fault(3, "hang", "collective"),)
    assert options.tensor_parallel == 2 and options.timeouts.probe_s == 5 and options.min_busbw_gbps == 100
    assert options.model_shape is not None and options.model_shape.num_attention_heads == 16
    assert dict(options.extra_env) == {"NCCL_P2P_DISABLE": "1"}
    assert collective_env({"CCL_ALLREDUCE": "ring", "ZE_AFFINITY_MASK": "0"}) == {"CCL_ALLREDUCE": "ring"}
    pinned = parse_profile({**data, "preflight": {"quarantine_file": "q/q.json"}}, tmp_path / "p.yaml")
    assert quarantine_path_for(pinned) == tmp_path / "q" / "q.json"
    state = parse_profile({**data, "supervisor": {"state_dir": "st"}}, tmp_path / "p.yaml")
    assert quarantine_path_for(state) == tmp_path / "st" / "quarantine.json"
    assert options_for_profile(loaded, platform="cpu").faults == ()


def test_the_worker_and_the_standalone_command_need_no_pydantic_yaml_or_prometheus() -> None:
    # What runs on a bare torch host: the probe worker and `python -m preflight` (without --profile).
    code = (
        "import sys\n"
        "for name in ('pydantic', 'yaml', 'prometheus_client', 'torch'):\n"
        "    sys.modules[name] = None\n"
        "import preflight.probe, preflight.cli, preflight.orchestrate, preflight.bench\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)
