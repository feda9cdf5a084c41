"""XPU MoE and shared-expert knobs the lab measured as unsafe under capture, slower, or inert."""

from __future__ import annotations

import re

from service.guard.facts import GuardFacts
from service.guard.rules._base import (
    SEED_HANDOFF,
    Rule,
    Verdict,
    args,
    capture_mode,
    env_on,
    env_spelled,
    fail,
    flag_under_capture,
    ok,
    rule,
)

FUSED_ACT_QUANT = "VLLM_XPU_SHARED_EXPERT_FUSED_ACT_QUANT"
BOUNDARY_OUT = "VLLM_XPU_SHARED_EXPERT_BOUNDARY_OUT"
FUSED_GATE_MUL = "VLLM_XPU_SHARED_EXPERT_FUSED_GATE_MUL"
STREAM = "VLLM_XPU_SHARED_EXPERTS_STREAM"
NO_EMPTY_CACHE = "VLLM_XPU_GRAPH_NO_EMPTY_CACHE"
M8_N_GT_K = "VLLM_XPU_W8A8_GROUPED_GEMM_N_GT_K_POLICY"
GROUPED_GEMM_POLICY = re.compile(r"^VLLM_XPU_W8A8_GROUPED_GEMM\w*POLICY$")
FULL_LAYERLET = "VLLM_XPU_MOE_W8A8_FULL_LAYERLET"
DIAGNOSTIC_ENV = (
    "VLLM_XPU_EAGLE_DATA_DUMP_DIR",
    "VLLM_XPU_MOE_LIVE_ABI_FILE",
    "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET_SKIP_LAYERS",
    "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET_LAYER_REGEX",
)


@rule(
    "shared-expert-fused-act-quant-capture",
    summary="the shared-expert fused act/quant path must not run under graph capture",
    remedy=f"unset {FUSED_ACT_QUANT} in engine.env",
    evidence=f'{SEED_HANDOFF}, 2026-06-17: the color canary mismatch at repeat 6 was "NON-DETERMINISM under '
    'PIECEWISE capture replay, not a systematic error"; "fused-act-quant (kernel correct but slower + '
    'replay-nondeterministic)"',
    platforms=("xpu",),
)
def shared_expert_fused_act_quant_capture(facts: GuardFacts) -> Verdict:
    mode = flag_under_capture(facts, FUSED_ACT_QUANT)
    if isinstance(mode, Verdict):
        return mode
    return fail(
        f"{env_spelled(facts, FUSED_ACT_QUANT)} under graph capture ({mode.how}): its freshly allocated outputs "
        "made replay nondeterministic (canary diverged at repeat 6)"
    )


@rule(
    "shared-expert-boundary-out-capture",
    summary="the shared-expert `_out` boundary path must not run under graph capture",
    remedy=f"unset {BOUNDARY_OUT} (and {FUSED_GATE_MUL}, which rides inside it) in engine.env, or waive this rule "
    "for a run that deep-canaries the exact identity under PIECEWISE replay",
    evidence=f'{SEED_HANDOFF}, 2026-06-19: "Shared-Expert Fused Act/Quant _out Is Not Graph-Safe"; "promotion '
    'requires deep canaries under normal PIECEWISE replay, not only eager replay"',
    platforms=("xpu",),
)
def shared_expert_boundary_out_capture(facts: GuardFacts) -> Verdict:
    mode = flag_under_capture(facts, BOUNDARY_OUT)
    if isinstance(mode, Verdict):
        return mode
    return fail(
        f"{env_spelled(facts, BOUNDARY_OUT, FUSED_GATE_MUL)} under graph capture ({mode.how}): the shared-expert "
        "_out boundary passed shallow checks but failed deep canaries under PIECEWISE replay"
    )


@rule(
    "shared-experts-stream-without-no-empty-cache",
    summary="shared-experts aux-stream overlap under capture needs VLLM_XPU_GRAPH_NO_EMPTY_CACHE=1",
    remedy=f"unset {STREAM} (it is slower anyway), or set {NO_EMPTY_CACHE}=1",
    evidence=f'{SEED_HANDOFF}, 2026-06-17 "Attacking the Capture Constraint": capture with the aux stream failed '
    f'until "Fix added (vllm cuda_graph.py, env-gated {NO_EMPTY_CACHE}): no-op torch.xpu.empty_cache during '
    'capture for XPU", which "unblocks aux-stream graph capture"',
    platforms=("xpu",),
)
def shared_experts_stream_without_no_empty_cache(facts: GuardFacts) -> Verdict:
    mode = flag_under_capture(facts, STREAM)
    if isinstance(mode, Verdict):
        return mode
    if env_on(facts, NO_EMPTY_CACHE):
        return ok(f"{NO_EMPTY_CACHE} is on")
    return fail(
        f"{env_spelled(facts, STREAM)} under graph capture ({mode.how}) without {NO_EMPTY_CACHE}=1: "
        "torch.xpu.empty_cache during capture breaks aux-stream graph capture"
    )


