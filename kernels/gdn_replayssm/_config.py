"""Launch configuration shared by the recurrent baseline and the ReplaySSM kernels.

The baseline and the ReplaySSM flush path are compiled with `FP_FUSION = False` (Triton's `enable_fp_fusion`
launch option): every float multiply and add is then rounded on its own (`mul.rn` / `add.rn`, ptxas
`--fmad=false`), so whether the compiler contracts `a * b + c` into an FMA no longer depends on the
surrounding kernel. With fusion on, LLVM and ptxas contract differently in the two kernels and the results
differ in the last bits.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
import triton

DotPrecision = str  # "ieee" | "tf32" | "tf32x3" (NVIDIA); "ieee" is portable

# `enable_fp_fusion` for the baseline and the ReplaySSM kernels; must be the same for both (module docstring)
FP_FUSION = False

# How the bit-exact path adds (`_common.exact_sum`): the baseline with `exact_sums=True` and every flush fold
# use the same mode, so the fold reproduces the baseline whatever their tiles. TREE_SUMS (the default): a
# fixed pairwise tree in float32 (`_common.tree_sum`), layout-independent by construction, no float64 unit
# needed (the XPU target); H200 run 11: verify T = 4 steps 1.04-1.21x faster than with FLOAT64_SUMS at B >= 64,
# whose float32 terms are added in float64 and rounded once (a slow float64 conversion per term).
FLOAT64_SUMS = 1
TREE_SUMS = 2
EXACT_SUM_MODE = TREE_SUMS
SUM_MODES = {"float64": FLOAT64_SUMS, "tree": TREE_SUMS}  # the benchmarks' --exact-sums

# The rank-1 update `S += u k^T` of the baseline op order as one fused multiply-add per element (`tl.fma`,
# rounded once) instead of a multiply and an add. Explicit, so it is the same in every kernel whatever
# `FP_FUSION` says, and it is what vLLM's own kernel, compiled with fusion on, gets from the compiler. The fold
# is instruction-bound (ncu, H200 run 12: 62 % of issue slots busy, FMUL and FADD 76 % of the instructions),
# and the update is one of its five operations per state element and record.
FUSED_UPDATE = True
FMA_FLAG = 4  # the bit of the op-order code (`op_order`) that says `FUSED_UPDATE`

# The bit-exact path's state dots (`S k`, `S q`) as a chain of fused multiply-adds across `CHAIN_BLOCKS` blocks of
# columns, then the tree over one block (`_common.chain_dot`), instead of a product per element and the tree over
# the whole row (0, the default). Per row of 16 elements a thread holds, the tree is 16 multiplies and 15 additions;
# a chain of 2 blocks 8 + 8 fused + 7 (the tree's first level fused into its products, at the tree's depth), of
# 4 blocks 4 + 12 + 3 (one level deeper), of 8 blocks 2 + 14 + 1 (four deeper). The fold,
# the baseline with `exact_sums` and the flush's window part all use it, so the checkpoint stays the baseline's
# bit for bit; the benchmark's vLLM-order baseline does not. Triton 3.6, sm_90
# (`kernels/scripts/sm90_device_triton.sh --kernels "flush persistent" --loops [--chain-blocks N]`): 8 blocks take
# the fold's loop in the persistent 16-row launch from 1319 to 1134 instructions per 4 records, and were slower on
# the H200 (run 17, `bench --chain-dots`, whole verify T = 4 steps at B = 64 / 256: 108.5 / 388.1 -> 110.3 / 395.7
# us) with the fold at 2 warps per scheduler. Run 30: 2 / 4 / 8 blocks take it to 1230 / 1166 / 1134 and every fold
# was slower (decode's at B = 256 616.4 -> 647.2 / 640.7 / 660.0 us, verify T = 4's 2210.2 -> 2327.0 / 2246.3 /
# 2276.1): each chain build converts the key's halves through shared memory, 64 `LDS` a loop against the tree's 32.
# Their bit-exact GPU cases (`-m gpu -k chain_dots`) pass.
CHAIN_BLOCKS = 0
CHAIN_BLOCK_CHOICES = (0, 2, 4, 8)
CHAIN_FLAG = 8  # the op-order code's chain field: `CHAIN_FLAG * log2(CHAIN_BLOCKS)`, 0 without a chain


def chain_code(blocks: int) -> int:
    """The op-order code's chain field for a chain of `blocks` column blocks (0: none)."""
    if blocks not in CHAIN_BLOCK_CHOICES:
        raise ValueError(f"CHAIN_BLOCKS must be one of {CHAIN_BLOCK_CHOICES}, got {blocks!r}")
    return CHAIN_FLAG * (blocks.bit_length() - 1) if blocks else 0


