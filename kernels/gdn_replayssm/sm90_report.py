"""Compile the kernels for sm_90 (H100/H200) on this machine, no GPU needed: registers, spills, shared memory, the
programs per SM they allow, a SASS digest.

    PYTHONPATH=kernels python -m gdn_replayssm.sm90_report [--kernels flush,decode] [--max-registers 168]

Device time is scarce; what the compiler makes of a kernel is not. Triton's NVIDIA backend ships `ptxas` and
`cuobjdump`, so a kernel can be compiled for sm_90 here and its resource use read before it is timed:
registers and shared memory (they bound the resident programs per SM), stack bytes (spills), and a digest of
the SASS opcode stream, which tells whether a refactor changed the machine code at all. Shapes are Qwen3.6's GDN layer
(H = 16, HV = 32, K = V = 128), bf16 activations and rings, fp32 state, ring 32 unless a build's name says
otherwise (the decode's default is 16 since run 25); the tiles are the launchers' defaults for a large batch
(`_replay.py`), plus the small-batch tiles where they differ. The
numbers are this machine's Triton's; the H200 runs in ops/results used Triton 3.6, so treat differences
between versions as indicative, and compare configurations compiled by the same one.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import _config, _replay
from ._decode import _decode_kernel
from ._decode_heads import _key_head_decode_kernel
from ._flush import (
    _flush_kernel,
    _flush_persistent_kernel,
    _flushing_list_kernel,
    _layers_fold_kernel,
    _normalised_keys_kernel,
)
from ._window import _key_products_kernel, _window_kernel
from .baseline import _recurrent_kernel

GEO = {"H": 16, "HV": 32, "K": 128, "V": 128, "BK": 128}
RING_ARGS = {
    "mixed_qkv": "*bf16", "a": "*bf16", "b": "*bf16", "A_log": "*fp32", "dt_bias": "*fp32", "state": "*fp32",
    "ring_u": "*bf16", "ring_k": "*bf16", "ring_g": "*fp32", "ring_v": "*bf16", "ring_beta": "*fp32",
    "write_pos": "*i32", "ring_base": "*i32", "state_indices": "*i32", "out": "*bf16", "scale": "fp32",
    "stride_x": "i32", "stride_a": "i32", "stride_b": "i32", "stride_state": "i32", "stride_ru": "i32",
    "stride_rk": "i32", "stride_rg": "i32", "stride_rv": "i32", "stride_rbeta": "i32",
}  # fmt: skip
BASELINE_ARGS = {
    "mixed_qkv": "*bf16", "a": "*bf16", "b": "*bf16", "A_log": "*fp32", "dt_bias": "*fp32", "state": "*fp32",
    "state_indices": "*i32", "num_accepted": "*i32", "out": "*bf16", "scale": "fp32", "stride_x": "i32",
    "stride_a": "i32", "stride_b": "i32", "stride_state": "i32",
}  # fmt: skip
PERSISTENT_ARGS = {**RING_ARGS, "B": "i32"}  # `_flush_persistent_kernel`'s
WINDOW_ARGS = {**RING_ARGS, "products": "*fp32"}  # `_window_kernel`'s and `_key_products_kernel`'s
KEY_HEAD_ARGS = {**RING_ARGS, "state_desc": "*fp32"}  # `_key_head_decode_kernel`'s: the pool again unless `TMA_STATE`
BF16_STATE = {"state": "*bf16", "state_desc": "*bf16"}
LIST_ARGS = {"state_indices": "*i32", "write_pos": "*i32", "ring_base": "*i32", "rows": "*i32", "B": "i32"}
ALIGNED = ("stride_x", "stride_state", "stride_ru", "stride_rk", "stride_rv")  # multiples of 16 in vLLM's layouts


@dataclass(frozen=True)
class Build:
    """One kernel configuration to compile."""

    name: str
    kernel: Any
    args: dict[str, str]
    constants: dict[str, Any]
    num_warps: int
    fp_fusion: bool = True
    max_registers: int | None = None  # the launcher's own cap, if it sets one


def _fold_constants() -> dict[str, Any]:
    """The flush launch's constants in the builds: ring 32, the bit-exact path's op order, keys normalised in the
    kernel."""
    return {"L": 32, "BC": 4, "DOT_PRECISION": "tf32", "EXACT_FOLD": True, "EXACT": _config.op_order(), "keys": None,
            "NORMALISED_KEYS": False, "JOIN": 0, "DEFER": False}  # fmt: skip


def _decode_constants() -> dict[str, Any]:
    """`_decode_kernel`'s constants in the builds: ring 32 in 32-record history chunks, a first chunk of 8."""
    return {**GEO, "L": 32, "BH": 32, "EXACT_FOLD": True, "BC": 4, "FUSED_FLUSH": False, "DOT_PRECISION": "tf32",
            "EXACT": _config.op_order(), "FIRST_CHUNK": 8, "JOIN": 0, "DEFER": False,
            "PAIRED_STATE": False}  # fmt: skip


