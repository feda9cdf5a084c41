"""Launcher of one ReplaySSM step.

A step is two launches with no host synchronisation between them; every program reads its row's cursors
on the device and leaves the rows that belong to the other launch alone (writes nothing for them):

- non-flush rows: `_window_kernel` (`_window.py`, spec verify, T >= 2) or `_decode_kernel` (`_decode.py`, T = 1)
  read the checkpoint once, reconstruct `S_w x` from it and the committed records, and append the window's
  records. They never write the state;
- flush rows: `_flush_kernel` (`_flush.py`) folds the history into the checkpoint.

Four switches below change how the flush rows are launched (`FUSED_FLUSH`, off; `CONCURRENT_FLUSH` and
`PERSISTENT_FLUSH`, on; `DEFERRED_FOLD`, verify steps and small decode batches; all measured on the H200); flush
rows fold to the same bits under all of them, and under every flush tile.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton

from ._config import interpreting
from ._decode import _decode_kernel
from ._decode_heads import launch_key_head_decode
from ._flush import (
    FLUSH_BLOCK_V,
    FLUSH_CHUNK,
    FLUSH_WARPS,
    LIST_ENTRY,
    _flush_kernel,
    _flush_persistent_kernel,
    _flushing_list_kernel,
    _normalised_keys_kernel,
)
from ._window import (
    SMALL_WINDOW_BLOCK_V,
    SMALL_WINDOW_WARPS,
    WIDE_WINDOW_BLOCK_V,
    WIDE_WINDOW_WARPS,
    WINDOW_BLOCK,
    WINDOW_BLOCK_K,
    WINDOW_BLOCK_V,
    WINDOW_STAGES,
    WINDOW_WARPS,
    _key_products_kernel,
    _window_kernel,
    history_block,
    key_products_size,
)
from .ring import ReplayCursors, ReplayRing

DECODE_BLOCK_V = 64  # V rows per decode program
DECODE_WARPS = 4
# History records per chunk of the decode kernel. A chunk costs its full size whatever the history holds, and
# its loads wait for the row's cursors after the tile is consumed, at 4 warps per scheduler (128 registers), so
# every wave of programs pays their latency. H200, B = 256, non-flush decode with 0 / 1 / 15 / 30 records:
# 32-record chunks 142 / 248 / 256 / 262 us; 8-record chunks (a Triton 3.6 compile: 231 loop instructions
# against 680) - / 192 / 249 / 362 us, slower on average over a ring of 32 (runs 13-14). 16-record chunks take
# 145 registers, one program per SM fewer (slower in run 12). Tried and dropped in run 14: the keys' products
# once per key head in a kernel before the decode (245 / 249 / 255 us, counting that kernel), the whole
# history's sums in a kernel before the decode (201 / 299 / 308 / 319 us: its own dependent loads, at 112
# registers, cost ~58 us even with no history).
DECODE_HISTORY_BLOCK = 32
# > 0: a history of at most this many records (the first steps after each flush) is read as one chunk of this
# size instead of DECODE_HISTORY_BLOCK. H200 run 14, non-flush decode with 1 / 4 / 8 / 15 records: 196 / 198 /
# 200 / 259 against 249 / 250 / 251 / 256 us at B = 256, 54-55 against 68 us at B = 64 (1-8 records), 10.2-10.7
# against 12.8-13.2 us at B = 8; a first chunk of 16 saved less (`bench_parts` variants "decode 64x4 no first
# chunk", "decode 64x4 first16"; `bench --decode-first-chunk 0` is the whole-step A/B).
DECODE_FIRST_CHUNK = 8
PRELOAD_MAX_RECORDS = 32  # the longest ring a preloading decode program reads in one tile
# Small batches, up to SMALL_BATCH rows (a grid that does not fill the machine, where a step's time is its
# programs' latency): the flush launch keeps the plain grid (PERSISTENT_FLUSH below), the decode kernel reads
# rings of up to PRELOAD_MAX_RECORDS records whole, in physical order, together with the state tile, on a
# `[32, K]` tile of 4 warps, so that no load waits for the cursors, and the window kernel issues its loads
# outside the K pass before it. Larger batches are bandwidth-bound, and there the extra bytes and registers
# cost more than the latency saved (H200, ops/results/h200-replayssm run 8: decode 6.2 -> 4.9 us at B = 1,
# 70 -> 84 us at B = 64; verify T = 4 6.8 -> 6.3 us, 87 -> 90 us). Run 20, whole steps with the small-batch path
# up to 1 / 2 rows (`bench --small-batch`), lockstep: at B = 4 the large path wins (decode 10.4 / 11.5 us,
# verify T = 4 all accepted 15.6 / 17.1 us, mixed 16.9 / 18.3 us; staggered alike), at B = 2 the small one for
# verify (10.9 / 10.0 us all accepted, 11.4 / 10.4 us mixed; decode 8.0 / 8.2 us); up to 8 rows it lost at B = 8.
# Smaller preloading tiles (16 or 8 V rows, 2 warps) were slower at B = 1 and 4 (`bench_parts`, run 20).
SMALL_BATCH = 2
# Decode launches preload their rings up to this many rows (None: SMALL_BATCH), apart from the small-batch path's
# other choices (`bench --preload-decode-max-batch` is the A/B; `decode_preload`).
# H200 run 26, decode, ring 16, lockstep, chunked -> preloading, B = 3 / 4 / 8 / 16: 7.95 / 8.53 / 12.90 / 21.39 ->
# 6.60 / 8.00 / 12.73 / 21.98 us (both at 128 registers); B = 32 39.6 -> 40.2 (uncapped); a bf16 state at B = 8
# 10.4 -> 11.4 us. Up to 4 rows.
PRELOAD_DECODE_MAX_BATCH: int | None = 4
PRELOAD_DECODE_BLOCK_V = 32
PRELOAD_DECODE_WARPS = 4
# From this many rows (None: never) the non-flush decode runs one program per (row, key head) over all of its
# state tiles (`_decode_heads._key_head_decode_kernel`): the key head's side of the history once instead of once
# per value head and V tile, and the whole ring read in physical order with the first tile (rings of at most
# `PRELOAD_MAX_RECORDS` records; longer ones keep `_decode_kernel`), each state tile as column chunks of
# `KEY_HEAD_DECODE_K_CHUNK` (`chunked_projections`: row sums of three shuffle levels instead of five; sm_90, Triton
# 3.6: 857 -> 265 shuffles a program). H200 run 27 (ring 16, lockstep, us per layer-step, `_decode_kernel` ->
# key head, 64x4 tiles, chunks of 32): fp32 B = 16 / 32 / 64 / 128 / 256 21.4 / 38.0 / 67.0 / 125.0 / 242.6 ->
# 21.0 / 32.3 / 58.6 / 107.9 / 210.3 (1.03-1.15x -> 1.06-1.33x the baseline); bf16 B = 16 / 24 / 32 / 64 / 256
# 17.4 / 24.0 / 31.0 / 59.8 / 217.5 -> 19.9 / 23.6 / 27.6 / 52.2 / 190.6; at B = 5 / 8 (fp32) it lost (10.0 / 13.0
# -> 15.3 / 16.6: 80-128 programs); fp32 B = 20 / 24 26.8 / 30.1 -> 24.2 / 27.0. Hence from 16 rows for an fp32
# state and from 24 for a 2-byte one (bf16 B = 24 level, B = 16 14 % slower). Without the chunks it gained 1-2 %
# (fp32 B = 128 / 256 124.9 / 242.6 -> 123.3 / 238.8), 128x8 and 32x4 tiles less than 64x4 (fp32 B = 256 302.7 and
# 231.3 us). `bench --key-head-decode-min-batch 4096` is the A/B. Run 42b, a bf16 state with
# `KEY_HEAD_DECODE_LATE_NORMS`, `_decode_kernel` -> key head (unrolled), B = 8 / 12 / 16 / 20: 10.1 / 14.8 / 17.2 /
# 21.4 -> 14.2 / 16.9 / 18.4 / 20.2 us: hence from 20 rows for a 2-byte state (24 until then). Run 43a-b, the same
# A/B at B = 16 / 17 / 18 / 19 (two runs each, the same within 0.1 us): 17.2 / 19.3 / 20.1 / 20.9 -> 18.4 / 19.1 /
# 19.6 / 19.9 us: hence from 17.
KEY_HEAD_DECODE_MIN_BATCH: int | None = 16
NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH: int | None = 17  # bf16 and fp16 states
KEY_HEAD_DECODE_BLOCK_V = 64
KEY_HEAD_DECODE_WARPS = 4
# 0: whole tiles, a bf16 state read as pairs (`PAIRED_STATE`; bf16 B = 32 / 64 / 256: 29.2 / 55.0 / 198.4 us)
KEY_HEAD_DECODE_K_CHUNK = 32
# True: the key-head decode adds its records' terms inside the column chunks' sums (`chunked_history_projections`;
# rings of at most `KEY_HEAD_DECODE_K_CHUNK` records): no row sums of their own, which cross warps. sm_90 (Triton
# 3.6, at 128 registers, ring 16), shuffles / barriers / stack per program: chunks of 32 265 / 64 / 0 B ->
# 167 / 52 / 88 B (the records' tile padded to 32 columns spills; 168 registers without), chunks of 16 185 / 64 /
# 0 -> 89 / 52 / 0. Slower, so off: H200 run 31k, the pipelined loop's non-flush launch at B = 64 / 256, 7
# records, 46.0 / 161.4 us against 48.0 / 168.1 (chunks of 32) and 81.1 / 296.3 (16); run 28a timed it unrolled
# (`bench --key-head-decode-fused-history`, `bench_parts` "... fused history" variants).
KEY_HEAD_DECODE_FUSED_HISTORY = False
# From `KEY_HEAD_DECODE_STAGES_MIN_BATCH` rows (None: never) the key-head decode's tiles run in a loop of
# `KEY_HEAD_DECODE_STAGES` stages that the compiler software-pipelines (`_key_head_decode_kernel`'s `STAGES`): the
# next tile's state is copied into shared memory (cp.async) while this one is summed. Unrolled, each program reads
# its four tiles one after the other, the next tile's loads behind this tile's stores: ncu, H200 run 28a, B = 256,
# no history, 64x4 chunks of 32: 181.7 us, 47 % of the stall samples waiting on global loads, 3.9 warps per
# scheduler (128 registers), issue slots 35 % busy, DRAM 70 % (`_decode_kernel` 64x4: 151.7 us, 56 %, 76 %).
# Run 28b (`bench_parts`, non-flush launches, B = 16 / 64 / 256, 7 records): 18.8 / 50.6 / 177.8 -> 16.2 / 46.3 /
# 161.4 us with 2 stages (3: 16.2 / 50.6 / 168.3; 32-row tiles, whole tiles, chunks of 16 and caps of 80-96
# registers slower; run 28d: 64x8 and 128x8 tiles and 4 stages slower too). Whole decode steps, run 28c
# (lockstep, us per layer-step, unrolled -> 2 stages): fp32 B = 32 / 64 / 128 / 256 32.6 / 58.7 / 107.6 / 209.2
# -> 31.0 / 55.4 / 101.7 / 195.3 (1.21-1.34x -> 1.27-1.43x the baseline); bf16 B = 24 / 32 / 64 / 256 (run 27
# unrolled) 23.6 / 27.6 / 52.2 / 190.6 -> 22.0 / 24.6 / 45.4 / 163.6 (0.89x at B >= 32). At B = 16 (fp32) the
# steps were slower, 20.9 -> 23.6 us (run 28d: 23.8), though its non-flush launch was faster alone; B = 20 24.1 ->
# 24.6, B = 24 level: hence from 24 rows.
KEY_HEAD_DECODE_STAGES = 2
KEY_HEAD_DECODE_STAGES_MIN_BATCH: int | None = 24
# True: in the pipelined loop each tile loads the next tile's token inputs (`a`, `b`, `v`) before its own stores
# (`_key_head_decode_kernel`'s `PREFETCH`). Without it each tile's first global loads come after the last tile's
# stores, which they cannot pass, so every tile waits a global round trip with no state copy of its own in flight
# (sm_90: the loop starts with the copies' wait, then the `a` and `b` loads and the gates that need them). H200
# run 32a, the non-flush launch (`bench_parts`, 64x4 chunks of 32, 2 stages), B = 64 / 128 / 256, 7 records, twice:
# 46.4 / 85.2 / 161.5-161.8 -> 44.8 / 82.5 / 156.5-157.2 us (3 stages, 2 buffers, slower either way: 168.2-168.6);
# whole decode steps, both starts: 54.2 / 99.9 / 189.9 -> 53.0 / 97.8 / 185.7 us (1.47 -> 1.51x at B = 256).
# `bench --no-key-head-decode-prefetch` is the A/B.
KEY_HEAD_DECODE_PREFETCH = True
# The key-head decode's records' tile holds the ring in at least this many rows (a power of two; the other kernels'
# tiles, `_window.history_block`, at least 16 for their dots). It changes only rings of at most 8 records, none of
# them a default (`ring.default_ring_len`). H200 run 40c, whole decode steps (fp32, lockstep, us per layer-step), ring
# 8 with tiles of 16 -> 8 rows, B = 16 / 32 / 64 / 128 / 256: 20.4 / 31.9 / 54.3 / 99.6 / 189.3 -> 18.8 / 30.9 / 52.9
# / 97.3 / 185.5 (sm_90 at 128 registers: 1744 -> 1640 instructions); the default ring of 16 took 20.9 / 30.3 / 53.1
# / 97.8 / 185.7, and at B = 1 / 2 / 4 (another decode kernel) 4.0 / 5.7 / 8.0 against ring 8's 4.3 / 5.9 / 8.3, so
# 16 stays the decode's ring (run 40d). `bench --key-head-decode-min-history-block 16` is the A/B.
KEY_HEAD_DECODE_MIN_HISTORY_BLOCK = 8
# True: the key-head decode's pipelined loop reads its state tiles' column chunks through a tensor descriptor of the
# state pool (`_descriptors.state_descriptor`: on Hopper bulk copies, TMA, that one thread issues per box) where the
# device and the pool's alignment allow, instead of each thread's `cp.async` copies. sm_90 (Triton 3.6, 64x4, chunks
# of 32, 2 stages): 128 -> 126 registers, 1760 -> 1952 instructions (the barriers' bookkeeping), the same 34.8 KB.
# H200 run 41 (`h200-bench-41a-*`, `-41b-decode-*`, `-41c-*`; lockstep, whole decode steps, us per layer-step,
# pointers -> descriptor): fp32, two runs each, B = 64 / 128 / 256 53.1 / 97.8 / 185.8 and 53.0 / 97.8 / 185.8 ->
# 52.2 / 96.6 / 184.0 and 52.2 / 96.5 / 183.9 (1.50 -> 1.52x the baseline at 256), B = 24 / 32 26.0 / 30.3 -> 24.5 /
# 29.3; bf16, B = 24 / 32 / 64 / 256 21.7 / 23.9 / 43.4 / 154.8 -> 21.9 / 23.9 / 42.9 / 152.5. The unrolled tiles
# (below `KEY_HEAD_DECODE_STAGES_MIN_BATCH` rows) keep the pointers: fp32 B = 16 20.9 -> 35.0 through the
# descriptor, each tile waiting for its own copies. A stream that only reads the tiles was level with it (a scratch
# kernel, `h200-stream-41a-tma.jsonl`: 133.8 against 134.0 us at B = 256), and the window kernel's state chunks
# through a descriptor (its dots then `HGMMA` from the copies' shared memory, 2048 -> 1696 instructions on the wide
# tile) slower (T = 2 / 4 / 8 at B = 256 245.8 / 313.4 / 461.1 -> 255.9 / 315.0 / 465.4 us a step; not kept).
# `bench --no-key-head-decode-tma` is the A/B.
KEY_HEAD_DECODE_TMA = True
# "auto": on a narrow state (`narrow_state`: bf16, fp16) the key-head decode's column chunks take the token's raw key
# and query and divide the two row sums by their norms once (`_projections._chunk_sums`' `LATE_NORMS`), instead of
# normalising the key and query elementwise in every chunk of every tile (a division and, for the query, the scale
# per element). sm_90 (Triton 3.6, 64x4, chunks of 32, 2 stages, through the descriptor), the pipelined loop's
# instructions: bf16 state 1240 -> 1012, no spill either way; fp32 1060 -> 970, but 24 B of spills at the 128-register
# cap (five values reloaded from local memory every tile; the query alone late: 88 B; the key alone: none, 1035).
# H200 run 42a (`h200-bench-42a-*`, lockstep, whole decode steps, us per layer-step, elementwise -> late): bf16,
# B = 24 / 32 / 64 / 256, 21.9 / 23.9 / 42.9 / 152.4 -> 20.2 / 22.3 / 39.8 / 141.9 (0.96 -> 1.03x the baseline at
# 256); fp32 slower, two runs each, B = 64 / 128 / 256 52.2 / 96.5 / 184.0 -> 53.0-53.1 / 98.1 / 187.2, level at
# 24. "always" / "never" (`bench --key-head-decode-late-norms`, `--no-key-head-decode-late-norms`) are the A/B.
KEY_HEAD_DECODE_LATE_NORMS = "auto"
# True: on a bf16 (or fp16) state with inputs of the same dtype, the window kernel's K pass dots the state chunks with
# the window's keys and queries as stored (`_window._state_dot`'s `RAW`), not converted to float32 for a TF32 dot:
# the products are exact either way (a bf16 value is exact in TF32) and the sums float32. sm_90 (Triton 3.6), bf16
# state: the wide tile 1808 -> 1680 instructions (28 -> 34 KB of shared memory), T = 2's 64x2 tile with its keys'
# side 1440 -> 1352. H200 run 42d (lockstep, us a step, two runs each, TF32 -> bf16 dot), all accepted: T = 4 at
# B = 16 / 64 / 256 23.5 / 76.8 / 290.1 -> 22.3 / 71.6 / 265.0 (1.57 -> 1.71x the baseline at 256), T = 8 32.7 /
# 111.5 / 433.3 -> 31.6 / 106.9 / 408.4, T = 2 17.4 / 60.7 -> 17.2 / 59.9 with the keys' side in the kernel; mixed
# acceptance T = 4 at 256 250.1 -> 224.5. After the key products' pre-pass (T = 2 from 65 rows) slower, B = 256
# 188.8 -> 191.7 (mixed 180.3 -> 183.1), so those builds keep TF32. `bench --no-window-raw-state-dot` is the A/B.
WINDOW_RAW_STATE_DOT = True
# What is left to get (H200 run 31, fp32, B = 64 / 128 / 256): kernels that only read the state tiles and take
# their two row sums (`bench_stream`) run 36.2 / 67.6 / 129.7 us as one program per 64x4 tile (92 % of the read
# bandwidth at 256) and 40.5 / 75.0 / 136.2 us as one program per key head over its four tiles (2 stages), where
# this decode's non-flush launch takes 46.0 / - / 159.5 us (`bench_parts`, 7 records; 159.7 with none). Not closed
# by register caps for 5 programs per SM (96: 168.8 us, spilling; kc16 s2 196.1, the plain loop 193.4; 112: 160.4),
# nor by splitting the step into a launch for the history's weights and one program per state tile (run 31f, commit
# cb497a0: 188.7-300.1 us with the weights launch's 27 us; removed). A scratch ablation of this kernel (run 31h)
# points at its `u` records' tile and the key head's side of the history. Run 32 took 159.5 -> 156.5 us with
# `KEY_HEAD_DECODE_PREFETCH`; `ncu` then puts a third of the stall samples on each tile's wait for its state copies
# at the loop's top (one buffer: the next tile's copies go out after this tile's work). Level or slower there
# (scratch branches, results README run 32): the token's inputs before the slot, the gates once per program, only
# the committed records read, one tail per program after a loop that only streams, one loop over all the column
# chunks, 32-row tiles at five programs per SM; and in the tree until run 33, the loop rotated so that each tile's
# finish read nothing the pipeliner copies and the next tile's copies went out right after its sums (commit
# 3f38357, removed): 194.8 against 154.3 us at B = 256 (55.1 / 102.5 against 44.0 / 81.5 at 64 / 128).

# > 0: `_decode_kernel` reads an fp32 state's tile as column chunks of this many at `DECODE_K_CHUNK_BATCHES` rows
# (`decode_k_chunk`). Run 27 (fp32, chunks of 32 at every batch size, B = 1 / 2 / 5 / 8 / 16 / 64 / 256: 4.1 / 5.7 /
# 10.0 / 13.0 / 21.4 / 67.0 / 242.6 -> 4.5 / 5.9 / 9.8 / 12.3 / 21.9 / 72.8 / 254.0 us): faster at 5-8 rows only.
# Run 29d (fp32, lockstep, whole decode steps, us per layer-step, B = 5 / 6 / 8 / 12 / 15): 9.6 / 10.6 / 12.9 / 17.7
# / 20.6 -> 9.4 / 10.4 / 12.3 / 18.6 / 21.2 (0.87 / 0.85 / 0.98x -> 0.89 / 0.87 / 1.02x at 5-8 rows). `bench
# --decode-k-chunk 0` is the A/B.
DECODE_K_CHUNK = 32
DECODE_K_CHUNK_BATCHES = range(5, 9)
# True: the non-flush kernels fold their own flush rows (one launch per step, compiled without FP fusion);
# False: flush rows go to `_flush_kernel`, a second launch with its own small tile
FUSED_FLUSH = False  # measured slower everywhere but B = 1 mixed (ops/results/h200-replayssm, run 5)
# True: the flush launch goes to a side stream, so the serial fold overlaps the bandwidth-bound non-flush
# launch (the two write disjoint rows); the current stream waits for it before returning. CUDA only: seed 003
# measured an auxiliary stream on Arc Pro B70 (XPU) as fork/join overhead with nothing hidden.
# Run 8, one row in ten flushing: 3-8 % faster than the same launches in stream order.
CONCURRENT_FLUSH = True
# Priority of that side stream in verify steps (torch's convention: lower is higher, 0 the default, -1 high on
# CUDA); decode steps keep the default. The block scheduler hands freed SM slots to the higher-priority
# stream's pending programs first, so the flush launch, enqueued a moment after the non-flush one, need not wait
# for every non-flush program to be dispatched. H200 run 15, whole steps under CUDA graphs, default / high:
# verify T = 4, staggered starts, all accepted 140.5 / 135.2 us (B = 64), 517.4 / 504.4 us (B = 256), mixed
# 122.3 / 116.9 and 446.9 / 435.7 us; lockstep, all accepted 133.6 / 131.2 and 508.8 / 499.9 us. Decode lost in
# three of four cases (lockstep 74.5 / 78.2 us at B = 64, 274.4 / 277.6 at B = 256; staggered 278.3 / 281.3 at
# B = 256, 82.4 / 77.3 at B = 64): most decode steps flush no row, and the idle flush programs then only delay
# the non-flush ones (`bench --flush-stream-priority 0` is the A/B). Half the persistent grid
# (`--persistent-rows-per-sm 64`), to leave the non-flush programs room on every SM, was slower (572.0 us).
FLUSH_STREAM_PRIORITY = -1
# True: above SMALL_BATCH rows the flush launch is a fixed grid that finds the flushing rows on the device
# (`_flush_persistent_kernel`) instead of one program per (row, head, tile), most of which return at once.
# Run 8: an idle flush launch costs 1.8 us instead of 11 us at B = 64 (2.0 against 41 us at B = 256); a
# verify T = 4 step with one row in ten flushing 175 us instead of 242 us at B = 64. Run 9 (whole steps): at
# B = 1 with the side stream, the plain grid is faster (verify T = 4: 8.6 against 14.5 us).
PERSISTENT_FLUSH = True
# Which steps defer their fold ("auto": `deferred_fold`; "always"; "never"). A deferring step's non-flush launch does
# every row's step, flushing rows included (outputs reconstructed, records appended: the early-flush rule keeps the
# window inside the ring), and the flush launch after it only folds the committed records into the checkpoint, on side
# streams that the step's commit joins (`join_deferred_folds`) instead of each layer. A layer's fold then runs under the
# next layers' launches, off the step's critical path; the checkpoint is still the baseline's bit for bit, but a flush
# step's outputs are reconstructed like any other step's (not the baseline's bits), and the checkpoint may be read only
# after the commit (or `replayssm_join`). Without a side stream (not CUDA, or CONCURRENT_FLUSH off) the fold runs right
# after the non-flush launch. Ignored with FUSED_FLUSH. "auto" is from H200 run 22 (fp32 state, us per layer-step, plain
# -> deferred). Verify gains everywhere: T = 4 staggered, all accepted, B = 1 / 8 / 32 / 64 / 128 / 256: 8.5 / 27.3 /
# 58.0 / 99.7 / 186.7 / 354.6 -> 8.0 / 24.9 / 55.4 / 94.6 / 174.8 / 334.5 (mixed acceptance at B = 256: 324.6 -> 297.8);
# T = 2 1-7 %, T = 8 8-14 %. Decode gains at 2-32 rows only (DEFERRED_DECODE_BATCHES): B = 2 / 4 / 8 / 32 8.3 / 10.5 /
# 14.8 / 40.5 -> 7.5 / 9.9 / 14.1 / 40.4; B = 1 / 64 / 128 / 256 5.2 / 74.3 / 141.0 / 272.6 -> 5.3 / 74.8 / 143.1 /
# 275.9 (not profiled).
DEFERRED_FOLD = "auto"
DEFERRED_DECODE_BATCHES = range(2, 33)
# Side streams that deferred folds are spread over, round robin: the folds of consecutive layers then run
# side by side instead of queueing on one stream (a decode flush at B = 1 takes ~18 us, four layers' steps).
# Run 22, lockstep, B = 8: one stream 26.6 us per verify T = 4 step (decode 14.7), four 24.9 (14.1), eight
# 25.0 (14.1); the same at B = 64 and 256.
DEFERRED_FOLD_STREAMS = 4
# Batch sizes whose steps leave their flushing rows' folds to `replayssm_fold` (one launch for every layer, after the
# last) when the cursors were allocated with `step_fold=True`, one range for decode, one for verify. Each layer is then
# one launch on one stream, as in the baseline, instead of a non-flush launch and a flush launch (idle in most steps)
# with a side stream's fork and join; the folds of all layers run one after the other at the end of the step instead of
# under the next layers' launches, which the larger batches need. H200 run 23 (`bench --trace`, decode B = 1, per
# layer-step): the decode kernel 4.25 us against the baseline kernel's 4.23, the idle flush launch 1.64 us and ~1 us of
# it not hidden. Whole steps, fp32 state, us per layer-step, per-layer folds -> step fold
# (`h200-bench-23ef-compare.txt`, lockstep; staggered alike): decode B = 1 / 2 / 4 / 8 5.2 / 7.5 / 9.9 / 14.1 -> 4.9 /
# 6.8 / 9.7 / 14.0, B = 32 / 64 / 256 0.7 / 2.1 / 2.3 % slower; verify T = 4 all accepted B = 4 / 8 / 32 14.3 / 24.9 /
# 55.4 -> 12.9 / 24.2 / 52.2 (mixed 13.7 / 23.4 / 50.9 -> 11.9 / 21.9 / 47.5), B = 1 / 2 / 64 / 256 1-2 / 1 / 1 / 4 %
# slower. Run 29d (lockstep, verify B = 2 / 3, all accepted; mixed alike): T = 2 7.5 / 10.3 -> 7.3 / 8.9, T = 4 8.2 /
# 11.2 -> 8.0 / 9.8, T = 8 9.9 / 13.1 -> 9.8 / 12.7; at B = 1 mixed (T = 2 6.4 -> 6.1, T = 4 6.7 -> 6.8, T = 8 7.5 ->
# 7.9), so verify from 2 rows.
STEP_FOLD_DECODE_BATCHES = range(1, 9)
STEP_FOLD_VERIFY_BATCHES = range(2, 33)
# V rows per program of the step fold (one warp), at every batch size. The per-layer folds' small tiles
# (FLUSH_SMALL_TILE_BLOCK_V) shorten the serial chain a small step waits for; the step fold's programs are already
# 30 layers' worth, and there 16 rows won. H200 run 23 (`h200-bench-23dk-compare.txt`, lockstep, us per layer-step,
# 8 -> 16 rows): decode B = 1 / 2 / 4 / 8 4.9 / 6.8 / 9.7 / 14.0 -> 4.8 / 6.7 / 9.5 / 13.4; verify T = 4 at B = 4 / 8
# 12.9 / 24.2 -> 12.0 / 22.4 all accepted, 12.0 / 21.9 -> 11.4 / 20.8 mixed (`bench --step-fold-block-v` is the A/B).
STEP_FOLD_BLOCK_V = 16
# Flush tiles: 8 rows per program up to FLUSH_SMALL_TILE_MAX_BATCH rows, where few rows flush per step and the
# fold's serial chain is the step's critical path (a shorter chain per record: 30 -> 18.5 us for a B = 1
# decode flush); 16 rows above, where the folds fill the machine and fewer, larger programs do the same work
# with fewer reductions per state row (two rows per thread share each record's key). H200 run 12, whole verify
# T = 4 steps, all accepted / mixed, lockstep: 1.10 -> 1.29x / 1.26 -> 1.34x at B = 32, 1.14 -> 1.34x /
# 1.34 -> 1.47x at B = 64, 1.13 -> 1.39x / 1.36 -> 1.56x at B = 128 with 16 rows instead of 8
# (`bench --flush-small-tile-max-batch` is the A/B).
FLUSH_SMALL_TILE_BLOCK_V = 8
FLUSH_SMALL_TILE_MAX_BATCH = 8
# State rows resident per SM in the persistent flush grid (one-warp programs). H200 run 15, whole verify T = 4
# steps at B = 256, all accepted, staggered starts: 518.9 us at 128, 712.5 / 1068.2 / 1662.2 us at 64 / 32 / 16;
# the fold needs every warp it can get, and the freed register file did not let the non-flush launch overlap it.
PERSISTENT_ROWS_PER_SM = 128
# Register cap of the persistent flush launch (None: the compiler's choice; sm_90, 8-row tiles: ~190 with tree
# sums, ~240 with float64 sums, 150-168 on the plain grid). Run 10 (float64 sums): every row flushing, B = 64,
# verify T = 4: 869 us uncapped, 686 us at 168 for that launch. Run 11 (tree sums), whole verify T = 4 steps at
# 168: all accepted 177 / 549 us against 164 / 536 uncapped (B = 64 / 256), mixed 132 / 487 against 142 / 479:
# no cap (`bench --persistent-max-registers 168` is the A/B).
PERSISTENT_MAX_REGISTERS: int | None = None
# Register cap of a decode step's persistent fold where it folds in line (T = 1, not deferred), on CUDA devices
# (None: `PERSISTENT_MAX_REGISTERS`, which wins when set). The 16-row fold takes ~230 registers uncapped, 8 one-warp
# programs per SM; at 168 (104 B of spills, sm_90), 12, and a latency-bound fold (run 28h: 28.5 of 55.9 us per
# layer-step at B = 64) gets 50 % more warps. H200 run 28i, decode, fp32, lockstep, B = 64 / 256: 55.1 / 193.6 ->
# 53.9 / 191.6 us (8-row tiles 58.7 / 212.5, and 55.6 / 200.9 at 128 registers). Verify keeps the fold uncapped
# (run 11 above).
DECODE_FOLD_MAX_REGISTERS: int | None = 168
# The persistent fold's flushing rows from a list written once per launch by a one-program kernel
# (`_flush._flushing_list_kernel`), instead of every program's scan of the batch, which stays in registers through
# the item loop: "auto" lists a decode step's in-line fold (T = 1, not deferred; `listed_fold`), "always" every
# persistent fold, "never" none. Triton 3.6, sm_90, B = 256 (a scratch build before this switch, run 30): the decode
# fold 237 -> 204 registers uncapped and no spill at its cap of 168 (96 B scanning); the verify step's deferred fold
# 239 -> 202, so `LISTED_FOLD_MAX_REGISTERS` holds 10 programs per SM instead of 8, without a spill; ~250 fewer
# instructions outside the record loop. The list costs one more small launch, on the fold's stream. H200, whole
# steps, us per layer-step (`bench --listed-folds` / `--no-listed-folds` are the A/B): run 30d, lockstep, B = 64 /
# 256, decode 54.2 / 193.3 -> 54.2 / 189.9; verify T = 4 94.5 / 334.8 -> 94.1 / 340.7 (all accepted), 85.1 / 292.7
# -> 85.1 / 298.8 (mixed), hence decode only. Run 31a, decode, both starts, twice each: B = 128 101.1 -> 99.9, B =
# 256 193.6-193.7 -> 189.9-190.0; B = 32 (deferred) and 64 level.
LISTED_FOLDS = "auto"
# Register cap of a listed persistent fold that would otherwise run uncapped (verify, deferred decode), on CUDA
# devices: 200, ten one-warp programs per SM.
LISTED_FOLD_MAX_REGISTERS: int | None = 200
# Register cap of the decode launch on CUDA devices, every state dtype (None: the compiler's choice; `maxnreg` is a
# CUDA option, Triton refuses it on other backends). sm_90 with Triton 3.6 (`sm90_report`): with the ring of 16
# (`ring.default_ring_len`) the chunked build takes 168 registers, 3 programs per SM instead of 4, and 128 under
# the cap without a spill; the preloading builds take 120-128 either way; a bf16 state's build takes 157 uncapped
# (run 20). H200 run 26, decode, fp32, lockstep, ring 16, B = 64 / 128 / 256: 71.1 / 134.0 / 266.0 us uncapped,
# 66.9 / 124.8 / 242.1 at 128 (1.03-1.07x -> 1.09-1.16x the baseline; staggered alike), B = 16 / 32: 22.5 / 39.6
# -> 21.4 / 37.9; 8-record history chunks (128 registers uncapped) 68.2 / 128.1 / 242.8. bf16 state (paired, ring
# 16), B = 1 / 8 / 64 / 256: 3.6 / 13.1 / 79.6 / 301.6 us uncapped, 3.7 / 10.4 / 59.6 / 216.5 at 128
# (`bench --decode-max-registers 255` is the A/B).
DECODE_MAX_REGISTERS: int | None = 128
# A bf16 state's decode tile loaded as int32 pairs of elements (`pair_projections`) where those loads are aligned
# (`paired_state`): the pairs take the fp32 tile's layout (sm_90, Triton 3.6: 128 registers without the cap, STS 90
# -> 66, PRMT 119 -> 46). H200 run 25, bf16 state, decode, lockstep, B = 1 / 8 / 64 / 256: 5.0 / 13.4 / 82.1 /
# 304.6 us plain, 4.4 / 11.2 / 67.2 / 244.8 us paired (0.48-0.57x -> 0.60-0.63x the baseline;
# `bench --no-paired-state` is the A/B).
PAIRED_STATE = True
# True: above SMALL_BATCH rows, for the exact fold, a small kernel (`_flush._normalised_keys_kernel`, one
# program per flushing row and key head) normalises the flushing rows' record keys once, into a `[B, H, L, K]`
# float32 scratch, before the flush launch; the flush programs read them instead of each normalising the same
# keys (at Qwen3.6 shapes 16 programs per key head with 16-row tiles, 32 with 8-row ones). The fold is bound by
# instruction issue (ncu, run 12); a Triton 3.6 sm_90 compile of its loop per chunk of 4 records: 1319
# instructions against 1660 in the persistent launch of 16-row tiles. The values are the ones the fold computes
# (same helper, same op order, FP fusion off), so the checkpoint stays bit-identical. H200 run 14, every row
# flushing, persistent 16-row launch: 300 against 337 us (T = 1) and 379 against 412 us (T = 4) at B = 64,
# 1182 against 1331 and 1536 against 1711 us at B = 256; at B = 1 (8-row tiles) slower, 17.8 against 13.2 us,
# the extra launch on the critical path.
FLUSH_NORMALISED_KEYS = True
# True: with FLUSH_NORMALISED_KEYS the same pass also normalises the window's tokens (keys, and queries times
# the scale, with `load_token`'s helpers and op order, so outputs and checkpoints stay bit-identical), and the
# flush programs' window part reads them instead of normalising q and k in each of the 16 programs of a key
# head. Triton 3.6 sm_90 (`sm90_report --kernels "flush persistent"`), persistent 16-row launch at B = 256:
# 5944 -> 4352 instructions for T = 4 (the fold's loop unchanged), 2984 -> 2576 for decode; registers 249 ->
# 245. H200 run 17 (`bench --quick --tokens 1,4,8 --batch-sizes 64,256 --starts lockstep`, off -> on, B = 64 /
# 256): verify T = 4 all accepted 108.5 / 388.1 -> 105.6 / 376.6 us, mixed 98.5 / 351.9 -> 97.1 / 343.0; T = 8
# all accepted at B = 64 180.3 -> 160.4; decode within 1 % (`bench --no-flush-normalised-window` is the A/B,
# `-m gpu -k "other_key_source and window"` the bit-exact cases).
FLUSH_NORMALISED_WINDOW = True
# True: above SMALL_BATCH rows (not when preloading) the window kernel's K pass takes the keys' products with
# each other (history keys x window keys and queries, window x window) and their squared norms (the Gram
# diagonals) as dots on the raw inputs, in their own dtype (bf16 in vLLM: exact products on bf16 tensor cores,
# float32 sums), instead of converting them to float32 for TF32 dots and summing the squares on the CUDA
# cores; only the state's dot stays TF32. A Triton 3.6 sm_90 compile: the K pass 165 instructions per chunk
# against 300 (100 of them bf16 -> float32 conversions), 118 registers against 96. H200 run 14, T = 4,
# non-flush rows: 78.6 against 81.2 us at B = 64, 295.0 against 305.5 us at B = 256; 6.1 against 5.6 us at
# B = 1 (preloading), hence not there.
WINDOW_RAW_KEY_DOTS = True
# With WINDOW_RAW_KEY_DOTS: True and WINDOW_KEY_PRODUCTS: False, the history keys' squared norms are the
# diagonal of their Gram matrix, a `[BH, BH]` dot per K chunk; False, their squares summed on the CUDA cores in
# float32 (exact squares of bf16 values, like the dot's products), and no Gram matrix. A Triton 3.6 sm_90
# compile: 96 registers against 118 (10 programs of 2 warps per SM against 8), the same 1360 instructions, 46
# HMMA against 54. H200 run 16 (without key products): 1-3 % slower in whole steps. The key products' pre-pass
# always sums.
WINDOW_HISTORY_GRAM_NORMS = True
# True: from WINDOW_PRODUCTS_MIN_BATCH rows (below it, and when preloading, not) a small kernel before the
# window kernel (`_window._key_products_kernel`, one program per row and key head) takes the keys' side of the
# window kernel's K pass: the history keys' and the window's products and norms, and the window keys' ring
# append. The window kernel's K pass is then the state's dot alone. Without it each of the 8 programs (4 V tiles
# x 2 value heads) of a key head repeats that work, 2/3 of the pass's dots and their operand conversions (the
# kernel is L1-bound: ncu run 12). H200 run 16, whole steps, lockstep, B = 64 / 256: verify T = 4 all accepted
# 131.9 -> 123.3 / 505.6 -> 440.5 us, mixed 117.0 -> 101.4 / 438.2 -> 377.1 us, T = 2 101.2 -> 87.9 / 369.1 ->
# 290.1 us; B = 1 (preloading, so not used) unchanged. `bench --no-window-key-products` is the A/B.
WINDOW_KEY_PRODUCTS = True
# The batch size from which the window kernel takes the key products' pre-pass (WINDOW_KEY_PRODUCTS) and
# `_window.WINDOW_BLOCK_V` rows per program (the wide tiles of WIDE_WINDOW_TOKENS: from WIDE_WINDOW_MIN_BATCH,
# without the pre-pass unless WIDE_WINDOW_KEY_PRODUCTS); below it, run 15's path (keys' side in the kernel,
# 32-row tiles).
# H200 run 17, non-flush rows alone (`h200-parts-17b-window-gate`, wp = 2T - 2 records short of a flush), run
# 15's path -> this one: T = 2 11.9 -> 12.5 / 22.3 -> 19.2 / 41.1 -> 32.2 / 77.4 -> 56.5 us at B = 8 / 16 / 32
# / 64, T = 4 17.9 -> 14.7 / 30.1 -> 21.6 / 54.1 -> 37.4 / 101.2 -> 66.8 us. Run 16's grid had it at B = 8,
# where whole verify T = 2 steps got slower (17.2 -> 28.1 us).
WINDOW_PRODUCTS_MIN_BATCH = 16
# Window sizes T whose non-flush rows take `_window.WIDE_WINDOW_BLOCK_V` rows and `WIDE_WINDOW_WARPS` per
# program (from WINDOW_PRODUCTS_MIN_BATCH rows) instead of `WINDOW_BLOCK_V` and `WINDOW_WARPS`; measured with
# `default_ring_len(T)` (64 records for these T). Run 17 chose T = 3-4 when T = 8 took a ring of 128; at the ring of
# 64 it has had since run 25, T = 6 and 8 run faster wide too. H200 run 33, non-flush rows (`bench_parts`), 64x2 ->
# 128x4 at B = 64 / 256: T = 8 69.0 / 238.1 -> 65.5 / 212.8 us, T = 6 68.5 / 241.2 -> 66.8 / 228.6 (T = 2, at its
# ring of 32, 54.6 / 188.8 against 59.5 / 206.8: stays narrow); whole T = 8 steps (`bench --quick`, lockstep /
# staggered), B = 64 / 256, all accepted 135.7 / 132.6 and 493.0 / 480.2 -> 130.3 / 127.0 and 475.1 / 462.2, mixed
# 98.8 / 98.9 and 348.5 -> 92.1 / 92.1 and 325.6 / 324.9. Run 34, T = 3 / 5 / 7, non-flush rows at B = 64 / 256: 66.2 /
# 233.3, 69.4 / 244.2 and 69.5 / 242.0 -> 63.7 / 216.7, 66.7 / 229.0 and 67.5 / 231.8; whole T = 5 / 7 steps (lockstep)
# at B = 256 all accepted 396.2 / 451.0 -> 384.6 / 443.0, mixed 323.5 / 335.5 -> 312.3 / 326.5. `bench
# --no-wide-window` is the A/B.
WIDE_WINDOW_TOKENS: tuple[int, ...] = (3, 4, 5, 6, 7, 8)
# False: the wide tile (WIDE_WINDOW_TOKENS, from WIDE_WINDOW_MIN_BATCH rows, on a state of a dtype in
# WIDE_WINDOW_IN_KERNEL_STATES) keeps the keys' side in its own K pass instead of taking the key products' pre-pass,
# at WIDE_WINDOW_IN_KERNEL_STAGES stages (NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES on a bf16 state), the history
# keys' norms summed (WIDE_WINDOW_HISTORY_GRAM_NORMS, as WINDOW_HISTORY_GRAM_NORMS for the other tiles) and, on
# CUDA, at most WIDE_WINDOW_MAX_REGISTERS registers (four programs per SM).
# A wide program covers the whole of V, so only the key head's two value heads repeat the keys' side (the 64x2
# tile repeats it four times, 32x2 eight), and the pre-pass launch, which sat on the step's critical path, is gone.
# sm_90, Triton 3.6, T = 4: 128 registers, 1736 instructions (2 stages: 2024), 39.9 KB of shared memory at 2
# stages and 60 KB at 3 (three programs per SM), against 123 registers and 52 KB for the tile after the pre-pass.
# H200 run 37 (`bench_parts --parts window`, non-flush launches with the pre-pass -> in-kernel, us, B = 64 / 128 /
# 256): T = 3 67.8 / 123.6 / 231.2 -> 58.7 / 109.5 / 206.0, T = 4 62.7 / 112.4 / 208.5 -> 59.1 / 109.5 / 206.6, T =
# 6 66.2 / 119.9 / 222.4 -> 62.0 / 114.7 / 216.7, T = 8 65.9 / 118.9 / 223.6 -> 60.4 / 113.5 / 211.7; 3 stages
# (three programs per SM) or the Gram norms were slower or level (`h200-parts-37a`, `-37b`). The 64x2 tile of T = 2
# stays with the pre-pass (run 37a, B = 64 / 256: in-kernel 52.8 / 176.6 -> 54.0 / 189.6 us; run 37f: the wide tile
# in-kernel 57.9 / 211.1, 64x2 in-kernel at 2 stages 54.8 / 196.6). Whole steps (`bench --quick`, lockstep, us per
# layer-step, the mean of two runs, pre-pass -> in-kernel, B = 64 / 128 / 256), all accepted / mixed: T = 3 94.4 /
# 173.3 / 331.1 -> 81.8 / 156.6 / 301.7 and 84.2 / 159.2 / 301.1 -> 73.2 / 142.6 / 272.4; T = 4 92.1 / 169.9 / 322.9
# -> 85.2 / 163.5 / 316.5 and 82.6 / 154.3 / 280.1 -> 76.1 / 148.3 / 275.3; T = 8 all accepted 129.4 / 244.1 / 474.3
# -> 119.9 / 234.1 / 458.9 (`h200-bench-37c-*`). `bench --wide-window-key-products` is the A/B.
WIDE_WINDOW_KEY_PRODUCTS = False
WIDE_WINDOW_IN_KERNEL_STAGES = 2
# bf16 and fp16 states: half the state tile's bytes, so 3 stages fit four programs per SM (sm_90 at 128 registers:
# 28 KB, no spill; 2 stages spill 8 B). H200 run 38a (`bench --quick --state-dtypes bf16`, lockstep, us per
# layer-step, T = 4 / 8 at B = 16 / 64 / 256, all accepted): the pre-pass 24.9 / 80.4 / 293.2 and 35.4 / 117.3 /
# 437.2, in-kernel at 2 stages 23.7 / 79.5 / 303.6 and 34.1 / 115.9 / 450.9, at 3 stages 23.2 / 77.0 / 289.8 and
# 32.7 / 111.3 / 433.1; mixed acceptance T = 4 22.7 / 70.4 / 252.6 -> 20.3 / 67.2 / 251.2 at 3 stages.
NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES = 3
# K columns per chunk. 16 at 3 stages (sm_90, fp32 state: 1656 instructions against 2024, 30 KB) was slower in H200
# run 38a (whole steps, lockstep, all accepted, B = 64 / 256: T = 3 81.4 / 300.5 -> 87.6 / 313.5 us, T = 4 84.8 /
# 315.2 -> 90.9 / 327.9, T = 8 119.6 / 456.3 -> 126.3 / 473.3).
WIDE_WINDOW_IN_KERNEL_BLOCK_K = 32
WIDE_WINDOW_MAX_REGISTERS = 128
WIDE_WINDOW_HISTORY_GRAM_NORMS = False
# The state dtypes whose wide windows keep the keys' side in the kernel by default: float32 (run 37) and bfloat16
# (run 38a, at NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES); a float16 state, never timed, keeps run 36's path (the
# wide tile after the pre-pass, from WINDOW_PRODUCTS_MIN_BATCH rows).
WIDE_WINDOW_IN_KERNEL_STATES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
# The batch size from which windows of WIDE_WINDOW_TOKENS take that wide tile when it keeps the keys' side in the
# kernel (below it the 32x2 tile, as below WINDOW_PRODUCTS_MIN_BATCH for the other T). H200 run 37f (`bench_parts`,
# non-flush launches, 32x2 -> 128x4 in-kernel, B = 8 / 12 / 16): T = 4 11.8 / 20.5 / 28.3 -> 12.5 / 14.7 / 17.8 us,
# T = 8 12.3 / 21.6 / 29.7 -> 12.7 / 15.0 / 18.1. Run 37g, whole steps (`bench --quick`, lockstep, us per
# layer-step, from 16 rows -> from 9, B = 10 / 12 / 14; B = 8 the same 32x2 steps both ways, B = 9 not timed): T = 4
# all accepted 24.9 / 27.2 / 33.6 -> 19.6 / 21.4 / 24.5 (1.32-1.37x -> 1.67-1.88x the baseline), mixed 23.1 / 25.0 /
# 31.1 -> 17.7 / 19.1 / 21.8; T = 8 all accepted 31.8 / 35.0 / 42.9 -> 25.5 / 28.4 / 32.8, mixed 24.9 / 27.1 / 33.6
# -> 18.7 / 20.4 / 23.7. `bench --wide-window-min-batch N` is the A/B.
WIDE_WINDOW_MIN_BATCH = 10
# Up to this many rows the 64x2 tile (the large tile of the windows outside WIDE_WINDOW_TOKENS: T = 2), on a state
# of a dtype in WINDOW_IN_KERNEL_STATES, keeps the keys' side in its own K pass too, at WINDOW_IN_KERNEL_STAGES stages
# with the history keys' norms summed (WINDOW_IN_KERNEL_HISTORY_GRAM_NORMS), instead of taking the key products'
# pre-pass; above it the pre-pass's one launch per row and key head beats four programs per key head repeating it.
# sm_90, Triton 3.6, T = 2 at its ring of 32: 128 registers, 11 KB of shared memory, 2080 instructions (eight
# programs per SM) against 95, 18 KB and 1704 after the pre-pass (ten). H200 run 38d-e (`bench --quick --tokens 2`,
# lockstep, us per layer-step, fp32, the pre-pass -> in-kernel, all accepted; the A/B then was `bench
# --no-window-key-products --no-window-history-gram-norms --window-stages 2`), B = 16 / 24 / 32 / 48 / 64 / 96:
# 23.0 / 32.6 / 40.3 / 64.4 / 77.8 / 106.3 -> 21.0 / 32.3 / 38.3 / 54.2 / 70.7 / 104.4, B = 128 / 256 135.4 / 246.0
# -> 137.9 / 259.6 (mixed acceptance the same way: 22.9 / 31.8 / 39.0 / 62.5 / 75.9 / 102.8 -> 20.6 / 31.6 / 37.1 /
# 52.6 / 68.6 / 101.0, 130.2 / 235.2 -> 133.2 / 250.8). `bench --window-in-kernel-max-batch N` is the A/B (0: never,
# both state widths).
WINDOW_IN_KERNEL_MAX_BATCH = 96
WINDOW_IN_KERNEL_STAGES = 2
WINDOW_IN_KERNEL_HISTORY_GRAM_NORMS = False
WINDOW_IN_KERNEL_STATES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
# A bf16 state's tile (half the bytes) at 3 stages up to 64 rows. sm_90, Triton 3.6: 128 registers, no spill, 14 KB,
# 1440 instructions (2 stages: 7 KB, 1408). H200 run 39a (`bench --quick --state-dtypes bf16 --tokens 2`, lockstep,
# us per layer-step, the pre-pass -> in-kernel at 3 stages, all accepted), B = 16 / 32 / 64 / 96: 18.8 / 32.6 / 62.1
# / 84.1 -> 17.2 / 32.2 / 59.9 / 88.8 (mixed acceptance 18.9 / 31.5 / 60.9 / 80.6 -> 16.9 / 31.1 / 58.1 / 85.6); at
# 2 stages 18.7 / 34.1 / 64.1 / 94.3, level or slower. An fp16 state, never timed, keeps the pre-pass.
# `bench --no-window-in-kernel-bf16-state` is the A/B.
NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH = 64
NARROW_STATE_WINDOW_IN_KERNEL_STAGES = 3
# Measured against the wide tile and not kept (H200 run 34, non-flush rows at T = 4 / 8, B = 64 / 256, the wide tile
# 62.7-63.7 / 212.2-213.0 and 66.3-67.2 / 219.0-222.4 us). One program per row and key head over its value heads'
# state tiles in a pipelined loop, the keys' side in registers instead of the pre-pass (commit c95de57, removed; 223
# registers, 2 programs per SM): 83.0 / 316.6 and 88.8 / 337.8 us at its best (64x4, 2 stages), whole T = 4 steps
# 1.68-1.91x against 2.00-2.62x. The history's `u` records 16 or 32 at a time instead of one `[128, 64]` tile (102
# and 118 registers against 124; with 16 at a cap of 96 and 2 stages, five programs per SM without spilling):
# 62.7-69.7 / 214.7-225.0 and 66.2-71.6 / 220.4-233.4 us; whole T = 4 steps, all accepted, 93.5 / 327.3 -> 95.3 /
# 328.4 us. The wide tile at 4 stages (69 KB, three programs per SM, leaving registers for two fold warps beside
# them, which at 3 stages the window's four programs take): 68.9 / 234.2 and 71.6 / 243.8 us, whole T = 4 steps
# 94.0 / 330.1 -> 98.4 / 348.7.
# "auto": the window kernel computes query s's output in its query row's column T + s of the `[BV, 16]` tiles,
# where `P` already holds `S_w q_s` and `x x^T` holds `k_j . q_s`, so both terms are elementwise there, instead of
# two selector dots (`P E`, `x x^T` against the query columns, 3xTF32 for a float32 output) that move them to
# column s; except in the preloading programs of windows up to 4 tokens, where it measured slower. "always" /
# "never" for the A/B (`bench --window-query-columns` / `--no-window-query-columns`). sm_90, Triton 3.6, T = 4:
# 128x4 1608 -> 1528 instructions, 39 -> 35 barriers, 10 -> 8 HMMA; 64x2 94 -> 112 registers; 32x2 preloading
# 138 -> 104 registers, 1464 -> 1384 instructions. H200 run 35 (`bench_parts`, non-flush launches, selector dots
# -> query columns, us): 128x4 B = 64 / 256 T = 4 64.2 / 214.5 -> 62.2 / 205.7, T = 8 66.8 / 226.7 -> 65.0 /
# 218.8; 64x2 T = 2 57.2 / 192.7 -> 53.6 / 177.3; preloading 32x2 at B = 1 / 2 T = 2 5.9 / 6.4 -> 5.9 / 6.6, T = 4
# 6.0 / 6.6 -> 6.35 / 6.75, T = 8 6.45 / 6.9 -> 6.3 / 6.7. Whole steps (`bench --quick`, lockstep, all
# accepted): B = 256 T = 2 / 4 / 8 256.6 / 332.0 / 479.1 -> 243.8 / 321.9 / 471.9, B = 64 81.4 / 93.8 / 130.5 ->
# 77.9 / 92.1 / 129.2; B = 1 T = 2 / 4 6.3 / 6.7 -> 6.7 / 7.0 (hence the exception), T = 8 7.5 -> 7.2.
WINDOW_QUERY_COLUMNS = "auto"
# "auto": the wide tile with its keys' side in the kernel, on a state of a dtype in WIDE_WINDOW_EARLY_GATES_STATES,
# loads the history's gates and the window's gate inputs before its K pass (a few registers), so that its tail does
# not wait on them: `ncu` run 36e had the gates' load, issued after the K pass because its address needs the
# cursors, as that tile's largest single wait (7.7 % of the stall samples); with the keys' side in the kernel the K
# pass waits on the cursors anyway (the history keys' rows). sm_90, Triton 3.6, T = 4 at 128 registers: fp32 2024
# -> 2048 instructions, no spill; bf16 16 B of spills; T = 2's 64x2 tile in-kernel 128 -> 150 registers uncapped.
# H200 run 39c (`bench --quick --tokens 4 --batch-sizes 64,256`, lockstep, fp32, us per layer-step, twice each,
# alternating): all accepted B = 64 84.9 / 84.9 -> 84.4 / 84.4, B = 256 316.0 / 315.4 -> 311.9 / 312.0; mixed 75.9 /
# 76.0 -> 74.7 / 74.7, 274.3 / 273.9 -> 270.8 / 270.9. A bf16 state, slower (run 39b, T = 4, B = 16 / 64: 23.2 / 76.8
# -> 23.6 / 78.4). "always" / "never" (every build that does not preload, or none) for the A/B: `bench
# --window-early-gates` / `--no-window-early-gates`.
WINDOW_EARLY_GATES = "auto"
WIDE_WINDOW_EARLY_GATES_STATES: tuple[torch.dtype, ...] = (torch.float32,)
MAX_PERSISTENT_ROWS = 4096  # every persistent program scans all rows; above this the plain grid is used


REGISTERS_PER_SM = 65536  # 32-bit registers per SM (sm_80, sm_90); a thread's share is allocated in steps of 8


def wide_keys_in_kernel(T: int, state_dtype: torch.dtype) -> bool:
    """Whether windows of T tokens on a state of `state_dtype` take the wide tile with its keys' side in the kernel
    when their launch is large (`WIDE_WINDOW_TOKENS`, `WIDE_WINDOW_KEY_PRODUCTS` off, and a state dtype in
    `WIDE_WINDOW_IN_KERNEL_STATES`)."""
    return T in WIDE_WINDOW_TOKENS and not WIDE_WINDOW_KEY_PRODUCTS and state_dtype in WIDE_WINDOW_IN_KERNEL_STATES


def narrow_state(state_dtype: torch.dtype) -> bool:
    """Whether a state of `state_dtype` takes the `NARROW_STATE_*` settings: fewer than 4 bytes an element."""
    return state_dtype.itemsize < 4


def wide_window_in_kernel_stages(state_dtype: torch.dtype) -> int:
    """Pipeline stages of the wide tile's K pass with the keys' side in the kernel: `WIDE_WINDOW_IN_KERNEL_STAGES`,
    `NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES` for a `narrow_state`."""
    return NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES if narrow_state(state_dtype) else WIDE_WINDOW_IN_KERNEL_STAGES


def large_window(B: int, preload: bool, fused: bool, *, T: int, state_dtype: torch.dtype) -> bool:
    """Whether a verify launch of windows of T tokens takes the large tiles (`window_tile`) and, unless they keep
    the keys' side in the kernel (`wide_keys_in_kernel`, `window_keys_in_kernel`), the key products' pre-pass
    (`window_key_products`): from `WIDE_WINDOW_MIN_BATCH` rows for the wide tiles that keep it in the kernel, from
    `WINDOW_PRODUCTS_MIN_BATCH` for the others."""
    min_batch = WIDE_WINDOW_MIN_BATCH if wide_keys_in_kernel(T, state_dtype) else WINDOW_PRODUCTS_MIN_BATCH
    return min_batch <= B and not preload and not fused


def window_keys_in_kernel(T: int, B: int, state_dtype: torch.dtype) -> bool:
    """Whether a large launch of B windows of T tokens outside `WIDE_WINDOW_TOKENS` (the 64x2 tile) on a state of
    `state_dtype` keeps the keys' side in the kernel (`WINDOW_IN_KERNEL_STATES`, up to `WINDOW_IN_KERNEL_MAX_BATCH`
    rows, `NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH` for a `narrow_state`)."""
    max_batch = NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH if narrow_state(state_dtype) else WINDOW_IN_KERNEL_MAX_BATCH
    plain_tile = T not in WIDE_WINDOW_TOKENS
    return plain_tile and max_batch >= B and state_dtype in WINDOW_IN_KERNEL_STATES


def window_in_kernel_stages(state_dtype: torch.dtype) -> int:
    """Pipeline stages of the 64x2 tile's K pass with the keys' side in the kernel: `WINDOW_IN_KERNEL_STAGES`,
    `NARROW_STATE_WINDOW_IN_KERNEL_STAGES` for a `narrow_state`."""
    return NARROW_STATE_WINDOW_IN_KERNEL_STAGES if narrow_state(state_dtype) else WINDOW_IN_KERNEL_STAGES


def window_key_products(T: int, B: int, large: bool, state_dtype: torch.dtype) -> bool:
    """Whether a `large` verify launch of B rows (`large_window`) takes the key products' pre-pass:
    `WINDOW_KEY_PRODUCTS`, except for the tiles that keep the keys' side in the kernel (`wide_keys_in_kernel`,
    `window_keys_in_kernel`)."""
    in_kernel = wide_keys_in_kernel(T, state_dtype) or window_keys_in_kernel(T, B, state_dtype)
    return WINDOW_KEY_PRODUCTS and large and not in_kernel


class WindowBuild(NamedTuple):
    """A verify launch's defaults for what its caller leaves unset (`launch_window`)."""

    stages: int
    block_k: int
    history_gram_norms: bool
    max_registers: int | None  # None: no cap
    early_gates: bool  # the gates before the K pass (`window_early_gates`), in programs that do not preload


