"""The canonical run identity: what it holds, its fingerprint, diffs, and the CLI."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli import main
from service.guard.engine_args import vllm_available
from service.guard.facts import build_facts
from service.identity import (
    IdentityUnavailable,
    RunIdentity,
    Versions,
    build_identity,
    diff_identities,
    fingerprint,
    identity_env,
    kernel_source_sha256,
)
from service.models.qwen36 import write_qwen36_config
from service.profile import parse_profile


@pytest.fixture(autouse=True, scope="module")
def _needs_vllm() -> None:
    """Imports vLLM on first use (once per test process), not at collection."""
    if not vllm_available():
        pytest.skip("vLLM is not importable here")


VERSIONS = Versions(vllm="0.32.0", warden="0.1.0", kernel_source_sha256="k" * 64)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen36_config(tmp_path_factory.mktemp("m") / "qwen36")


def profile_data(model: Path, **override: Any) -> dict[str, Any]:
    return {
        "name": "ident",
        "model": {"path": str(model)},
        "platform": "xpu",
        "devices": [0, 1],
        "tensor_parallel": 2,
        "engine": {
            "args": ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling", "--gpu-memory-utilization=0.90"],
            "env": {"VLLM_XPU_ENABLE_XPU_GRAPH": "1", "XPU_GRAPH": "1"},
        },
        **override,
    }


def identity_of(
    data: dict[str, Any], tmp_path: Path, *, env: dict[str, str] | None = None, versions: Versions = VERSIONS
) -> RunIdentity:
    loaded = parse_profile(data, tmp_path / "p.yaml")
    return build_identity(build_facts(loaded, base_env=env or {}), versions=versions)


def test_identity_fields(model: Path, tmp_path: Path) -> None:
    fields = identity_of(profile_data(model), tmp_path).fields
    assert fields["model"]["path"] == str(model)
    assert len(fields["model"]["config_sha256"]) == 64 and len(fields["model"]["weight_index_sha256"]) == 64
    assert fields["vllm_version"] == "0.32.0"
    assert fields["warden"] == {"version": "0.1.0", "kernel_source_sha256": "k" * 64}
    assert fields["platform"] == "xpu" and fields["devices"] == [0, 1] and fields["tensor_parallel"] == 2
    assert fields["engine_args"] == {
        "compilation_config": {"cudagraph_mode": "PIECEWISE"},
        "async_scheduling": False,
        "gpu_memory_utilization": 0.9,
    }
    assert fields["engine_env"] == {"VLLM_XPU_ENABLE_XPU_GRAPH": "1", "XPU_GRAPH": "1"}
    assert fields["speculative"] is None and fields["draft_model"] is None
    assert fields["replayssm"] == {"enabled": False}


def test_fingerprint_is_sha256_of_canonical_json() -> None:
    import hashlib

    fields = {"b": 1, "a": {"y": [1, 2], "x": "é"}}
    canonical = '{"a":{"x":"é","y":[1,2]},"b":1}'
    assert fingerprint(fields) == hashlib.sha256(canonical.encode()).hexdigest()
    assert fingerprint({"a": {"x": "é", "y": [1, 2]}, "b": 1}) == fingerprint(fields)


def test_equivalent_spellings_give_one_fingerprint(model: Path, tmp_path: Path) -> None:
    a = profile_data(model)
    b = copy.deepcopy(a)
    b["engine"]["args"] = [
        "--gpu-memory-utilization",
        "0.9",
        '--compilation-config={"cudagraph_mode": "PIECEWISE"}',
        "--no_async_scheduling",
        "--gpu-memory-utilization=0.90",
    ]
    assert identity_of(a, tmp_path).fingerprint == identity_of(b, tmp_path).fingerprint


def test_yaml_formatting_and_key_order_do_not_count(model: Path, tmp_path: Path) -> None:
    data = profile_data(model)
    block = yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    flow = yaml.safe_dump(dict(reversed(list(data.items()))), sort_keys=False, default_flow_style=True, width=40)
    (tmp_path / "a.yaml").write_text(block)
    (tmp_path / "b.yaml").write_text("# a comment\n" + flow)
    prints = {
        build_identity(
            build_facts(parse_profile(yaml.safe_load(p.read_text()), p), base_env={}), versions=VERSIONS
        ).fingerprint
        for p in (tmp_path / "a.yaml", tmp_path / "b.yaml")
    }
    assert len(prints) == 1


def test_config_json_formatting_does_not_count(tmp_path: Path) -> None:
    one = write_qwen36_config(tmp_path / "one")
    two = write_qwen36_config(tmp_path / "two")
    config = json.loads((two / "config.json").read_text())
    (two / "config.json").write_text(json.dumps(dict(reversed(list(config.items())))))
    a = identity_of(profile_data(one), tmp_path).fields["model"]
    b = identity_of(profile_data(two), tmp_path).fields["model"]
    assert a["config_sha256"] == b["config_sha256"] and a["weight_index_sha256"] == b["weight_index_sha256"]


def _mutations(model: Path, tmp_path: Path) -> dict[str, tuple[dict[str, Any], dict[str, str], Versions]]:
    base = profile_data(model)
    other_model = write_qwen36_config(tmp_path / "other", mtp_weights=True)  # same config, other index
    changed_config = write_qwen36_config(tmp_path / "changed")
    config = json.loads((changed_config / "config.json").read_text())
    config["text_config"]["rms_norm_eps"] = 1e-5
    (changed_config / "config.json").write_text(json.dumps(config))

    def with_(**kw: Any) -> dict[str, Any]:
        data = copy.deepcopy(base)
        data.update(kw)
        return data

    def engine(**kw: Any) -> dict[str, Any]:
        data = copy.deepcopy(base)
        data["engine"].update(kw)
        return data

    return {
        "weight index": (with_(model={"path": str(other_model)}), {}, VERSIONS),
        "config.json": (with_(model={"path": str(changed_config)}), {}, VERSIONS),
        "vllm version": (base, {}, Versions("0.33.0", "0.1.0", "k" * 64)),
        "warden version": (base, {}, Versions("0.32.0", "0.2.0", "k" * 64)),
        "kernel source": (base, {}, Versions("0.32.0", "0.1.0", "j" * 64)),
        "platform": (with_(platform="cuda"), {}, VERSIONS),
        "devices": (with_(devices=[2, 3]), {}, VERSIONS),
        "tensor parallel": (with_(devices=[0, 1, 2, 3], tensor_parallel=4), {}, VERSIONS),
        "engine arg": (engine(args=[*base["engine"]["args"], "--max-model-len=4096"]), {}, VERSIONS),
        "engine arg value": (
            engine(
                args=["-cc.cudagraph_mode=FULL_AND_PIECEWISE", "--no-async-scheduling", "--gpu-memory-utilization=0.90"]
            ),
            {},
            VERSIONS,
        ),
        "engine env": (engine(env={**base["engine"]["env"], "VLLM_XPU_GRAPH_NO_EMPTY_CACHE": "1"}), {}, VERSIONS),
        "inherited env": (base, {"CCL_ATL_TRANSPORT": "ofi"}, VERSIONS),
        "speculative": (with_(speculative={"method": "mtp", "num_speculative_tokens": 1}), {}, VERSIONS),
        "replayssm": (with_(replayssm={"enabled": True, "ring_len": 16}), {}, VERSIONS),
        "replayssm shadow check": (
            with_(replayssm={"enabled": True, "ring_len": 16, "shadow_check": True}),
            {},
            VERSIONS,
        ),
    }


def test_every_identity_field_changes_the_fingerprint(model: Path, tmp_path: Path) -> None:
    reference = identity_of(profile_data(model), tmp_path)
    seen = {reference.fingerprint}
    mutations = _mutations(model, tmp_path)
    for name, (data, env, versions) in mutations.items():
        changed = identity_of(data, tmp_path, env=env, versions=versions)
        assert changed.fingerprint != reference.fingerprint, name
        assert diff_identities(reference.fields, changed.fields), name
        seen.add(changed.fingerprint)
    assert len(seen) == len(mutations) + 1


def test_what_is_not_identity_does_not_change_it(model: Path, tmp_path: Path) -> None:
    base = profile_data(model)
    reference = identity_of(base, tmp_path).fingerprint
    renamed = {**copy.deepcopy(base), "name": "other-name", "api": {"port": 9555}}
    renamed["engine"]["port"] = 8123
    assert identity_of(renamed, tmp_path).fingerprint == reference
    noise = {"HOME": "/root", "PATH": "/bin", "VLLM_RPC_BASE_PATH": "/tmp/run1", "VLLM_API_KEY": "secret"}
    assert identity_of(base, tmp_path, env=noise).fingerprint == reference
    ring = {**copy.deepcopy(base), "replayssm": {"enabled": False, "ring_len": 64}}
    assert identity_of(ring, tmp_path).fingerprint == reference  # ring_len means nothing while ReplaySSM is off


def test_an_omitted_ring_len_is_the_measured_default_for_the_window(model: Path, tmp_path: Path) -> None:
    """Without `replayssm.ring_len` the run takes the kernels' measured ring for its verify window (1 + k
    tokens) and, where `--max-num-seqs` caps the batch, for that batch; the identity records that length:
    leaving the default out and writing it are the same run."""
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    omitted = identity_of(profile_data(model, speculative=spec, replayssm={"enabled": True}), tmp_path)
    assert omitted.fields["replayssm"]["ring_len"] == 64
    written = profile_data(model, speculative=spec, replayssm={"enabled": True, "ring_len": 64})
    assert identity_of(written, tmp_path).fingerprint == omitted.fingerprint

    def ring_len(**sections: Any) -> Any:
        """The identity's ring length of a profile with ReplaySSM on and these sections."""
        return identity_of(profile_data(model, replayssm={"enabled": True}, **sections), tmp_path).fields["replayssm"][
            "ring_len"
        ]

    assert ring_len() == 16  # decode
    # an engine capped at 8 sequences a step takes the small-batch ring for windows of 3+ tokens, not for decode
    small = {"args": ["--max-num-seqs", "8"], "env": {}}
    assert ring_len(speculative=spec, engine=small) == 32
    assert ring_len(engine=small) == 16
    assert ring_len(speculative=spec, engine={"args": ["--max-num-seqs=9"], "env": {}}) == 64
    assert ring_len(speculative={"method": "mtp", "num_speculative_tokens": 7}) == 64


