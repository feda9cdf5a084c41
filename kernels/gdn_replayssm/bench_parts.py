"""Each launch of a ReplaySSM step timed on its own, with tile variants: where a step's time goes.

    PYTHONPATH=kernels python -m gdn_replayssm.bench_parts [--json] [--out PATH] [--batch-sizes 1,64,256]

`gdn_replayssm.bench` times whole steps in their steady state; this tool pins the cursors instead, so one
launch does the same work on every replay (nothing is committed):

- `window`: every row at `wp = (L - 2T) // 2` committed records (the mean history of a ring that fills
  from 0 to `L - 2T` between flushes), so every row takes the non-flush path;
- `flush`: every row at `wp = L - T` (where an all-accepted row flushes), so every row folds;
- `flush_idle` / `window_idle`: the other kernel's rows only, i.e. the cost of a launch whose programs all
  return at once;
- `mixed10`: one row in ten flushing, the others not: one fused launch against the two split launches, the
  fold in line or deferred (`STEP_MODES`; deferred folds joined after the last layer);
- `baseline`: the recurrent kernel with `num_accepted = T`.

Each variant is checked first against the PyTorch reference on sampled rows (one eager call on copies);
a variant that fails prints nothing but a line on stderr. Times are per launch (one layer), under CUDA-graph
replay of enough layers that their footprint dwarfs L2; `GBps` counts the bytes that launch must move.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton

from . import _config
from ._config import default_tile
from ._replay import join_deferred_folds, launch_flush, launch_window, replayssm_fwd, ring_args
from .baseline import recurrent_step
from .bench import (
    MODEL_GDN_LAYERS,
    QWEN36,
    X_DTYPE,
    Bytes,
    Geo,
    Spec,
    _int_list,
    _rel,
    copy_bandwidth_gbps,
    layers_in_budget,
    ring_len_for,
    run_identity,
    step_inputs,
)
from .reference import corrected_values_ref, replayssm_decode_ref, replayssm_verify_ref
from .ring import ReplayCursors, ReplayRing

TIME_TARGET_S = 0.15

# (name, kwargs of the launcher); the first of each list is the committed default (for verify, from
# `_replay.WINDOW_PRODUCTS_MIN_BATCH` rows). Earlier runs swept more tiles and register caps
# (ops/results/h200-replayssm/h200-parts-4b.txt, -6-maxnreg.txt); these are the ones still in contention.
# `_decode_kernel`'s variants name it (`key_head: False`): from `_replay.KEY_HEAD_DECODE_MIN_BATCH` rows the default
# decode launch is the key-head kernel (first among its variants below)
_PLAIN_DECODE: list[tuple[str, dict[str, Any]]] = [
    ("decode 64x4", {}),
    ("decode 32x4", {"block_v": 32, "num_warps": 4}),
    ("decode 32x4 preload", {"preload": True, "block_v": 32, "num_warps": 4}),
    ("decode 64x4 preload", {"preload": True, "block_v": 64, "num_warps": 4}),  # rings of 16 at larger batches
    ("decode 64x4 uncapped", {"max_registers": 255}),  # the default is capped at 128 on CUDA (run 26)
    # smaller preloading tiles, to spread a latency-bound small batch over more programs: slower at B = 1
    # and 4 (H200 run 20, h200-parts-20.txt), as the window's below
    ("decode 16x4 preload", {"preload": True, "block_v": 16, "num_warps": 4}),
    ("decode 16x2 preload", {"preload": True, "block_v": 16, "num_warps": 2}),
    ("decode 8x2 preload", {"preload": True, "block_v": 8, "num_warps": 2}),
    ("decode 64x4 h8", {"history": 8}),
    ("decode 64x4 no first chunk", {"first_chunk": 0}),
    ("decode 64x4 first16", {"first_chunk": 16}),
    # the state tile read as column chunks (`_projections.chunked_projections`): shorter row sums (run 27: slower
    # but at 5-8 rows)
    ("decode 64x4 kc32", {"k_chunk": 32}),
    ("decode 32x4 preload kc32", {"preload": True, "block_v": 32, "num_warps": 4, "k_chunk": 32}),
]
# one program per (row, key head) over its value heads' tiles (`_decode_heads`; rings of up to 32 records), its
# state tiles as column chunks of `kc` (0: whole tiles), unrolled; run 27: 64x4 kc32 the fastest at B = 64 and 256
_KEY_HEAD_DECODE = [(64, 4, 32), (32, 4, 32), (64, 4, 16), (32, 2, 32), (64, 4, 0), (32, 4, 0), (64, 8, 0)]
# (bv, warps, kc, stages, register cap or 0 for the decode's own): sm_90 (Triton 3.6) with no spill or a few bytes;
# run 28b: 64x4 kc32 s2 the fastest (the default from `_replay.KEY_HEAD_DECODE_STAGES_MIN_BATCH` rows)
_KEY_HEAD_STAGES = [
    (64, 4, 32, 2, 0), (64, 4, 32, 3, 0), (32, 4, 32, 2, 0), (32, 4, 32, 3, 0), (32, 4, 32, 3, 96), (32, 4, 32, 3, 80),
    (32, 4, 0, 2, 80), (32, 4, 0, 3, 80), (64, 4, 16, 2, 96), (64, 4, 16, 3, 96), (64, 4, 0, 2, 0),
    (64, 8, 32, 2, 0), (128, 8, 32, 2, 0), (64, 4, 32, 4, 0),
    # five programs per SM need <= 96 registers (sm_90, Triton 3.6: kc32 s2 spills 80 B there, kc16 s2 and the
    # plain loop kc32 s1 none); 112 is the lowest cap without a spill for kc32 s2
    (64, 4, 32, 2, 96), (64, 4, 32, 2, 112), (64, 4, 32, 1, 96), (64, 4, 32, 1, 0), (64, 4, 16, 3, 0),
]  # fmt: skip
_KEY_HEAD_PREFETCH = [(64, 4, 32, 2, 0), (64, 4, 32, 3, 0), (32, 4, 32, 2, 0), (32, 4, 32, 3, 0), (32, 4, 32, 3, 96),
                      (32, 4, 32, 4, 96)]  # fmt: skip


def _key_head_variant(
    bv: int, warps: int, kc: int, stages: int = 0, cap: int = 0, *, fused: bool = False, prefetch: bool = False
) -> tuple[str, dict[str, Any]]:
    """A key-head decode variant, named by what it sets: `{bv}x{warps}`, ` kc{kc}` for column chunks, ` fused
    history`, ` s{stages}` for the pipelined loop (0: unrolled), ` r{cap}` for a register cap (0: the decode's),
    ` prefetch` for the next tile's token inputs loaded ahead (off otherwise, whatever the module's default)."""
    name = f"decode key head {bv}x{warps}" + (f" kc{kc}" if kc else "") + (" fused history" if fused else "")
    name += (f" s{stages}" if stages else "") + (f" r{cap}" if cap else "") + (" prefetch" if prefetch else "")
    kwargs: dict[str, Any] = {"key_head": True, "preload": False, "block_v": bv, "num_warps": warps, "k_chunk": kc,
                              "stages": stages, "prefetch": prefetch}  # fmt: skip
    if fused:
        kwargs["fused_history"] = True
    if cap:
        kwargs["max_registers"] = cap
    return name, kwargs


def _in_kernel(
    stages: int, *, gram: bool, cap: int = 0, block_k: int = 32, block_v: int = 128, warps: int = 4
) -> dict[str, Any]:
    """A window launch with the keys' side in the kernel, every setting given (the launcher's defaults differ for
    the wide tile; `cap` 0: no register cap)."""
    return {
        "block_v": block_v, "num_warps": warps, "key_products": False, "num_stages": stages,
        "history_gram_norms": gram, "max_registers": cap, "block_k": block_k,
    }  # fmt: skip


WINDOW_VARIANTS: dict[int, list[tuple[str, dict[str, Any]]]] = {
    1: [
        *((name, {**kw, "key_head": False}) for name, kw in _PLAIN_DECODE),
        *(_key_head_variant(bv, w, kc) for bv, w, kc in _KEY_HEAD_DECODE),
        # the records' terms inside the chunks' sums (`_projections.chunked_history_projections`)
        *(_key_head_variant(64, 4, kc, fused=True) for kc in (32, 16)),
        # and in the pipelined loop (sm_90, Triton 3.6, at 128 registers: no spill, 1816 / 1712 instructions
        # against 1688 for kc32 s2)
        *(_key_head_variant(64, 4, kc, 2, fused=True) for kc in (32, 16)),
        # the tiles in a software-pipelined loop of `s` stages (`KEY_HEAD_DECODE_STAGES`), at a register cap of `r`
        *(_key_head_variant(bv, w, kc, s, r) for bv, w, kc, s, r in _KEY_HEAD_STAGES),
        # the next tile's token inputs loaded ahead of this tile's stores (`KEY_HEAD_DECODE_PREFETCH`); 32-row tiles
        # at 96 registers keep five programs per SM with two or three buffers (sm_90, Triton 3.6: no spill at 3 and
        # 4 stages, 8 B at 2)
        *(_key_head_variant(bv, w, kc, s, r, prefetch=True) for bv, w, kc, s, r in _KEY_HEAD_PREFETCH),
    ],
    4: [
        # explicit tiles and paths, so that a name means the same launch at every batch size and T (the defaults: from
        # `_replay.WIDE_WINDOW_MIN_BATCH` rows, for `_replay.WIDE_WINDOW_TOKENS`, "window 128x4 k32 s2 in-kernel key
        # products summed norms r128", with the gates before its K pass on an fp32 state (`_replay.window_early_gates`;
        # "... gates after" is the A/B); from `_replay.WINDOW_PRODUCTS_MIN_BATCH` rows, for the other T, "window 64x2
        # k32 s2 in-kernel key products summed norms" up to `_replay.WINDOW_IN_KERNEL_MAX_BATCH` rows and this first
        # one, 64x2 with the key products' pre-pass, above; below them "window 32x2 k32 s3 in-kernel key products")
        ("window 64x2 k32 s3", {"block_v": 64, "key_products": True, "num_warps": 2}),
        ("window 32x2 k32 s3 preload", {"preload": True}),  # the small-batch default
        ("window 16x2 k32 s3 preload", {"preload": True, "block_v": 16}),
        ("window 16x1 k32 s3 preload", {"preload": True, "block_v": 16, "num_warps": 1}),
        ("window 32x4 k32 s3 preload", {"preload": True, "num_warps": 4}),
        (
            "window 64x2 k32 s3 converted key dots",
            {"block_v": 64, "key_products": True, "raw_key_dots": False, "num_warps": 2},
        ),
        ("window 32x2 k32 s3 in-kernel key products", {"key_products": False, "block_v": 32, "num_warps": 2}),
        (
            "window 32x2 k32 s3 in-kernel key products summed norms",
            {"key_products": False, "history_gram_norms": False, "block_v": 32, "num_warps": 2},
        ),
        # other tiles for the state's dot (run 16: all slower than 64x2 at B = 64 and 256)
        ("window 32x2 k32 s3", {"block_v": 32, "key_products": True, "num_warps": 2}),
        ("window 64x4 k32 s3", {"block_v": 64, "key_products": True, "num_warps": 4}),
        ("window 64x2 k64 s2", {"block_v": 64, "key_products": True, "block_k": 64, "num_stages": 2, "num_warps": 2}),
        ("window 64x2 k32 s4", {"block_v": 64, "key_products": True, "num_stages": 4, "num_warps": 2}),
        # whole-V programs (sm_90 at ring 64: 128x4 124 registers, 128x8 76, against 109 for 64x2; run 17: 128x4
        # faster than 64x2 at T = 3, 4, slower at T = 2, 8; 128x8 slower)
        ("window 128x4 k32 s3", {"block_v": 128, "key_products": True, "num_warps": 4}),
        ("window 128x8 k32 s3", {"block_v": 128, "key_products": True, "num_warps": 8}),
        # whole-V programs with the keys' side in the kernel (`_replay.WIDE_WINDOW_KEY_PRODUCTS`; spelled out, as the
        # launch's defaults for it differ): each key head's side twice (its two value heads) instead of the pre-pass
        ("window 128x4 k32 s3 in-kernel key products", _in_kernel(3, gram=True)),
        ("window 128x4 k32 s2 in-kernel key products", _in_kernel(2, gram=True)),
        ("window 128x4 k32 s2 in-kernel key products r128", _in_kernel(2, gram=True, cap=128)),
        ("window 128x4 k32 s2 in-kernel key products summed norms r128", _in_kernel(2, gram=False, cap=128)),
        # the gates after the K pass (`_replay.WINDOW_EARLY_GATES`; "auto" loads them before it on an fp32 state)
        (
            "window 128x4 k32 s2 in-kernel key products summed norms r128 gates after",
            {**_in_kernel(2, gram=False, cap=128), "early_gates": False},
        ),
        ("window 128x4 k32 s3 in-kernel key products summed norms", _in_kernel(3, gram=False)),
        # 16-column chunks (sm_90 at 128 registers: 1656 / 1672 instructions and 30 / 40.5 KB at 3 / 4 stages,
        # against 2024 and 39 KB for k32 s2; four programs per SM all three)
        *(
            (
                f"window 128x4 k16 s{st} in-kernel key products summed norms r128",
                _in_kernel(st, gram=False, cap=128, block_k=16),
            )
            for st in (3, 4)
        ),
        ("window 64x2 k32 s3 in-kernel key products", _in_kernel(3, gram=True, block_v=64, warps=2)),
        (
            "window 64x2 k32 s2 in-kernel key products summed norms",
            _in_kernel(2, gram=False, block_v=64, warps=2),
        ),
        # the outputs through two selector dots instead of in the query columns, or the other way round where the
        # default is the dots (`_replay.WINDOW_QUERY_COLUMNS`)
        (
            "window 128x4 k32 s3 selector dots",
            {"block_v": 128, "key_products": True, "num_warps": 4, "query_columns": False},
        ),
        (
            "window 64x2 k32 s3 selector dots",
            {"block_v": 64, "key_products": True, "num_warps": 2, "query_columns": False},
        ),
        ("window 32x2 k32 s3 preload selector dots", {"preload": True, "query_columns": False}),
        ("window 32x2 k32 s3 preload query columns", {"preload": True, "query_columns": True}),
        # 128x4 with fewer or smaller buffers, or at 96 registers for five programs per SM (32-column chunks at 3
        # stages hold 52 KB of shared memory, 4 programs per SM, as do its 124 registers at ring 64): slower in run
        # 33 (2 / 3 stages of 16 or 32 columns, at 96 registers or not; h200-parts-33b, -33c)
    ],
}
# flush tiles: fewer rows per warp shorten the fold's per-record chain (fewer conversions per thread) at the
# price of more programs, which the persistent grid keeps off the machine when they are idle. The persistent
# kernel's loop costs registers (8x1: ~240 against 168 for the plain grid), hence the register cap.
FLUSH_TILES: list[tuple[str, dict[str, int]]] = [
    ("16x1", {"block_v": 16, "num_warps": 1}),
    ("8x1", {"block_v": 8, "num_warps": 1}),
    ("8x1 r168", {"block_v": 8, "num_warps": 1, "max_registers": 168, "programs_per_sm": 12}),
    # register caps of the 16-row tile (~250 registers uncapped, 8 programs per SM): as many programs per SM as
    # the cap lets the register file hold (`_replay.persistent_programs_per_sm`)
    ("16x1 r200", {"block_v": 16, "num_warps": 1, "max_registers": 200}),
    ("16x1 r168", {"block_v": 16, "num_warps": 1, "max_registers": 168}),
    # 13 and 14 per SM for a decode step's fold (sm_90: 160 and 256 B of spills; run 29i, B = 256: 945.4 and 1078.3
    # against 616.8 us at 168)
    ("16x1 r152", {"block_v": 16, "num_warps": 1, "max_registers": 152}),
    ("16x1 r144", {"block_v": 16, "num_warps": 1, "max_registers": 144}),
    ("16x1 r128", {"block_v": 16, "num_warps": 1, "max_registers": 128}),
    # uncapped where the launcher would cap it: a decode step's in-line fold (`_replay.DECODE_FOLD_MAX_REGISTERS`)
    ("16x1 r255", {"block_v": 16, "num_warps": 1, "max_registers": 255}),
]
FLUSH_VARIANTS = [
    *((f"flush {name}", kw) for name, kw in FLUSH_TILES),
    *((f"flush {name} persistent", {**kw, "persistent": True}) for name, kw in FLUSH_TILES),
    # the keys normalised once per flushing row and key head before the launch (FLUSH_NORMALISED_KEYS)
    ("flush 8x1 normalised keys", {**FLUSH_TILES[1][1], "normalised_keys": True}),
    ("flush 16x1 persistent own keys", {**FLUSH_TILES[0][1], "persistent": True, "normalised_keys": False}),
    # the window's q and k normalised by the same pass (FLUSH_NORMALISED_WINDOW)
    (
        "flush 16x1 persistent normalised window",
        {**FLUSH_TILES[0][1], "persistent": True, "normalised_keys": True, "normalised_window": True},
    ),
    # the flushing rows from a list (LISTED_FOLDS; its kernel timed with the launch): the decode fold at its cap,
    # other folds at LISTED_FOLD_MAX_REGISTERS; by default only a decode step's in-line fold is listed, and the
    # unlisted variant is its A/B
    ("flush 16x1 persistent listed", {**FLUSH_TILES[0][1], "persistent": True, "listed": True}),
    ("flush 16x1 persistent unlisted", {**FLUSH_TILES[0][1], "persistent": True, "listed": False}),
    (
        "flush 16x1 persistent normalised window listed",
        {**FLUSH_TILES[0][1], "persistent": True, "normalised_keys": True, "normalised_window": True, "listed": True},
    ),
]
# how a step launches its flush rows, for the mixed10 part: (name, replayssm_fwd options, CUDA only); the fold
# in line (the flush launch first) unless deferred (`_replay.deferred_fold`: the fold after the non-flush
# launch, on side streams joined after the last layer, as a step's commit joins them)
STEP_MODES: list[tuple[str, dict[str, bool], bool]] = [
    ("split", {}, False),
    ("split persistent", {"persistent": True}, False),
    ("concurrent", {"concurrent": True}, True),  # up to SMALL_BATCH rows when not deferred
    ("concurrent persistent", {"concurrent": True, "persistent": True}, True),  # above
    ("deferred", {"concurrent": True, "deferred": True}, False),  # the default of verify and 2-32 decode rows
    ("deferred persistent", {"concurrent": True, "persistent": True, "deferred": True}, False),
]
# (block_v, num_warps, exact_sums)
BASELINE_TILES = {
    1: [(64, 4, False), (32, 1, False), (64, 4, True)],
    4: [(16, 1, False), (64, 4, False), (16, 1, True)],
}


class Setup:
    """Layers of state pools and rings for B rows, filled with plausible values; cursors pinned per part."""

    def __init__(self, B: int, T: int, L: int, *, replay: bool, geo: Geo, device: str, max_layers: int) -> None:
        torch.manual_seed(0)
        g = self.geo = geo
        self.B, self.T, self.L = B, T, L
        spec = Spec("replayssm" if replay else "baseline", B, T, "fp32", "all", L, geo=g)
        self.layers, slots = layers_in_budget(spec, max_layers)
        self.A_log, self.dt_bias, self.x, self.a, self.b = step_inputs(B, T, g, device)
        self.out = torch.empty(B * T, g.HV, g.V, dtype=X_DTYPE, device=device)
        self.idx = torch.arange(1, B + 1, dtype=torch.int32, device=device)
        self.cols = (1 + torch.arange(B * T, dtype=torch.int32, device=device)).view(B, T)
        self.n = torch.full((B,), T, dtype=torch.int32, device=device)
        self.cursors = ReplayCursors.allocate(num_slots=B + 1, ring_len=L, device=device)
        self.states = [torch.empty(slots, g.HV, g.V, g.K, device=device).normal_(0, 0.3) for _ in range(self.layers)]
        self.rings: list[ReplayRing] = []
        if replay:
            for _ in range(self.layers):
                ring = ReplayRing.allocate(num_slots=B + 1, num_k_heads=g.H, num_v_heads=g.HV, head_k_dim=g.K,
                                           head_v_dim=g.V, ring_len=L, dtype=X_DTYPE, device=device)  # fmt: skip
                ring.u.normal_(0, 0.3)
                ring.k.normal_()
                ring.v.normal_()  # type: ignore[union-attr]
                ring.g.uniform_(-0.3, -0.01)
                ring.beta.uniform_(0.2, 0.9)  # type: ignore[union-attr]
                self.rings.append(ring)

    def pin(self, wp: int, *, flush_wp: int | None = None, every: int = 10) -> None:
        """Every row at `wp`; with `flush_wp`, every `every`-th row at `flush_wp` instead."""
        self.cursors.write_pos.fill_(wp)
        if flush_wp is not None:
            self.cursors.write_pos[1::every] = flush_wp
        self.cursors.base.fill_(0)

    def args(self, layer: int) -> list[object]:
        return self._args(self.states[layer], self.rings[layer], self.cursors, self.out)

    def _args(self, state: torch.Tensor, ring: ReplayRing, cursors: ReplayCursors, out: torch.Tensor) -> list[object]:
        return ring_args(
            mixed_qkv=self.x, a=self.a, b=self.b, A_log=self.A_log, dt_bias=self.dt_bias, state=state, ring=ring,
            cursors=cursors, state_indices=self.idx, out=out, scale=self.geo.K**-0.5,
        )  # fmt: skip

    def check(self, launch: Callable[[list[object]], None]) -> float:
        """One eager launch on copies of layer 0 against the reference step on sampled rows."""
        dev = self.x.device
        sub = torch.tensor(sorted({0, self.B // 2, self.B - 1}), device=dev)
        T = self.T
        tok = (sub[:, None] * T + torch.arange(T, device=dev)[None, :]).reshape(-1)
        state, ring, cursors = self.states[0].clone(), self.rings[0].clone(), self.cursors.clone()
        corrected_values_ref(state=state, ring=ring)  # the timed launches left layer 0 off its trajectory
        ref_state, ref_ring, ref_cursors = state.clone(), ring.clone(), cursors.clone()
        out = torch.zeros_like(self.out)
        launch(self._args(state, ring, cursors, out))
        join_deferred_folds(state.device)  # a deferring launch's folds, before anything reads the checkpoints
        ref_out = torch.empty(len(sub) * T, self.geo.HV, self.geo.V, dtype=X_DTYPE, device=dev)
        step = replayssm_decode_ref if T == 1 else replayssm_verify_ref
        step(mixed_qkv=self.x[tok], a=self.a[tok], b=self.b[tok], A_log=self.A_log, dt_bias=self.dt_bias,
             state=ref_state, ring=ref_ring, cursors=ref_cursors, state_indices=self.idx[sub], out=ref_out)  # fmt: skip
        slots = self.idx[sub].long()
        return max(_rel(ref_out, out[tok]), _rel(ref_state[slots], state[slots]))


def _every_layer(s: Setup, launch: Callable[[list[object]], None]) -> None:
    """One launch per layer, then the join of any deferred folds (before a graph capture ends, as a commit
    would)."""
    for i in range(s.layers):
        launch(s.args(i))
    join_deferred_folds(s.out.device)


def time_launches(body: Callable[[], None]) -> float:
    """Seconds per call of `body` (which launches once per layer), under CUDA-graph replay; off CUDA (the
    interpreter, for tests) one eager call timed with the host clock."""
    body()
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        body()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    reps = max(3, min(200, math.ceil(TIME_TARGET_S / max(time.perf_counter() - t0, 1e-6))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / 1e3 / reps


Run = tuple[str, str, "int | tuple[int, int]", Callable[[list[object]], None]]


def _bound(launch: Callable[..., None], kw: dict[str, Any]) -> Callable[[list[object]], None]:
    """`launch(args, **kw)` as a launch of the step's arguments alone (a `Run`'s last field)."""
    return lambda args: launch(args, **kw)


def _replay_runs(
    geo: dict[str, Any],
    window_variants: list[tuple[str, dict[str, Any]]],
    flush_variants: list[tuple[str, dict[str, Any]]],
    flush_tiles: list[tuple[str, dict[str, int]]],
    wps: tuple[int, int],
    *,
    cuda: bool,
) -> list[Run]:
    """(part, variant, pinned write_pos, launch) for every ReplaySSM measurement of one case."""
    wp_window, wp_flush = wps
    mixed = (wp_window, wp_flush)
    runs: list[Run] = []
    for name, kw in window_variants:
        runs.append(("window", name, wp_window, _bound(launch_window, {**geo, **kw})))
    for name, kw in flush_variants:
        runs.append(("flush_idle", name, wp_window, _bound(launch_flush, {**geo, **kw})))
        runs.append(("flush", name, wp_flush, _bound(launch_flush, {**geo, **kw})))
    runs.append(("window_idle", "default", wp_flush, lambda args: launch_window(args, **geo)))
    # one launch folding its own flush rows: every row flushing, none, and one row in ten
    fused = "fused (non-flush kernel)"
    runs.append(("flush", fused, wp_flush, lambda args: launch_window(args, **geo, fused=True)))
    runs.append(("window", fused, wp_window, lambda args: launch_window(args, **geo, fused=True)))
    runs.append(("mixed10", fused, mixed, lambda args: launch_window(args, **geo, fused=True)))
    for tile_name, tile in flush_tiles:
        for mode, kw, cuda_only in STEP_MODES:
            if cuda_only and not cuda:  # the side stream is a CUDA stream
                continue
            options: dict[str, Any] = dict(fused=False, concurrent=False, persistent=False, deferred=False) | kw
            runs.append(("mixed10", f"{mode} {tile_name}", mixed,
                         _bound(replayssm_fwd, {**geo, **options, "flush_tile": tile})))  # fmt: skip
    return runs


def parts(
    B: int,
    T: int,
    L: int,
    copy_gbps: float,
    emit: Callable[[dict[str, Any]], None],
    *,
    g: Geo = QWEN36,
    device: str = "cuda",
    max_layers: int = MODEL_GDN_LAYERS,
    window_variants: list[tuple[str, dict[str, Any]]] | None = None,
    flush_variants: list[tuple[str, dict[str, Any]]] | None = None,
    flush_tiles: list[tuple[str, dict[str, int]]] | None = None,
    baseline_tiles: list[tuple[int, int, bool]] | None = None,
    only: set[str] | None = None,
    variants: set[str] | None = None,
    eager: int = 0,
    window_wp: int | None = None,
) -> int:
    """Times every part of one case; returns the number of variants that failed their check. `variants`
    keeps only the named launches; `eager` > 0 runs each checked launch that many times on layer 0, eagerly,
    and times nothing (for a profiler such as `ncu`, which then sees plain kernel launches). `window_wp` pins
    the non-flush rows' history length (default: half the longest a non-flush row can have)."""
    failed = 0
    step = 1 if T == 1 else 4  # the variant lists' key: decode, or verify (any T > 1)
    s = Setup(B, T, L, replay=True, geo=g, device=device, max_layers=max_layers)
    precision = default_tile(head_v_dim=g.V, device=torch.device(device), num_tokens=T, out_dtype=X_DTYPE).dot_precision
    model = Bytes(Spec("replayssm", B, T, "fp32", "all", L, geo=g))
    wp_window, wp_flush = (L - 2 * T) // 2 if window_wp is None else window_wp, L - T
    if not 0 <= wp_window <= L - 2 * T:
        raise ValueError(f"window_wp must be in 0..{L - 2 * T} (a non-flush row) for T={T}, L={L}; got {wp_window}")
    runs = _replay_runs(
        dict(T=T, L=L, H=g.H, HV=g.HV, K=g.K, V=g.V, B=B, dot_precision=precision),
        WINDOW_VARIANTS[step] if window_variants is None else window_variants,
        FLUSH_VARIANTS if flush_variants is None else flush_variants,
        FLUSH_TILES if flush_tiles is None else flush_tiles,
        (wp_window, wp_flush),
        cuda=device == "cuda",
    )
    for part, name, pinned, launch in runs:
        if (only and part not in only) or (variants and name not in variants):
            continue
        wp, flush_wp = pinned if isinstance(pinned, tuple) else (pinned, None)
        s.pin(wp, flush_wp=flush_wp)
        err = s.check(launch) if not part.endswith("_idle") else 0.0
        if not err <= 2e-2:
            print(f"# FAILED correctness {part} {name} T={T} B={B}: relative error {err:.3e}", file=sys.stderr)
            failed += 1
            continue
        s.pin(wp, flush_wp=flush_wp)
        if eager:
            for _ in range(eager):
                s.pin(wp, flush_wp=flush_wp)
                launch(s.args(0))
                join_deferred_folds(s.out.device)
            if device == "cuda":
                torch.cuda.synchronize()
            print(f"# eager {part} {name} T={T} B={B}: {eager} launches, not timed", file=sys.stderr)
            continue
        sec = time_launches(partial(_every_layer, s, launch))
        us = sec / s.layers * 1e6
        nbytes = 0 if part.endswith("_idle") else sum(model.step(int(w))[0] for w in s.cursors.write_pos[1:].tolist())
        emit(_row(part, name, B, T, L, wp, us, nbytes, copy_gbps, s.layers, err))

    if (only and "baseline" not in only) or eager:
        return failed
    base = Setup(B, T, L, replay=False, geo=g, device=device, max_layers=max_layers)
    bmodel = Bytes(Spec("baseline", B, T, "fp32", "all", L, geo=g))
    for bv, nw, exact in BASELINE_TILES[step] if baseline_tiles is None else baseline_tiles:
        tile = default_tile(head_v_dim=g.V, device=torch.device(device), num_tokens=T)
        tile = type(tile)(block_v=bv, num_warps=nw, num_stages=tile.num_stages, dot_precision=tile.dot_precision)

        def body(tile=tile, exact=exact) -> None:
            for i in range(base.layers):
                recurrent_step(mixed_qkv=base.x, a=base.a, b=base.b, A_log=base.A_log, dt_bias=base.dt_bias,
                               state=base.states[i], state_indices=base.cols, num_accepted=base.n if T > 1 else None,
                               out=base.out, config=tile, exact_sums=exact)  # fmt: skip

        us = time_launches(body) / base.layers * 1e6
        nbytes = B * bmodel.step(0)[0]
        name = f"baseline {bv}x{nw}{' exact' if exact else ''}"
        emit(_row("baseline", name, B, T, L, 0, us, nbytes, copy_gbps, base.layers, 0.0))
    if device == "cuda":
        torch.cuda.empty_cache()
    return failed


