"""Graph capture: the capture mode must be explicit and on, and nothing capture-unsafe may ride it."""

from __future__ import annotations

from service.guard.facts import GuardFacts
from service.guard.rules._base import (
    GPU_PLATFORMS,
    SEED_HANDOFF,
    SEED_PLAN,
    VLLM,
    Rule,
    Verdict,
    args,
    capture_mode,
    env_spelled,
    fail,
    flag_under_capture,
    hybrid_gdn,
    is_mtp,
    ok,
    rule,
    spec_method,
)

FUSED_PROLOGUE = "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET"
FUSED_PROLOGUE_ENV = (
    FUSED_PROLOGUE,
    "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET_ALLOW_CAPTURE",
    "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET_SKIP_LAYERS",
    "VLLM_XPU_INT8_MOE_FUSED_PROLOGUE_OFFSET_LAYER_REGEX",
)

# Speculative methods with which vLLM keeps async scheduling on when it is left unset
# (VllmConfig: EagleModelTypes, which include every *_mtp method and dflash, plus these).
_ASYNC_KEEPING_METHODS = {"eagle", "eagle3", "extract_hidden_states", "dflash", "dspark", "draft_model", "ngram_gpu"}


@rule(
    "cudagraph-mode-unset",
    summary="engine.args must set compilation_config.cudagraph_mode explicitly",
    remedy='add --compilation-config=\'{"cudagraph_mode":"PIECEWISE"}\' (or -cc.cudagraph_mode=PIECEWISE) '
    "to engine.args",
    evidence=f'{SEED_HANDOFF}: "a run missing COMPILATION_CONFIG=\'{{"cudagraph_mode":"PIECEWISE"}}\' defaulted '
    f"to graph-none and measured around 15 tok/s, which was incorrectly compared against the fast PIECEWISE "
    f'forced-comm lane"; {SEED_PLAN}: "always set PIECEWISE+cg128 explicitly (the graph-NONE ~15 tok/s trap)". '
    f"On CUDA, {VLLM} picks the mode from the optimization level (-O2: FULL_AND_PIECEWISE), so the identity "
    f"depends on version defaults.",
    platforms=GPU_PLATFORMS,
    overrides={"cuda": "warn"},
)
def cudagraph_mode_unset(facts: GuardFacts) -> Verdict:
    mode = capture_mode(args(facts))
    if mode.mode != "UNSET":
        return ok(f"cudagraph mode {mode.mode} from {mode.how}")
    if facts.platform == "xpu":
        return fail(
            f"engine.args leave the cudagraph mode to the default ({mode.how}); on the lab's XPU build that "
            "default is graph NONE, measured at ~15 tok/s against ~93 tok/s with PIECEWISE"
        )
    return fail(
        f"engine.args leave the cudagraph mode to vLLM's default ({mode.how}); the run identity then depends "
        "on the vLLM version and optimization level"
    )


@rule(
    "cudagraph-none",
    summary="graph capture must not be off (cudagraph_mode NONE, --enforce-eager or -O0) on accelerators",
    remedy="use cudagraph_mode PIECEWISE (the lab's safe lane) and drop --enforce-eager/-O0; for a deliberate "
    "eager diagnostic, waive this rule in guard.waive with the reason",
    evidence=f'{SEED_HANDOFF}: graph-none "measured around 15 tok/s" against the 93.55 tok/s PIECEWISE lane, and '
    'for MTP "A graph-none run measured 19 tok/s - the accepted-launcher default is cudagraph_mode:NONE"',
    platforms=GPU_PLATFORMS,
)
def cudagraph_none(facts: GuardFacts) -> Verdict:
    mode = capture_mode(args(facts))
    if mode.mode == "NONE":
        return fail(f"{mode.how} turns graph capture off: the lab measured ~15 tok/s instead of ~93 tok/s")
    return ok(f"capture mode {mode.mode}")


@rule(
    "fused-prologue-capture",
    summary="the fused W8A8 MoE prologue must not run under graph capture",
    remedy=f"unset {FUSED_PROLOGUE} (and its _ALLOW_CAPTURE) in engine.env; layer skip lists do not make it safe",
    evidence=f"{SEED_HANDOFF}, 2026-06-17 addendum: \"the failure is SYSTEMIC to 'fused-prologue capture enabled at "
    'all,\' not per-layer MoE math"; skip0, skip0-3, skip0-19 and skip0-37 all "failed before readiness with '
    'UR_RESULT_ERROR_DEVICE_LOST" at the dummy logit_indices copy during c1 PIECEWISE capture, and device-lost '
    'crashes wedged device 3 ("cost a reboot each time", seed 000)',
    platforms=("xpu",),
)
def fused_prologue_capture(facts: GuardFacts) -> Verdict:
    mode = flag_under_capture(facts, FUSED_PROLOGUE)
    if isinstance(mode, Verdict):
        return mode
    return fail(
        f"{env_spelled(facts, *FUSED_PROLOGUE_ENV)} enables the fused MoE prologue under graph capture "
        f"({mode.how}); on any enabled layer this device-losts the card (UR_RESULT_ERROR_DEVICE_LOST) at the "
        "sampler's dummy copy during capture"
    )


@rule(
    "async-scheduling-piecewise",
    summary="async scheduling must be off when a hybrid GDN model replays captured graphs on XPU",
    remedy="add --no-async-scheduling to engine.args (the lab's clean TP2/no-async identity)",
    evidence=f'{SEED_HANDOFF}, 2026-06-19: "Async Scheduling Was A Separate Correctness Poison"; "graph-none '
    'async is correct, but async+PIECEWISE corrupts canaries"; the safe lane is "VLLM_EXTRA_ARGS='
    f"'--no-async-scheduling ...'\". {VLLM} turns async scheduling on when it is left unset "
    "(VllmConfig, unless a speculative method or the executor rules it out).",
    platforms=("xpu",),
)
def async_scheduling_piecewise(facts: GuardFacts) -> Verdict:
    values = args(facts)
    explicit = values.get("async_scheduling")
    if explicit is False:
        return ok("--no-async-scheduling")
    method = spec_method(facts)
    if explicit is None and method is not None and not is_mtp(method) and method not in _ASYNC_KEEPING_METHODS:
        return ok(f"vLLM turns async scheduling off for speculative method {method}")
    if explicit is None and facts.speculative is not None and facts.speculative.get("disable_padded_drafter_batch"):
        return ok("vLLM turns async scheduling off with disable_padded_drafter_batch")
    mode = capture_mode(values)
    if not mode.captured:
        return ok(f"no graph replay ({mode.how}): async scheduling is correct without it")
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    how = "on (--async-scheduling)" if explicit is True else "on by vLLM's default (no --no-async-scheduling)"
    gdn = facts.model.require().gdn_layers
    return fail(
        f"async scheduling is {how} with graph replay ({mode.how}) on a hybrid model with {gdn} GDN layers: "
        "async + PIECEWISE replay corrupted canaries in the lab"
    )


RULES: tuple[Rule, ...] = (cudagraph_mode_unset, cudagraph_none, fused_prologue_capture, async_scheduling_piecewise)