def builds() -> list[Build]:
    """The configurations the launchers use at Qwen3.6 shapes (`_replay.py` says when each applies), with the
    bit-exact path's op order `_config.op_order()`."""
    exact = _config.op_order()
    flush = _fold_constants()
    decode = _decode_constants()
    one_size = {**decode, "FIRST_CHUNK": 0}  # every history chunk of BH records
    keyed = {k: v for k, v in flush.items() if k != "keys"} | {"NORMALISED_KEYS": True}
    out = []
    for T in (1, 4):
        for bv in (8, 16):
            out.append(Build(f"flush T={T} {bv}x1", _flush_kernel, RING_ARGS, {**GEO, **flush, "T": T, "BV": bv}, 1,
                             fp_fusion=False))  # fmt: skip
        out.append(Build(f"flush persistent T={T} 8x1 B=64", _flush_persistent_kernel, PERSISTENT_ARGS,
                         {**GEO, **flush, "T": T, "BV": 8, "BB": 64, "NV": 16}, 1, fp_fusion=False))  # fmt: skip
        out.append(Build(f"flush T={T} 16x1 normalised keys", _flush_kernel, {**RING_ARGS, "keys": "*fp32"},
                         {**GEO, **keyed, "T": T, "BV": 16}, 1, fp_fusion=False))  # fmt: skip
        out.append(Build(f"flush persistent T={T} 8x1 B=64 normalised keys", _flush_persistent_kernel,
                         {**PERSISTENT_ARGS, "keys": "*fp32"}, {**GEO, **keyed, "T": T, "BV": 8, "BB": 64, "NV": 16},
                         1, fp_fusion=False))  # fmt: skip
    keyed_args = {**PERSISTENT_ARGS, "keys": "*fp32"}
    window_keyed = {**keyed, "NORMALISED_KEYS": 2}  # FLUSH_NORMALISED_WINDOW
    for T in (1, 4):  # the flush launch above FLUSH_SMALL_TILE_MAX_BATCH rows
        for name, kw, args in (("", flush, PERSISTENT_ARGS), (" normalised keys", keyed, keyed_args),
                               (" normalised window", window_keyed, keyed_args)):  # fmt: skip
            out.append(Build(f"flush persistent T={T} 16x1 B=256{name}", _flush_persistent_kernel, args,
                             {**GEO, **kw, "T": T, "BV": 16, "BB": 256, "NV": 8}, 1, fp_fusion=False))  # fmt: skip
    out.append(Build("flush normalised keys pass", _normalised_keys_kernel, {**RING_ARGS, "keys": "*fp32"},
                     {"T": 4, "L": 32, "H": 16, "K": 128, "BK": 128, "BC": 4, "BT": 4, "EXACT": exact,
                      "NORMALISED_KEYS": 1, "JOIN": 0, "DEFER": False}, 1,
                     fp_fusion=False))  # fmt: skip
    out.append(Build("decode 64x4", _decode_kernel, RING_ARGS, {**decode, "BV": 64, "PRELOAD": False}, 4))
    out.append(Build("decode 32x4 preload", _decode_kernel, RING_ARGS, {**one_size, "BV": 32, "PRELOAD": True}, 4))
    out.append(Build("decode 64x4 h8", _decode_kernel, RING_ARGS, {**one_size, "BV": 64, "PRELOAD": False, "BH": 8}, 4))
    out.append(Build("decode 64x4 no first chunk", _decode_kernel, RING_ARGS,
                     {**one_size, "BV": 64, "PRELOAD": False}, 4))  # fmt: skip
    out.extend(_window_builds())
    window_args, in_kernel = WINDOW_ARGS, _wide_in_kernel_constants()
    # a bf16 state, uncapped and as launched on CUDA (`_replay.DECODE_MAX_REGISTERS` says why)
    bf16_state = {**RING_ARGS, "state": "*bf16"}
    for pairs, paired in (("", False), (" paired", True)):  # `_replay.PAIRED_STATE`: the tile as int32 pairs
        out.extend(Build(f"decode 64x4 bf16 state{pairs}{name}", _decode_kernel, bf16_state,
                         {**decode, "BV": 64, "PRELOAD": False, "PAIRED_STATE": paired}, 4, max_registers=cap)
                   for name, cap in ((" uncapped", None), ("", _replay.DECODE_MAX_REGISTERS)))  # fmt: skip
    # coalesced flushes (`ReplayCursors.flush_join`): the step's plan read from `write_pos[0]`
    join = {"JOIN": 16}
    out.append(Build("decode 64x4 coalesced flushes", _decode_kernel, RING_ARGS,
                     {**decode, "BV": 64, "PRELOAD": False, **join}, 4))  # fmt: skip
    out.append(Build("window T=4 128x4 in-kernel key products ring 64 coalesced flushes", _window_kernel, window_args,
                     {**in_kernel, "JOIN": 32}, 4, max_registers=_replay.WIDE_WINDOW_MAX_REGISTERS))  # fmt: skip
    out.append(Build("flush persistent T=4 16x1 B=256 normalised window coalesced flushes", _flush_persistent_kernel,
                     keyed_args, {**GEO, **window_keyed, "T": 4, "BV": 16, "BB": 256, "NV": 8, **join}, 1,
                     fp_fusion=False))  # fmt: skip
    # deferred folds (`_replay.deferred_fold`): the non-flush kernels take every row, the flush launch only folds
    defer = {"DEFER": True}
    out.append(Build("decode 32x4 deferred fold, preload", _decode_kernel, RING_ARGS,
                     {**one_size, "BV": 32, "PRELOAD": True, **defer}, 4))  # fmt: skip
    out.append(Build("decode 64x4 deferred fold", _decode_kernel, RING_ARGS,
                     {**decode, "BV": 64, "PRELOAD": False, **defer}, 4))  # fmt: skip
    # decode as launched with its default ring of 16 records (`ring.default_ring_len`) and the join at half of it:
    # the preloading, deferring build of the step fold's small batches, and the chunked build above them, uncapped
    # and as launched since run 26 (at 128 registers, `_replay.DECODE_MAX_REGISTERS`; the other decode builds here
    # are uncapped)
    ring16 = {"L": 16, "BH": 16, "JOIN": 8}
    out.extend([Build("decode ring 16, 32x4 deferred fold, preload", _decode_kernel, RING_ARGS,
                      {**one_size, **ring16, "BV": 32, "PRELOAD": True, **defer}, 4),
                Build("decode ring 16, 64x4 coalesced flushes", _decode_kernel, RING_ARGS,
                      {**decode, **ring16, "BV": 64, "PRELOAD": False}, 4),
                Build("decode ring 16 at 128 registers, 64x4 coalesced flushes", _decode_kernel, RING_ARGS,
                      {**decode, **ring16, "BV": 64, "PRELOAD": False}, 4, max_registers=128),
                Build("decode ring 16 h8, 64x4 coalesced flushes", _decode_kernel, RING_ARGS,
                      {**decode, **ring16, "BH": 8, "BV": 64, "PRELOAD": False}, 4),
                # the large-batch candidates with one loop: a single chunk of 16, the whole ring preloaded
                *(Build(f"decode ring 16 {name}, 64x4 coalesced flushes", _decode_kernel, RING_ARGS,
                        {**one_size, **ring16, "BV": 64, "PRELOAD": preload}, 4)
                  for name, preload in (("one chunk", False), ("preload", True)))])  # fmt: skip
    out.append(Build("window T=4 128x4 in-kernel key products ring 64 deferred fold", _window_kernel, window_args,
                     {**in_kernel, "JOIN": 32, **defer}, 4,
                     max_registers=_replay.WIDE_WINDOW_MAX_REGISTERS))  # fmt: skip
    for T in (1, 4):
        out.append(Build(f"flush persistent T={T} 16x1 B=256 normalised keys deferred fold", _flush_persistent_kernel,
                         keyed_args, {**GEO, **keyed, "T": T, "BV": 16, "BB": 256, "NV": 8, **defer}, 1,
                         fp_fusion=False))  # fmt: skip
    out.append(Build("flush T=1 8x1 deferred fold", _flush_kernel, RING_ARGS,
                     {**GEO, **flush, "T": 1, "BV": 8, **defer}, 1, fp_fusion=False))  # fmt: skip
    # the step fold (`fold.replayssm_fold`): every layer's folds in one persistent launch, 16-row programs
    layers_args = {name: kind for name, kind in RING_ARGS.items() if name in ("state", "write_pos", "ring_base",
                   "state_indices") or name.startswith(("ring_", "stride_r")) or name == "stride_state"}  # fmt: skip
    layers_args |= {"offsets": "*i64", "B": "i32", "LAYERS": "i32"}
    step = {k: v for k, v in flush.items() if k in ("L", "BC", "DOT_PRECISION", "EXACT_FOLD", "EXACT", "JOIN")}
    for T, B in ((1, 1), (1, 8), (4, 32)):
        out.append(Build(f"step fold T={T} 16x1 B={B}", _layers_fold_kernel, layers_args,
                         {**GEO, **step, "T": T, "BV": _replay.STEP_FOLD_BLOCK_V, "BB": B, "NV": 8}, 1,
                         fp_fusion=False))  # fmt: skip
    vllm = {**GEO, "EXACT_SUMS": _config.op_order(exact_sums=False)}
    for T, bv, warps in ((1, 64, 4), (4, 16, 1)):
        out.append(Build(f"baseline T={T} {bv}x{warps}", _recurrent_kernel, BASELINE_ARGS,
                         {**vllm, "T": T, "BV": bv, "HAS_NUM_ACCEPTED": T > 1}, warps))  # fmt: skip
    exact_baseline = {**GEO, "T": 1, "BV": 64, "HAS_NUM_ACCEPTED": False, "EXACT_SUMS": exact}
    out.append(Build("baseline T=1 64x4 exact", _recurrent_kernel, BASELINE_ARGS, exact_baseline, 4, fp_fusion=False))
    return out + _key_head_builds() + _k_chunk_builds() + _decode_fold_builds()


