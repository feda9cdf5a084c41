"""`_common.tree_sum`: the fixed float32 order of `_config.TREE_SUMS`, checked bit for bit against the same
tree written in torch, on data where another order rounds differently."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from gdn_replayssm._common import tree_sum


@triton.jit
def _row_sums(x, out, R: tl.constexpr, N: tl.constexpr):
    o_r = tl.arange(0, R)
    o_n = tl.arange(0, N)
    tl.store(out + o_r, tree_sum(tl.load(x + o_r[:, None] * N + o_n[None, :])))


def halving_tree(x: torch.Tensor) -> torch.Tensor:
    """`x[:, j] + x[:, j + N/2]`, level by level, in float32."""
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        x = x[:, :half] + x[:, half:]
    return x[:, 0]


@pytest.mark.parametrize("n", [2, 16, 128])
def test_tree_sum_adds_in_the_halving_order(n: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # magnitudes spread over 2^-12 .. 2^12: sums in another order round differently
    x = (torch.randn(8, n, dtype=torch.float64) * torch.exp2(torch.randint(-12, 13, (8, n)))).float().to(device)
    out = torch.empty(8, dtype=torch.float32, device=device)
    _row_sums[(1,)](x, out, R=8, N=n)
    assert torch.equal(out.cpu(), halving_tree(x.cpu())), "tree_sum does not add in the halving order"
    if n >= 16:
        sequential = x.cpu().cumsum(dim=1)[:, -1]
        assert not torch.equal(sequential, halving_tree(x.cpu())), "the data does not tell orders apart"
