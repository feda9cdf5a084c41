"""The engine's inputs as a whole: a readable model, arguments vLLM accepts, warden's own flags, memory."""

from __future__ import annotations

import math

from service.guard.engine_args import FactUnavailable
from service.guard.facts import GuardFacts
from service.guard.rules._base import (
    SEED_HANDOFF,
    VLLM,
    Rule,
    Verdict,
    args,
    fail,
    ok,
    rule,
)
from service.supervisor.engine_command import OWNED_ARGS

# Parsed option names (vLLM dest form) that warden sets from dedicated profile fields.
OWNED_DESTS = {
    "model": "model.path",
    "served_model_name": "model.served_name",
    "host": "engine.host",
    "port": "engine.port",
    "tensor_parallel_size": "tensor_parallel",
    "speculative_config": "speculative",
    "spec_method": "speculative",
    "spec_model": "speculative",
    "spec_tokens": "speculative",
}


@rule(
    "model-unreadable",
    summary="the model folder must have a readable config.json",
    remedy="point model.path at the checkpoint folder (relative paths resolve against the profile's folder)",
    evidence="every model rule (TP divisibility, MTP weights, GDN layers) reads config.json and the weight index; "
    "an unreadable model cannot be vouched for, and vLLM fails on it after launch",
)
def model_unreadable(facts: GuardFacts) -> Verdict:
    if facts.model.shape is None:
        return fail(f"model {facts.model.reference}: {facts.model.error}")
    return ok(f"{facts.model.path}: {facts.model.shape.num_hidden_layers} layers")


@rule(
    "engine-args-invalid",
    summary="vLLM's own argument parser must accept engine.args",
    remedy="fix the argument vLLM names; boolean flags take no value (--enforce-eager, --no-async-scheduling)",
    evidence=f"{VLLM} parses these arguments with FlexibleArgumentParser at launch and exits on any it rejects; "
    "checking them here refuses before a device is touched",
)
def engine_args_invalid(facts: GuardFacts) -> Verdict:
    parsed = facts.engine_args
    if parsed.status == "invalid":
        return fail(f"vLLM rejects engine.args {list(parsed.raw)}: {parsed.error}")
    if parsed.status == "unavailable":
        raise FactUnavailable(f"engine.args could not be parsed: {parsed.error}")
    return ok(f"{len(parsed.values)} settings differ from vLLM's defaults")


@rule(
    "engine-args-owned",
    summary="engine.args must not set what warden sets from the profile (model, host, port, TP, speculation)",
    remedy="remove the flag from engine.args and set the profile field named in the reason",
    evidence="service/supervisor/engine_command.py sets --model, --served-model-name, --host, --port, "
    "--tensor-parallel-size and --speculative-config from dedicated profile fields; a second spelling in "
    "engine.args would make two sources of truth",
)
def engine_args_owned(facts: GuardFacts) -> Verdict:
    written = sorted({a.split("=", 1)[0] for a in facts.engine_args.raw} & set(OWNED_ARGS))
    found = {flag: OWNED_ARGS[flag] for flag in written}
    if facts.engine_args.status == "parsed":
        for dest, field in OWNED_DESTS.items():
            if dest in facts.engine_args.values:
                found[f"--{dest.replace('_', '-')}"] = field
    elif not found:
        args(facts)  # raises: without a parse only literal spellings could be checked
    if found:
        listed = "; ".join(f"{flag} (set `{field}` instead)" for flag, field in sorted(found.items()))
        return fail(f"engine.args sets options warden owns: {listed}")
    return ok("no warden-owned options in engine.args")


@rule(
    "gpu-memory-utilization-range",
    summary="--gpu-memory-utilization must be a fraction in (0, 1]",
    remedy="set --gpu-memory-utilization to a fraction such as 0.90 (the lab's identities)",
    evidence=f"{VLLM} CacheConfig declares gpu_memory_utilization with gt=0, le=1 but validates it only when the "
    f"engine builds its config, after launch; {SEED_HANDOFF} identities use GPU_MEMORY_UTILIZATION=0.90",
)
def gpu_memory_utilization_range(facts: GuardFacts) -> Verdict:
    value = args(facts).get("gpu_memory_utilization")
    if value is None:
        return ok("vLLM's default (0.92)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return fail(f"--gpu-memory-utilization {value!r} is not a finite number")
    if not 0 < value <= 1:
        return fail(f"--gpu-memory-utilization {value} is outside (0, 1]: it is a fraction of device memory")
    return ok(f"--gpu-memory-utilization {value}")


@rule(
    "gpu-memory-utilization-unset",
    summary="XPU identities name their memory fraction explicitly",
    remedy="add --gpu-memory-utilization=0.90 to engine.args",
    evidence=f'{SEED_HANDOFF}: the safe fast identity\'s core settings include "GPU_MEMORY_UTILIZATION=0.90"; '
    f"{VLLM}'s default is 0.92",
    platforms=("xpu",),
    severity="warn",
)
def gpu_memory_utilization_unset(facts: GuardFacts) -> Verdict:
    values = args(facts)
    if values.get("gpu_memory_utilization") is None and values.get("kv_cache_memory_bytes") is None:
        return fail("neither --gpu-memory-utilization nor --kv-cache-memory-bytes is set: vLLM's 0.92 applies")
    return ok("memory budget set explicitly")


RULES: tuple[Rule, ...] = (
    model_unreadable,
    engine_args_invalid,
    engine_args_owned,
    gpu_memory_utilization_range,
    gpu_memory_utilization_unset,
)