def _window_constants() -> dict[str, Any]:
    """`_window_kernel`'s constants in the builds: T = 4, ring 32, 32x2 tiles, the bit-exact path's op order."""
    return {**GEO, "T": 4, "L": 32, "BKC": 32, "BV": 32, "BX": 16, "BH": 32, "NV": 4, "DOT_PRECISION": "tf32",
            "EXACT_FOLD": True, "NUM_STAGES": 3, "BC": 4, "FUSED_FLUSH": False, "EXACT": _config.op_order(),
            "RAW_KEY_DOTS": False, "JOIN": 0, "DEFER": False,
            "QUERY_COLUMNS": _replay.window_query_columns(4, preload=False), "EARLY_GATES": False}  # fmt: skip


def _wide_in_kernel_constants() -> dict[str, Any]:
    """The wide tile as launched by default from `_replay.WIDE_WINDOW_MIN_BATCH` rows for T >= 3: the keys' side in
    the kernel (`_replay.WIDE_WINDOW_KEY_PRODUCTS` off) at its own stages and summed history norms, on the ring its
    windows take (`ring.default_ring_len`: 64 records)."""
    return {**_window_constants(), "BV": 128, "NV": 1, "L": 64, "BH": 64, "PRELOAD": False, "PRODUCTS": False,
            "NUM_STAGES": _replay.WIDE_WINDOW_IN_KERNEL_STAGES, "BKC": _replay.WIDE_WINDOW_IN_KERNEL_BLOCK_K,
            "RAW_KEY_DOTS": 1 if _replay.WIDE_WINDOW_HISTORY_GRAM_NORMS else 2,
            "EARLY_GATES": _replay.window_early_gates(True, torch.float32)}  # fmt: skip


