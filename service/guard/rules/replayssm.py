"""ReplaySSM: the ring invariants and where GDN ReplaySSM can apply at all."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from service.guard.facts import GuardFacts, int_value
from service.guard.rules._base import (
    REPLAYSSM_NOTES,
    SEED_PLAN,
    Rule,
    Verdict,
    fail,
    ok,
    prefix_caching,
    rule,
    spec_method,
    spec_tokens,
)

ENV_PREFIX = "WARDEN_GDN_REPLAYSSM"
# The longest ring spec verify takes: the window kernel holds every committed record in one tile
# (gdn_replayssm._window.MAX_HISTORY_BLOCK; a test keeps the two equal).
MAX_VERIFY_RING_LEN = 128
# Keys that make a draft a tree instead of one linear chain (vLLM's tree attention config and the
# EAGLE top-k spellings of vLLM and SGLang).
_TOPK_KEYS = ("speculative_eagle_topk", "eagle_topk", "num_speculative_candidates")


@rule(
    "replayssm-ring-too-short",
    summary="the ReplaySSM ring must hold two verify windows and be a power of two",
    remedy="set replayssm.ring_len to a power of two >= 2*(1+num_speculative_tokens), or leave it out for the "
    "measured default (32, 64 or 128 by the verify window)",
    evidence=f"{SEED_PLAN}: \"match upstream's early-flush invariant (max_cache_len >= 2 * max_spec_len) exactly "
    f"(overflow -> uninitialized logit -> desync; this is the edge that bit codex v2)\"; {REPLAYSSM_NOTES}: SGLang's "
    'spec kernel requires "max_cache_len is a power of two" and flushes early at wp + 2T > ring_len',
)
def replayssm_ring_too_short(facts: GuardFacts) -> Verdict:
    if not facts.replayssm_enabled:
        return ok("ReplaySSM is off")
    k = spec_tokens(facts)
    window = 1 + k
    need = 2 * window
    ring = facts.replayssm_ring_len
    problems = []
    if ring < need:
        problems.append(f"is shorter than 2*(1 + num_speculative_tokens) = 2*(1 + {k}) = {need}")
    if ring < 1 or ring & (ring - 1):
        problems.append("is not a power of two")
    if problems:
        return fail(
            f"replayssm.ring_len={ring} " + " and ".join(problems) + ": a verify window would overflow the ring "
            "and feed the sampler an uninitialized logit"
        )
    return ok(f"ring_len={ring} >= {need}, a power of two")


@rule(
    "replayssm-ring-too-long",
    summary=f"with speculative decoding the ReplaySSM ring holds at most {MAX_VERIFY_RING_LEN} records",
    remedy=f"set replayssm.ring_len between 2*(1+num_speculative_tokens) and {MAX_VERIFY_RING_LEN}, or leave it out "
    "for the measured default (32, 64 or 128 by the verify window)",
    evidence="kernels/gdn_replayssm/_window.py: the spec-verify kernel holds the whole committed history in one "
    f"tile of up to {MAX_VERIFY_RING_LEN} rows, and replayssm_verify raises ValueError for a longer ring, i.e. "
    "the engine would fail at its first verify step, not at startup",
)
def replayssm_ring_too_long(facts: GuardFacts) -> Verdict:
    if not facts.replayssm_enabled or facts.speculative is None:
        return ok("no ReplaySSM spec verify")
    ring = facts.replayssm_ring_len
    if ring > MAX_VERIFY_RING_LEN:
        return fail(
            f"replayssm.ring_len={ring} with {spec_method(facts)} speculation: spec verify takes rings of at most "
            f"{MAX_VERIFY_RING_LEN} records, so the first verify step would fail"
        )
    return ok(f"ring_len={ring} <= {MAX_VERIFY_RING_LEN}")


def _tree_reason(spec: Mapping[str, Any]) -> str | None:
    for key in _TOPK_KEYS:
        value = int_value(spec, key)
        if value is not None and value > 1:
            return f"speculative.{key}={value}"
    tree = spec.get("speculative_token_tree")
    if tree is None:
        return None
    nodes: Any = tree
    if isinstance(tree, str):
        try:
            nodes = ast.literal_eval(tree)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return f"speculative.speculative_token_tree={tree!r} (not a readable chain)"
    if isinstance(nodes, list | tuple) and all(
        isinstance(node, list | tuple) and all(step == 0 for step in node) for node in nodes
    ):
        return None  # every node is (0,), (0, 0), ...: a single chain
    return f"speculative.speculative_token_tree={tree!r}"


@rule(
    "replayssm-tree-spec",
    summary="ReplaySSM verifies one linear chain of drafts, not a tree",
    remedy="use chain speculation (top-k 1, no token tree) with ReplaySSM",
    evidence=f"{REPLAYSSM_NOTES}: SGLang's GDN ReplaySSM spec path is \"GDN only; linear chain only "
    '(speculative_eagle_topk <= 1)"; the ring records one window of 1+k consecutive positions',
)
def replayssm_tree_spec(facts: GuardFacts) -> Verdict:
    if not facts.replayssm_enabled or facts.speculative is None:
        return ok("no ReplaySSM speculation")
    reason = _tree_reason(facts.speculative)
    if reason is not None:
        return fail(f"{reason} asks for tree speculation with method {spec_method(facts)}; ReplaySSM verifies chains")
    return ok("chain speculation")


@rule(
    "replayssm-not-hybrid",
    summary="ReplaySSM needs a model with GDN layers",
    remedy="set replayssm.enabled: false for this model",
    evidence=f"{REPLAYSSM_NOTES}: the plugin overrides QwenGatedDeltaNetAttention (the GDN layer) and the GDN "
    "attention backend; a model without linear_attention layers has nothing for it to replace",
)
def replayssm_not_hybrid(facts: GuardFacts) -> Verdict:
    if not facts.replayssm_enabled:
        return ok("ReplaySSM is off")
    shape = facts.model.require()
    if shape.is_hybrid_gdn:
        return ok(f"{shape.gdn_layers} GDN layers")
    return fail(
        f"replayssm.enabled, but {facts.model.reference} has no GDN (linear_attention) layers among its "
        f"{shape.num_hidden_layers}"
    )


@rule(
    "replayssm-env-in-engine-env",
    summary="ReplaySSM is configured by the profile's replayssm section, not engine.env",
    remedy=f"remove {ENV_PREFIX}* from engine.env and set replayssm.enabled / replayssm.ring_len",
    evidence="kernels/gdn_replayssm/vllm_plugin.py: the plugin acts on WARDEN_GDN_REPLAYSSM=1; setting it by hand "
    "bypasses the ring checks above and makes two sources of truth",
)
def replayssm_env_in_engine_env(facts: GuardFacts) -> Verdict:
    names = sorted(n for n in facts.profile_env if n.startswith(ENV_PREFIX))
    if names:
        return fail(f"engine.env sets {', '.join(names)}; the replayssm section is the one source of truth")
    return ok(f"no {ENV_PREFIX}* in engine.env")


@rule(
    "replayssm-layer-swap-not-built",
    summary="this build plugs GDN ReplaySSM into vLLM's CPU build only",
    remedy="set replayssm.enabled: false on this platform, or serve with platform: cpu",
    evidence="kernels/gdn_replayssm/vllm_plugin.py: register() installs ReplaySSM on the CPU build's GDN decode and "
    "spec verify (kernels/gdn_replayssm/vllm_cpu_hooks.py) and raises on any other platform: the CUDA/XPU layer swap "
    "onto the Triton kernels (research/replayssm.md section 6.2) is not built, so the engine would die at start-up",
    platforms=("cuda", "xpu", "sim"),
)
def replayssm_layer_swap_not_built(facts: GuardFacts) -> Verdict:
    if not facts.replayssm_enabled:
        return ok("ReplaySSM is off")
    return fail(
        f"replayssm.enabled on platform {facts.platform}: the GDN layer swap onto the ReplaySSM kernels exists for "
        "vLLM's CPU build only"
    )


@rule(
    "replayssm-prefix-caching",
    summary="ReplaySSM on the CPU build needs --no-enable-prefix-caching",
    remedy="add --no-enable-prefix-caching to engine.args",
    evidence="kernels/gdn_replayssm/vllm_cpu.py: a request's state is its checkpoint (block column 0) plus the records "
    "in its ring, and only the checkpoint lives in vLLM's blocks; vLLM's prefix cache saves and copies GDN state "
    "blocks without going through the GDN ops the plugin replaces, so a cache hit would resume from a checkpoint "
    "without its records (research/replayssm.md 6.6: merged Mamba2 ReplaySSM forces a flush at align-mode block "
    "boundaries for the same reason)",
    platforms=("cpu",),
)
def replayssm_prefix_caching(facts: GuardFacts) -> Verdict:
    if not facts.replayssm_enabled:
        return ok("ReplaySSM is off")
    how = prefix_caching(facts)
    if how is None:
        return ok("--no-enable-prefix-caching")
    return fail(f"replayssm.enabled with prefix caching {how}: a prefix-cache hit would lose the ring's records")


RULES: tuple[Rule, ...] = (
    replayssm_layer_swap_not_built,
    replayssm_prefix_caching,
    replayssm_ring_too_short,
    replayssm_ring_too_long,
    replayssm_tree_spec,
    replayssm_not_hybrid,
    replayssm_env_in_engine_env,
)