def _row(part, name, B, T, L, wp, us, nbytes, copy_gbps, layers, err) -> dict[str, Any]:  # noqa: PLR0917
    gbps = nbytes / (us * 1e-6) / 1e9 if nbytes else 0.0
    return {
        "part": part,
        "variant": name,
        "B": B,
        "T": T,
        "ring_len": L,
        "wp": wp,
        "us": round(us, 2),
        "GBps": round(gbps, 1),
        "frac_copy": round(gbps / copy_gbps, 3),
        "layers": layers,
        "check_rel_err": float(f"{err:.3e}"),
    }


def _parser() -> argparse.ArgumentParser:
    """The command line (`main`)."""
    p = argparse.ArgumentParser(prog="python -m gdn_replayssm.bench_parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON line per measurement")
    p.add_argument("--out", type=Path, help="also write the JSON lines here")
    p.add_argument("--batch-sizes", default="1,64,256")
    p.add_argument("--tokens", default="1,4")
    p.add_argument("--ring-len", type=int, help="default: default_ring_len(T, max_batch=B)")
    p.add_argument("--parts", help="comma list of parts to time (default: all)")
    p.add_argument("--variants", help="comma list of variant names to keep, e.g. 'decode 64x4,flush 8x1'")
    p.add_argument("--eager", type=int, default=0,
                   help="run each checked launch N times eagerly and time nothing (for ncu)")  # fmt: skip
    p.add_argument("--window-wp", type=_int_list(0, 1024), help="comma list of history lengths for the non-flush "
                   "rows (default: half the longest), e.g. 0,15,30; longer than ring_len - 2T: skipped")  # fmt: skip
    _config.add_op_order_arguments(p)
    return p


