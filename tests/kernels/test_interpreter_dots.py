"""bf16 x bf16 `tl.dot` is exact where the kernel tests run: on the GPU, and under the interpreter through
`interpreter_dots.widen_bf16_dots` (which `conftest.py` installs), without which the interpreter multiplies the
operands' bit patterns."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl


@triton.jit
def _dot_kernel(a, b, c, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(a + o[:, None] * N + o[None, :])
    y = tl.load(b + o[:, None] * N + o[None, :])
    tl.store(c + o[:, None] * N + o[None, :], tl.dot(x, y, out_dtype=tl.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_narrow_dots_are_exact(dtype: torch.dtype) -> None:
    """Small integers (exact in both types, exact sums): the dot equals the float32 matmul bit for bit."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 16
    a = torch.randint(-3, 4, (n, n), device=device).to(dtype)
    b = torch.randint(-3, 4, (n, n), device=device).to(dtype)
    c = torch.zeros(n, n, device=device)
    _dot_kernel[(1,)](a, b, c, N=n)
    assert torch.equal(c, a.float() @ b.float())


def test_widened_dots_keep_fractions() -> None:
    """bf16 values with fractional bits widen exactly: the dot of a row with a one-hot column is that row's
    element, unchanged."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 16
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    eye = torch.eye(n, device=device).to(torch.bfloat16)
    c = torch.zeros(n, n, device=device)
    _dot_kernel[(1,)](a, eye, c, N=n)
    assert torch.equal(c, a.float())