def window_early_gates(wide_in_kernel: bool, state_dtype: torch.dtype) -> bool:
    """Whether a verify build loads the gates before its K pass (`WINDOW_EARLY_GATES`): under "auto", the wide tile
    with its keys' side in the kernel (`wide_in_kernel`) on a state of a dtype in `WIDE_WINDOW_EARLY_GATES_STATES`."""
    if WINDOW_EARLY_GATES == "auto":
        return wide_in_kernel and state_dtype in WIDE_WINDOW_EARLY_GATES_STATES
    return WINDOW_EARLY_GATES == "always"


def window_build(T: int, large: bool, key_products: bool, block_v: int | None, state: torch.Tensor) -> WindowBuild:
    """The defaults of a verify launch's build, by its tile (`window_tile`, or `block_v`) and whether it takes the
    key products' pre-pass. The wide tile with the keys' side in the kernel: `wide_window_in_kernel_stages`,
    `WIDE_WINDOW_IN_KERNEL_BLOCK_K`, `WIDE_WINDOW_HISTORY_GRAM_NORMS` and, on NVIDIA CUDA (`register_caps`),
    `WIDE_WINDOW_MAX_REGISTERS`; the 64x2 tile with the keys' side in the kernel: `window_in_kernel_stages` and
    `WINDOW_IN_KERNEL_HISTORY_GRAM_NORMS`; every other build `WINDOW_STAGES` and `WINDOW_HISTORY_GRAM_NORMS`; no cap
    but the wide tile's. The gates before the K pass by `window_early_gates`."""
    tile = block_v or window_tile(T, large)[0]
    in_kernel = large and not key_products
    if in_kernel and T in WIDE_WINDOW_TOKENS and tile == WIDE_WINDOW_BLOCK_V:
        cap = WIDE_WINDOW_MAX_REGISTERS if register_caps(state.device) else None
        stages = wide_window_in_kernel_stages(state.dtype)
        early = window_early_gates(True, state.dtype)
        return WindowBuild(stages, WIDE_WINDOW_IN_KERNEL_BLOCK_K, WIDE_WINDOW_HISTORY_GRAM_NORMS, cap, early)
    early = window_early_gates(False, state.dtype)
    if in_kernel and T not in WIDE_WINDOW_TOKENS and tile == WINDOW_BLOCK_V:
        stages = window_in_kernel_stages(state.dtype)
        return WindowBuild(stages, WINDOW_BLOCK_K, WINDOW_IN_KERNEL_HISTORY_GRAM_NORMS, None, early)
    return WindowBuild(WINDOW_STAGES, WINDOW_BLOCK_K, WINDOW_HISTORY_GRAM_NORMS, None, early)