def planned_cases(a: argparse.Namespace) -> Iterator[tuple[int, int, int, int | None]]:
    """`(T, B, ring length, pinned history or None)` of each measurement the command line asks for, in order,
    each at `bench.ring_len_for`'s length for its T and B; a pinned history too long for a non-flush row there
    is skipped with a note on stderr."""
    window_wps: list[int | None] = list(a.window_wp) if a.window_wp else [None]
    for T in (int(t) for t in a.tokens.split(",")):
        for B in (int(b) for b in a.batch_sizes.split(",")):
            L = ring_len_for(a, T, B)
            for wp in window_wps:
                if wp is not None and not 0 <= wp <= L - 2 * T:
                    print(f"# --window-wp {wp}: skipped for T={T}, B={B} (non-flush rows: 0..{L - 2 * T})",
                          file=sys.stderr)  # fmt: skip
                    continue
                yield T, B, L, wp


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    _config.use_op_order(a)
    only = set(a.parts.split(",")) if a.parts else None
    if not torch.cuda.is_available():
        print("gdn_replayssm.bench_parts needs a CUDA device", file=sys.stderr)
        return 2
    identity = run_identity()
    copy_gbps = copy_bandwidth_gbps()
    sink = a.out.open("w") if a.out else None

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps({**record, **identity, "copy_GBps": round(copy_gbps, 1), "op_order": _config.op_order_name()})
        if a.json:
            print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()
        r = record
        print(f"# {r['part']:>11} {r['variant']:<26} T={r['T']} B={r['B']:>3} wp={r['wp']:>2}: {r['us']:8.1f} us "
              f"{r['GBps']:7.0f} GB/s ({100 * r['frac_copy']:.0f}% copy)", file=sys.stderr)  # fmt: skip

    print(f"# {identity} copy_GBps={copy_gbps:.1f} triton={triton.__version__} op_order={_config.op_order_name()}",
          file=sys.stderr)  # fmt: skip
    failed = 0
    for T, B, L, wp in planned_cases(a):
        failed += parts(B, T, L, copy_gbps, emit, only=only, window_wp=wp,
                        variants=set(a.variants.split(",")) if a.variants else None, eager=a.eager)  # fmt: skip
    if sink:
        sink.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
