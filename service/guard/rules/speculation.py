"""Speculative decoding: drafts that measure nothing, verifiers that diverge, speed traps."""

from __future__ import annotations

import re

from service.guard.engine_args import FactUnavailable
from service.guard.facts import GuardFacts, ModelFacts
from service.guard.rules._base import (
    GPU_PLATFORMS,
    SEED_HANDOFF,
    SEED_PLAN,
    VLLM,
    Rule,
    Verdict,
    args,
    capture_mode,
    compilation,
    fail,
    hybrid_gdn,
    is_mtp,
    is_ngram,
    ok,
    rule,
    spec_method,
    spec_tokens,
)

_MTP_EXPERT = re.compile(r"^(?:model\.)?mtp\.layers\.\d+\.mlp\.experts\.(\d+)\.")


def _mtp_source(facts: GuardFacts) -> ModelFacts:
    """Where MTP weights come from: the named draft, else the target checkpoint itself."""
    return facts.draft if facts.draft is not None else facts.model


@rule(
    "spec-gdn-without-replayssm",
    summary="speculative decoding on a hybrid GDN model needs ReplaySSM verification",
    remedy="set replayssm.enabled: true (with ring_len >= 2*(1+num_speculative_tokens)), or drop speculative",
    evidence=f'{SEED_PLAN}: "spec-decode verifier diverges from no-spec. -> Fixed by porting ReplaySSM"; '
    f'{SEED_HANDOFF}: "At k=1 PIECEWISE both json- and color-canary FAILED (the verifier bonus-row GDN '
    'recurrent/conv state divergence ... is not fixed)"',
    platforms=GPU_PLATFORMS,
    overrides={"cuda": "warn"},
)
def spec_gdn_without_replayssm(facts: GuardFacts) -> Verdict:
    method = spec_method(facts)
    if method is None:
        return ok("no speculative decoding")
    if facts.replayssm_enabled:
        return ok("ReplaySSM verifies the drafts")
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    gdn = facts.model.require().gdn_layers
    return fail(
        f"speculative.method {method} (k={spec_tokens(facts)}) on a model with {gdn} GDN layers without "
        "ReplaySSM: the native verifier's GDN state diverged from no-spec output in the lab"
    )


@rule(
    "mtp-weights-missing",
    summary="an MTP method needs a checkpoint that actually has mtp.* weights",
    remedy="point model.path (or speculative.model) at a checkpoint with an MTP head, e.g. the Quark INT8 + "
    "FP8 MTP hybrid; or use another speculative method",
    evidence=f'{SEED_HANDOFF}, 2026-06-17: "the Quark INT8 checkpoint has 0 mtp.* weights"; serving that path '
    'with MTP ran a "random/uninitialized MTP head -> 0% acceptance"',
)
def mtp_weights_missing(facts: GuardFacts) -> Verdict:
    method = spec_method(facts)
    if not is_mtp(method):
        return ok("no MTP speculation")
    source = _mtp_source(facts)
    shape = source.require()
    count = shape.mtp_tensor_count
    if count is None:
        raise FactUnavailable(
            f"{source.reference} has neither model.safetensors.index.json nor model.safetensors: mtp.* tensors "
            "cannot be counted"
        )
    if count == 0:
        return fail(
            f"speculative.method {method} reads its MTP head from {source.reference}, whose weights list 0 mtp.* "
            f"tensors (config mtp_num_hidden_layers={shape.mtp_num_hidden_layers}): the head would be "
            "uninitialized and accept 0 % of drafts"
        )
    if shape.mtp_num_hidden_layers == 0:
        return fail(
            f"{source.reference} lists {count} mtp.* tensors but its config says mtp_num_hidden_layers=0, "
            "so no MTP layer would load them"
        )
    return ok(f"{count} mtp.* tensors in {source.reference}")


def _is_dflash(model: ModelFacts) -> bool | None:
    config = model.config
    if config is None:
        return True if "dflash" in model.reference.lower() else None
    architectures = config.get("architectures") or []
    names = [str(a).lower() for a in architectures] if isinstance(architectures, list) else []
    model_type = str(model.text_config.get("model_type", "")).lower()
    return any("dflash" in n for n in names) or "dflash_config" in config or "dflash" in model_type


def _architectures(model: ModelFacts) -> str:
    config = model.config or {}
    return ", ".join(str(a) for a in config.get("architectures") or []) or "no architectures"