def window_tile(T: int, large: bool) -> tuple[int, int]:
    """V rows and warps of a window program: `SMALL_WINDOW_BLOCK_V` below `WINDOW_PRODUCTS_MIN_BATCH` rows (or
    when preloading; `large` False), else the wide tile for `WIDE_WINDOW_TOKENS` and `WINDOW_BLOCK_V` for the
    rest."""
    if not large:
        return SMALL_WINDOW_BLOCK_V, SMALL_WINDOW_WARPS
    if T in WIDE_WINDOW_TOKENS:
        return WIDE_WINDOW_BLOCK_V, WIDE_WINDOW_WARPS
    return WINDOW_BLOCK_V, WINDOW_WARPS


def register_caps(device: torch.device) -> bool:
    """Whether launches on `device` take register caps: only NVIDIA's CUDA backend knows `maxnreg`
    (`launch_options`), and a ROCm build of torch names its devices "cuda" too."""
    return device.type == "cuda" and torch.version.hip is None


def decode_max_registers(device: torch.device) -> int | None:
    """The decode launch's register cap: `DECODE_MAX_REGISTERS` on an NVIDIA CUDA device, None elsewhere
    (`register_caps`)."""
    return DECODE_MAX_REGISTERS if register_caps(device) else None


def decode_preload(B: int) -> bool:
    """Whether a decode launch of B rows reads its rings whole with the state tile (rings of at most
    `PRELOAD_MAX_RECORDS` records): up to `PRELOAD_DECODE_MAX_BATCH` rows (`SMALL_BATCH` when that is None)."""
    return B <= (SMALL_BATCH if PRELOAD_DECODE_MAX_BATCH is None else PRELOAD_DECODE_MAX_BATCH)  # noqa: SIM300