@rule(
    "shared-experts-stream",
    summary="shared-experts aux-stream overlap is slower on Arc Pro B70 (measured -21 %)",
    remedy=f"unset {STREAM} in engine.env",
    evidence=f'{SEED_HANDOFF}, 2026-06-17 session summary: "shared-experts stream overlap: capture-fixable (added '
    f'{NO_EMPTY_CACHE}) but no XPU stream concurrency -> -21%"',
    platforms=("xpu",),
    severity="warn",
)
def shared_experts_stream(facts: GuardFacts) -> Verdict:
    if env_on(facts, STREAM):
        return fail(
            f"{env_spelled(facts, STREAM)}: the separate stream gives no real concurrency on this hardware; "
            "measured 21 % slower than the safe lane"
        )
    return ok(f"{STREAM} is off")


@rule(
    "grouped-gemm-m8-n-gt-k",
    summary="the grouped-GEMM m8 policy must not be selected for N > K shapes",
    remedy=f"unset {M8_N_GT_K} in engine.env",
    evidence=f'{SEED_HANDOFF}, 2026-06-18 m8 policy checks: "m8 only when N>K ... crashed before JSON flush ... '
    'rejected, unsafe"; "GEMM2-only m8 segfaulted"; addendum 6 "m8 Guard": the policy override "now '
    'ignores m8 when gemm_n > gemm_k" only after the kernels are rebuilt',
    platforms=("xpu",),
)
def grouped_gemm_m8_n_gt_k(facts: GuardFacts) -> Verdict:
    value = facts.engine_env.get(M8_N_GT_K)
    if value is not None and value.strip().lower() == "m8":
        return fail(f"{M8_N_GT_K}={value} selects the m8 grouped-GEMM policy where N > K, which segfaulted")
    return ok("no m8 policy for N > K shapes")


@rule(
    "grouped-gemm-m8-policy",
    summary="no grouped-GEMM m8 policy in a serving identity (not repeatable)",
    remedy="unset the m8 policy variable in engine.env",
    evidence=f'{SEED_HANDOFF}, 2026-06-18: "Generic m8 can reduce a single-run tail, but the improvement is not '
    'stable across repeats ... do not set any m8 policy env in accepted endpoint launchers"',
    platforms=("xpu",),
    severity="warn",
)
def grouped_gemm_m8_policy(facts: GuardFacts) -> Verdict:
    names = sorted(
        name
        for name, value in facts.engine_env.items()
        if GROUPED_GEMM_POLICY.match(name) and name != M8_N_GT_K and value.strip().lower() == "m8"
    )
    if names:
        return fail(f"{env_spelled(facts, *names)}: the m8 policy was rejected for repeatability")
    return ok("no m8 policy")


@rule(
    "full-layerlet-inactive-under-capture",
    summary="the W8A8 full MoE layerlet never engages on the PIECEWISE lane; the run measures the control",
    remedy=f"unset {FULL_LAYERLET}, or measure it on a lane where its trace shows use_w8a8_full_layerlet=true",
    evidence=f'{SEED_HANDOFF}, 2026-06-21 gate trace: "The PIECEWISE trace repeatedly had no scratch keys or W8A8 '
    'offset scratch and never enabled the full-layerlet op (use_w8a8_full_layerlet=false)"',
    platforms=("xpu",),
    severity="warn",
)
def full_layerlet_inactive_under_capture(facts: GuardFacts) -> Verdict:
    if not env_on(facts, FULL_LAYERLET):
        return ok(f"{FULL_LAYERLET} is off")
    mode = capture_mode(args(facts))
    if not mode.captured:
        return ok(f"{FULL_LAYERLET} is on without capture ({mode.how})")
    return fail(
        f"{env_spelled(facts, FULL_LAYERLET)} under graph capture ({mode.how}): the traced PIECEWISE lane never "
        "enabled the full-layerlet op, so numbers from this identity are the control's"
    )


@rule(
    "diagnostic-env-set",
    summary="diagnostic dump, trace and bisection variables do not belong in a serving identity",
    remedy="unset them in engine.env for serving and benchmark runs",
    evidence=f'{SEED_HANDOFF}: live ABI logging "Use this only when necessary because it adds overhead"; EAGLE '
    'data dumps "Normal inference is unchanged when these envs are unset"; fused-prologue skip/regex gates '
    "exist for bisection",
    platforms=("xpu",),
    severity="warn",
)
def diagnostic_env_set(facts: GuardFacts) -> Verdict:
    names = sorted(
        name
        for name in facts.engine_env
        if (name in DIAGNOSTIC_ENV or (name.startswith("VLLM_XPU_") and name.endswith("_TRACE_FILE")))
    )
    if names:
        return fail(f"{env_spelled(facts, *names)}: diagnostics add overhead or change what runs")
    return ok("no diagnostic variables")


RULES: tuple[Rule, ...] = (
    shared_expert_fused_act_quant_capture,
    shared_expert_boundary_out_capture,
    shared_experts_stream_without_no_empty_cache,
    shared_experts_stream,
    grouped_gemm_m8_n_gt_k,
    grouped_gemm_m8_policy,
    full_layerlet_inactive_under_capture,
    diagnostic_env_set,
)
