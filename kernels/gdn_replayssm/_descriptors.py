"""Tensor descriptors of the state pool, for kernels that read their state tiles through them (`TMA_STATE`).

On Hopper a descriptor load is a bulk copy (TMA) that one thread issues for the whole box: no per-thread
addresses or masks, and the compiler's pipeliner waits on a barrier instead of on each thread's copies. Under
`TRITON_INTERPRET=1` the loads are emulated, so the CPU tests run the same kernels. A descriptor needs 16-byte
aligned strides and base, which vLLM's pools have; where they are not, the kernels read through pointers.
"""

from __future__ import annotations

import functools

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

ALIGN = 16  # bytes: a descriptor's base address and every stride but the last


@functools.cache
def descriptor_device(device: torch.device) -> bool:
    """Whether kernels on `device` can read through tensor descriptors: CUDA from compute capability 9 (the bulk
    copies), and the interpreter's CPU tensors (the tests). Cached: every key-head decode launch asks."""
    if device.type == "cpu":
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def state_descriptor(state: torch.Tensor, *, block_v: int, k_chunk: int) -> TensorDescriptor | None:
    """A descriptor of the state pool `[N, HV, V, K]` (each slot's `[HV, V, K]` contiguous, any slot stride) whose
    box is `[1, 1, block_v, k_chunk]`: one column chunk of one state tile. None where the pool's base, slot stride
    or row length is not a multiple of 16 bytes, where a box row is shorter than 16 bytes, or on a device that
    cannot read through descriptors."""
    N, HV, V, K = state.shape
    size = state.element_size()
    inner = state.stride(1) == V * K and state.stride(2) == K and state.stride(3) == 1
    aligned = state.data_ptr() % ALIGN == 0 and (state.stride(0) * size) % ALIGN == 0 and (K * size) % ALIGN == 0
    if not (inner and aligned and (k_chunk * size) % ALIGN == 0 and descriptor_device(state.device)):
        return None
    return TensorDescriptor(state, [N, HV, V, K], [state.stride(0), V * K, K, 1], [1, 1, block_v, k_chunk])