def window_preload(B: int) -> bool:
    """Whether a verify launch of `B` rows issues the window kernel's side loads before its K pass (the small-batch
    path, up to `SMALL_BATCH` rows)."""
    return B <= SMALL_BATCH


def key_head_decode(B: int, L: int, state_dtype: torch.dtype) -> bool:
    """Whether a decode launch of B rows on a ring of L records runs `_key_head_decode_kernel`
    (`KEY_HEAD_DECODE_MIN_BATCH`, `NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH` for a `narrow_state`; not where it
    preloads, `decode_preload`)."""
    first = NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH if narrow_state(state_dtype) else KEY_HEAD_DECODE_MIN_BATCH
    return first is not None and first <= B and not decode_preload(B) and whole_ring_tile(L)


def whole_ring_tile(L: int) -> bool:
    """Whether a ring of L records fits the one history tile that the preloading and the key-head decode read it
    in (`PRELOAD_MAX_RECORDS` rows)."""
    return history_block(L) <= PRELOAD_MAX_RECORDS


def paired_state(state: torch.Tensor, K: int) -> bool:
    """Whether the decode kernel can read `state` as int32 pairs of elements (`PAIRED_STATE`): bf16, and every
    row of K elements starts on a 4-byte boundary (K, the slot stride and the pool's address even)."""
    aligned = K % 2 == 0 and state.stride(0) % 2 == 0 and state.data_ptr() % 4 == 0
    return state.dtype == torch.bfloat16 and aligned


