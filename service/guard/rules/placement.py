"""Placement: tensor-parallel sizes the model can shard to, and only healthy, warden-chosen devices."""

from __future__ import annotations

from preflight.model_shape import tensor_parallel_problems
from service.guard.engine_args import FactUnavailable
from service.guard.facts import GuardFacts
from service.guard.rules._base import (
    ALL_PLATFORMS,
    DEVICE_PLATFORMS,
    SEED_HANDOFF,
    SEED_PLAN,
    Rule,
    Verdict,
    fail,
    ok,
    rule,
)

DEVICE_MASK_ENV = ("CUDA_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR")


@rule(
    "tp-divisibility",
    summary="the tensor-parallel size must divide the attention, KV and GDN head counts as the engine shards them",
    remedy="pick a tensor_parallel size that divides the head counts (for Qwen3.6-35B-A3B: 1, 2, 4, 8 or 16)",
    evidence=f'{SEED_HANDOFF}: "TP3 is incompatible with this model, and TP2 is the only healthy exact topology '
    'available"; vLLM splits query heads and GDN key/value heads across ranks and replicates KV heads only when '
    "the rank count is a multiple of them (preflight.model_shape.tensor_parallel_problems)",
    platforms=ALL_PLATFORMS,
)
def tp_divisibility(facts: GuardFacts) -> Verdict:
    tp = facts.tensor_parallel
    if tp is None:
        return ok("tensor_parallel: auto; placement picks a valid size")
    problems = tensor_parallel_problems(facts.model.require(), tp)
    if problems:
        return fail(f"TP{tp} cannot shard {facts.model.reference}: " + "; ".join(problems))
    return ok(f"TP{tp} shards every head group evenly")


@rule(
    "tp-device-count",
    summary="the tensor-parallel size cannot exceed the devices listed",
    remedy="list at least tensor_parallel devices, or lower tensor_parallel",
    evidence="vLLM starts one tensor-parallel rank per visible device; with fewer devices than ranks the engine "
    "fails at startup after loading for minutes",
    platforms=DEVICE_PLATFORMS,
)
def tp_device_count(facts: GuardFacts) -> Verdict:
    if facts.devices is None or facts.tensor_parallel is None:
        return ok("devices or tensor_parallel is auto")
    if facts.tensor_parallel > len(facts.devices):
        return fail(
            f"tensor_parallel {facts.tensor_parallel} needs {facts.tensor_parallel} devices, but devices lists "
            f"{len(facts.devices)}: {list(facts.devices)}"
        )
    return ok(f"TP{facts.tensor_parallel} on {len(facts.devices)} devices")


@rule(
    "unhealthy-device-selected",
    summary="no device that preflight quarantined may be selected",
    remedy="drop the quarantined devices from `devices` (or use devices: auto), or repair and re-run preflight",
    evidence=f'{SEED_HANDOFF}: "Keep TP4 blocked until device 3 XPU/XCCL health is repaired externally"; '
    f'{SEED_PLAN}: "The repeated device-3 driver wedges (from device-lost capture crashes) cost a reboot each time"',
    platforms=DEVICE_PLATFORMS,
)
def unhealthy_device_selected(facts: GuardFacts) -> Verdict:
    if facts.quarantined is None:
        raise FactUnavailable("no device health was given to the guard (preflight's quarantine)")
    if facts.devices is None:
        return ok("devices: auto; placement chooses among healthy devices")
    bad = sorted(set(facts.devices) & set(facts.quarantined))
    if bad:
        details = "; ".join(f"device {d}: {facts.quarantined[d]}" for d in bad)
        return fail(f"devices {list(facts.devices)} include quarantined devices ({details})")
    return ok(f"devices {list(facts.devices)} are not quarantined")


@rule(
    "device-mask-in-engine-env",
    summary="device masks come from `devices` and placement, never from engine.env",
    remedy="remove the mask from engine.env and list the devices in the profile's `devices`",
    evidence=f'{SEED_HANDOFF}: healthy-subset runs pinned "ONEAPI_DEVICE_SELECTOR=level_zero:0,1" and '
    '"ZE_AFFINITY_MASK=0,1" by hand to avoid device 3; warden derives both from `devices`, and engine.env is '
    "applied after them, so a mask there would silently override placement",
    platforms=DEVICE_PLATFORMS,
)
def device_mask_in_engine_env(facts: GuardFacts) -> Verdict:
    names = [n for n in DEVICE_MASK_ENV if n in facts.profile_env]
    if names:
        spelled = ", ".join(f"{n}={facts.profile_env[n]}" for n in names)
        return fail(f"engine.env sets {spelled}, which would override the devices warden places the engine on")
    return ok("no device mask in engine.env")


RULES: tuple[Rule, ...] = (tp_divisibility, tp_device_count, unhealthy_device_selected, device_mask_in_engine_env)