@rule(
    "dflash-method-mismatch",
    summary="a DFlash draft runs only with method: dflash, and method dflash needs a DFlash draft",
    remedy="set speculative.method: dflash for a DFlash draft (e.g. z-lab/Qwen3.6-35B-A3B-DFlash), or name a "
    "DFlash draft in speculative.model",
    evidence=f'{SEED_PLAN}: "z-lab/Qwen3.6-35B-A3B-DFlash (use with method:dflash, not mtp - a prior attempt '
    f'mis-used it)"; {VLLM} registers DFlash drafts as DFlashDraftModel (model registry) and detects them by '
    '"dflash" in the draft name',
)
def dflash_method_mismatch(facts: GuardFacts) -> Verdict:
    method = spec_method(facts)
    if method is None:
        return ok("no speculative decoding")
    draft = facts.draft
    if method == "dflash":
        if draft is None:
            return fail("speculative.method dflash names no draft in speculative.model")
        is_dflash = _is_dflash(draft)
        if is_dflash is None:
            raise FactUnavailable(f"the draft {draft.reference} cannot be read here to confirm it is a DFlash model")
        if not is_dflash:
            return fail(
                f"speculative.method dflash, but the draft {draft.reference} is not a DFlash model "
                f"({_architectures(draft)})"
            )
        return ok(f"DFlash draft {draft.reference}")
    if draft is not None and _is_dflash(draft) is True:
        return fail(
            f"the draft {draft.reference} is a DFlash model ({_architectures(draft)}) but speculative.method is "
            f"{method}: it measures nothing useful unless run as method dflash"
        )
    return ok(f"method {method} without a DFlash draft")


@rule(
    "spec-capture-size-unset",
    summary="speculative runs should set the capture size explicitly (the lab's cg128)",
    remedy="add max_cudagraph_capture_size to the compilation config, e.g. "
    '--compilation-config=\'{"cudagraph_mode":"PIECEWISE","max_cudagraph_capture_size":128}\'',
    evidence=f'{SEED_HANDOFF}, 2026-06-17 MTP addendum: "always set PIECEWISE+cg128 for valid spec-decode speed"; '
    'the n-gram run used {"cudagraph_mode":"PIECEWISE","max_cudagraph_capture_size":128}',
    platforms=GPU_PLATFORMS,
    severity="warn",
)
def spec_capture_size_unset(facts: GuardFacts) -> Verdict:
    if facts.speculative is None:
        return ok("no speculative decoding")
    values = args(facts)
    mode = capture_mode(values)
    if not mode.captured:
        return ok(f"nothing is captured ({mode.how})")
    config = compilation(values)
    for name in ("max_cudagraph_capture_size", "cudagraph_capture_sizes"):
        if config.get(name) is not None:
            return ok(f"{name}={config[name]}")
    return fail(
        f"speculative decoding with {mode.how} but no max_cudagraph_capture_size or cudagraph_capture_sizes: "
        "verify batches of 1+k tokens per request fall back to the default capture sizes"
    )


@rule(
    "ngram-spec-general-prompts",
    summary="n-gram speculation only pays on repetitive prompts",
    remedy="use a learned draft (MTP, EAGLE, DFlash) for general traffic; keep ngram for high-reuse workloads",
    evidence=f'{SEED_HANDOFF}, 2026-06-17: "n-gram spec decode is NOT a reliable path ... It regresses speed on '
    'general prompts (low acceptance) and is nondeterministic (json canary)"',
    platforms=GPU_PLATFORMS,
    severity="warn",
)
def ngram_spec_general_prompts(facts: GuardFacts) -> Verdict:
    method = spec_method(facts)
    if is_ngram(method):
        return fail(f"speculative.method {method}: near-zero acceptance on general prompts made it slower")
    return ok("no n-gram speculation")


@rule(
    "mtp-draft-full-moe",
    summary="an MTP head that is a full MoE layer costs about one target forward per draft token",
    remedy="expect MTP to be slower than no-spec here; a light EAGLE-style draft is the lever",
    evidence=f'{SEED_HANDOFF}, 2026-06-17: "The MTP head is a FULL MoE layer (256 experts, '
    "mtp.layers.0.mlp.experts.*), nearly as expensive as a target forward. Measured at k=1 PIECEWISE cg128: "
    '69.46 tok/s ... SLOWER than the 93.55 base"',
    platforms=("xpu",),
    severity="warn",
)
def mtp_draft_full_moe(facts: GuardFacts) -> Verdict:
    method = spec_method(facts)
    if not is_mtp(method):
        return ok("no MTP speculation")
    source = _mtp_source(facts)
    names = source.require().tensor_names
    if names is None:
        raise FactUnavailable(f"{source.reference} lists no tensors")
    experts = {m.group(1) for m in (_MTP_EXPERT.match(n) for n in names) if m}
    if experts:
        return fail(
            f"the MTP head in {source.reference} is a full MoE layer with {len(experts)} experts: measured "
            "69 tok/s at k=1 against 93.55 tok/s without speculation"
        )
    return ok("the MTP head has no routed experts")


RULES: tuple[Rule, ...] = (
    spec_gdn_without_replayssm,
    mtp_weights_missing,
    dflash_method_mismatch,
    spec_capture_size_unset,
    ngram_spec_general_prompts,
    mtp_draft_full_moe,
)
