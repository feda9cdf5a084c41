"""The one normalized view of a profile that every guard rule reads.

Built from a `LoadedProfile` plus what the caller knows at the time: where the run is placed
(platform, devices, tensor-parallel size) and which devices preflight has quarantined. The guard
reads no preflight state itself, and building facts never raises: what cannot be read is recorded
as missing, and rules that need it report `unknown`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preflight.model_shape import ModelShape, ModelShapeError, read_tensor_names, shape_from_config
from preflight.platforms import ConcretePlatform, resolve_platform
from service.guard.engine_args import EngineArgsFacts, FactUnavailable, normalize_engine_args
from service.profile import LoadedProfile, Profile, engine_fixes, profile_ring_len

# Environment variables that can change what the engine computes or how fast: these prefixes are
# the run identity's, and the guard's env rules only ever look at names with them.
RELEVANT_ENV_PREFIXES = ("VLLM_", "XPU_", "CCL_", "NCCL_", "ZE_", "ONEAPI_", "FLA_", "TORCH_", "CUDA_", "WARDEN_")

ArgParser = Callable[[Sequence[str]], EngineArgsFacts]


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: the form every hash in the guard is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ModelFacts:
    """A model folder as config.json and its weight index describe it."""

    reference: str  # as the profile writes it
    path: str | None  # the resolved folder, when it exists locally
    config: Mapping[str, Any] | None = None
    shape: ModelShape | None = None
    config_sha256: str | None = None  # over config.json's canonical JSON: formatting does not count
    weight_index_sha256: str | None = None
    error: str | None = None

    def require(self) -> ModelShape:
        if self.shape is None:
            raise FactUnavailable(f"model facts for {self.reference} are unavailable: {self.error}")
        return self.shape

    @property
    def text_config(self) -> Mapping[str, Any]:
        config = self.config or {}
        nested = config.get("text_config")
        return {**config, **nested} if isinstance(nested, dict) else config


def _weight_index_sha256(model_dir: Path) -> str | None:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return sha256_json(json.loads(index.read_text(encoding="utf-8")))
    names = read_tensor_names(model_dir)
    return None if names is None else sha256_json(list(names))


def read_model_facts(model_dir: Path, reference: str | None = None) -> ModelFacts:
    """Never raises: an unreadable folder gives facts with `error` set."""
    ref = reference if reference is not None else str(model_dir)
    if not model_dir.is_dir():
        return ModelFacts(reference=ref, path=None, error=f"{model_dir} is not a folder on this host")
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ModelFacts(reference=ref, path=str(model_dir), error=f"{model_dir} has no config.json")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return ModelFacts(reference=ref, path=str(model_dir), error=f"{config_path} cannot be read: {error}")
    if not isinstance(config, dict):
        return ModelFacts(reference=ref, path=str(model_dir), error=f"{config_path} is not a JSON object")
    try:
        config_sha = sha256_json(config)
    except ValueError as error:  # NaN or infinity in config.json
        return ModelFacts(reference=ref, path=str(model_dir), config=config, error=f"{config_path}: {error}")
    try:
        index_sha = _weight_index_sha256(model_dir)
        shape = shape_from_config(config, read_tensor_names(model_dir))
    except (ModelShapeError, OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return ModelFacts(reference=ref, path=str(model_dir), config=config, config_sha256=config_sha, error=str(error))
    return ModelFacts(
        reference=ref,
        path=str(model_dir),
        config=config,
        shape=shape,
        config_sha256=config_sha,
        weight_index_sha256=index_sha,
    )


@dataclass(frozen=True)
class Placement:
    """Where the caller will run the engine: the concrete platform, the devices chosen (None:
    leave the device mask alone) and the tensor-parallel size."""

    platform: ConcretePlatform
    devices: tuple[int, ...] | None
    tensor_parallel: int


@dataclass(frozen=True)
class GuardFacts:
    profile_name: str
    platform: ConcretePlatform
    model: ModelFacts
    engine_args: EngineArgsFacts
    engine_env: Mapping[str, str]  # what the engine will see: relevant inherited variables + engine.env
    profile_env: Mapping[str, str]  # engine.env as the profile writes it
    speculative: Mapping[str, Any] | None
    draft: ModelFacts | None  # speculative.model, when one is named
    replayssm_enabled: bool
    replayssm_ring_len: int  # as the profile sets it, else default_ring_len of the verify window
    devices: tuple[int, ...] | None  # None: "auto", chosen later by placement
    tensor_parallel: int | None  # None: "auto", chosen later by placement
    quarantined: Mapping[int, str] | None  # device -> why; None: no health data given
    canary_prompt: str = ""
    waivers: Mapping[str, str] = field(default_factory=dict)
    replayssm_shadow_check: bool = False  # vLLM's verify run beside ReplaySSM (a diagnostic; slower)
    vllm_fixes: tuple[str, ...] = ()  # warden's fixes for vLLM bugs the engine gets (service.profile.engine_fixes)


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(RELEVANT_ENV_PREFIXES)}


def int_value(values: Mapping[str, Any] | None, key: str) -> int | None:
    """`values[key]` when it is an integer (not a bool, which Python counts as one), else None."""
    value = values.get(key) if values is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ring_len(profile: Profile, engine_args: EngineArgsFacts) -> int:
    """`replayssm.ring_len`, or when the profile leaves it out the measured default for its verify window and,
    where `engine.args` caps the batch (`--max-num-seqs`), for that batch."""
    max_seqs = int_value(engine_args.values, "max_num_seqs") if engine_args.status == "parsed" else None
    return profile_ring_len(profile, max_seqs if max_seqs is not None and max_seqs >= 1 else None)


def build_facts(
    loaded: LoadedProfile,
    *,
    placement: Placement | None = None,
    quarantined: Mapping[int, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    parse_args: ArgParser | None = None,
) -> GuardFacts:
    """The guard's view of `loaded`.

    `base_env` is the environment the engine inherits (default: this process's); only variables
    with `RELEVANT_ENV_PREFIXES` are kept. `parse_args` replaces vLLM's parser (tests).
    """
    profile = loaded.profile
    if placement is not None:
        platform: ConcretePlatform = placement.platform
        devices = placement.devices
        tensor_parallel: int | None = placement.tensor_parallel
    else:
        platform = resolve_platform(profile.platform)
        devices = tuple(profile.devices) if isinstance(profile.devices, list) else None
        tensor_parallel = profile.tensor_parallel if isinstance(profile.tensor_parallel, int) else None
    speculative = profile.speculative.model_dump(exclude_none=True) if profile.speculative is not None else None
    draft = None
    if speculative is not None and isinstance(speculative.get("model"), str) and speculative["model"]:
        draft = read_model_facts(loaded.resolve(speculative["model"]), reference=speculative["model"])
    parser = parse_args if parse_args is not None else normalize_engine_args
    inherited = relevant_env(os.environ if base_env is None else base_env)
    engine_args = parser(profile.engine.args)
    return GuardFacts(
        profile_name=profile.name,
        platform=platform,
        model=read_model_facts(loaded.model_dir, reference=profile.model.path),
        engine_args=engine_args,
        engine_env={**inherited, **profile.engine.env},
        profile_env=dict(profile.engine.env),
        speculative=speculative,
        draft=draft,
        replayssm_enabled=profile.replayssm.enabled,
        replayssm_ring_len=_ring_len(profile, engine_args),
        devices=devices,
        tensor_parallel=tensor_parallel,
        quarantined=None if quarantined is None else dict(quarantined),
        canary_prompt=profile.supervisor.canary_prompt,
        waivers=dict(profile.guard.waive),
        replayssm_shadow_check=profile.replayssm.shadow_check,
        vllm_fixes=engine_fixes(profile, platform),
    )
