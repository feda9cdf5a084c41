"""vLLM's CPU build (platforms cpu and sim): inputs that kill its engine, measured on the CI machine."""

from __future__ import annotations

from service.guard.engine_args import FactUnavailable
from service.guard.facts import GuardFacts, int_value
from service.guard.rules._base import (
    CPU_ENGINE_PLATFORMS,
    CPU_NOTES,
    Rule,
    Verdict,
    args,
    fail,
    hybrid_gdn,
    is_ngram,
    ok,
    prefix_caching,
    rule,
    spec_method,
)
from service.profile import FIX_SIZE_ONE_STRIDES, FIX_SPEC_CONV_HISTORY

KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
GDN_HEAD_DIMS = (64, 128)
ATTENTION_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _speculating_without_conv_fix(facts: GuardFacts, fixed: str) -> Verdict | None:
    """The passes of the rules that warden's spec conv fix answers; None where the CPU engine speculates on a hybrid
    GDN model without it. `fixed`: what the fix keeps right, for the pass's reason."""
    if facts.speculative is None:
        return ok("no speculative decoding")
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    if FIX_SPEC_CONV_HISTORY in facts.vllm_fixes:
        return ok(f"warden's vLLM fixes are on: {fixed} ({FIX_SPEC_CONV_HISTORY})")
    return None


