"""The engine's argv and environment are built from the profile, as a list, per platform."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.errors import UserError
from service.profile import parse_profile
from service.supervisor.engine_command import build_engine_command


def command_for(
    tmp_path: Path, platform: str = "cpu", devices: list[int] | None = None, tp: int = 1, **override: object
):
    data = {"name": "t", "model": {"path": "model", "served_name": "tiny"}, **override}
    loaded = parse_profile(data, tmp_path / "p.yaml")
    return build_engine_command(
        loaded,
        platform=platform,
        devices=devices,
        tensor_parallel=tp,  # type: ignore[arg-type]
        runtime_dir=tmp_path / "rt",
        python="/usr/bin/python3",
        base_env={"PATH": "/bin"},
    )


def test_cpu_uses_the_api_server_module_and_profile_fields(tmp_path: Path) -> None:
    cmd = command_for(tmp_path, engine={"args": ["--enforce-eager", "--max-model-len=1024"], "port": 8123})
    assert cmd.argv[:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd.argv[cmd.argv.index("--model") + 1] == str(tmp_path / "model")
    assert cmd.argv[cmd.argv.index("--served-model-name") + 1] == "tiny"
    assert cmd.argv[cmd.argv.index("--port") + 1] == "8123"
    assert cmd.argv[-2:] == ["--enforce-eager", "--max-model-len=1024"]  # user args last, verbatim
    assert "--tensor-parallel-size" not in cmd.argv


def test_cuda_uses_the_cli_with_tp_and_device_mask(tmp_path: Path) -> None:
    cmd = command_for(tmp_path, platform="cuda", devices=[0, 2], tp=2)
    assert cmd.argv[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    assert cmd.argv[cmd.argv.index("--tensor-parallel-size") + 1] == "2"
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "0,2"


def test_xpu_masks_with_level_zero_and_oneapi_selector(tmp_path: Path) -> None:
    cmd = command_for(tmp_path, platform="xpu", devices=[0, 1], tp=2)
    assert cmd.env["ZE_AFFINITY_MASK"] == "0,1"
    assert cmd.env["ONEAPI_DEVICE_SELECTOR"] == "level_zero:0,1"


def test_environment_is_offline_private_and_profile_wins(tmp_path: Path) -> None:
    cmd = command_for(tmp_path, engine={"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "0"}})
    assert cmd.env["PATH"] == "/bin"
    assert cmd.env["TMPDIR"] == cmd.env["VLLM_RPC_BASE_PATH"] == str(tmp_path / "rt")
    assert cmd.env["VLLM_NO_USAGE_STATS"] == "1"
    assert cmd.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert cmd.env["HF_HUB_OFFLINE"] == "0"  # the profile is explicit; it wins
    assert cmd.cwd == tmp_path / "rt"


def test_speculative_config_is_passed_as_json(tmp_path: Path) -> None:
    cmd = command_for(tmp_path, speculative={"method": "mtp", "num_speculative_tokens": 3})
    spec = json.loads(cmd.argv[cmd.argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": 3}


@pytest.mark.parametrize("arg", ["--port=9000", "--host", "--model", "-tp", "--speculative-config={}"])
def test_args_warden_owns_are_refused_with_the_field_to_use(tmp_path: Path, arg: str) -> None:
    with pytest.raises(UserError, match=r"engine\.args sets") as raised:
        command_for(tmp_path, engine={"args": [arg]})
    assert "instead" in raised.value.remedy


def test_replayssm_turns_the_plugin_on_with_the_guards_ring(tmp_path: Path) -> None:
    spec = {"method": "mtp", "num_speculative_tokens": 3}
    off = command_for(tmp_path, speculative=spec)
    assert not any(name.startswith("WARDEN_GDN_REPLAYSSM") for name in off.env)
    default = command_for(tmp_path, speculative=spec, replayssm={"enabled": True})
    assert default.env["WARDEN_GDN_REPLAYSSM"] == "1"
    assert default.env["WARDEN_GDN_REPLAYSSM_RING_LEN"] == "64"  # default_ring_len(1 + 3): no batch cap known
    explicit = command_for(tmp_path, speculative=spec, replayssm={"enabled": True, "ring_len": 16})
    assert explicit.env["WARDEN_GDN_REPLAYSSM_RING_LEN"] == "16"
    data = {"name": "t", "model": {"path": "model"}, "speculative": spec, "replayssm": {"enabled": True}}
    loaded = parse_profile(data, tmp_path / "p.yaml")
    resolved = build_engine_command(loaded, platform="cpu", devices=None, tensor_parallel=1, runtime_dir=tmp_path,
                                    base_env={}, replayssm_ring_len=32)  # fmt: skip
    assert resolved.env["WARDEN_GDN_REPLAYSSM_RING_LEN"] == "32"  # the guard's (it read --max-num-seqs)
    assert "WARDEN_GDN_REPLAYSSM_SHADOW" not in resolved.env
    shadow = command_for(tmp_path, speculative=spec, replayssm={"enabled": True, "shadow_check": True})
    assert shadow.env["WARDEN_GDN_REPLAYSSM_SHADOW"] == "1"


def test_the_plugin_reads_the_switches_warden_writes() -> None:
    from gdn_replayssm import vllm_plugin

    from service.supervisor import engine_command

    written = (engine_command.REPLAYSSM_ENV, engine_command.REPLAYSSM_RING_LEN_ENV, engine_command.REPLAYSSM_SHADOW_ENV,
               engine_command.VLLM_FIXES_ENV)  # fmt: skip
    read = (vllm_plugin.ENABLE_ENV, vllm_plugin.RING_LEN_ENV, vllm_plugin.SHADOW_ENV, vllm_plugin.FIXES_ENV)
    assert read == written
    assert vllm_plugin.ring_len_from_env({vllm_plugin.RING_LEN_ENV: "32"}) == 32
    with pytest.raises(RuntimeError, match=r"WARDEN_GDN_REPLAYSSM_RING_LEN='x'.*replayssm\.ring_len"):
        vllm_plugin.ring_len_from_env({vllm_plugin.RING_LEN_ENV: "x"})


def test_the_cpu_engine_gets_warden_s_vllm_fixes_unless_the_profile_turns_them_off(tmp_path: Path) -> None:
    from gdn_replayssm import vllm_cpu_fixes

    from service.profile import CPU_VLLM_FIXES

    assert CPU_VLLM_FIXES == vllm_cpu_fixes.FIXES  # the names the identity records are the plugin's
    assert command_for(tmp_path).env["WARDEN_VLLM_CPU_FIXES"] == "1"
    assert command_for(tmp_path, platform="sim").env["WARDEN_VLLM_CPU_FIXES"] == "1"  # sim serves vLLM's CPU build
    assert "WARDEN_VLLM_CPU_FIXES" not in command_for(tmp_path, platform="cuda").env
    off = command_for(tmp_path, engine={"vllm_fixes": False, "env": {"WARDEN_VLLM_CPU_FIXES": "1"}})
    assert "WARDEN_VLLM_CPU_FIXES" not in off.env  # the profile field decides, not a variable set by hand