def decode_k_chunk(B: int, state_dtype: torch.dtype) -> int:
    """The column chunks of `_decode_kernel`'s state tile in a launch of B rows: `DECODE_K_CHUNK` at
    `DECODE_K_CHUNK_BATCHES` rows of a 4-byte state, else 0 (whole tiles; a 2-byte state keeps `PAIRED_STATE`'s
    loads, which the chunks would replace, and was not timed with them)."""
    return DECODE_K_CHUNK if B in DECODE_K_CHUNK_BATCHES and state_dtype.itemsize == 4 else 0


def exact_input_dots(dtype: torch.dtype) -> bool:
    """Whether a dot of operands stored as `dtype` is exact on this run: not bf16 under the interpreter, whose bf16
    dots multiply the bit patterns as integers (Triton 3.9; the interpreter does not support bf16 arithmetic,
    triton-lang/triton#11584). The tests' interpreter has exact bf16 dots (`tests/kernels/interpreter_dots.py`)."""
    return not (dtype == torch.bfloat16 and interpreting())


def window_raw_state_dot(state_dtype: torch.dtype, input_dtype: torch.dtype, key_products: bool) -> bool:
    """Whether the window kernel's K pass dots the state with the window's keys and queries in their stored dtype
    (`WINDOW_RAW_STATE_DOT`): a `narrow_state` of the inputs' dtype, in a build with its keys' side in the kernel
    (not after the `key_products` pre-pass), where such dots are exact (`exact_input_dots`)."""
    same = WINDOW_RAW_STATE_DOT and narrow_state(state_dtype) and state_dtype == input_dtype and not key_products
    return same and exact_input_dots(state_dtype)


