"""Profile schema v1: valid profiles load; every invalid field is named in the error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.errors import UserError
from service.profile import load_profile, parse_profile

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {"name": "t", "model": {"path": "m"}}


def test_embedded_default_profile_loads_with_its_documented_values() -> None:
    loaded = load_profile(REPO / "ops" / "profiles" / "tiny-cpu.yaml")
    profile = loaded.profile
    assert profile.name == "tiny-cpu"
    assert profile.platform == "cpu"
    assert loaded.served_name == "tiny"
    assert loaded.model_dir == (REPO / "models" / "tiny-qwen35-moe").resolve()
    assert "--kv-cache-memory-bytes=64M" in profile.engine.args
    assert (profile.api.host, profile.api.port) == ("127.0.0.1", 9400)


def test_container_profile_is_the_embedded_default_but_for_its_addresses_and_model() -> None:
    """compose.yaml's profile differs from tiny-cpu.yaml only where a container must: every interface (the ports are
    published on the host's loopback) and the model the image built."""
    default = yaml.safe_load((REPO / "ops" / "profiles" / "tiny-cpu.yaml").read_text())
    container = yaml.safe_load((REPO / "ops" / "profiles" / "tiny-cpu-container.yaml").read_text())
    for profile in (default, container):
        profile["engine"].pop("host")
        profile["api"].pop("host")
        profile["model"].pop("path")
    assert container == default
    loaded = load_profile(REPO / "ops" / "profiles" / "tiny-cpu-container.yaml")
    assert loaded.profile.engine.host == loaded.profile.api.host == "0.0.0.0"  # noqa: S104 (the container boundary)
    assert loaded.model_dir == Path("/opt/models/tiny-qwen35-moe")


@pytest.mark.parametrize("platform", ["cuda", "xpu"])
def test_accelerator_profiles_find_their_model_where_the_images_mount_it(platform: str) -> None:
    """compose.cuda.yaml and compose.xpu.yaml mount ops/profiles at /opt/warden/ops/profiles and the host's models at
    /opt/warden/models: a shipped profile whose model.path left that folder would serve nothing in the image."""
    profiles = [p for p in (REPO / "ops" / "profiles").glob("*.yaml")
                if yaml.safe_load(p.read_text())["platform"] == platform]  # fmt: skip
    assert profiles, f"no shipped {platform} profile"
    for path in profiles:
        model = Path(yaml.safe_load(path.read_text())["model"]["path"])
        in_image = (Path("/opt/warden/ops/profiles") / model).resolve()
        assert in_image.parent == Path("/opt/warden/models"), f"{path.name}: model.path {model} -> {in_image}"
        # the same layout outside a container: the repository's models/ folder
        assert load_profile(path).model_dir == (REPO / "models" / in_image.name).resolve()


def test_defaults_of_a_minimal_profile() -> None:
    profile = parse_profile(MINIMAL, Path("p.yaml")).profile
    assert profile.platform == "auto"
    assert profile.devices == "auto" and profile.tensor_parallel == "auto"
    assert (profile.engine.host, profile.engine.port) == ("127.0.0.1", 8000)
    assert profile.replayssm.enabled is False and profile.replayssm.ring_len is None  # by the window
    assert profile.speculative is None
    assert (profile.api.host, profile.api.port) == ("127.0.0.1", 9400)
    assert profile.supervisor.restart.max_restarts == 3


def test_relative_model_path_resolves_against_the_profile_folder(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    path = tmp_path / "profiles" / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "model": {"path": "../models/x"}}))
    assert load_profile(path).model_dir == (tmp_path / "models" / "x").resolve()


def test_speculative_passes_unknown_keys_through_to_vllm() -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}
    profile = parse_profile({**MINIMAL, "speculative": spec}, Path("p.yaml")).profile
    assert profile.speculative is not None
    assert profile.speculative.model_dump(exclude_none=True) == spec