def op_order(exact_sums: bool = True) -> int:
    """The `EXACT` code the kernels take: the sum mode (0 with `exact_sums` False: `tl.sum` in the compiler's
    order), plus `FMA_FLAG` under `FUSED_UPDATE`, plus the chain field of `CHAIN_BLOCKS` (`chain_code`; exact sums
    only). Read per launch, so the module switches apply at once."""
    chain = chain_code(CHAIN_BLOCKS) if exact_sums else 0
    return (EXACT_SUM_MODE if exact_sums else 0) | (FMA_FLAG if FUSED_UPDATE else 0) | chain


def op_order_name() -> str:
    """`tree`, `float64`, plus `+fma` under `FUSED_UPDATE` and `+chain` (8 blocks, as run 17 named it) or
    `+chainN` under `CHAIN_BLOCKS`: the fold's op order in benchmark records."""
    sums = next(name for name, mode in SUM_MODES.items() if mode == EXACT_SUM_MODE)
    chain = {0: "", 8: "+chain"}.get(CHAIN_BLOCKS, f"+chain{CHAIN_BLOCKS}")
    return sums + ("+fma" if FUSED_UPDATE else "") + chain


def add_op_order_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmarks' `--exact-sums tree|float64`, `--unfused-update`, `--chain-blocks N` and `--chain-dots`
    (8 blocks, run 17's flag); `use_op_order` applies them."""
    parser.add_argument(
        "--exact-sums", choices=sorted(SUM_MODES), help="how the bit-exact path adds (default tree; or float64)"
    )
    parser.add_argument(
        "--unfused-update",
        action="store_true",
        help="the state update as a multiply and an add, each rounded (default: one fused multiply-add)",
    )
    chain = parser.add_mutually_exclusive_group()
    chain.add_argument(
        "--chain-blocks",
        type=int,
        choices=CHAIN_BLOCK_CHOICES,
        help="the bit-exact path's state dots as a chain of fused multiply-adds over this many column blocks, "
        "0: none (CHAIN_BLOCKS, default 0)",
    )
    chain.add_argument("--chain-dots", action="store_true", help="--chain-blocks 8")


def use_op_order(args: argparse.Namespace) -> None:
    """Set `EXACT_SUM_MODE`, `FUSED_UPDATE` and `CHAIN_BLOCKS` from parsed `add_op_order_arguments`; unset ones
    keep the defaults."""
    global EXACT_SUM_MODE, FUSED_UPDATE, CHAIN_BLOCKS  # noqa: PLW0603 (the module switches the launchers read per call)
    if args.exact_sums is not None:
        EXACT_SUM_MODE = SUM_MODES[args.exact_sums]
    if args.unfused_update:
        FUSED_UPDATE = False
    if args.chain_dots:
        CHAIN_BLOCKS = 8
    elif args.chain_blocks is not None:
        CHAIN_BLOCKS = args.chain_blocks


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


def default_tile(
    *, head_v_dim: int, device: torch.device, num_tokens: int | None = None, out_dtype: torch.dtype | None = None
) -> TileConfig:
    """The baseline's tile for one step, and the precision of ReplaySSM's reconstruction dots.

    Tile (H200, `python -m gdn_replayssm.bench_parts`): decode four warps per `[64, K]` tile; verify (and an
    unknown `num_tokens`) one warp per `[16, K]` tile.
    Dots: on NVIDIA GPUs one TF32 pass when the outputs are bfloat16 / float16, 3xTF32 otherwise; "ieee"
    elsewhere. One TF32 pass rounds each operand to 11 significant bits, finer than the 8 of a bfloat16
    output, and at most a non-flush step's outputs and `u` records see that error: the checkpoint is only
    ever written by the exact fold, so nothing feeds it back. 3xTF32 costs the H200 1.8x on the window
    kernel (bench_parts, B = 64, T = 4).
    """
    nvidia = device.type == "cuda" and torch.version.hip is None and not interpreting()
    decode = nvidia and num_tokens == 1
    block_v = min(64 if decode else 16, max(16, triton.next_power_of_2(head_v_dim)))
    num_warps = 4 if decode else 1
    if not nvidia:
        precision = "ieee"
    elif out_dtype in (torch.bfloat16, torch.float16):
        precision = "tf32"
    else:
        precision = "tf32x3"
    return TileConfig(block_v=block_v, num_warps=num_warps, num_stages=2, dot_precision=precision)


def check_device(device: torch.device) -> None:
    """Triton needs an accelerator, or TRITON_INTERPRET=1 with CPU tensors."""
    if device.type == "cpu" and not interpreting():
        raise ValueError("the Triton kernels need tensors on a GPU, or TRITON_INTERPRET=1 with CPU tensors")
