"""warden's fixes for vLLM CPU GDN bugs, against vLLM's real code in process.

Each test first runs vLLM's code as shipped on the case and checks that this vLLM build still gets it wrong (when a
vLLM release fixes it, that assertion says the fix can go), then checks the fixed code: the one-token rows against
vLLM's op on a dense copy, the spec conv against a causal conv over the accepted inputs.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gdn_replayssm import vllm_cpu_fixes

BF16 = torch.bfloat16


@pytest.fixture
def ops(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """`vllm._custom_ops` (imported when the test runs, as in test_replayssm_vllm_cpu), its ops and vLLM's spec
    conv restored after."""
    module = pytest.importorskip("vllm._custom_ops")
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    for name, _, _ in vllm_cpu_fixes._OPS:
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(gdn_attention, "_spec_forward", gdn_attention._spec_forward)
    monkeypatch.setattr(vllm_cpu_fixes, "_installed", [])
    return module


def _one_token_prefill(dim: int, generator: torch.Generator) -> torch.Tensor:
    """A one-token prefill's convolution input as vLLM's CPU GDN code makes it: a row of the layer's wider
    projection, `.contiguous()` (which keeps the row stride of a single row), transposed to `[dim, 1]`."""
    projection = torch.randn(1, dim + 32, generator=generator).to(BF16)
    return projection[:, :dim].contiguous().transpose(0, 1)


def test_a_one_token_prefill_convolution_runs_and_matches_vllm_on_a_dense_copy(ops: ModuleType) -> None:
    generator = torch.Generator().manual_seed(1)
    dim, width = 64, 4
    weight = torch.randn(dim, width, generator=generator).to(BF16)
    x = _one_token_prefill(dim, generator)
    fresh_states = torch.randn(3, width - 1, dim, generator=generator).to(BF16).transpose(1, 2)  # [slots, dim, w-1]
    args = {"weight": weight, "bias": None, "query_start_loc": torch.tensor([0, 1], dtype=torch.int32),
            "cache_indices": torch.tensor([2], dtype=torch.int32), "has_initial_state": torch.tensor([True]),
            "silu_activation": True, "is_weight_packed": False}  # fmt: skip

    with pytest.raises(RuntimeError, match="expect x to be transposed"):
        ops.causal_conv1d_fwd_cpu(x=x, conv_states=fresh_states.clone(), **args)

    expected_states = fresh_states.clone()
    expected = ops.causal_conv1d_fwd_cpu(x=vllm_cpu_fixes.dense_columns(x), conv_states=expected_states, **args)
    assert vllm_cpu_fixes.install() == [
        "causal_conv1d_fwd_cpu",
        "fused_sigmoid_gating_delta_rule_update_cpu",
        "_spec_forward",
    ]
    states = fresh_states.clone()
    got = ops.causal_conv1d_fwd_cpu(x=x, conv_states=states, **args)  # the fixed op, called as vLLM calls it
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(states, expected_states, rtol=0, atol=0)  # the conv state written in place
    assert not torch.equal(states, fresh_states)

    wide = torch.randn(5, dim, generator=generator).to(BF16).transpose(0, 1)  # several tokens: left as given
    assert vllm_cpu_fixes.dense_columns(wide) is wide


def test_a_one_row_decode_indexed_by_a_block_table_column_runs_and_writes_the_pool(ops: ModuleType) -> None:
    """With speculation vLLM's state indices are column 0 of a `[rows, 1 + k]` block table: one row keeps the
    table's row stride through `.contiguous()`."""
    generator = torch.Generator().manual_seed(2)
    H, HV, K, V = 2, 4, 64, 64
    table = torch.tensor([[3, 4, 5, 6]], dtype=torch.int32)
    indices = table[:, 0].contiguous()
    assert indices.stride() == (4,)
    fresh_pool = torch.randn(8, HV, K, V, generator=generator) * 0.1
    args = {"A_log": torch.randn(HV, generator=generator), "dt_bias": torch.randn(HV, generator=generator).to(BF16),
            "q": torch.randn(1, 1, H, K, generator=generator).to(BF16),
            "k": torch.randn(1, 1, H, K, generator=generator).to(BF16),
            "v": torch.randn(1, 1, HV, V, generator=generator).to(BF16),
            "a": torch.randn(1, HV, generator=generator).to(BF16),
            "b": torch.randn(1, HV, generator=generator).to(BF16),
            "cu_seqlens": torch.tensor([0, 1], dtype=torch.int32), "use_qk_l2norm_in_kernel": True}  # fmt: skip

    with pytest.raises(RuntimeError, match="contiguous at last dimension"):
        ops.fused_sigmoid_gating_delta_rule_update_cpu(initial_state_source=fresh_pool.clone(),
                                                       initial_state_indices=indices, **args)  # fmt: skip

    expected_pool = fresh_pool.clone()
    expected = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        initial_state_source=expected_pool, initial_state_indices=torch.tensor([3], dtype=torch.int32), **args
    )
    vllm_cpu_fixes.install()
    pool = fresh_pool.clone()
    got = ops.fused_sigmoid_gating_delta_rule_update_cpu(initial_state_source=pool, initial_state_indices=indices,
                                                         **args)  # fmt: skip
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(pool, expected_pool, rtol=0, atol=0)  # slot 3 updated in vLLM's own pool
    assert not torch.equal(pool[3], fresh_pool[3]) and torch.equal(pool[4:], fresh_pool[4:])


