"""Every guard rule: a refusing (failing) case and a passing case, on facts built without vLLM.

Facts are built directly (engine arguments given in their normalized form), so these tests need
neither vLLM nor a model: model folders are config.json + weight index files written here.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from service.guard import ALL_RULES, RULES_BY_ID, EngineArgsFacts, GuardFacts, evaluate
from service.guard.evaluate import WAIVER_RULE_ID
from service.guard.facts import ModelFacts, read_model_facts
from service.guard.rules import Rule, Verdict
from service.models.qwen36 import write_qwen36_config
from service.profile import CPU_VLLM_FIXES

SAFE_XPU_ARGS: dict[str, Any] = {
    "compilation_config": {"cudagraph_mode": "PIECEWISE"},
    "async_scheduling": False,
    "gpu_memory_utilization": 0.9,
}
CPU_ARGS: dict[str, Any] = {"dtype": "bfloat16", "enforce_eager": True, "kv_cache_memory_bytes": 64 << 20}
CONTRACT_IDS = {
    "cudagraph-mode-unset",
    "cudagraph-none",
    "fused-prologue-capture",
    "async-scheduling-piecewise",
    "spec-gdn-without-replayssm",
    "replayssm-ring-too-short",
    "replayssm-ring-too-long",
    "replayssm-tree-spec",
    "replayssm-not-hybrid",
    "mtp-weights-missing",
    "dflash-method-mismatch",
    "spec-capture-size-unset",
    "tp-divisibility",
    "shared-expert-fused-act-quant-capture",
    "shared-expert-boundary-out-capture",
    "shared-experts-stream-without-no-empty-cache",
    "shared-experts-stream",
    "grouped-gemm-m8-n-gt-k",
    "ngram-spec-general-prompts",
    "gpu-memory-utilization-range",
    "unhealthy-device-selected",
}


def _write_model(folder: Path, config: dict[str, Any], tensors: list[str] | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        index = {"metadata": {}, "weight_map": dict.fromkeys(tensors, "model.safetensors")}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def tiny_config(head_dim: int = 64, dtype: str = "bfloat16") -> dict[str, Any]:
    """The shape `warden model tiny` builds: 3 GDN layers + 1 attention layer, 4 experts."""
    return {
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
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "num_experts": 4,
        "mtp_num_hidden_layers": 1,
        "dtype": dtype,
    }


def dense_config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "dtype": "bfloat16",
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    mtp_dense = ["mtp.fc.weight", "mtp.layers.0.mlp.gate_proj.weight", "model.embed_tokens.weight"]
    return {
        "qwen36": write_qwen36_config(root / "qwen36"),
        "qwen36-mtp": write_qwen36_config(root / "qwen36-mtp", mtp_weights=True),
        "qwen36-noindex": _write_model(
            root / "qwen36-noindex", json.loads((root / "qwen36/config.json").read_text()), None
        ),
        "mtp-dense-head": _write_model(root / "mtp-dense-head", tiny_config(), mtp_dense),
        "dense": _write_model(root / "dense", dense_config(), ["model.embed_tokens.weight"]),
        "tiny": _write_model(root / "tiny", tiny_config(), ["model.embed_tokens.weight"]),
        "tiny32": _write_model(root / "tiny32", tiny_config(head_dim=32), ["model.embed_tokens.weight"]),
        "tiny-fp32": _write_model(root / "tiny-fp32", tiny_config(dtype="float32"), ["model.embed_tokens.weight"]),
        "dflash": _write_model(
            root / "Qwen3.6-35B-A3B-DFlash",
            {**dense_config(), "architectures": ["DFlashDraftModel"], "dflash_config": {"mask_token_id": 1}},
            ["fc.weight"],
        ),
        "missing": root / "does-not-exist",
    }


@dataclass(frozen=True)
class Setup:
    """The inputs of one GuardFacts; every field has a default that passes every rule on xpu."""

    platform: str = "xpu"
    model: str = "qwen36"
    args: dict[str, Any] = field(default_factory=lambda: dict(SAFE_XPU_ARGS))
    args_status: str = "parsed"
    raw: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    profile_env: dict[str, str] = field(default_factory=dict)
    speculative: dict[str, Any] | None = None
    draft: str | None = None
    replayssm: bool = False
    ring_len: int = 16
    devices: tuple[int, ...] | None = (0, 1, 2, 3)
    tp: int | None = 4
    quarantined: dict[int, str] | None = field(default_factory=dict)
    canary: str = "The supervisor checks that the engine generates real tokens."
    waivers: dict[str, str] = field(default_factory=dict)
    vllm_fixes: tuple[str, ...] = ()


def cpu(**kw: Any) -> Setup:
    defaults: dict[str, Any] = {"platform": "cpu", "model": "tiny", "args": dict(CPU_ARGS), "devices": None, "tp": 1,
                                "vllm_fixes": CPU_VLLM_FIXES}  # fmt: skip
    return Setup(**{**defaults, **kw})


def xpu(**kw: Any) -> Setup:
    return Setup(**kw)


@functools.cache
def model_facts(path: Path, reference: str | None = None) -> ModelFacts:
    """Reading the real-size Qwen3.6 index takes ~50 ms; the folders never change within a run."""
    return read_model_facts(path, reference)


def build(setup: Setup, models: dict[str, Path]) -> GuardFacts:
    draft = None
    if setup.draft is not None:
        path = models.get(setup.draft, Path(setup.draft))
        draft = model_facts(path, str(path) if setup.draft in models else setup.draft)
    return GuardFacts(
        profile_name="t",
        platform=setup.platform,  # type: ignore[arg-type]
        model=model_facts(models[setup.model]),
        engine_args=EngineArgsFacts(
            status=setup.args_status,  # type: ignore[arg-type]
            raw=setup.raw,
            values=setup.args if setup.args_status == "parsed" else {},
            error=None if setup.args_status == "parsed" else "test says so",
        ),
        engine_env={**setup.env, **setup.profile_env},
        profile_env=setup.profile_env,
        speculative=setup.speculative,
        draft=draft,
        replayssm_enabled=setup.replayssm,
        replayssm_ring_len=setup.ring_len,
        devices=setup.devices,
        tensor_parallel=setup.tp,
        quarantined=setup.quarantined,
        canary_prompt=setup.canary,
        waivers=setup.waivers,
        vllm_fixes=setup.vllm_fixes,
    )


MTP1 = {"method": "mtp", "num_speculative_tokens": 1}
NGRAM3 = {"method": "ngram", "num_speculative_tokens": 3}
NO_ASYNC_CG = {
    **SAFE_XPU_ARGS,
    "compilation_config": {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 128},
}
SPEC_OK = {"model": "qwen36-mtp", "speculative": MTP1, "replayssm": True, "args": NO_ASYNC_CG}

# rule id -> (failing setups, passing setups)
CASES: dict[str, tuple[list[Setup], list[Setup]]] = {
    "model-unreadable": ([xpu(model="missing")], [xpu()]),
    "engine-args-invalid": ([xpu(args_status="invalid")], [xpu()]),
    "engine-args-owned": (
        [xpu(args={**SAFE_XPU_ARGS, "tensor_parallel_size": 2}), xpu(raw=("--port", "8001"))],
        [xpu(raw=("--gpu-memory-utilization=0.9",))],
    ),
    "gpu-memory-utilization-range": (
        [
            xpu(args={**SAFE_XPU_ARGS, "gpu_memory_utilization": 1.5}),
            cpu(args={**CPU_ARGS, "gpu_memory_utilization": 0.0}),
        ],
        [xpu(), cpu()],
    ),
    "gpu-memory-utilization-unset": (
        [xpu(args={"compilation_config": {"cudagraph_mode": "PIECEWISE"}, "async_scheduling": False})],
        [xpu()],
    ),
    "cudagraph-mode-unset": (
        [
            xpu(args={"async_scheduling": False}),
            xpu(args={"optimization_level": "O3"}),
            Setup(platform="cuda", args={}),
        ],
        [xpu(), Setup(platform="cuda", args={"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}})],
    ),
    "cudagraph-none": (
        [
            xpu(args={**SAFE_XPU_ARGS, "enforce_eager": True}),
            xpu(args={"compilation_config": {"cudagraph_mode": "NONE"}}),
            Setup(platform="cuda", args={"optimization_level": "O0"}),
        ],
        [xpu(), cpu()],
    ),
    "fused-prologue-capture": (
        [xpu(env={"VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET": "1"})],
        [xpu(env={"VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET": "0"}), xpu()],
    ),
    "async-scheduling-piecewise": (
        [
            xpu(args={"compilation_config": {"cudagraph_mode": "PIECEWISE"}}),
            xpu(args={**SAFE_XPU_ARGS, "async_scheduling": True}),
        ],
        [xpu(), xpu(model="dense", args={"compilation_config": {"cudagraph_mode": "PIECEWISE"}})],
    ),
    "shared-expert-fused-act-quant-capture": (
        [xpu(env={"VLLM_XPU_SHARED_EXPERT_FUSED_ACT_QUANT": "1"})],
        [xpu()],
    ),
    "shared-expert-boundary-out-capture": (
        [xpu(env={"VLLM_XPU_SHARED_EXPERT_BOUNDARY_OUT": "1", "VLLM_XPU_SHARED_EXPERT_FUSED_GATE_MUL": "1"})],
        [xpu(env={"VLLM_XPU_SHARED_EXPERT_BOUNDARY_OUT": "false"})],
    ),
    "shared-experts-stream-without-no-empty-cache": (
        [xpu(env={"VLLM_XPU_SHARED_EXPERTS_STREAM": "1"})],
        [xpu(env={"VLLM_XPU_SHARED_EXPERTS_STREAM": "1", "VLLM_XPU_GRAPH_NO_EMPTY_CACHE": "1"}), xpu()],
    ),
    "shared-experts-stream": ([xpu(env={"VLLM_XPU_SHARED_EXPERTS_STREAM": "1"})], [xpu()]),
    "grouped-gemm-m8-n-gt-k": (
        [xpu(env={"VLLM_XPU_W8A8_GROUPED_GEMM_N_GT_K_POLICY": "m8"})],
        [xpu(env={"VLLM_XPU_W8A8_GROUPED_GEMM_N_GT_K_POLICY": "default"}), xpu()],
    ),
    "grouped-gemm-m8-policy": ([xpu(env={"VLLM_XPU_W8A8_GROUPED_GEMM_POLICY": "M8"})], [xpu()]),
    "full-layerlet-inactive-under-capture": ([xpu(env={"VLLM_XPU_MOE_W8A8_FULL_LAYERLET": "1"})], [xpu()]),
    "diagnostic-env-set": (
        [
            xpu(env={"VLLM_XPU_MOE_W8A8_FULL_LAYERLET_TRACE_FILE": "trace.jsonl"}),
            xpu(env={"VLLM_XPU_EAGLE_DATA_DUMP_DIR": "d"}),
        ],
        [xpu()],
    ),
    "spec-gdn-without-replayssm": (
        [xpu(**{**SPEC_OK, "replayssm": False}), Setup(platform="cuda", **{**SPEC_OK, "replayssm": False})],
        [xpu(**SPEC_OK), xpu(model="dense", speculative={"method": "ngram", "num_speculative_tokens": 3})],
    ),
    "mtp-weights-missing": (
        [xpu(**{**SPEC_OK, "model": "qwen36"}), xpu(**{**SPEC_OK, "model": "qwen36", "draft": "qwen36"})],
        [xpu(**SPEC_OK), xpu(**{**SPEC_OK, "model": "qwen36", "draft": "qwen36-mtp"})],
    ),
    "dflash-method-mismatch": (
        [
            xpu(**{**SPEC_OK, "draft": "dflash"}),
            xpu(**{**SPEC_OK, "speculative": {"method": "dflash", "num_speculative_tokens": 1}, "draft": "dense"}),
            xpu(**{**SPEC_OK, "speculative": {"method": "dflash", "num_speculative_tokens": 1}}),
        ],
        [
            xpu(**{**SPEC_OK, "speculative": {"method": "dflash", "num_speculative_tokens": 1}, "draft": "dflash"}),
            xpu(**SPEC_OK),
        ],
    ),
    "spec-capture-size-unset": ([xpu(**{**SPEC_OK, "args": SAFE_XPU_ARGS})], [xpu(**SPEC_OK), xpu()]),
    "ngram-spec-general-prompts": (
        [xpu(**{**SPEC_OK, "speculative": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5}})],
        [xpu(**SPEC_OK)],
    ),
    "mtp-draft-full-moe": ([xpu(**SPEC_OK)], [xpu(**{**SPEC_OK, "model": "mtp-dense-head"})]),
    "replayssm-ring-too-short": (
        [xpu(**{**SPEC_OK, "ring_len": 2}), xpu(**{**SPEC_OK, "ring_len": 12}), xpu(replayssm=True, ring_len=1)],
        [xpu(**SPEC_OK), xpu(**{**SPEC_OK, "ring_len": 4}), xpu(replayssm=True, ring_len=2)],
    ),
    "replayssm-ring-too-long": (
        [xpu(**{**SPEC_OK, "ring_len": 256})],
        [xpu(**{**SPEC_OK, "ring_len": 128}), xpu(replayssm=True, ring_len=256)],  # decode takes any ring
    ),
    "replayssm-tree-spec": (
        [
            xpu(**{**SPEC_OK, "speculative": {**MTP1, "speculative_token_tree": "[(0,), (1,), (0, 0)]"}}),
            xpu(
                **{
                    **SPEC_OK,
                    "speculative": {"method": "eagle", "num_speculative_tokens": 3, "speculative_eagle_topk": 4},
                }
            ),
        ],
        [xpu(**SPEC_OK), xpu(**{**SPEC_OK, "speculative": {**MTP1, "speculative_token_tree": "[(0,), (0, 0)]"}})],
    ),
    "replayssm-not-hybrid": ([xpu(model="dense", replayssm=True)], [xpu(replayssm=True), xpu(model="dense")]),
    "replayssm-env-in-engine-env": ([xpu(profile_env={"WARDEN_GDN_REPLAYSSM": "1"})], [xpu()]),
    "replayssm-prefix-caching": (
        [cpu(replayssm=True), cpu(replayssm=True, args={**CPU_ARGS, "enable_prefix_caching": True})],
        [cpu(replayssm=True, args={**CPU_ARGS, "enable_prefix_caching": False}), cpu()],
    ),
    "replayssm-layer-swap-not-built": (
        [xpu(**SPEC_OK), Setup(platform="cuda", **SPEC_OK), Setup(platform="sim", **SPEC_OK)],
        [xpu(**{**SPEC_OK, "replayssm": False}), cpu(speculative=MTP1, replayssm=True)],
    ),
    "tp-divisibility": ([xpu(tp=3, devices=(0, 1, 2))], [xpu(), xpu(tp=2, devices=(0, 1)), xpu(tp=None)]),
    "tp-device-count": ([xpu(tp=4, devices=(0, 1))], [xpu(), xpu(devices=None)]),
    "unhealthy-device-selected": (
        [xpu(quarantined={3: "UR_RESULT_ERROR_DEVICE_LOST in the last run"})],
        [xpu(quarantined={5: "gone"}), xpu(tp=2, devices=(0, 1), quarantined={3: "wedged"}), xpu(devices=None)],
    ),
    "device-mask-in-engine-env": (
        [
            xpu(profile_env={"ZE_AFFINITY_MASK": "0,1"}),
            Setup(platform="cuda", profile_env={"CUDA_VISIBLE_DEVICES": "1"}),
        ],
        [xpu(env={"ZE_AFFINITY_MASK": "0,1"})],
    ),
    "cpu-kv-cache-size-unset": (
        [cpu(args={"dtype": "bfloat16"})],
        [cpu(), cpu(args={"dtype": "bfloat16"}, env={"VLLM_CPU_KVCACHE_SPACE": "1"})],
    ),
    "cpu-spec-prefix-caching": (
        [cpu(speculative=MTP1), cpu(speculative=MTP1, args={**CPU_ARGS, "enable_prefix_caching": True})],
        [cpu(speculative=MTP1, args={**CPU_ARGS, "enable_prefix_caching": False}), cpu()],
    ),
    "cpu-ngram-hybrid": (
        [cpu(speculative=NGRAM3, vllm_fixes=()), cpu(speculative=NGRAM3, vllm_fixes=("cpu-gdn-one-token-rows",))],
        [cpu(model="dense", speculative=NGRAM3, vllm_fixes=()), cpu(speculative=MTP1), cpu(speculative=NGRAM3)],
    ),
    "cpu-spec-structured-outputs": (
        [cpu(speculative=MTP1, args={**CPU_ARGS, "enable_prefix_caching": False}, vllm_fixes=())],
        [
            cpu(),
            cpu(model="dense", speculative=MTP1, args={**CPU_ARGS, "enable_prefix_caching": False}, vllm_fixes=()),
            cpu(speculative=MTP1, args={**CPU_ARGS, "enable_prefix_caching": False}),
        ],
    ),
    "cpu-head-dim": ([cpu(model="tiny32")], [cpu(), cpu(model="dense")]),
    "cpu-dtype-not-bf16": (
        [cpu(args={**CPU_ARGS, "dtype": "float32"}), cpu(model="tiny-fp32", args={"kv_cache_memory_bytes": 1 << 26})],
        [cpu(), cpu(args={"kv_cache_memory_bytes": 1 << 26})],
    ),
    "cpu-canary-single-token": (
        [cpu(canary="Hello!!!!", vllm_fixes=())],
        [cpu(), cpu(canary="Hello!!!!"), cpu(model="dense", canary="Hello!!!!", vllm_fixes=())],
    ),
    "cpu-gdn-one-token-rows": (
        [cpu(vllm_fixes=()), cpu(vllm_fixes=("cpu-gdn-spec-conv-history",))],
        [cpu(), cpu(model="dense", vllm_fixes=())],
    ),
    "cpu-spec-conv-history": (
        [cpu(speculative=MTP1, vllm_fixes=()), cpu(speculative=MTP1, vllm_fixes=("cpu-gdn-one-token-rows",))],
        [cpu(speculative=MTP1), cpu(vllm_fixes=()), cpu(model="dense", speculative=MTP1, vllm_fixes=())],
    ),
    WAIVER_RULE_ID: ([xpu(waivers={"cudagraph-nones": "typo"})], [xpu(waivers={"cudagraph-none": "eager bisection"})]),
}


def _cases(expect: str) -> list[Any]:
    out = []
    for rule_id, (failing, passing) in CASES.items():
        for i, setup in enumerate(failing if expect == "fail" else passing):
            out.append(pytest.param(rule_id, setup, id=f"{rule_id}-{expect}{i}"))
    return out


@pytest.mark.parametrize(("rule_id", "setup"), _cases("fail"))
def test_rule_fails(models: dict[str, Path], rule_id: str, setup: Setup) -> None:
    report = evaluate(build(setup, models))
    finding = report.finding(rule_id)
    assert finding.status == "fail", finding
    assert finding.severity in ("refuse", "warn")
    assert finding.reason and finding.remedy and finding.evidence
    assert report.refused == any(f.refuses for f in report.findings)
    if finding.severity == "refuse":
        assert report.refused
        assert finding in report.refusals


@pytest.mark.parametrize(("rule_id", "setup"), _cases("pass"))
def test_rule_passes(models: dict[str, Path], rule_id: str, setup: Setup) -> None:
    finding = evaluate(build(setup, models)).finding(rule_id)
    assert finding.status in ("pass", "not-applicable"), finding


def test_every_rule_has_a_failing_and_a_passing_case() -> None:
    ids = {r.id for r in ALL_RULES} | {WAIVER_RULE_ID}
    assert set(CASES) == ids
    for rule_id, (failing, passing) in CASES.items():
        assert failing and passing, rule_id


def test_passing_setups_pass_on_their_platform(models: dict[str, Path]) -> None:
    """The default xpu and cpu setups pass every rule: each case changes one thing."""
    for setup in (xpu(), cpu()):
        report = evaluate(build(setup, models))
        assert not [f for f in report.findings if f.status in ("fail", "unknown")]


def test_contract_rule_ids_exist_and_are_stable_kebab_case() -> None:
    assert set(RULES_BY_ID) >= CONTRACT_IDS
    for r in ALL_RULES:
        assert r.id == r.id.lower() and " " not in r.id
        assert r.platforms, r.id
        assert r.evidence and r.remedy and r.summary, r.id
        assert any(
            src in r.evidence for src in ("seed 00", "research/", "vLLM", "kernels/", "service/", "vllm", "every")
        ), r.id


@pytest.mark.parametrize(
    ("rule_id", "platform", "severity"),
    [
        ("spec-gdn-without-replayssm", "xpu", "refuse"),
        ("spec-gdn-without-replayssm", "cuda", "warn"),
        ("spec-gdn-without-replayssm", "cpu", None),
        ("cudagraph-mode-unset", "xpu", "refuse"),
        ("cudagraph-mode-unset", "cuda", "warn"),
        ("cudagraph-none", "cpu", None),
        ("fused-prologue-capture", "cuda", None),
        ("async-scheduling-piecewise", "xpu", "refuse"),
        ("tp-divisibility", "cpu", "refuse"),
        ("shared-experts-stream", "xpu", "warn"),
        ("cpu-ngram-hybrid", "sim", "refuse"),
    ],
)
def test_severity_depends_on_platform(rule_id: str, platform: str, severity: str | None) -> None:
    assert RULES_BY_ID[rule_id].severity_on(platform) == severity


def test_cpu_eager_is_not_refused(models: dict[str, Path]) -> None:
    report = evaluate(build(cpu(), models))
    assert report.finding("cudagraph-none").status == "not-applicable"
    assert not report.refused


def test_tp3_is_refused_for_qwen36_with_head_counts(models: dict[str, Path]) -> None:
    finding = evaluate(build(xpu(tp=3, devices=(0, 1, 2)), models)).finding("tp-divisibility")
    assert finding.refuses
    assert "16 attention heads do not split over 3 ranks" in finding.reason


def test_waived_finding_is_reported_counted_and_does_not_refuse(models: dict[str, Path]) -> None:
    setup = xpu(args={**SAFE_XPU_ARGS, "enforce_eager": True}, waivers={"cudagraph-none": "eager bisection run"})
    report = evaluate(build(setup, models))
    finding = report.finding("cudagraph-none")
    assert finding.status == "fail" and finding.waived and finding.waiver_reason == "eager bisection run"
    assert not finding.refuses and not report.refused
    assert report.waived == (finding,)
    assert report.counts()["waived"] == 1
    assert report.to_json()["findings"][[f["rule"] for f in report.to_json()["findings"]].index("cudagraph-none")][
        "waived"
    ]


def test_a_waiver_does_not_hide_other_refusals(models: dict[str, Path]) -> None:
    setup = xpu(
        args={**SAFE_XPU_ARGS, "enforce_eager": True},
        env={"VLLM_XPU_W8A8_GROUPED_GEMM_N_GT_K_POLICY": "m8"},
        waivers={"cudagraph-none": "eager bisection run"},
    )
    report = evaluate(build(setup, models))
    assert [f.rule for f in report.refusals] == ["grouped-gemm-m8-n-gt-k"]


def test_unparsed_args_make_argument_rules_unknown_never_passed(models: dict[str, Path]) -> None:
    report = evaluate(build(xpu(args_status="unavailable", tp=3, devices=(0, 1, 2)), models))
    unknown = {f.rule for f in report.unknown}
    assert {"cudagraph-mode-unset", "cudagraph-none", "async-scheduling-piecewise", "engine-args-invalid"} <= unknown
    # Rules that need no arguments still decide: env flags that are off, and the model's shape.
    assert report.finding("fused-prologue-capture").status == "pass"
    assert report.finding("tp-divisibility").refuses
    assert report.engine_args_status == "unavailable"


def test_env_flag_without_args_is_unknown_not_passed(models: dict[str, Path]) -> None:
    setup = xpu(args_status="unavailable", env={"VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET": "1"})
    assert evaluate(build(setup, models)).finding("fused-prologue-capture").status == "unknown"


def test_missing_quarantine_is_unknown(models: dict[str, Path]) -> None:
    finding = evaluate(build(xpu(quarantined=None), models)).finding("unhealthy-device-selected")
    assert finding.status == "unknown"
    assert "preflight" in finding.reason


def test_mtp_without_weight_index_is_unknown(models: dict[str, Path]) -> None:
    finding = evaluate(build(xpu(**{**SPEC_OK, "model": "qwen36-noindex"}), models)).finding("mtp-weights-missing")
    assert finding.status == "unknown"


def test_reasons_quote_the_concrete_values(models: dict[str, Path]) -> None:
    report = evaluate(
        build(xpu(**{**SPEC_OK, "ring_len": 2, "model": "qwen36"}, env={"VLLM_XPU_SHARED_EXPERTS_STREAM": "1"}), models)
    )
    assert "replayssm.ring_len=2" in report.finding("replayssm-ring-too-short").reason
    assert "2*(1 + 1) = 4" in report.finding("replayssm-ring-too-short").reason
    assert "0 mtp.* tensors" in report.finding("mtp-weights-missing").reason
    assert "VLLM_XPU_SHARED_EXPERTS_STREAM=1" in report.finding("shared-experts-stream").reason


def test_a_rule_that_raises_becomes_unknown(models: dict[str, Path]) -> None:
    def broken(facts: GuardFacts) -> Verdict:
        raise ZeroDivisionError("boom")

    bad = Rule(id="broken", severities={"xpu": "refuse"}, summary="s", remedy="r", evidence="e", check=broken)
    report = evaluate(build(xpu(), models), rules=[bad])
    finding = report.finding("broken")
    assert finding.status == "unknown"
    assert "ZeroDivisionError: boom" in finding.reason
    assert not report.refused


def test_report_json_is_serialisable_and_complete(models: dict[str, Path]) -> None:
    report = evaluate(build(xpu(env={"VLLM_XPU_SHARED_EXPERTS_STREAM": "1"}), models))
    data = json.loads(json.dumps(report.to_json()))
    assert data["refused"] is True
    assert {f["rule"] for f in data["findings"]} == {r.id for r in ALL_RULES} | {WAIVER_RULE_ID}
    stream = next(f for f in data["findings"] if f["rule"] == "shared-experts-stream")
    assert set(stream) >= {"rule", "severity", "waived", "reason", "remedy", "evidence", "status"}
    assert data["counts"]["refuse"] == 1 and data["counts"]["warn"] == 1


def test_ring_limits_follow_the_kernels() -> None:
    """The guard and the profile hard-code what the kernels define (service does not import them): the longest
    ring spec verify takes, and the measured default ring length per window."""
    from gdn_replayssm import default_ring_len as kernels_default
    from gdn_replayssm._window import MAX_HISTORY_BLOCK

    from service.guard.rules.replayssm import MAX_VERIFY_RING_LEN
    from service.profile import default_ring_len

    assert MAX_VERIFY_RING_LEN == MAX_HISTORY_BLOCK
    caps = (None, 1, 8, 9, 1024)
    assert [default_ring_len(T, cap) for T in range(1, 17) for cap in caps] == [
        kernels_default(T, max_batch=cap) for T in range(1, 17) for cap in caps
    ]