def window_raw_key_dots(preload: bool, input_dtype: torch.dtype) -> bool:
    """Whether a verify launch dots the keys with each other as stored (`WINDOW_RAW_KEY_DOTS`): not when preloading,
    and where such dots are exact (`exact_input_dots`)."""
    return WINDOW_RAW_KEY_DOTS and not preload and exact_input_dots(input_dtype)


def key_head_decode_late_norms(state_dtype: torch.dtype) -> bool:
    """Whether the key-head decode normalises its row sums instead of the chunks' key and query
    (`KEY_HEAD_DECODE_LATE_NORMS`): under "auto", on a `narrow_state`."""
    if KEY_HEAD_DECODE_LATE_NORMS == "auto":
        return narrow_state(state_dtype)
    return KEY_HEAD_DECODE_LATE_NORMS == "always"


def key_head_decode_stages(B: int) -> int:
    """The pipelined loop's stages of a key-head decode launch of B rows: `KEY_HEAD_DECODE_STAGES` from
    `KEY_HEAD_DECODE_STAGES_MIN_BATCH` rows, else 0 (the tiles unrolled)."""
    first = KEY_HEAD_DECODE_STAGES_MIN_BATCH
    return KEY_HEAD_DECODE_STAGES if first is not None and first <= B else 0