def test_install_is_idempotent_and_leaves_out_an_op_this_vllm_lacks(
    ops: ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(ops, "causal_conv1d_fwd_cpu")
    with caplog.at_level("INFO", logger="vllm.warden_fixes"):
        assert vllm_cpu_fixes.install() == ["fused_sigmoid_gating_delta_rule_update_cpu", "_spec_forward"]
    assert "this vLLM has no causal_conv1d_fwd_cpu; that fix is not installed" in caplog.text
    wrapped = ops.fused_sigmoid_gating_delta_rule_update_cpu
    assert vllm_cpu_fixes.install() == ["fused_sigmoid_gating_delta_rule_update_cpu", "_spec_forward"]
    assert ops.fused_sigmoid_gating_delta_rule_update_cpu is wrapped  # not wrapped twice


DIM, WIDTH, K = 8, 4, 3  # the conv buffer holds WIDTH - 1 + K columns, as vLLM allocates it for k = 3


def _run_spec_conv(
    spec_forward: Callable[..., Any], ops: ModuleType, windows: list[int], accepted: list[int], seed: int
) -> list[float]:
    """Steps of one request through `spec_forward` (vLLM's signature), window t of `windows[t]` tokens of which
    `accepted[t]` are accepted, told at the next step as vLLM tells it. Returns each step's largest conv output
    error against a causal conv over the inputs actually accepted."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(DIM, WIDTH, generator=generator)
    conv = types.SimpleNamespace(weight=weight.view(DIM, 1, WIDTH), bias=None)
    layer = types.SimpleNamespace(conv1d=conv, activation="silu", A_log=None, dt_bias=None,
                                  rearrange_mixed_qkv=lambda x: (x[None], x[None], x[None]))  # fmt: skip
    seen: dict[str, torch.Tensor] = {}

    def spec_op(**kwargs: torch.Tensor) -> torch.Tensor:  # vLLM's recurrent part: the conv outputs are its `q`
        seen["q"] = kwargs["q"].clone()
        return kwargs["q"]

    buffers = torch.zeros(2, DIM, WIDTH - 1 + K)  # slot 1; after a prefill its first WIDTH - 1 columns hold inputs
    history = list(torch.randn(WIDTH - 1, DIM, generator=generator))
    buffers[1, :, : WIDTH - 1] = torch.stack(history, 1)
    told, errors = 1, []
    for tokens, kept in zip(windows, accepted, strict=True):
        x = torch.randn(tokens, DIM, generator=generator)
        meta = types.SimpleNamespace(num_spec_decodes=1, spec_state_indices_tensor=torch.tensor([[1, 2, 3, 4]]),
                                     spec_query_start_loc=torch.tensor([0, tokens]),
                                     num_accepted_tokens=torch.tensor([told]))  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ops, "fused_sigmoid_gating_delta_rule_update_spec_cpu", spec_op)
            patch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)  # vLLM's torch conv, on any CPU
            spec_forward(layer, meta, x, torch.zeros(tokens, 1), torch.zeros(tokens, 1), buffers, None, WIDTH,
                         WIDTH - 1 + K)  # fmt: skip
        inputs = torch.stack(history[-(WIDTH - 1) :] + list(x), 1).unsqueeze(0)
        expected = F.silu(F.conv1d(inputs, weight.unsqueeze(1), groups=DIM)[0]).T
        errors.append(float((seen["q"] - expected).abs().max() / expected.abs().max()))
        history += list(x[:kept])
        told = kept
    return errors


# (windows, accepted): full windows; windows of 1 (drafts trimmed to none) and 2; a full window after short ones
SHORT_WINDOWS = [([4, 1, 1, 4, 4], [1, 1, 1, 1, 2]), ([4, 2, 2, 4, 4], [2, 2, 1, 3, 1]), ([1, 1, 1, 4], [1, 1, 1, 1])]


def test_the_spec_conv_reads_the_inputs_up_to_the_last_accepted_token_after_short_windows(ops: ModuleType) -> None:
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    shipped = gdn_attention._spec_forward
    assert max(_run_spec_conv(shipped, ops, [4] * 6, [2, 4, 1, 3, 4, 1], seed=0)) < 1e-6  # full windows: right
    for seed, (windows, accepted) in enumerate(SHORT_WINDOWS):
        errors = _run_spec_conv(shipped, ops, windows, accepted, seed=seed)
        assert max(errors) > 0.1, (windows, errors)  # as shipped: the step after a short window reads wrong inputs
    with pytest.raises(RuntimeError, match="must match the size"):  # more accepted than the next window holds
        _run_spec_conv(shipped, ops, [4, 1], [3, 1], seed=9)

    vllm_cpu_fixes.install()
    fixed = gdn_attention._spec_forward
    assert fixed is not shipped
    patterns = [([4] * 6, [2, 4, 1, 3, 4, 1]), *SHORT_WINDOWS, ([4, 1, 2, 4], [3, 1, 2, 4]), ([4, 4, 1], [4, 4, 1])]
    for seed, (windows, accepted) in enumerate(patterns):
        errors = _run_spec_conv(fixed, ops, windows, accepted, seed=seed)
        assert max(errors) < 1e-6, (windows, accepted, errors)
