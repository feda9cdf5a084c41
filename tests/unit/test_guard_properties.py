"""Property tests: the guard never raises on arbitrary input, and the identity fingerprint is stable
under formatting and spelling but moves with every identity field.

Example counts are modest (the CI machine has two cores); vLLM is imported once per process.
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from service.errors import UserError
from service.guard import EngineArgsFacts, GuardFacts, build_facts, evaluate, normalize_engine_args
from service.guard.engine_args import vllm_available
from service.guard.facts import read_model_facts
from service.identity import _SECRET as SECRET_NAME
from service.identity import IdentityUnavailable, Versions, build_identity
from service.models.qwen36 import write_qwen36_config
from service.profile import parse_profile

VERSIONS = Versions(vllm="0.32.0", warden="0.1.0", kernel_source_sha256="0" * 64)
FEW = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATUSES = {"pass", "fail", "unknown", "not-applicable"}


@pytest.fixture(scope="module")
def vllm() -> None:
    if not vllm_available():
        pytest.skip("vLLM is not importable here")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    odd = root / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"num_hidden_layers": 3, "num_attention_heads": 0, "layer_types": 7}))
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"\xff" * 4)
    tiny = root / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "layer_types": ["linear_attention", "full_attention"],
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 64,
                "linear_value_head_dim": "64",
                "hidden_size": 256,
            }
        )
    )
    qwen36 = write_qwen36_config(root / "qwen36", mtp_weights=True)
    small = root / "small"  # the Qwen3.6 config with a short index: reading it costs nothing
    small.mkdir()
    (small / "config.json").write_text((qwen36 / "config.json").read_text())
    names = ["lm_head.weight", "mtp.fc.weight", "model.language_model.embed_tokens.weight"]
    (small / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, "a")}))
    return {
        "qwen36": qwen36,
        "small": small,
        "odd": odd,
        "broken": broken,
        "tiny": tiny,
        "missing": root / "missing",
    }


# ---- strategies ------------------------------------------------------------------------------

FLAGS = [
    "--enforce-eager",
    "--no-enforce-eager",
    "--async-scheduling",
    "--no-async-scheduling",
    "-cc",
    "--compilation-config",
    "-cc.cudagraph_mode",
    "-cc.max_cudagraph_capture_size",
    "-O",
    "-O0",
    "-O3",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--max-model-len",
    "--dtype",
    "-tp",
    "--port",
    "--speculative-config",
    "--enable-prefix-caching",
    "--config",
    "--help",
    "-h",
    "--",
]
TOKENS = st.one_of(
    st.sampled_from(FLAGS),
    st.sampled_from(
        ["PIECEWISE", "NONE", "FULL", "0.9", "1.5", "nan", "64M", "bfloat16", "{}", '{"cudagraph_mode":1}']
    ),
    st.integers(-5, 5000).map(str),
    st.text(max_size=10),
    st.builds(lambda f, v: f"{f}={v}", st.sampled_from(FLAGS), st.text(max_size=6)),
)
ARG_LISTS = st.lists(TOKENS, max_size=7)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
ARG_KEYS = st.sampled_from(
    [
        "compilation_config",
        "enforce_eager",
        "async_scheduling",
        "optimization_level",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "enable_prefix_caching",
        "dtype",
        "tensor_parallel_size",
        "model",
    ]
)
ENV_NAMES = st.sampled_from(
    [
        "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET",
        "VLLM_XPU_SHARED_EXPERTS_STREAM",
        "VLLM_XPU_GRAPH_NO_EMPTY_CACHE",
        "VLLM_XPU_SHARED_EXPERT_FUSED_ACT_QUANT",
        "VLLM_XPU_SHARED_EXPERT_BOUNDARY_OUT",
        "VLLM_XPU_W8A8_GROUPED_GEMM_N_GT_K_POLICY",
        "VLLM_XPU_W8A8_GROUPED_GEMM_POLICY",
        "VLLM_XPU_MOE_W8A8_FULL_LAYERLET",
        "VLLM_XPU_X_TRACE_FILE",
        "VLLM_CPU_KVCACHE_SPACE",
        "ZE_AFFINITY_MASK",
        "CUDA_VISIBLE_DEVICES",
        "WARDEN_GDN_REPLAYSSM",
    ]
) | st.text(min_size=1, max_size=10)
ENV = st.dictionaries(ENV_NAMES, st.sampled_from(["1", "0", "m8", "true", "", "off"]) | st.text(max_size=5), max_size=5)
METHODS = st.sampled_from(["mtp", "qwen3_5_mtp", "ngram", "ngram_gpu", "dflash", "eagle", "suffix"]) | st.text(
    max_size=6
)
SPECULATIVE = st.none() | st.fixed_dictionaries(
    {"method": METHODS, "num_speculative_tokens": st.integers(-2, 12)},
    optional={
        "model": st.sampled_from(["qwen36", "tiny", "missing", "z-lab/Qwen3.6-35B-A3B-DFlash"]) | st.text(max_size=6),
        "speculative_token_tree": st.text(max_size=20) | st.sampled_from(["[(0,), (0, 0)]", "[(0,), (1,)]", "((("]),
        "speculative_eagle_topk": st.integers(-1, 5) | st.text(max_size=3),
    },
)


@st.composite
def guard_facts(draw: st.DrawFn, models: dict[str, Path]) -> GuardFacts:
    status = draw(st.sampled_from(["parsed", "invalid", "unavailable"]))
    values = draw(st.dictionaries(ARG_KEYS | st.text(max_size=8), JSON, max_size=5)) if status == "parsed" else {}
    speculative = draw(SPECULATIVE)
    draft = None
    if speculative is not None and "model" in speculative:
        name = speculative["model"]
        draft = read_model_facts(models.get(name, Path(str(name))), reference=str(name))
    env = draw(ENV)
    profile_env = draw(ENV)
    return GuardFacts(
        profile_name="fuzz",
        platform=draw(st.sampled_from(["xpu", "cuda", "cpu", "sim"])),
        model=read_model_facts(models[draw(st.sampled_from(sorted(models)))]),
        engine_args=EngineArgsFacts(status=status, raw=tuple(draw(ARG_LISTS)), values=values, error="e"),
        engine_env={**env, **profile_env},
        profile_env=profile_env,
        speculative=speculative,
        draft=draft,
        replayssm_enabled=draw(st.booleans()),
        replayssm_ring_len=draw(st.integers(-4, 300)),
        devices=draw(st.none() | st.lists(st.integers(0, 8), max_size=5).map(tuple)),
        tensor_parallel=draw(st.none() | st.integers(-2, 17)),
        quarantined=draw(st.none() | st.dictionaries(st.integers(0, 8), st.text(max_size=8), max_size=3)),
        canary_prompt=draw(st.text(max_size=20)),
        waivers=draw(
            st.dictionaries(
                st.text(max_size=12) | st.sampled_from(["cudagraph-none", "tp-divisibility"]),
                st.text(min_size=1, max_size=5),
                max_size=2,
            )
        ),
    )


# ---- the guard never raises --------------------------------------------------------------------


@FEW
@given(data=st.data())
def test_evaluate_never_raises_on_arbitrary_facts(models: dict[str, Path], data: st.DataObject) -> None:
    facts = data.draw(guard_facts(models))
    report = evaluate(facts)
    assert {f.status for f in report.findings} <= STATUSES
    json.dumps(report.to_json())
    assert report.refused == any(
        f.status == "fail" and f.severity == "refuse" and not f.waived for f in report.findings
    )


@settings(max_examples=60, deadline=None)
@given(args=ARG_LISTS)
def test_normalizing_arbitrary_argument_lists_never_raises(vllm: None, args: list[str]) -> None:
    parsed = normalize_engine_args(args)
    assert parsed.status in ("parsed", "invalid")
    json.dumps(dict(parsed.values), allow_nan=False)
    if parsed.status == "invalid":
        assert parsed.error


PROFILE_NAMES = st.from_regex(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,10}$", fullmatch=True)


@st.composite
def profile_dicts(draw: st.DrawFn, models: dict[str, Path]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": draw(PROFILE_NAMES),
        "model": {"path": str(models[draw(st.sampled_from(sorted(models)))])},
        "platform": draw(st.sampled_from(["auto", "cuda", "xpu", "cpu", "sim"])),
        "devices": draw(st.just("auto") | st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True)),
        "tensor_parallel": draw(st.just("auto") | st.integers(1, 8)),
        "engine": {"args": draw(ARG_LISTS), "env": draw(st.dictionaries(ENV_NAMES, st.text(max_size=4), max_size=3))},
        "replayssm": {"enabled": draw(st.booleans()), "ring_len": draw(st.integers(1, 64))},
    }
    spec = draw(SPECULATIVE)
    if spec is not None:
        data["speculative"] = spec
    if draw(st.booleans()):
        data["guard"] = {
            "waive": draw(st.dictionaries(st.sampled_from(["cudagraph-none", "nope"]), st.text(max_size=5), max_size=2))
        }
    return data


@FEW
@given(data=st.data())
def test_arbitrary_profiles_never_raise_out_of_the_guard(
    vllm: None, models: dict[str, Path], data: st.DataObject
) -> None:
    raw = data.draw(profile_dicts(models))
    try:
        loaded = parse_profile(raw, Path(tempfile.gettempdir()) / "fuzz.yaml")
    except UserError:
        assume(False)
        return
    env = data.draw(st.dictionaries(ENV_NAMES, st.text(max_size=4), max_size=3))
    facts = build_facts(loaded, quarantined=data.draw(st.none() | st.just({3: "lost"})), base_env=env)
    report = evaluate(facts)
    assert {f.status for f in report.findings} <= STATUSES
    try:
        identity = build_identity(facts, versions=VERSIONS)
    except IdentityUnavailable:
        assert facts.engine_args.status != "parsed"
    else:
        assert len(identity.fingerprint) == 64


# ---- fingerprint stability and sensitivity -------------------------------------------------------


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _fingerprint_of_yaml(text: str, folder: Path) -> str:
    path = folder / "p.yaml"
    path.write_text(text)
    loaded = parse_profile(yaml.safe_load(text), path)
    return build_identity(build_facts(loaded, base_env={}), versions=VERSIONS).fingerprint


def _valid_profile(models: dict[str, Path], args: list[str], env: dict[str, str], tp: int) -> dict[str, Any]:
    return {
        "name": "stable",
        "model": {"path": str(models["small"])},
        "platform": "xpu",
        "devices": list(range(tp)),
        "tensor_parallel": tp,
        "engine": {"args": args, "env": env},
        "speculative": {"method": "mtp", "num_speculative_tokens": 1},
        "replayssm": {"enabled": True, "ring_len": 16},
    }


SAFE_ENV = st.dictionaries(
    st.sampled_from(["VLLM_XPU_ENABLE_XPU_GRAPH", "XPU_GRAPH", "CCL_ATL_TRANSPORT", "FLA_X", "TORCH_Y"]),
    st.text(alphabet="abc01", max_size=4),
    max_size=4,
)


@FEW
@given(
    placed=st.tuples(SAFE_ENV, st.sampled_from([1, 2, 4])),
    seed=st.integers(0, 2**16),
    style=st.tuples(st.booleans(), st.integers(2, 6), st.integers(20, 200)),
)
def test_fingerprint_is_stable_under_key_order_and_yaml_formatting(
    vllm: None, models: dict[str, Path], placed: tuple[dict[str, str], int], seed: int, style: tuple[bool, int, int]
) -> None:
    (env, tp), (flow, indent, width) = placed, style
    data = _valid_profile(models, ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling"], env, tp)
    with tempfile.TemporaryDirectory() as tmp:
        reference = _fingerprint_of_yaml(yaml.safe_dump(data), Path(tmp))
        other = yaml.safe_dump(
            _shuffled(copy.deepcopy(data), random.Random(seed)),
            sort_keys=False,
            default_flow_style=flow,
            indent=indent,
            width=width,
        )
        assert _fingerprint_of_yaml("# formatting differs\n" + other, Path(tmp)) == reference


# Each setting with equivalent spellings; the first is the reference spelling.
SPELLINGS: dict[str, list[list[str]]] = {
    # Dotted spellings share one prefix (-cc): vLLM merges `-cc.x` flags with each other but not with
    # `--compilation-config.y` flags, and the last of the two wins (see test_guard_engine_args).
    "mode": [["-cc.cudagraph_mode=PIECEWISE"], ["-cc.cudagraph_mode", "PIECEWISE"]],
    "capture": [
        ["--max-cudagraph-capture-size=128"],
        ["-cc.max_cudagraph_capture_size=128"],
        ["--max_cudagraph_capture_size", "128"],
    ],
    "eager": [["--enforce-eager"], ["--enforce_eager"]],
    "async": [["--no-async-scheduling"], ["--no_async_scheduling"]],
    "opt": [["-O3"], ["-O", "3"], ["--optimization-level=3"], ["-O=3"]],
    "kv": [["--kv-cache-memory-bytes=64M"], ["--kv-cache-memory-bytes", "67108864"]],
    "mem": [["--gpu-memory-utilization=0.9"], ["--gpu-memory-utilization", "0.90"], ["--gpu_memory_utilization=.9"]],
    "len": [["--max-model-len=4096"], ["--max-model-len", "4K"], ["--max_model_len=4096"]],
}


@FEW
@given(
    chosen=st.lists(st.sampled_from(sorted(SPELLINGS)), unique=True, max_size=len(SPELLINGS)),
    picks=st.lists(st.integers(0, 3), min_size=len(SPELLINGS), max_size=len(SPELLINGS)),
    seed=st.integers(0, 2**16),
)
def test_equivalent_spellings_give_the_same_identity(
    vllm: None, models: dict[str, Path], chosen: list[str], picks: list[int], seed: int
) -> None:
    # Whole-JSON spellings (-cc '{...}') replace each other rather than merge, so every spelling here
    # sets one field; JSON spellings are covered in test_guard_engine_args.
    reference = [arg for name in sorted(chosen) for arg in SPELLINGS[name][0]]
    groups = [SPELLINGS[name][picks[i] % len(SPELLINGS[name])] for i, name in enumerate(chosen)]
    random.Random(seed).shuffle(groups)
    variant = [arg for group in groups for arg in group]
    a, b = normalize_engine_args(reference), normalize_engine_args(variant)
    assert a.status == b.status == "parsed", (a.error, b.error)
    assert a.values == b.values
    with tempfile.TemporaryDirectory() as tmp:
        fa = _fingerprint_of_yaml(yaml.safe_dump(_valid_profile(models, reference, {}, 2)), Path(tmp))
        fb = _fingerprint_of_yaml(yaml.safe_dump(_valid_profile(models, variant, {}, 2)), Path(tmp))
    assert fa == fb


IDENTITY_CHANGES = st.one_of(
    st.tuples(
        st.just("env"),
        st.from_regex(r"^(VLLM|XPU|CCL|NCCL|ZE|ONEAPI|FLA|TORCH|WARDEN)_[A-Z]{1,6}$", fullmatch=True).filter(
            lambda name: not SECRET_NAME.search(name)  # secrets never enter the identity
        ),
        st.text(alphabet="xyz19", min_size=1, max_size=4),
    ),
    st.tuples(st.just("arg"), st.just("--max-model-len"), st.integers(1, 100_000).map(str)),
    st.tuples(st.just("arg"), st.just("--gpu-memory-utilization"), st.floats(0.05, 0.9).map(lambda f: f"{f:.3f}")),
    st.tuples(st.just("tp"), st.just("tensor_parallel"), st.sampled_from(["1", "4"])),
    st.tuples(st.just("spec"), st.just("num_speculative_tokens"), st.integers(2, 7).map(str)),
    st.tuples(st.just("ring"), st.just("ring_len"), st.sampled_from(["32", "64", "128"])),
)


@FEW
@given(change=IDENTITY_CHANGES)
def test_any_identity_change_moves_the_fingerprint(
    vllm: None, models: dict[str, Path], change: tuple[str, str, str]
) -> None:
    kind, key, value = change
    base = _valid_profile(models, ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling"], {}, 2)
    changed = copy.deepcopy(base)
    if kind == "env":
        changed["engine"]["env"][key] = value
    elif kind == "arg":
        changed["engine"]["args"].append(f"{key}={value}")
    elif kind == "tp":
        changed["tensor_parallel"] = int(value)
        changed["devices"] = list(range(int(value)))
    elif kind == "spec":
        changed["speculative"]["num_speculative_tokens"] = int(value)
    else:
        changed["replayssm"]["ring_len"] = int(value)
    with tempfile.TemporaryDirectory() as tmp:
        a = _fingerprint_of_yaml(yaml.safe_dump(base), Path(tmp))
        b = _fingerprint_of_yaml(yaml.safe_dump(changed), Path(tmp))
    assert a != b, change