INVALID = [
    pytest.param({"engine": {"prot": 1}}, "engine.prot", "unknown field", id="unknown-nested-field"),
    pytest.param({"enigne": {}}, "enigne", "unknown field", id="unknown-top-level-field"),
    pytest.param({"engine": {"port": 70000}}, "engine.port", "65535", id="port-out-of-range"),
    pytest.param({"engine": {"port": "http"}}, "engine.port", "integer", id="port-not-a-number"),
    pytest.param({"engine": {"args": "--enforce-eager"}}, "engine.args", "list", id="args-not-a-list"),
    pytest.param({"engine": {"env": {"A=B": "1"}}}, "engine.env", "'A=B'", id="env-bad-name"),
    pytest.param({"platform": "gpu"}, "platform", "'gpu'", id="platform-unknown"),
    pytest.param({"model": {"path": "m\x00"}}, "model.path", "NUL character", id="model-path-with-nul"),
    pytest.param(
        {"speculative": {"method": "draft_model", "num_speculative_tokens": 2, "model": "\x00"}},
        "speculative.model",
        "NUL character",
        id="draft-model-path-with-nul",
    ),
    pytest.param({"devices": "all"}, "devices", "'all'", id="devices-not-auto-or-list"),
    pytest.param({"devices": []}, "devices", "no device", id="devices-empty"),
    pytest.param({"devices": [-1]}, "devices[0]", "greater than or equal to 0", id="devices-negative"),
    pytest.param({"devices": [1, 1]}, "devices", "repeat", id="devices-repeated"),
    pytest.param({"tensor_parallel": 0}, "tensor_parallel", "greater than or equal to 1", id="tp-zero"),
    pytest.param(
        {"speculative": {"method": "mtp"}}, "speculative.num_speculative_tokens", "required", id="spec-missing-k"
    ),
    pytest.param(
        {"speculative": {"method": "mtp", "num_speculative_tokens": 0}},
        "speculative.num_speculative_tokens",
        "greater than or equal to 1",
        id="spec-k-zero",
    ),
    pytest.param(
        {"replayssm": {"ring_len": 0}}, "replayssm.ring_len", "greater than or equal to 1", id="ring-len-zero"
    ),
    pytest.param({"replayssm": {"enable": True}}, "replayssm.enable", "unknown field", id="replayssm-typo"),
    pytest.param(
        {"replayssm": {"shadow_check": True}}, "replayssm", "set enabled: true as well", id="shadow-without-replayssm"
    ),
    pytest.param(
        {"guard": {"waive": {"cudagraph-none": " "}}}, "guard.waive", "needs a reason", id="waiver-without-reason"
    ),
    pytest.param(
        {"sim": {"faults": [{"device": 0, "fault": "melt"}]}}, "sim.faults[0].fault", "'melt'", id="sim-fault-kind"
    ),
    pytest.param(
        {"sim": {"devices": 2, "faults": [{"device": 3, "fault": "hang"}]}},
        "sim",
        "device 3",
        id="sim-fault-device-out-of-range",
    ),
    pytest.param({"supervisor": {"stop_grace_s": 0}}, "supervisor.stop_grace_s", "greater than 0", id="grace-zero"),
    pytest.param(
        {"supervisor": {"restart": {"max_restarts": -1}}},
        "supervisor.restart.max_restarts",
        "greater than or equal to 0",
        id="restarts-negative",
    ),
    pytest.param({"api": {"port": 8000}}, "(top level)", "both 8000", id="api-port-equals-engine-port"),
    pytest.param({"api": {"token": "x"}}, "api.token", "unknown field", id="api-token-inline-refused"),
    pytest.param({"name": "my profile"}, "name", "letters", id="name-with-space"),
    pytest.param({"model": {"served_name": "x"}}, "model.path", "required", id="model-path-missing"),
]


@pytest.mark.parametrize(("override", "field", "message"), INVALID)
def test_invalid_field_is_named_with_what_is_wrong(override: dict[str, object], field: str, message: str) -> None:
    with pytest.raises(UserError) as raised:
        parse_profile({**MINIMAL, **override}, Path("p.yaml"))
    text = str(raised.value)
    line = next((ln for ln in text.splitlines() if ln.strip().startswith(f"{field}:")), None)
    assert line is not None, f"no line for {field!r} in:\n{text}"
    assert message in line
    assert "remedy:" in text


def test_missing_file_yaml_errors_and_non_mapping_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_profile(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: t\nmodel: {path: m\n")
    with pytest.raises(UserError, match=r"not valid YAML at line \d+"):
        load_profile(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- name: t\n")
    with pytest.raises(UserError, match="YAML mapping"):
        load_profile(listed)


def test_a_home_folder_of_no_known_user_stays_as_written(tmp_path: Path) -> None:
    """`~nosuchuser/x` cannot be expanded: it is a (missing) folder beside the profile, not a traceback."""
    loaded = parse_profile({"name": "t", "model": {"path": "~no-such-user-here/m"}}, tmp_path / "p.yaml")
    assert loaded.model_dir == tmp_path / "~no-such-user-here" / "m"
