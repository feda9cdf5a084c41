"""warden's fixes for vLLM CPU GDN bugs on one-token rows, against vLLM's real ops in process.

Each test first hands vLLM's op a one-token row as vLLM's own GDN code does and checks that this vLLM build still
fails on it (when a vLLM release fixes it, that assertion says the fix can go), then checks that the fixed op
computes what vLLM's op computes on a dense copy, and writes the tensors vLLM gave it in place.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from gdn_replayssm import vllm_cpu_fixes

BF16 = torch.bfloat16


@pytest.fixture
def ops(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """`vllm._custom_ops` (imported when the test runs, as in test_replayssm_vllm_cpu), its ops restored after."""
    module = pytest.importorskip("vllm._custom_ops")
    for name, _, _ in vllm_cpu_fixes._OPS:
        monkeypatch.setattr(module, name, getattr(module, name))
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
    assert vllm_cpu_fixes.install() == ["causal_conv1d_fwd_cpu", "fused_sigmoid_gating_delta_rule_update_cpu"]
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
        assert vllm_cpu_fixes.install() == ["fused_sigmoid_gating_delta_rule_update_cpu"]
    assert "this vLLM has no causal_conv1d_fwd_cpu; that fix is not installed" in caplog.text
    wrapped = ops.fused_sigmoid_gating_delta_rule_update_cpu
    assert vllm_cpu_fixes.install() == ["fused_sigmoid_gating_delta_rule_update_cpu"]
    assert ops.fused_sigmoid_gating_delta_rule_update_cpu is wrapped  # not wrapped twice