def _window_builds() -> list[Build]:
    """The window kernel's builds: 32x2 (preloading, raw key dots, after the pre-pass), 64x2 for T = 2 and 4, the
    wide tile in-kernel and after the pre-pass, and the pre-pass itself; on a bf16 state the state dot in bf16
    (`_replay.WINDOW_RAW_STATE_DOT`)."""
    out = []
    # the window kernel: preloading at small batches (as launched), raw key dots (codes 1, 2) and the keys' side in
    # its own kernel before it (WINDOW_KEY_PRODUCTS), at 32x2 and at the default 64x2
    window, window_args = _window_constants(), WINDOW_ARGS
    for name, preload, raw, products in (("", False, 0, False), (" preload", True, 0, False),
                                         (" raw key dots", False, 1, False),
                                         (" raw key dots, norms summed", False, 2, False),
                                         (" key products", False, 2, True)):  # fmt: skip
        out.append(Build(f"window T=4 32x2{name}", _window_kernel, window_args,
                         {**window, "PRELOAD": preload, "RAW_KEY_DOTS": raw, "PRODUCTS": products,
                          "QUERY_COLUMNS": _replay.window_query_columns(4, preload)}, 2))  # fmt: skip
    # from WINDOW_PRODUCTS_MIN_BATCH rows: 64x2 tiles, and 128x4 for the windows WIDE_WINDOW_TOKENS names
    default = {**window, "BV": 64, "NV": 2, "PRELOAD": False, "RAW_KEY_DOTS": 2, "PRODUCTS": True}
    from_rows = f"from {_replay.WINDOW_PRODUCTS_MIN_BATCH} rows"
    t2 = {**default, "T": 2, "QUERY_COLUMNS": _replay.window_query_columns(2, preload=False)}
    raw_bf16 = _replay.window_raw_state_dot(torch.bfloat16, torch.bfloat16, False)  # the bf16 in-kernel builds'
    t2_in_kernel = {**t2, "PRODUCTS": False, "NUM_STAGES": _replay.WINDOW_IN_KERNEL_STAGES,
                    "RAW_KEY_DOTS": 1 if _replay.WINDOW_IN_KERNEL_HISTORY_GRAM_NORMS else 2}  # fmt: skip
    out.extend([
        Build("window T=4 64x2 key products", _window_kernel, window_args, default, 2),
        Build(f"window T=2 64x2 key products (default above {_replay.WINDOW_IN_KERNEL_MAX_BATCH} rows)",
              _window_kernel, window_args, t2, 2),
        Build(f"window T=2 64x2 in-kernel key products (default {from_rows} to {_replay.WINDOW_IN_KERNEL_MAX_BATCH})",
              _window_kernel, window_args, t2_in_kernel, 2),
        Build(f"window T=2 64x2 in-kernel key products bf16 state (default {from_rows} to "
              f"{_replay.NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH})", _window_kernel, {**window_args, "state": "*bf16"},
              {**t2_in_kernel, "NUM_STAGES": _replay.NARROW_STATE_WINDOW_IN_KERNEL_STAGES,
               "RAW_STATE_DOT": raw_bf16}, 2),
    ])  # fmt: skip
    in_kernel = _wide_in_kernel_constants()
    wide = {**in_kernel, "PRODUCTS": True, "NUM_STAGES": 3, "BKC": 32, "RAW_KEY_DOTS": 2,  # after the pre-pass
            "EARLY_GATES": _replay.window_early_gates(False, torch.float32)}  # fmt: skip
    out.extend([
        Build("window T=4 128x4 key products ring 64 (with WIDE_WINDOW_KEY_PRODUCTS)", _window_kernel, window_args,
              wide, 4),
        Build(f"window T=4 128x4 in-kernel key products ring 64 at {_replay.WIDE_WINDOW_MAX_REGISTERS} registers "
              f"(default from {_replay.WIDE_WINDOW_MIN_BATCH} rows for T >= 3)", _window_kernel, window_args,
              in_kernel, 4, max_registers=_replay.WIDE_WINDOW_MAX_REGISTERS),
        Build(f"window T=4 128x4 in-kernel key products ring 64 bf16 state at {_replay.WIDE_WINDOW_MAX_REGISTERS} "
              "registers", _window_kernel, {**window_args, "state": "*bf16"},
              {**in_kernel, "NUM_STAGES": _replay.NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES,
               "EARLY_GATES": _replay.window_early_gates(True, torch.bfloat16), "RAW_STATE_DOT": raw_bf16}, 4,
              max_registers=_replay.WIDE_WINDOW_MAX_REGISTERS),
        Build("window key products pass", _key_products_kernel, window_args,
              {"T": 4, "L": 32, "H": 16, "K": 128, "BK": 128, "BKC": 32, "BX": 16, "BH": 32, "DOT_PRECISION": "tf32",
               "NUM_STAGES": 3, "RAW_KEY_DOTS": 2, "JOIN": 0, "DEFER": False}, 2),
    ])  # fmt: skip
    return out


