"""Launch configuration shared by the recurrent baseline and the ReplaySSM kernels.

The baseline and the ReplaySSM flush path must use the same state tile (`block_v`, `num_warps`) for the
folded checkpoint to be bit-identical to the baseline's state: both reduce over K in the same layout.
Both kernels are also compiled with `FP_FUSION = False` (Triton's `enable_fp_fusion` launch option): every
float multiply and add is then rounded on its own (`mul.rn` / `add.rn`, ptxas `--fmad=false`), so whether
the compiler contracts `a * b + c` into an FMA no longer depends on the surrounding kernel. With fusion on,
LLVM and ptxas contract differently in the two kernels and the results differ in the last bits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

DotPrecision = str  # "ieee" | "tf32" | "tf32x3" (NVIDIA); "ieee" is portable

# `enable_fp_fusion` for the baseline and the ReplaySSM kernels; must be the same for both (module docstring)
FP_FUSION = False


@dataclass(frozen=True)
class TileConfig:
    """Tile of one program: `block_v` rows of the `[V, K]` state (all of K), `num_warps` warps.

    `dot_precision` applies to the reconstruction dots of non-flush rows only; flush rows and the baseline
    use no dot. `block_v` must be a power of two >= 16 (dot operand constraint).
    """

    block_v: int
    num_warps: int
    num_stages: int
    dot_precision: DotPrecision

    def __post_init__(self) -> None:
        if self.block_v < 16 or self.block_v & (self.block_v - 1):
            raise ValueError(f"block_v must be a power of two >= 16, got {self.block_v}")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"num_warps must be 1, 2, 4 or 8, got {self.num_warps}")
        if self.dot_precision not in ("ieee", "tf32", "tf32x3"):
            raise ValueError(f"dot_precision must be 'ieee', 'tf32' or 'tf32x3', got {self.dot_precision!r}")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def default_tile(*, head_v_dim: int, device: torch.device, num_tokens: int | None = None) -> TileConfig:
    """The tile of one step; 3xTF32 dots on NVIDIA GPUs.

    Verify (and an unknown `num_tokens`): one warp per `[32, K]` tile, vLLM's packed-decode tile on Hopper.
    Decode (`num_tokens == 1`) on NVIDIA GPUs: two warps per `[64, K]` tile, the fastest ReplaySSM decode tile
    of the H200 tune at B = 256 (412 us against 502 us for 32x1; the baseline is flat, 279-280 us, at both).
    The baseline and ReplaySSM take the same `num_tokens`, so they always share the tile.
    """
    nvidia = device.type == "cuda" and torch.version.hip is None and not interpreting()
    wide = nvidia and num_tokens == 1
    block_v = min(64 if wide else 32, max(16, triton.next_power_of_2(head_v_dim)))
    num_warps = 2 if block_v == 64 else 1
    return TileConfig(block_v=block_v, num_warps=num_warps, num_stages=2, dot_precision="tf32x3" if nvidia else "ieee")


def check_device(device: torch.device) -> None:
    """Triton needs an accelerator, or TRITON_INTERPRET=1 with CPU tensors."""
    if device.type == "cpu" and not interpreting():
        raise ValueError("the Triton kernels need tensors on a GPU, or TRITON_INTERPRET=1 with CPU tensors")
