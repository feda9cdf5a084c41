"""The bit-exact op order, piece by piece: `_common.tree_sum` (`_config.TREE_SUMS`) and the fused update
(`_config.FMA_FLAG`), each checked bit for bit against the same arithmetic written in torch, on data where
another order rounds differently."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from gdn_replayssm import _config
from gdn_replayssm._common import delta_step, tree_sum


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


@triton.jit
def _delta_steps(h, k, v, beta, out, EXACT: tl.constexpr, R: tl.constexpr, N: tl.constexpr):  # noqa: PLR0917
    o_r = tl.arange(0, R)
    o_n = tl.arange(0, N)
    b_h = tl.load(h + o_r[:, None] * N + o_n[None, :])
    b_h, _ = delta_step(b_h, tl.load(k + o_n), tl.load(v + o_r), 0.0, tl.load(beta), EXACT)  # g = 0: exp is 1
    tl.store(out + o_r[:, None] * N + o_n[None, :], b_h)


def test_fused_update_rounds_once() -> None:
    """With `_config.FMA_FLAG` in the op order, `delta_step`'s update `S += u k^T` is one fused multiply-add
    per element: the product is not rounded before the add (the baseline and the fold share this helper)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    h, k, v = torch.randn(8, 128, generator=gen), torch.randn(128, generator=gen), torch.randn(8, generator=gen)
    beta = torch.tensor([0.75])
    u = (v - halving_tree(h * k)) * beta  # g = 0, so the decay leaves h as it is
    fused = (u.double()[:, None] * k.double()[None, :] + h.double()).float()  # the product is exact in float64
    unfused = h + u[:, None] * k[None, :]
    assert not torch.equal(fused, unfused), "the data does not tell a fused update from an unfused one"
    order = _config.TREE_SUMS | _config.FMA_FLAG
    out = torch.empty_like(h, device=device)
    _delta_steps[(1,)](*(t.to(device) for t in (h, k, v, beta)), out, EXACT=order, R=8, N=128)
    assert torch.equal(out.cpu(), fused), "delta_step does not fuse the update under FMA_FLAG"