def _decode_fold_builds() -> list[Build]:
    """A decode step's in-line persistent fold at B = 256 as launched on CUDA, at
    `_replay.DECODE_FOLD_MAX_REGISTERS` (the other fold builds are uncapped, as verify launches them)."""
    cap = _replay.DECODE_FOLD_MAX_REGISTERS
    scratch_keys = {**GEO, **{k: v for k, v in _fold_constants().items() if k != "keys"}, "BV": 16, "BB": 256, "NV": 8}
    fold = {**scratch_keys, "NORMALISED_KEYS": 2, "T": 1}
    listed_cap = _replay.LISTED_FOLD_MAX_REGISTERS
    verify = {**scratch_keys, "NORMALISED_KEYS": 1, "T": 4, "DEFER": True, "LISTED": True}
    listed_args = {**PERSISTENT_ARGS, "keys": "*fp32", "rows": "*i32"}
    return [
        Build(f"flush persistent T=1 16x1 B=256 normalised window at {cap} registers", _flush_persistent_kernel,
              {**PERSISTENT_ARGS, "keys": "*fp32"}, fold, 1, fp_fusion=False, max_registers=cap),
        # `_replay.LISTED_FOLDS`: the flushing rows from a list, the decode fold at its cap, a verify step's
        # deferred fold at `LISTED_FOLD_MAX_REGISTERS`, and the list's kernel
        Build(f"flush persistent T=1 16x1 B=256 normalised window listed at {cap} registers",
              _flush_persistent_kernel, listed_args, {**fold, "LISTED": True}, 1, fp_fusion=False, max_registers=cap),
        Build(f"flush persistent T=4 16x1 B=256 normalised keys deferred fold listed at {listed_cap} registers",
              _flush_persistent_kernel, listed_args, verify, 1, fp_fusion=False, max_registers=listed_cap),
        Build("flush list B=256", _flushing_list_kernel, LIST_ARGS, {"T": 4, "L": 32, "BB": 256, "JOIN": 0}, 4),
    ]  # fmt: skip