def launch_options(max_registers: int | None, **options: object) -> dict[str, object]:
    """A launch's compile options, with `maxnreg` only when a register cap is set: it is a CUDA option, and
    Triton refuses a keyword the device's backend does not know, even one set to None (the AMD and Intel XPU
    backends have no `maxnreg`), so passing it always would stop every launch off CUDA."""
    return {**options, "maxnreg": max_registers} if max_registers else dict(options)


def persistent_max_registers(T: int, defer: bool, device: torch.device, listed: bool = False) -> int | None:
    """The persistent fold's register cap: `PERSISTENT_MAX_REGISTERS` when set, else `DECODE_FOLD_MAX_REGISTERS`
    for a decode step's in-line fold on a CUDA device, else `LISTED_FOLD_MAX_REGISTERS` for a `listed` fold on a
    CUDA device, else None."""
    cuda = register_caps(device)
    decode = T == 1 and not defer and cuda
    return (
        PERSISTENT_MAX_REGISTERS
        or (DECODE_FOLD_MAX_REGISTERS if decode else None)
        or (LISTED_FOLD_MAX_REGISTERS if listed and cuda else None)
        or None
    )


def persistent_programs_per_sm(block_v: int, num_warps: int, max_registers: int | None) -> int:
    """Programs per SM of the persistent flush launch: `PERSISTENT_ROWS_PER_SM` state rows' worth, or under a
    register cap as many programs as the register file holds at that cap."""
    if max_registers is None:
        return max(1, PERSISTENT_ROWS_PER_SM // block_v)
    per_thread = -(-max_registers // 8) * 8
    return max(1, REGISTERS_PER_SM // (per_thread * 32 * num_warps))


def listed_fold(T: int, defer: bool) -> bool:
    """Whether a persistent fold reads its flushing rows from a list (`LISTED_FOLDS`): by default a decode step's
    in-line fold, the one that runs under a register cap it otherwise spills at."""
    if LISTED_FOLDS != "auto":
        return LISTED_FOLDS == "always"
    return T == 1 and not defer


def window_query_columns(T: int, preload: bool) -> bool:
    """Whether the window kernel computes its outputs in the query columns (`WINDOW_QUERY_COLUMNS`): by default
    everywhere but the preloading programs of windows up to 4 tokens."""
    if WINDOW_QUERY_COLUMNS != "auto":
        return WINDOW_QUERY_COLUMNS == "always"
    return not preload or T > 4


def deferred_fold(T: int, B: int) -> bool:
    """Whether a step of `B` rows of `T` tokens defers its flush rows' fold (`DEFERRED_FOLD`): by default
    every verify step, and decode steps of `DEFERRED_DECODE_BATCHES` rows."""
    if DEFERRED_FOLD != "auto":
        return DEFERRED_FOLD == "always"
    return T > 1 or B in DEFERRED_DECODE_BATCHES


def step_fold(cursors_step_fold: bool, T: int, B: int) -> bool:
    """Whether the layers of a step of `B` rows of `T` tokens leave their folds to `replayssm_fold`: with cursors
    allocated `step_fold=True`, for `STEP_FOLD_DECODE_BATCHES` (T = 1) or `STEP_FOLD_VERIFY_BATCHES` rows (not
    with FUSED_FLUSH, whose kernels fold in line)."""
    batches = STEP_FOLD_DECODE_BATCHES if T == 1 else STEP_FOLD_VERIFY_BATCHES
    return cursors_step_fold and B in batches and not FUSED_FLUSH


def persistent_flush_default(device: torch.device, B: int) -> bool:
    """`PERSISTENT_FLUSH` above `SMALL_BATCH` rows, on CUDA devices (the grid is sized by their SM count) and
    under the interpreter (CPU tensors, a 3-program grid for the tests); other devices (XPU) take the plain
    grid, which needs no machine size and has not been measured against it there."""
    return PERSISTENT_FLUSH and B > SMALL_BATCH and device.type in ("cuda", "cpu")


def persistent_programs(device: torch.device, items: int, per_sm: int) -> int:
    """Grid of the persistent flush launch: `per_sm` programs per SM (the ones the machine holds at once), at
    most one per item. Under the interpreter, 3, so that the tests see programs loop over several items."""
    if device.type != "cuda":
        return max(1, min(items, 3))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(items, sms * per_sm))


def ring_args(
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    ring: ReplayRing,
    cursors: ReplayCursors,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    scale: float,
) -> list[object]:
    """The positional arguments every ReplaySSM kernel takes first, in their order (the raw records' strides 0
    for an open-loop ring, which has none)."""
    return [
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        state,
        ring.u,
        ring.k,
        ring.g,
        ring.v,
        ring.beta,
        cursors.write_pos,
        cursors.base,
        state_indices,
        out,
        scale,
        mixed_qkv.stride(0),
        a.stride(0),
        b.stride(0),
        state.stride(0),
        ring.u.stride(0),
        ring.k.stride(0),
        ring.g.stride(0),
        ring.v.stride(0) if ring.v is not None else 0,
        ring.beta.stride(0) if ring.beta is not None else 0,
    ]


def _inputs(args: list[object]) -> torch.Tensor:
    """The tokens' `mixed_qkv` in a `ring_args` list (its first argument)."""
    inputs = args[0]
    assert isinstance(inputs, torch.Tensor)
    return inputs


def _state(args: list[object]) -> torch.Tensor:
    """The state pool in a `ring_args` list (its sixth argument)."""
    state = args[5]
    assert isinstance(state, torch.Tensor)
    return state


def _has_raw_records(args: list[object]) -> bool:
    """Whether the ring in a `ring_args` list holds the raw records of the exact fold (`ring.v`, tenth)."""
    return args[9] is not None


def flush_block_v(B: int) -> int:
    """Rows per flush program for a batch of B rows (`FLUSH_SMALL_TILE_MAX_BATCH`)."""
    return FLUSH_SMALL_TILE_BLOCK_V if B <= FLUSH_SMALL_TILE_MAX_BATCH else FLUSH_BLOCK_V


def fold_tile_rows(block_v: int, V: int, exact: bool) -> int:
    """A fold program's V rows as launched: `block_v`, at most `V` rounded up to a power of two (16 at least),
    and 16 at least for the open-loop fold, whose dots need 16-row operands."""
    block_v = min(block_v, max(16, triton.next_power_of_2(V)))
    return block_v if exact else max(block_v, 16)


def launch_flush(
    args: list[object],
    *,
    T: int,
    L: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    B: int,
    dot_precision: str,
    block_v: int | None = None,
    num_warps: int | None = None,
    chunk: int = FLUSH_CHUNK,
    max_registers: int | None = None,
    persistent: bool = False,
    programs_per_sm: int | None = None,
    normalised_keys: bool | None = None,
    normalised_window: bool | None = None,
    join: int = 0,
    defer: bool = False,
    listed: bool | None = None,
) -> None:
    """The flush launch: one program per (V tile, row, value head), or with `persistent` a fixed grid of
    `persistent_programs(...)` that share out the flushing rows' tiles (rows up to `MAX_PERSISTENT_ROWS`).
    The tile defaults to `flush_block_v(B)` x `FLUSH_WARPS`; the open-loop fold's dots need 16 rows or more.
    `normalised_keys` (exact fold only) defaults to `FLUSH_NORMALISED_KEYS` above `SMALL_BATCH` rows, and
    `normalised_window` (with it) to `FLUSH_NORMALISED_WINDOW`. `join`: `cursors.flush_join`. `defer`: fold
    only, after the non-flush launch did the rows' steps (`deferred_fold`). `listed` (default `listed_fold`):
    the persistent grid reads the flushing rows from `_flushing_list_kernel`'s list."""
    from ._config import FP_FUSION, op_order  # the baseline's settings: the bit-identical fold needs them

    block_v = fold_tile_rows(block_v or flush_block_v(B), V, _has_raw_records(args))
    nv = triton.cdiv(V, block_v)
    constants = dict(T=T, L=L, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=block_v, BC=chunk,
                     DOT_PRECISION=dot_precision, EXACT=op_order(), JOIN=join, DEFER=defer)  # fmt: skip
    options = dict(num_warps=num_warps or FLUSH_WARPS, enable_fp_fusion=FP_FUSION)
    keys = None
    normalised_keys = FLUSH_NORMALISED_KEYS and B > SMALL_BATCH if normalised_keys is None else normalised_keys
    window = (FLUSH_NORMALISED_WINDOW if normalised_window is None else normalised_window) and not defer
    code = 0
    if normalised_keys and _has_raw_records(args):
        code = 2 if window else 1
        keys = torch.empty((B, H, L + T * window, K), dtype=torch.float32, device=_state(args).device)
        _normalised_keys_kernel[(B, H)](
            *args, keys, T=T, L=L, H=H, K=K, BK=constants["BK"], BC=chunk, BT=triton.next_power_of_2(T),
            EXACT=constants["EXACT"], NORMALISED_KEYS=code, JOIN=join, DEFER=defer, num_warps=FLUSH_WARPS,
            enable_fp_fusion=FP_FUSION,
        )  # fmt: skip
    constants["NORMALISED_KEYS"] = code
    if persistent and B <= MAX_PERSISTENT_ROWS:
        device = _state(args).device
        listed = listed_fold(T, defer) if listed is None else listed
        cap = max_registers or persistent_max_registers(T, defer, device, listed)
        per_sm = programs_per_sm or persistent_programs_per_sm(block_v, options["num_warps"], cap)
        grid = (persistent_programs(device, B * HV * nv, per_sm),)
        rows = _flushing_list(args, B=B, T=T, L=L, join=join) if listed else None
        _flush_persistent_kernel[grid](
            *args, B, keys, **constants, BB=triton.next_power_of_2(B), NV=nv, rows=rows, LISTED=listed,
            **launch_options(cap, **options),
        )  # fmt: skip
        return
    _flush_kernel[(nv, B, HV)](*args, keys, **constants, **launch_options(max_registers, **options))


def _flushing_list(args: list[object], *, B: int, T: int, L: int, join: int) -> torch.Tensor:
    """The step's flushing rows for a listed persistent fold (`_flush._flushing_list_kernel`), from the launch's
    `ring_args`: `[1 + B]` entries of `LIST_ENTRY` int32, header first."""
    write_pos, ring_base, state_indices = args[11:14]  # `ring_args`' order
    rows = torch.empty(LIST_ENTRY.value * (B + 1), dtype=torch.int32, device=_state(args).device)
    _flushing_list_kernel[(1,)](
        state_indices, write_pos, ring_base, rows, B, T=T, L=L, BB=triton.next_power_of_2(B), JOIN=join, num_warps=4
    )
    return rows


def launch_window(
    args: list[object],
    *,
    T: int,
    L: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    B: int,
    dot_precision: str,
    block_v: int | None = None,
    num_warps: int | None = None,
    block_k: int | None = None,
    num_stages: int | None = None,
    history: int | None = None,
    fused: bool = False,
    max_registers: int | None = None,
    preload: bool | None = None,
    first_chunk: int | None = None,
    raw_key_dots: bool | None = None,
    history_gram_norms: bool | None = None,
    key_products: bool | None = None,
    key_head: bool | None = None,
    k_chunk: int | None = None,
    fused_history: bool | None = None,
    stages: int | None = None,
    prefetch: bool | None = None,
    query_columns: bool | None = None,
    early_gates: bool | None = None,
    join: int = 0,
    defer: bool = False,
) -> None:
    """The non-flush launch: `_decode_kernel` for T = 1, `_window_kernel` for spec verify; with `fused` they
    fold their flush rows too (and are compiled without FP fusion, which the bit-identical fold needs).
    `preload` defaults to `decode_preload(B)` for decode, `window_preload(B)` for verify; preloading decode programs
    default to a 32-row tile. `history` (decode only, a power of two) defaults to `DECODE_HISTORY_BLOCK`, `first_chunk`
    (decode only, not with `preload`, 0: none) to `DECODE_FIRST_CHUNK`, `raw_key_dots` (verify only) to
    `window_raw_key_dots`, `key_products` (verify, neither preloading nor fused) to
    `window_key_products` from `WINDOW_PRODUCTS_MIN_BATCH` rows, `block_v` and `num_warps` (verify) to `window_tile`,
    and `num_stages`, `block_k`, `history_gram_norms` (with raw key dots) and `max_registers` (verify; 0: no cap) to
    the launch's `window_build`. `key_head` (decode, neither preloading nor fused; `block_v`, `num_warps` its tile)
    defaults to `key_head_decode(B, L, state.dtype)`. `k_chunk` (decode): the state tile's column chunks,
    default `KEY_HEAD_DECODE_K_CHUNK` or `DECODE_K_CHUNK`; `fused_history` (key head), default
    `KEY_HEAD_DECODE_FUSED_HISTORY`; `stages` (key head), default `key_head_decode_stages(B)`; `prefetch` (key head,
    with stages), default `KEY_HEAD_DECODE_PREFETCH`. `query_columns` (verify), default
    `window_query_columns(T, preload)`; `early_gates` (verify, not with `preload`), default the build's. `join`:
    `cursors.flush_join`. `defer`: flushing rows too (`deferred_fold`; not with `fused`)."""
    from ._config import FP_FUSION, op_order

    BK = triton.next_power_of_2(K)
    if preload is None:
        preload = decode_preload(B) if T == 1 else window_preload(B)
    # what both kernels take; FP fusion off only when they fold flush rows (the bit-identical fold needs it)
    constants = dict(L=L, H=H, HV=HV, K=K, V=V, BK=BK, BC=FLUSH_CHUNK, FUSED_FLUSH=fused,
                     DOT_PRECISION=dot_precision, EXACT=op_order(), JOIN=join, DEFER=defer and not fused)  # fmt: skip
    options = dict(enable_fp_fusion=FP_FUSION if fused else True)
    state = _state(args)
    if T == 1:
        preload = preload and whole_ring_tile(L)
        bh = history_block(L) if preload else min(history or DECODE_HISTORY_BLOCK, history_block(L))
        bv = block_v or (PRELOAD_DECODE_BLOCK_V if preload else DECODE_BLOCK_V)
        bv = min(bv, max(16, triton.next_power_of_2(V)))
        first = DECODE_FIRST_CHUNK if first_chunk is None else first_chunk
        first = 0 if preload or first >= bh else first
        paired = PAIRED_STATE and paired_state(state, K) and not fused
        cap = launch_options(max_registers or decode_max_registers(state.device), **options)
        if (key_head_decode(B, L, state.dtype) if key_head is None else key_head) and not preload and not fused:
            launch_key_head_decode(
                args, L=L, H=H, HV=HV, K=K, V=V, B=B, block_v=block_v or KEY_HEAD_DECODE_BLOCK_V,
                num_warps=num_warps or KEY_HEAD_DECODE_WARPS, join=join, defer=defer, paired=paired, options=cap,
                k_chunk=KEY_HEAD_DECODE_K_CHUNK if k_chunk is None else k_chunk,
                fused_history=KEY_HEAD_DECODE_FUSED_HISTORY if fused_history is None else fused_history,
                stages=key_head_decode_stages(B) if stages is None else stages,
                prefetch=KEY_HEAD_DECODE_PREFETCH if prefetch is None else prefetch,
                min_history_block=KEY_HEAD_DECODE_MIN_HISTORY_BLOCK,
                tma_state=KEY_HEAD_DECODE_TMA,
                late_norms=key_head_decode_late_norms(state.dtype),
            )  # fmt: skip
            return
        kc = min(decode_k_chunk(B, state.dtype) if k_chunk is None else k_chunk, BK) if not fused else 0
        _decode_kernel[(triton.cdiv(V, bv), B, HV)](
            *args, **constants, BV=bv, BH=bh, PRELOAD=preload, FIRST_CHUNK=first, PAIRED_STATE=paired and not kc, KC=kc,
            num_warps=num_warps or (PRELOAD_DECODE_WARPS if preload else DECODE_WARPS), **cap,
        )  # fmt: skip
        return
    large = large_window(B, preload, fused, T=T, state_dtype=state.dtype)
    bv, warps = window_tile(T, large)
    bv = min(block_v or bv, max(16, triton.next_power_of_2(V)))
    warps = num_warps or warps
    nv = triton.cdiv(V, bv)
    keyed = window_key_products(T, B, large, state.dtype) if key_products is None else key_products
    keyed = keyed and not preload and not fused
    build = window_build(T, large, keyed, block_v, state)
    num_stages = build.stages if num_stages is None else num_stages
    block_k = build.block_k if block_k is None else block_k
    max_registers = build.max_registers if max_registers is None else max_registers
    raw = window_raw_key_dots(preload, _inputs(args).dtype) if raw_key_dots is None else raw_key_dots
    if history_gram_norms is None:
        history_gram_norms = build.history_gram_norms
    raw_code = (1 if history_gram_norms else 2) if raw else 0
    bkc = max(16, min(block_k, BK))
    products = None
    if keyed:
        products = torch.empty((B, H, key_products_size(L)), dtype=torch.float32, device=state.device)
        # the window's warps and column chunks: 1, 2 or 8 warps, or chunks of 64 or 128, were slower (H200 run 33e,
        # T = 4, B = 256: 213.0-246.2 against 212.3 us for both launches)
        _key_products_kernel[(B, H)](
            *args, products, T=T, L=L, H=H, K=K, BK=BK, BKC=bkc, BX=WINDOW_BLOCK, BH=history_block(L),
            DOT_PRECISION=dot_precision, NUM_STAGES=num_stages, RAW_KEY_DOTS=2 if raw else 0,  # no Gram matrix
            JOIN=join, DEFER=defer, num_warps=warps,
        )  # fmt: skip
    _window_kernel[(nv * HV, B)](
        *args,
        products,
        **constants,
        T=T,
        BKC=bkc,
        BV=bv,
        BX=WINDOW_BLOCK,
        BH=history_block(L),
        NV=nv,
        NUM_STAGES=num_stages,
        PRELOAD=preload,
        RAW_KEY_DOTS=raw_code,
        PRODUCTS=products is not None,
        QUERY_COLUMNS=window_query_columns(T, preload) if query_columns is None else query_columns,
        EARLY_GATES=(build.early_gates if early_gates is None else early_gates) and not preload,
        RAW_STATE_DOT=window_raw_state_dot(state.dtype, _inputs(args).dtype, products is not None),
        num_warps=warps,
        **launch_options(max_registers, **options),
    )


def replayssm_fwd(args: list[object], *, T: int, L: int, H: int, HV: int, K: int, V: int, B: int,
                  dot_precision: str, join: int = 0, fused: bool | None = None, concurrent: bool | None = None,
                  persistent: bool | None = None, deferred: bool | None = None,
                  flush_tile: dict[str, int] | None = None, leave_fold: bool = False) -> None:  # fmt: skip
    """One step from `ring_args(...)`: one launch, or the flush launch then the non-flush launch; arguments
    already validated. `fused` / `concurrent` / `persistent` / `deferred` default to the module switches
    (`persistent` only above `SMALL_BATCH` rows); `flush_tile` (`launch_flush`'s `block_v`, `num_warps`,
    `programs_per_sm`, `max_registers`) is for the benchmark's variants. `leave_fold` (`step_fold`): the
    non-flush launch does every row's step, as with a deferred fold, and `replayssm_fold` folds."""
    geo: dict[str, Any] = dict(T=T, L=L, H=H, HV=HV, K=K, V=V, B=B, dot_precision=dot_precision, join=join)
    if leave_fold:
        launch_window(args, **geo, defer=True)
        return
    if FUSED_FLUSH if fused is None else fused:
        launch_window(args, **geo, fused=True)
        return
    persistent = persistent_flush_default(_state(args).device, B) if persistent is None else persistent
    flush_geo: dict[str, Any] = {**geo, **(flush_tile or {}), "persistent": persistent}
    concurrent = CONCURRENT_FLUSH if concurrent is None else concurrent
    if deferred_fold(T, B) if deferred is None else deferred:
        launch_window(args, **geo, defer=True)  # first: it reads the checkpoints the folds rewrite
        if concurrent and _state(args).is_cuda:
            with deferred_fold_stream(_state(args).device):
                launch_flush(args, **flush_geo, defer=True)
        else:
            launch_flush(args, **flush_geo, defer=True)
        return
    if concurrent and _state(args).is_cuda:
        with SideStream(_state(args).device, FLUSH_STREAM_PRIORITY if T > 1 else 0) as streams:
            launch_flush(args, **flush_geo)  # on the side stream, next to the non-flush launch
        launch_window(args, **geo)
        streams.join()
        return
    launch_flush(args, **flush_geo)
    launch_window(args, **geo)


_SIDE_STREAMS: dict[tuple[torch.device, int, int], torch.cuda.Stream] = {}
# per device: the deferred-fold streams with work since the last join (by index), and the round robin's next
_PENDING_FOLDS: dict[torch.device, dict[int, torch.cuda.Stream]] = {}
_NEXT_FOLD_STREAM: dict[torch.device, int] = {}


def deferred_fold_stream(device: torch.device) -> SideStream:
    """The next of `DEFERRED_FOLD_STREAMS` side streams (after the current stream's work so far), pending until
    `join_deferred_folds`."""
    i = _NEXT_FOLD_STREAM.get(device, 0)
    _NEXT_FOLD_STREAM[device] = (i + 1) % DEFERRED_FOLD_STREAMS
    stream = SideStream(device, priority=0, index=1 + i)
    _PENDING_FOLDS.setdefault(device, {})[i] = stream.side
    return stream


def join_deferred_folds(device: torch.device) -> None:
    """Makes the current stream wait for the deferred folds forked on `device` since the last join. The commit,
    the reset and the plan call it before they touch the cursors those folds read; the checkpoints are valid
    after it. With nothing pending it does nothing (no stream operation)."""
    for side in _PENDING_FOLDS.pop(device, {}).values():
        torch.cuda.current_stream(device).wait_stream(side)


class SideStream:
    """`with SideStream(device) as s:` runs its body on a per-device side stream that first waits for the
    current stream; `s.join()` makes the current stream wait for the side stream (before anything reads what
    the body wrote, and before a CUDA-graph capture ends)."""

    def __init__(self, device: torch.device, priority: int = 0, index: int = 0) -> None:
        self.main = torch.cuda.current_stream(device)
        key = (device, priority, index)
        if key not in _SIDE_STREAMS:
            _SIDE_STREAMS[key] = torch.cuda.Stream(device, priority=priority)
        self.side = _SIDE_STREAMS[key]
        self.ctx = torch.cuda.stream(self.side)

    def __enter__(self) -> SideStream:
        self.side.wait_stream(self.main)
        self.ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ctx.__exit__(*exc)

    def join(self) -> None:
        self.main.wait_stream(self.side)