def test_a_local_draft_is_identified_by_folder_and_content(model: Path, tmp_path: Path) -> None:
    draft = tmp_path / "drafts" / "dflash"
    draft.mkdir(parents=True)
    (draft / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "num_attention_heads": 2})
    )
    spec = {"method": "dflash", "num_speculative_tokens": 4, "model": "drafts/dflash"}
    first = identity_of(profile_data(model, speculative=spec), tmp_path)
    assert first.fields["speculative"]["model"] == str(draft)
    assert first.fields["draft_model"]["config_sha256"]
    (draft / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "num_hidden_layers": 2, "num_attention_heads": 2})
    )
    assert identity_of(profile_data(model, speculative=spec), tmp_path).fingerprint != first.fingerprint


def test_identity_env_drops_secrets_paths_and_placed_device_masks() -> None:
    env = {"VLLM_API_KEY": "s", "HF_TOKEN": "s", "WARDEN_API_TOKEN": "s", "ZE_AFFINITY_MASK": "0,1", "CCL_X": "1"}
    assert identity_env(env, devices_known=True) == {"CCL_X": "1"}
    assert identity_env(env, devices_known=False) == {"CCL_X": "1", "ZE_AFFINITY_MASK": "0,1"}


def test_diff_lists_the_fields_that_differ() -> None:
    a = {"engine_args": {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, "tensor_parallel": 4, "x": True}
    b = {"engine_args": {}, "tensor_parallel": 2, "x": 1}
    fields = [(d.field, d.a, d.b) for d in diff_identities(a, b)]
    assert fields == [
        ("engine_args.compilation_config", {"cudagraph_mode": "PIECEWISE"}, "<absent>"),
        ("tensor_parallel", 4, 2),
        ("x", True, 1),
    ]
    assert diff_identities(a, copy.deepcopy(a)) == []


def test_unparsed_arguments_have_no_identity(model: Path, tmp_path: Path) -> None:
    loaded = parse_profile(profile_data(model, engine={"args": ["--enforce-eager=true"]}), tmp_path / "p.yaml")
    with pytest.raises(IdentityUnavailable, match="ignored explicit argument"):
        build_identity(build_facts(loaded, base_env={}), versions=VERSIONS)


def test_kernel_source_hash_covers_paths_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fake_kernels_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "k.py").write_text("x = 1\n")
    (package / "notes.txt").write_text("not source")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = kernel_source_sha256("fake_kernels_pkg")
    (package / "notes.txt").write_text("changed, but not a .py file")
    assert kernel_source_sha256("fake_kernels_pkg") == first
    (package / "sub" / "k.py").write_text("x = 2\n")
    assert kernel_source_sha256("fake_kernels_pkg") != first
    sys.modules.pop("fake_kernels_pkg", None)
    assert kernel_source_sha256("no_such_package_here") is None
    assert kernel_source_sha256() is not None  # the installed gdn_replayssm


def test_identity_cli(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump(profile_data(model)))
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(profile_data(model, devices=[0, 1, 2, 3], tensor_parallel=4)))

    assert main(["identity", str(a), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fingerprint"] == fingerprint(out["identity"])
    saved = tmp_path / "a-identity.json"
    saved.write_text(json.dumps(out))

    assert main(["identity", "diff", str(a), str(saved)]) == 0
    assert capsys.readouterr().out.startswith("identical: ")

    assert main(["identity", "diff", str(saved), str(b), "--json"]) == 3
    diff = json.loads(capsys.readouterr().out)
    assert diff["identical"] is False
    assert {d["field"] for d in diff["differences"]} == {"devices", "tensor_parallel"}

    assert main(["identity", "diff", str(a)]) == 2
    assert "identity diff A B" in capsys.readouterr().err
