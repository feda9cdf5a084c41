"""Exact bfloat16 `tl.dot` under Triton's interpreter, so the CPU tests can run the kernels' bf16 x bf16 dots.

The interpreter keeps bfloat16 tensors as their 16-bit patterns (numpy has no bfloat16), and its `create_dot`
hands them to `np.matmul` as they are: a bf16 dot multiplies the bit patterns as integers (Triton 3.9, ~1e10 off
for a 16x16 dot of values in [-2, 2]). The interpreter does not support bfloat16 arithmetic
(triton-lang/triton#11584). `widen_bf16_dots` makes its dots widen bfloat16 operands to float32 first; that is
exact (a bfloat16 is the top half of a float32), and a float32 `np.matmul` then sums the exact products in
float32, as the GPU's bf16 tensor-core dots do. Installed by `conftest.py` whenever the tests run interpreted.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def widen_bf16_dots() -> None:
    """Patch `InterpreterBuilder.create_dot` (once) to widen bfloat16 operands to float32."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "widens_bf16", False):
        return
    create_dot = builder.create_dot

    def widened(handle: Any) -> Any:
        if handle.dtype != tl.bfloat16:
            return handle
        bits = np.asarray(handle.data).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot_widened(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        return create_dot(self, widened(a), widened(b), d, *args)

    create_dot_widened.widens_bf16 = True  # type: ignore[attr-defined]
    create_dot_widened.plain = create_dot  # type: ignore[attr-defined]  # for a test that needs the interpreter's own
    builder.create_dot = create_dot_widened