def _k_chunk_builds() -> list[Build]:
    """`_decode_kernel` with its state tile read as column chunks of 32 (`_replay.DECODE_K_CHUNK`) at the ring of 16,
    as launched on CUDA: the chunked-history build and the preloading, deferring one."""
    cap = _replay.DECODE_MAX_REGISTERS
    decode = {**_decode_constants(), "L": 16, "BH": 16, "JOIN": 8, "KC": 32}
    return [
        Build("decode ring 16 at 128 registers, 64x4 kc32", _decode_kernel, RING_ARGS,
              {**decode, "BV": 64, "PRELOAD": False}, 4, max_registers=cap),
        Build("decode ring 16 at 128 registers, 32x4 deferred fold, preload kc32", _decode_kernel, RING_ARGS,
              {**decode, "BV": 32, "PRELOAD": True, "FIRST_CHUNK": 0, "DEFER": True}, 4, max_registers=cap),
    ]  # fmt: skip


def _key_head_builds() -> list[Build]:
    """`_key_head_decode_kernel` at the decode's default ring of 16 with the join at half of it, as launched on
    CUDA (`_replay.DECODE_MAX_REGISTERS`): 64-row tiles (two per value head) and 32-row ones, whole and in column
    chunks (`KEY_HEAD_DECODE_K_CHUNK`, 32 the default), the records inside the chunks' sums
    (`KEY_HEAD_DECODE_FUSED_HISTORY`), a paired bf16 state, the deferring build, and the pipelined loop of
    `KEY_HEAD_DECODE_STAGES` with `KEY_HEAD_DECODE_PREFETCH` (fp32 and bf16 states, deferring or not; without the
    prefetch; on a ring of 8 in its 8-row records' tile, `KEY_HEAD_DECODE_MIN_HISTORY_BLOCK`; and reading the state
    through a tensor descriptor, `KEY_HEAD_DECODE_TMA`, which the pointer builds above do not, with and without
    `KEY_HEAD_DECODE_LATE_NORMS`)."""
    cap = _replay.DECODE_MAX_REGISTERS
    heads = {**GEO, "L": 16, "BH": 16, "EXACT_FOLD": True, "JOIN": 8, "DEFER": False, "PAIRED_STATE": False, "G": 2,
             "KC": 0, "FUSED_HISTORY": False}  # fmt: skip
    out = [Build(f"decode key head {bv}x{warps}", _key_head_decode_kernel, KEY_HEAD_ARGS,
                 {**heads, "BV": bv, "NV": 128 // bv}, warps, max_registers=cap)
           for bv, warps in ((64, 4), (32, 4), (32, 2))]  # fmt: skip
    out.extend(Build(f"decode key head {bv}x{warps} kc{kc}", _key_head_decode_kernel, KEY_HEAD_ARGS,
                     {**heads, "BV": bv, "NV": 128 // bv, "KC": kc}, warps, max_registers=cap)
               for bv, warps, kc in ((64, 4, 32), (32, 4, 32), (64, 4, 16)))  # fmt: skip
    out.extend(Build(f"decode key head 64x4 kc{kc} fused history", _key_head_decode_kernel, KEY_HEAD_ARGS,
                     {**heads, "BV": 64, "NV": 2, "KC": kc, "BH": max(16, kc), "FUSED_HISTORY": True}, 4,
                     max_registers=cap) for kc in (32, 16))  # fmt: skip
    out.append(Build("decode key head 64x4 bf16 state paired", _key_head_decode_kernel, {**KEY_HEAD_ARGS, **BF16_STATE},
                     {**heads, "BV": 64, "NV": 2, "PAIRED_STATE": True}, 4, max_registers=cap))  # fmt: skip
    out.append(Build("decode key head 64x4 deferred fold", _key_head_decode_kernel, KEY_HEAD_ARGS,
                     {**heads, "BV": 64, "NV": 2, "DEFER": True}, 4, max_registers=cap))  # fmt: skip
    staged = {**heads, "BV": 64, "NV": 2, "KC": _replay.KEY_HEAD_DECODE_K_CHUNK,
              "STAGES": _replay.KEY_HEAD_DECODE_STAGES, "PREFETCH": _replay.KEY_HEAD_DECODE_PREFETCH}  # fmt: skip
    out.extend(Build(f"decode key head 64x4 kc{staged['KC']} s{staged['STAGES']}{name}", _key_head_decode_kernel,
                     {**KEY_HEAD_ARGS, **args}, {**staged, **more}, 4, max_registers=cap)
               for name, args, more in (("", {}, {}), (" deferred fold", {}, {"DEFER": True}),
                                        (" bf16 state", BF16_STATE, {}),
                                        (" no prefetch", {}, {"PREFETCH": False}),
                                        (" ring 8", {}, {"L": 8, "BH": 8, "JOIN": 4}),
                                        (" tma", {"state_desc": "tensordesc<fp32[1,1,64,32]>"}, {"TMA_STATE": True}),
                                        (" bf16 state tma",
                                         {**BF16_STATE, "state_desc": "tensordesc<bf16[1,1,64,32]>"},
                                         {"TMA_STATE": True}),
                                        (" tma late norms", {"state_desc": "tensordesc<fp32[1,1,64,32]>"},
                                         {"TMA_STATE": True, "LATE_NORMS": True}),
                                        (" bf16 state tma late norms",
                                         {**BF16_STATE, "state_desc": "tensordesc<bf16[1,1,64,32]>"},
                                         {"TMA_STATE": True, "LATE_NORMS": True})))  # fmt: skip
    return out


def _tool(name: str) -> Path:
    """A binary of Triton's NVIDIA backend (`ptxas`, `cuobjdump`)."""
    from triton.backends import nvidia

    path = Path(nvidia.__file__).parent / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: this Triton install has no NVIDIA backend binaries")
    return path


def compile_sm90(build: Build, max_registers: int | None = None) -> tuple[bytes, int]:
    """The cubin of one configuration, compiled for sm_90, and the shared memory a program takes (bytes): with the
    registers, what bounds the resident programs per SM (228 KB of it on an H100/H200)."""
    fn = build.kernel
    while not isinstance(fn, triton.runtime.jit.JITFunction):  # unwrap @triton.heuristics
        fn = fn.fn
    parameters = inspect.signature(fn.fn).parameters
    params = list(parameters)
    # constexpr parameters with a default that the build does not set take the default, as in a launch
    defaults = {p: v.default for p, v in parameters.items() if v.default is not inspect.Parameter.empty}
    constants = {**{p: v for p, v in defaults.items() if p not in build.args}, **build.constants}
    signature = {p: "constexpr" if p in constants else build.args[p] for p in params}
    aligned = [p for p in params if build.args.get(p, "").startswith("*") or (p in ALIGNED and p in build.args)]
    source = ASTSource(
        fn,
        signature,
        constexprs={(params.index(k),): v for k, v in constants.items()},
        attrs={(params.index(p),): [["tt.divisibility", 16]] for p in aligned},
    )
    options: dict[str, Any] = {"num_warps": build.num_warps, "num_stages": 3, "enable_fp_fusion": build.fp_fusion}
    if max_registers or build.max_registers:
        options["maxnreg"] = max_registers or build.max_registers
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.asm["cubin"], int(compiled.metadata.shared)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    """`cuobjdump <flag>` of a cubin (`-sass`, `-res-usage`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(_tool("cuobjdump")), flag, str(path)], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip


def report(cubin: bytes) -> dict[str, Any]:
    """Registers, stack bytes and the SASS opcode digest of a cubin (read with `cuobjdump`)."""
    usage = _cuobjdump(cubin, "-res-usage")
    found = re.search(r"REG:(\d+)\s+STACK:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage[:200]!r}")
    opcodes = [text for _, text in _instructions(_cuobjdump(cubin, "-sass"))]
    digest = hashlib.sha256("\n".join(opcodes).encode()).hexdigest()[:12]
    return {"registers": int(found[1]), "stack_bytes": int(found[2]), "instructions": len(opcodes), "sass": digest}


# sm_90 (H100/H200) per-SM limits, as CUDA's occupancy calculator applies them
SM90_REGISTERS = 65536  # per SM
SM90_REGISTER_UNIT = 256  # registers are allocated per warp in units of this many
SM90_MAX_WARPS = 64
SM90_MAX_PROGRAMS = 32
SM90_SHARED = 228 * 1024  # bytes per SM
SM90_SHARED_RESERVED = 1024  # bytes the runtime reserves per program


def programs_per_sm(registers: int, shared: int, num_warps: int) -> int:
    """Programs (CTAs) of one kernel resident on an sm_90 SM at once: the least of what its registers, shared
    memory (bytes) and warps allow. A warp's registers round up to `SM90_REGISTER_UNIT`, so a cap of 102 keeps four
    128-thread programs, as 128 does: five need 96 or fewer (CUDA's occupancy calculator on the H200 agreed for
    the key-head decode at 96-128 registers, 2 and 3 stages: `ops/results/h200-replayssm/h200-occupancy-43c.jsonl`)."""
    if registers < 1 or num_warps < 1 or shared < 0:
        raise ValueError(
            f"registers and num_warps must be >= 1 and shared >= 0, got {registers}, {num_warps}, {shared}"
        )
    per_warp = -(-registers * 32 // SM90_REGISTER_UNIT) * SM90_REGISTER_UNIT
    by_registers = SM90_REGISTERS // (per_warp * num_warps)
    by_shared = SM90_SHARED // (shared + SM90_SHARED_RESERVED)
    return min(by_registers, by_shared, SM90_MAX_WARPS // num_warps, SM90_MAX_PROGRAMS)


def _instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text up to its `;`) of every instruction in a `cuobjdump -sass` listing."""
    return [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def loops(sass: str) -> list[dict[str, Any]]:
    """The innermost loops of a kernel's SASS (no other loop inside), longest first: each backward branch `BRA`
    to an earlier address closes a loop; its body is the instructions from the target to the branch. Per
    loop: the instruction count, the floating-point (`F*`, `HMMA`) and shuffle counts, the top opcodes."""
    rows = [(addr, text.strip()) for addr, text in _instructions(sass)]
    found: list[dict[str, Any]] = []
    for i, (addr, text) in enumerate(rows):
        jump = re.search(r"\bBRA\b[^0-9]*(0x[0-9a-f]+)", text)
        if jump is None or int(jump[1], 16) >= addr:
            continue
        start = int(jump[1], 16)
        body = [t for a, t in rows[: i + 1] if a >= start]
        counts = Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        found.append({
            "span": (start, addr),
            "instructions": len(body),
            "float": sum(n for op, n in counts.items() if op.startswith(("F", "HMMA")) and op not in ("FLO",)),
            "shuffles": counts.get("SHFL", 0),
            "top": counts.most_common(8),
        })  # fmt: skip
    inner = [a for a in found if not any(b is not a and a["span"][0] <= b["span"][0] and b["span"][1] <= a["span"][1]
                                         for b in found)]  # fmt: skip
    return sorted(inner, key=lambda loop: -int(loop["instructions"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdn_replayssm.sm90_report", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", help="comma list of name prefixes to compile (default: all), e.g. flush,decode")
    p.add_argument("--max-registers", type=int, help="register cap (maxnreg) for every configuration")
    p.add_argument(
        "--loops", action="store_true", help="also the instruction mix of each kernel's longest innermost loop"
    )
    _config.add_op_order_arguments(p)
    a = p.parse_args(argv)
    _config.use_op_order(a)
    wanted = a.kernels.split(",") if a.kernels else None
    chosen = [b for b in builds() if wanted is None or any(b.name.startswith(w) for w in wanted)]
    if not chosen:
        p.error(f"--kernels {a.kernels}: no configuration starts with that; names: "
                + ", ".join(b.name for b in builds()))  # fmt: skip
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("gdn_replayssm.sm90_report: TRITON_INTERPRET=1 replaces the compiler; unset it", file=sys.stderr)
        return 2
    try:
        _tool("cuobjdump")
    except FileNotFoundError as exc:
        print(f"gdn_replayssm.sm90_report: {exc}", file=sys.stderr)
        return 2
    cap = f"maxnreg {a.max_registers}" if a.max_registers else "no cap beyond the launchers' own"
    sums = _config.op_order_name()
    print(f"# triton {triton.__version__}, sm_90, {cap}, op order: {sums}")
    for build in chosen:
        cubin, shared = compile_sm90(build, a.max_registers)
        r = report(cubin)
        per_sm = programs_per_sm(r["registers"], shared, build.num_warps)
        print(f"{build.name:<34} registers {r['registers']:>3}  stack {r['stack_bytes']:>4} B  shared "
              f"{shared / 1024:5.1f} KB  {per_sm:>2} per SM  {r['instructions']:>5} instructions  "
              f"sass {r['sass']}")  # fmt: skip
        if a.loops:
            for loop in loops(_cuobjdump(cubin, "-sass"))[:1]:
                top = " ".join(f"{op}:{n}" for op, n in loop["top"])
                print(f"    longest innermost loop: {loop['instructions']} instructions, {loop['float']} floating "
                      f"point, {loop['shuffles']} shuffles; {top}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