@rule(
    "cpu-kv-cache-size-unset",
    summary="the CPU engine needs an explicit KV-cache size",
    remedy=f"add --kv-cache-memory-bytes (e.g. 64M) to engine.args or set {KV_CACHE_ENV} (GiB) in engine.env",
    evidence=f'{CPU_NOTES}: "The KV cache size must be explicit"; otherwise the default 0.92 applies to one NUMA '
    'node and startup "fails after about 29 s with ValueError: Available memory on node 0 ..."',
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_kv_cache_size_unset(facts: GuardFacts) -> Verdict:
    if facts.engine_env.get(KV_CACHE_ENV):
        return ok(f"{KV_CACHE_ENV}={facts.engine_env[KV_CACHE_ENV]}")
    size = args(facts).get("kv_cache_memory_bytes")
    if size is None:
        return fail(f"neither --kv-cache-memory-bytes nor {KV_CACHE_ENV} sets the CPU KV-cache size")
    return ok(f"--kv-cache-memory-bytes {size}")


@rule(
    "cpu-spec-prefix-caching",
    summary="speculation on a hybrid model on CPU needs --no-enable-prefix-caching",
    remedy="add --no-enable-prefix-caching to engine.args",
    evidence=f'{CPU_NOTES}: without it "any spec method on the hybrid model kills the engine on the first request '
    "with TypeError: 'function' object is not subscriptable\" (a Triton kernel in mamba_utils on CPU)",
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_spec_prefix_caching(facts: GuardFacts) -> Verdict:
    if facts.speculative is None:
        return ok("no speculative decoding")
    how = prefix_caching(facts)
    if how is None:
        return ok("--no-enable-prefix-caching")
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    return fail(
        f"speculative.method {spec_method(facts)} with prefix caching {how} on a hybrid GDN model: the CPU "
        "engine dies on the first request"
    )


@rule(
    "cpu-ngram-hybrid",
    summary="without warden's vLLM fixes, n-gram speculation crashes the CPU engine on hybrid GDN models",
    remedy="leave engine.vllm_fixes on (the default), or use MTP or no speculation on CPU",
    evidence=f'{CPU_NOTES}: "the engine dies mid-generation: RuntimeError: The size of tensor a (6) must match the '
    "size of tensor b (5) in gdn_attention.py::_spec_forward\"; ngram's variable draft length triggers it. warden "
    "measured the cause (cpu-spec-conv-history) and its fix: the canary's json and color suites 16/16 against "
    "no-spec with ngram k = 3 and the fixes on (56 drafts, 22 accepted), the engine dead at the first request "
    "without them",
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_ngram_hybrid(facts: GuardFacts) -> Verdict:
    method = spec_method(facts)
    if not is_ngram(method):
        return ok("no n-gram speculation")
    gate = _speculating_without_conv_fix(facts, "windows of any length keep the accepted inputs")
    if gate is not None:
        return gate
    return fail(f"speculative.method {method} on a hybrid GDN model: the CPU GDN spec path crashes mid-generation")


@rule(
    "cpu-spec-structured-outputs",
    summary="without warden's vLLM fixes, a structured-output request kills a speculating CPU engine on a hybrid "
    "GDN model",
    remedy="leave engine.vllm_fixes on (the default); else send no structured-output (json, regex, grammar) "
    "requests to this engine, or serve it without speculative decoding",
    evidence="measured by warden: `warden canary --suite json` (regex-constrained answers) against the tiny MTP model "
    "with speculative.method mtp, k = 1 and k = 3, on vllm-cpu 0.32.0: the first request kills the engine core "
    "(RuntimeError: causal_conv1d_update_cpu: num_accepted_tokens must be in [1, seqlen]); the color suite, without "
    "a grammar, matched the no-spec answers 16/16 on the same engine. The cause is cpu-spec-conv-history's; with "
    "the fixes on, json and color matched no-spec 16/16 each (MTP k = 3)",
    platforms=CPU_ENGINE_PLATFORMS,
    severity="warn",
)
def cpu_spec_structured_outputs(facts: GuardFacts) -> Verdict:
    gate = _speculating_without_conv_fix(facts, "windows a grammar shortens keep the accepted inputs")
    if gate is not None:
        return gate
    return fail(
        f"speculative.method {spec_method(facts)} on a hybrid GDN model: any request with structured outputs "
        "kills the CPU engine (warden relaunches it)"
    )


@rule(
    "cpu-gdn-one-token-rows",
    summary="on CPU, a GDN row of one token kills the engine unless warden's vLLM fixes are on",
    remedy="leave engine.vllm_fixes on (the default); waive with the reason when no client can send a one-token prompt",
    evidence=f"{CPU_NOTES} and measured by warden on vllm-cpu 0.32.0 with the tiny hybrid model: a completion whose "
    "prompt is one token kills the engine core (RuntimeError: causal_conv1d_fwd_cpu: expect x to be transposed), "
    "with or without "
    "speculation; with MTP and --max-num-batched-tokens=9, a 10-token prompt, whose last prefill chunk is one token, "
    "too (RuntimeError: tensor must be contiguous at last dimension). Torch keeps the stride of a size-1 dimension "
    "through .contiguous(), and vLLM's C++ CPU ops check strides exactly (kernels/gdn_replayssm/vllm_cpu_fixes.py)",
    platforms=CPU_ENGINE_PLATFORMS,
    severity="warn",
)
def cpu_gdn_one_token_rows(facts: GuardFacts) -> Verdict:
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    if FIX_SIZE_ONE_STRIDES in facts.vllm_fixes:
        return ok(f"warden's vLLM fixes are on: one-token rows are served ({FIX_SIZE_ONE_STRIDES})")
    return fail("engine.vllm_fixes is off on a hybrid GDN model: a one-token prompt kills the CPU engine (warden "
                "relaunches it; the requests in flight are lost)")  # fmt: skip


@rule(
    "cpu-spec-conv-history",
    summary="without warden's vLLM fixes, the CPU GDN spec conv reads the wrong inputs after a short window",
    remedy="leave engine.vllm_fixes on (the default), or serve without speculative decoding",
    evidence="measured by warden on vllm-cpu 0.32.0, vLLM's _spec_forward against a causal conv over the accepted "
    "inputs (tests/integration/test_vllm_cpu_fixes.py): it rolls each request's conv buffer as if every window held "
    "1 + k tokens. After a window the scheduler trimmed (the token budget, the model length; a row without drafts "
    "is a window of 1), the next step's conv outputs are wrong by as much as the outputs themselves, and nothing "
    "fails. When more tokens were accepted than the next window holds, the engine dies (RuntimeError: The size of "
    "tensor a (6) must match the size of tensor b (5))",
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_spec_conv_history(facts: GuardFacts) -> Verdict:
    gate = _speculating_without_conv_fix(facts, "the spec conv keeps the accepted inputs")
    if gate is not None:
        return gate
    return fail(
        f"speculative.method {spec_method(facts)} on a hybrid GDN model with engine.vllm_fixes off: after a window "
        "the scheduler trimmed, the CPU engine computes wrong tokens without an error"
    )


@rule(
    "cpu-head-dim",
    summary="CPU kernels support GDN head dims 64/128 and a fixed set of attention head dims",
    remedy="use a model whose linear_key/value_head_dim is 64 or 128 (the tiny builder does)",
    evidence=f'{CPU_NOTES}: with GDN head dim 32 "the server starts and reports healthy, then the engine dies on '
    'the first request with RuntimeError: Unexpected head dim size, 32"; attention head_dim must be one of '
    "{32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}",
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_head_dim(facts: GuardFacts) -> Verdict:
    shape = facts.model.require()
    config = dict(facts.model.text_config)
    problems = []
    if shape.is_hybrid_gdn:
        for key in ("linear_key_head_dim", "linear_value_head_dim"):
            value = int_value(config, key)
            if value is None:
                raise FactUnavailable(f"config.json has no integer {key}")
            if value not in GDN_HEAD_DIMS:
                problems.append(f"{key}={value} (CPU GDN supports {', '.join(map(str, GDN_HEAD_DIMS))})")
    if "full_attention" in shape.layer_types:
        head_dim = int_value(config, "head_dim")
        hidden = int_value(config, "hidden_size")
        if head_dim is None and hidden is not None and shape.num_attention_heads:
            head_dim = hidden // shape.num_attention_heads
        if head_dim is None:
            raise FactUnavailable("config.json gives neither head_dim nor hidden_size")
        if head_dim not in ATTENTION_HEAD_DIMS:
            problems.append(f"head_dim={head_dim}")
    if problems:
        return fail("the CPU engine cannot run " + ", ".join(problems))
    return ok("head dims supported")


@rule(
    "cpu-dtype-not-bf16",
    summary="CPU GDN attention requires bfloat16",
    remedy="add --dtype=bfloat16 to engine.args",
    evidence=f"{CPU_NOTES}: \"The dtype must be bf16: 'CPU GDN attention requires BF16'\"",
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_dtype_not_bf16(facts: GuardFacts) -> Verdict:
    dtype = str(args(facts).get("dtype", "auto"))
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    if dtype in ("bfloat16", "bf16"):
        return ok("--dtype bfloat16")
    if dtype != "auto":
        return fail(f"--dtype {dtype} on a hybrid GDN model: CPU GDN attention requires bfloat16")
    config = facts.model.text_config
    saved = config.get("dtype", config.get("torch_dtype"))
    if saved is None:
        raise FactUnavailable("--dtype auto and config.json names no dtype")
    if str(saved) != "bfloat16":
        return fail(f"--dtype auto takes {saved} from config.json: CPU GDN attention requires bfloat16")
    return ok("config.json dtype bfloat16")


@rule(
    "cpu-canary-single-token",
    summary="without warden's vLLM fixes, a one-token prompt kills the CPU engine on hybrid GDN models: the canary "
    "must have several words",
    remedy="write a supervisor.canary_prompt of at least two words, or leave engine.vllm_fixes on",
    evidence=f'{CPU_NOTES}: "A 1-token prompt kills the engine on the hybrid model: causal_conv1d_fwd_cpu: expect x '
    'to be transposed."',
    platforms=CPU_ENGINE_PLATFORMS,
)
def cpu_canary_single_token(facts: GuardFacts) -> Verdict:
    if not hybrid_gdn(facts):
        return ok("the model has no GDN layers")
    if FIX_SIZE_ONE_STRIDES in facts.vllm_fixes:
        return ok(f"warden's vLLM fixes are on: a one-token prompt is served ({FIX_SIZE_ONE_STRIDES})")
    words = len(facts.canary_prompt.split())
    if words < 2:
        return fail(
            f"supervisor.canary_prompt {facts.canary_prompt!r} has {words} word(s) and may tokenize to one token"
        )
    return ok(f"canary prompt of {words} words")


RULES: tuple[Rule, ...] = (
    cpu_kv_cache_size_unset,
    cpu_spec_prefix_caching,
    cpu_ngram_hybrid,
    cpu_spec_structured_outputs,
    cpu_head_dim,
    cpu_dtype_not_bf16,
    cpu_canary_single_token,
    cpu_gdn_one_token_rows,
    cpu_spec_conv_history,
)
