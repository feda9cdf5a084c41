"""ReplaySSM vs the recurrent baseline at Qwen3.6 GDN shapes, every case timed under CUDA-graph replay.

    PYTHONPATH=kernels python -m gdn_replayssm.bench [--json] [--out PATH] [--quick [--sweep-ring]] [--shard K/N]
    PYTHONPATH=kernels python -m gdn_replayssm.bench --summarize SHARD.jsonl ... [--out PATH]

Method, per case (design, B, T, state dtype, acceptance pattern):
- Geometry H=16, HV=32, K=V=128, bf16 activations and u ring; state fp32 or bf16. Each layer has its own
  state pool (and rings); all layers share the cursors, as in vLLM. Enough layers (up to 30, the model's GDN
  count) that one step's footprint dwarfs L2, within a per-design memory budget.
- Correctness first: a few eager steps on sampled rows against the PyTorch reference, long enough to cross a
  flush. A case that fails prints nothing but a line on stderr, and the run exits non-zero.
- Ring: `default_ring_len(T, max_batch=B)` records (`--ring-len`), coalesced flushes with `default_flush_join`
  (`--coalesce-flushes FRACTION`, 0: off); every ReplaySSM step is planned (`replayssm_plan`) and committed.
  Step fold (cursors `step_fold=True`, `replayssm_fold` after the last layer; `--no-step-fold`: off) where
  `_replay.step_fold` says; elsewhere folds deferred where `_replay.deferred_fold` says (`--deferred-fold`:
  every step; `--no-deferred-fold`: none).
- Start: "lockstep" (every row enters the timed steps at the same ring position, as after a batch whose
  requests were all prefilled in one step: with all drafts accepted they flush in the same step, forever) or
  "staggered" (row i first runs i % S steps on its own, so the rows' ring positions spread over a flush
  cycle, as with requests that arrive at different times). The baseline has no ring: one start.
- One CUDA graph holds S steps (S >= ring_len: a full flush cycle and a ring wrap) of every layer plus one
  commit per step, with the acceptance counts of each step read from the device. The graph is replayed
  until about 0.3 s has passed; `us` = time / (replays * S * layers), i.e. per layer-step, amortized over
  flushes, commits and wraps at their real frequency.
- `GBps` = bytes the design must move (state, rings, inputs, outputs; from a host replay of the cursors
  over exactly the timed steps) / time. `copy_GBps` is a device-to-device copy measured in the same run.
- A SIGTERM (what `timeout` sends) ends the run after the case in progress: the summary is still written,
  and says how many cases were not run.
- A grid longer than one device call runs as shards (`--shard K/N`, each a call of its own): a baseline and
  every ReplaySSM case measured against it (starts, folds, swept ring lengths) stay in one shard, so each
  ratio comes from one run; `--summarize` merges the shards' JSON lines into one table.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import torch
import triton

from . import _config, _replay
from ._config import TileConfig, default_tile
from ._descriptors import descriptor_device
from .baseline import recurrent_step
from .bench_trace import format_summary, profile_kernels, trace_summary
from .commit import replayssm_commit, replayssm_plan
from .decode import replayssm_decode
from .fold import ReplayLayers, replayssm_fold
from .reference import (
    recurrent_ref,
    replayssm_commit_ref,
    replayssm_decode_ref,
    replayssm_plan_ref,
    replayssm_verify_ref,
)
from .ring import (
    SMALL_BATCH_RING_MAX_BATCH,
    Fold,
    ReplayCursors,
    ReplayRing,
    default_flush_join,
    default_ring_len,
    flush_due,
    flushing_rows,
)
from .verify import replayssm_verify

X_DTYPE = torch.bfloat16
MIXED_P = 0.7  # per-draft acceptance probability of the "mixed" pattern
MODEL_GDN_LAYERS = 30
MEM_BUDGET = 24 << 30  # bytes of state pools + rings per case
TIME_TARGET_S = 0.3
# the baseline is timed as vLLM runs it: float32 reductions in the compiler's order (not `exact_sums`), FP fusion on
BASELINE_EXACT_SUMS = False
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STARTS = ("lockstep", "staggered")
# cursors allocated `step_fold=True`, every layer registered, `replayssm_fold` after the last layer (as a model runner
# would with the measured `_replay.step_fold` batch sizes; `--no-step-fold`: False, every layer folds its own)
STEP_FOLD = True


def source_sha256() -> str:
    """sha256 over the package's `*.py` files sorted by relative path (path, NUL, bytes, NUL each); the
    same digest warden's identity reports, independent of git."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run_identity() -> dict[str, str]:
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "src_sha256": source_sha256()[:16],
    }


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, read + write bytes over the best of 10 timed copies."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * nbytes / best / 1e9


@dataclass(frozen=True)
class Geo:
    H: int = 16
    HV: int = 32
    K: int = 128
    V: int = 128

    @property
    def D(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V


QWEN36 = Geo()


@dataclass(frozen=True)
class Spec:
    design: str  # "replayssm" | "baseline"
    B: int
    T: int
    state: str  # "fp32" | "bf16"
    pattern: str  # "all" | "mixed"
    ring_len: int
    fold: Fold = "exact"
    sweep: str = "main"
    start: str = "lockstep"  # | "staggered" (module docstring)
    flush_join: int = 0  # `ReplayCursors.flush_join` (`--coalesce-flushes`)
    geo: Geo = QWEN36

    @property
    def acceptance(self) -> str:
        return "all" if self.pattern == "all" or self.T == 1 else f"mixed(p={MIXED_P})"


def accepted_counts(spec: Spec, steps: int, seed: int) -> torch.Tensor:
    """`[steps, B]` accepted tokens per step (bonus included): T for "all"; for "mixed" 1 + the number of
    leading drafts accepted, each with probability MIXED_P."""
    if spec.T == 1 or spec.pattern == "all":
        return torch.full((steps, spec.B), spec.T, dtype=torch.int32)
    g = torch.Generator().manual_seed(seed)
    ok = torch.rand(steps, spec.B, spec.T - 1, generator=g) < MIXED_P
    return 1 + ok.int().cumprod(dim=-1).sum(dim=-1).int()


class Bytes:
    """Bytes a design must move per row-step, from the cursor state (host model of the kernels' traffic)."""

    def __init__(self, spec: Spec) -> None:
        sb = DTYPES[spec.state].itemsize
        xb = X_DTYPE.itemsize
        H, HV, K, V, D = spec.geo.H, spec.geo.HV, spec.geo.K, spec.geo.V, spec.geo.D
        self.spec = spec
        self.state = HV * V * K * sb
        self.io = spec.T * (D + 2 * HV) * xb + spec.T * HV * V * xb
        exact = spec.fold == "exact"
        self.record = HV * V * xb + H * K * xb + HV * 4 + (HV * V * xb + HV * 4 if exact else 0)  # written
        self.replay_read = HV * V * xb + H * K * xb + HV * 4  # u, k, g per history record
        self.fold_read = (HV * V * xb + H * K * xb + HV * 8) if exact else self.replay_read

    def step(self, wp: int, flush: bool | None = None) -> tuple[int, bool]:
        """(bytes, flushed) of a row with history `wp`; `flush` is the step's decision for the row
        (`flushing_rows`), by default the row's own rule."""
        s = self.spec
        if s.design == "baseline":
            return self.io + self.state * (1 + s.T), False
        flush = flush_due(write_pos=wp, num_tokens=s.T, ring_len=s.ring_len) if flush is None else flush
        if not flush:
            return self.io + self.state + wp * self.replay_read + s.T * self.record, False
        records = 0 if s.T == 1 else s.T * self.record
        return self.io + 2 * self.state + wp * self.fold_read + records, True


def layers_in_budget(spec: Spec, max_layers: int) -> tuple[int, int]:
    """(layers, state slots per layer): as many layers, up to `max_layers`, as fit in `MEM_BUDGET` with their
    state pools (one slot per row for ReplaySSM, one per token for the baseline, plus the null slot 0) and
    ReplaySSM's bf16 rings."""
    g, B, T, L = spec.geo, spec.B, spec.T, spec.ring_len
    replay = spec.design == "replayssm"
    slots = (B + 1) if replay else (B * T + 1)
    ring_bytes = B * (2 * g.HV * L * g.V * 2 + g.H * L * g.K * 2 + 2 * g.HV * L * 4) if replay else 0
    layer_bytes = slots * g.HV * g.V * g.K * DTYPES[spec.state].itemsize + ring_bytes
    return max(1, min(max_layers, MEM_BUDGET // layer_bytes)), slots


def step_inputs(B: int, T: int, geo: Geo, device: str) -> tuple[torch.Tensor, ...]:
    """`A_log`, `dt_bias` and one step's `mixed_qkv`, `a`, `b` (bf16) for `B` rows of `T` tokens; the caller
    seeds the generator."""
    A_log = torch.empty(geo.HV, device=device).uniform_(math.log(0.05), math.log(0.5))
    dt_bias = torch.randn(geo.HV, device=device) * 0.3 - 1.0
    x = torch.randn(B * T, geo.D, device=device).to(X_DTYPE)
    a = torch.randn(B * T, geo.HV, device=device).to(X_DTYPE)
    b = torch.randn(B * T, geo.HV, device=device).to(X_DTYPE)
    return A_log, dt_bias, x, a, b


def _sample_rows(B: int) -> list[int]:
    return sorted({0, B // 3, (2 * B) // 3, B - 1})


def _check_replay(*, spec, layer, cursors, idx, x, a, b, A_log, dt_bias, counts, config) -> float:
    """Eager steps on the full batch against the reference on sampled rows; returns the worst error."""
    dev, HV, V = x.device, spec.geo.HV, spec.geo.V
    sub = torch.tensor(_sample_rows(spec.B), device=dev)
    T = spec.T
    tok = (sub[:, None] * T + torch.arange(T, device=dev)[None, :]).reshape(-1)
    ref_state, ref_ring, ref_cursors = layer["state"].clone(), layer["ring"].clone(), cursors.clone()
    step, ref_step = (replayssm_decode, replayssm_decode_ref) if T == 1 else (replayssm_verify, replayssm_verify_ref)
    out = torch.empty(spec.B * T, HV, V, dtype=X_DTYPE, device=dev)
    ref_out = torch.empty(len(sub) * T, HV, V, dtype=X_DTYPE, device=dev)
    one_layer = ReplayLayers.register(states=[layer["state"]], rings=[layer["ring"]]) if cursors.step_fold else None
    worst = 0.0
    for s in range(spec.ring_len + 2):
        n = counts[s % counts.shape[0]]
        # the plan depends on every row: the reference plans the whole batch on the kernels' cursors (those
        # of the sampled rows are checked against its own) and must agree with the plan kernel
        whole = cursors.clone()
        replayssm_plan_ref(cursors=whole, state_indices=idx, num_tokens=T)
        replayssm_plan(cursors=cursors, state_indices=idx, num_tokens=T)
        if int(cursors.write_pos[0]) != int(whole.write_pos[0]):
            return math.inf
        ref_cursors.write_pos[0] = whole.write_pos[0]
        step(mixed_qkv=x, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=layer["state"], ring=layer["ring"],
             cursors=cursors, state_indices=idx, out=out, config=config)  # fmt: skip
        if one_layer is not None:
            replayssm_fold(layers=one_layer, cursors=cursors, state_indices=idx, num_tokens=T, config=config)
        ref_step(mixed_qkv=x[tok], a=a[tok], b=b[tok], A_log=A_log, dt_bias=dt_bias, state=ref_state, ring=ref_ring,
                 cursors=ref_cursors, state_indices=idx[sub], out=ref_out)  # fmt: skip
        worst = max(worst, _rel(ref_out, out[tok]))
        na = None if T == 1 else n
        replayssm_commit(cursors=cursors, state_indices=idx, num_accepted=na, num_tokens=T)
        replayssm_commit_ref(
            cursors=ref_cursors, state_indices=idx[sub], num_accepted=None if T == 1 else n[sub], num_tokens=T
        )
    slots = idx[sub].long()
    worst_state = _rel(ref_state[slots], layer["state"][slots])
    if not torch.equal(ref_cursors.write_pos[slots], cursors.write_pos[slots]):
        return math.inf
    return max(worst, worst_state)


def _check_baseline(*, spec, layer, cols, x, a, b, A_log, dt_bias, counts, config) -> float:
    dev, HV, V = x.device, spec.geo.HV, spec.geo.V
    sub = torch.tensor(_sample_rows(spec.B), device=dev)
    T = spec.T
    tok = (sub[:, None] * T + torch.arange(T, device=dev)[None, :]).reshape(-1)
    ref_state = layer["state"].clone()
    out = torch.empty(spec.B * T, HV, V, dtype=X_DTYPE, device=dev)
    ref_out = torch.empty(len(sub) * T, HV, V, dtype=X_DTYPE, device=dev)
    worst = 0.0
    for s in range(2):
        n = counts[s] if T > 1 else None
        recurrent_step(mixed_qkv=x, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=layer["state"], state_indices=cols,
                       num_accepted=n, out=out, config=config, exact_sums=BASELINE_EXACT_SUMS)  # fmt: skip
        recurrent_ref(mixed_qkv=x[tok], a=a[tok], b=b[tok], A_log=A_log, dt_bias=dt_bias, state=ref_state,
                      state_indices=cols[sub], num_accepted=None if n is None else n[sub], out=ref_out)  # fmt: skip
        worst = max(worst, _rel(ref_out, out[tok]))
    written = cols[sub].reshape(-1).long()
    return max(worst, _rel(ref_state[written], layer["state"][written]))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _rel(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref64, got64 = ref.double(), got.double()
    if not torch.isfinite(got64).all():
        return math.inf
    return ((ref64 - got64).pow(2).mean().sqrt() / ref64.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def run_case(  # noqa: PLR0912, PLR0915 (one linear recipe: set up, check, capture, time, count)
    spec: Spec,
    config: TileConfig,
    copy_gbps: float,
    identity: dict[str, str],
    *,
    device: str = "cuda",
    max_layers: int = MODEL_GDN_LAYERS,
    steps: int | None = None,
    trace: bool = False,
) -> dict[str, Any] | None:
    """Checks and times one case; None when the correctness check failed. Off CUDA (the interpreter, for
    tests) the steps run eagerly and are timed with the host clock. `trace` (CUDA only): one more replay
    under the profiler, summarised in the row's `trace` (`bench_trace`)."""
    torch.manual_seed(0)
    B, T, L = spec.B, spec.T, spec.ring_len
    H, HV, K, V = spec.geo.H, spec.geo.HV, spec.geo.K, spec.geo.V
    cuda = device == "cuda"
    sdt = DTYPES[spec.state]
    replay = spec.design == "replayssm"
    layers, slots_per_layer = layers_in_budget(spec, max_layers)
    steps = steps or max(L, 8)

    A_log, dt_bias, x, a, b = step_inputs(B, T, spec.geo, device)
    counts_host = accepted_counts(spec, steps, seed=B * 100 + T)
    counts = counts_host.to(device)
    out = torch.empty(B * T, HV, V, dtype=X_DTYPE, device=device)
    idx = torch.arange(1, B + 1, dtype=torch.int32, device=device)
    cols = (1 + torch.arange(B * T, dtype=torch.int32, device=device)).view(B, T)
    cursors = ReplayCursors.allocate(
        num_slots=B + 1, ring_len=L, flush_join=spec.flush_join, step_fold=STEP_FOLD and replay, device=device
    )
    layer_list = []
    for _ in range(layers):
        layer: dict[str, Any] = {
            "state": torch.empty(slots_per_layer, HV, V, K, dtype=sdt, device=device).normal_(0, 0.3)
        }
        if replay:
            layer["ring"] = ReplayRing.allocate(
                num_slots=B + 1, num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, ring_len=L,
                dtype=X_DTYPE, fold=spec.fold, device=device,
            )  # fmt: skip
        layer_list.append(layer)
    registered = None
    if cursors.step_fold:
        registered = ReplayLayers.register(
            states=[ly["state"] for ly in layer_list], rings=[ly["ring"] for ly in layer_list]
        )

    inputs = dict(spec=spec, layer=layer_list[0], x=x, a=a, b=b, A_log=A_log, dt_bias=dt_bias, counts=counts)
    if replay:
        check = _check_replay(**inputs, cursors=cursors, idx=idx, config=config)
    else:
        check = _check_baseline(**inputs, cols=cols, config=config)
    tol = 2e-2
    if not check <= tol:
        print(f"# FAILED correctness {spec}: relative error {check:.3e} > {tol:.0e}; no result", file=sys.stderr)
        return None

    def one_step(s: int, rows: torch.Tensor) -> None:
        if replay:  # the step's plan for coalesced flushes (nothing without them)
            replayssm_plan(cursors=cursors, state_indices=rows, num_tokens=T)
        for layer in layer_list:
            if replay:
                fn = replayssm_decode if T == 1 else replayssm_verify
                fn(mixed_qkv=x, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=layer["state"], ring=layer["ring"],
                   cursors=cursors, state_indices=rows, out=out, config=config)  # fmt: skip
            else:
                recurrent_step(mixed_qkv=x, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=layer["state"],
                               state_indices=cols, num_accepted=counts[s] if T > 1 else None, out=out,
                               config=config, exact_sums=BASELINE_EXACT_SUMS)  # fmt: skip
        if registered is not None:
            replayssm_fold(layers=registered, cursors=cursors, state_indices=rows, num_tokens=T, config=config)
        if replay:
            replayssm_commit(
                cursors=cursors, state_indices=rows, num_accepted=counts[s] if T > 1 else None, num_tokens=T
            )

    def one_graph_body() -> None:
        for s in range(steps):
            one_step(s, idx)

    if replay and spec.start == "staggered":  # row i runs i % steps steps alone (padding rows sit them out)
        lead = torch.arange(B, device=device) % steps
        for s in range(steps):
            one_step(s, torch.where(lead > s, idx, torch.full_like(idx, -1)))
    one_graph_body()  # every layer compiled and warm before the capture
    wp_host = cursors.write_pos[1:].tolist()
    if cuda:
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            one_graph_body()
        run = graph.replay
    else:
        run = one_graph_body
    run()  # warm-up replay
    _sync(device)
    t0 = time.perf_counter()
    run()
    _sync(device)
    replays = max(2, min(50, math.ceil(TIME_TARGET_S / max(time.perf_counter() - t0, 1e-6)))) if cuda else 1
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            run()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        timeline = trace_summary(profile_kernels(run, torch.cuda.synchronize), steps * layers) if trace else None
    else:
        t0 = time.perf_counter()
        run()
        seconds = time.perf_counter() - t0
        timeline = None
    del run

    # bytes over exactly the timed steps: replay the cursors on the host from the capture point
    model = Bytes(spec)
    total, flushes, row_steps, peak = 0, 0, 0, 0
    wp = list(wp_host)
    base = [0] * B
    for rep in range(2 + replays):
        for s in range(steps):
            n = counts_host[s].tolist()
            flushing = 0
            decided = flushing_rows(write_pos=wp, num_tokens=T, ring_len=L, flush_join=spec.flush_join)
            for i in range(B):
                nbytes, flushed = model.step(wp[i], decided[i])
                flushing += flushed
                if rep >= 2:
                    total += nbytes
                    flushes += flushed
                    row_steps += 1
                if replay:
                    if flushed:
                        wp[i], base[i] = (0, base[i]) if T == 1 else (n[i], (base[i] + wp[i]) % L)
                    else:
                        wp[i] += n[i] if T > 1 else 1
            if rep >= 2:
                peak = max(peak, flushing)
    if replay:
        total += row_steps * 12  # commit: read wp/base and n, write wp/base, once per row-step (all layers)
    us = seconds / (replays * steps * layers) * 1e6
    bytes_per_step = total / (row_steps / B) if row_steps else 0
    gbps = bytes_per_step / (us * 1e-6) / 1e9
    layer_list.clear()
    if cuda:
        torch.cuda.empty_cache()
    on = torch.device(device)
    decode_cap = _replay.decode_max_registers(on)
    key_head = _replay.key_head_decode(B, L, DTYPES[spec.state]) if replay and T == 1 else None
    stages = _replay.key_head_decode_stages(B)
    key_head_tma = _replay.KEY_HEAD_DECODE_TMA and stages > 0 and descriptor_device(on)
    deferred = _replay.deferred_fold(T, B)
    listed = _replay.listed_fold(T, deferred)
    fold_cap = _replay.persistent_max_registers(T, deferred, on, listed)
    query_columns = _replay.window_query_columns(T, _replay.window_preload(B))
    keyed = _window_key_products(spec.B, T, DTYPES[spec.state]) if replay and T > 1 else False
    window = _window_build(B, T, DTYPES[spec.state], on) if replay and T > 1 else None
    return {
        "design": spec.design,
        "fold": spec.fold if replay else None,
        "B": B,
        "T": T,
        "state_dtype": spec.state,
        "acceptance": spec.acceptance,
        "mean_accepted": round(float(counts_host.float().mean()), 3),
        "ring_len": L if replay else None,
        "us": round(us, 2),
        "GBps": round(gbps, 1),
        "copy_GBps": round(copy_gbps, 1),
        "frac_copy": round(gbps / copy_gbps, 3),
        "bytes_per_step": int(bytes_per_step),
        "flush_frac": round(flushes / max(row_steps, 1), 3) if replay else None,
        "peak_flush_frac": round(peak / B, 3) if replay else None,  # most rows flushing in one step
        "layers": layers,
        "steps_per_graph": steps,
        "replays": replays,
        "check_rel_err": float(f"{check:.3e}"),
        "sweep": spec.sweep,
        "start": spec.start if replay else None,
        "flush_join": spec.flush_join if replay else None,
        "block_v": None if replay else config.block_v,  # the ReplaySSM kernels keep their own tiles
        "num_warps": None if replay else config.num_warps,
        "exact_sums": None if replay else BASELINE_EXACT_SUMS,
        "dot_precision": config.dot_precision if replay else None,
        "fused_flush": _replay.FUSED_FLUSH if replay else None,
        "deferred_fold": _replay.deferred_fold(T, B) and not _replay.FUSED_FLUSH if replay else None,
        "step_fold": _replay.step_fold(cursors.step_fold, T, B) if replay else None,
        "concurrent_flush": _replay.CONCURRENT_FLUSH if replay else None,
        "persistent_flush": _replay.PERSISTENT_FLUSH if replay else None,
        "persistent_max_registers": fold_cap if replay else None,
        "persistent_rows_per_sm": _replay.PERSISTENT_ROWS_PER_SM if replay else None,
        "listed_folds": listed if replay else None,
        "flush_stream_priority": _replay.FLUSH_STREAM_PRIORITY if replay and T > 1 else None,  # verify only
        "flush_block_v": _fold_block_v(cursors, T, B) if replay else None,
        "decode_history_block": _replay.DECODE_HISTORY_BLOCK if replay and T == 1 else None,  # decode kernel only
        "decode_first_chunk": _replay.DECODE_FIRST_CHUNK if replay and T == 1 else None,
        "decode_preload": _replay.decode_preload(B) if replay and T == 1 else None,
        "decode_key_head": key_head,
        "decode_key_head_stages": stages if key_head else None,
        "decode_key_head_prefetch": _replay.KEY_HEAD_DECODE_PREFETCH and stages > 0 if key_head else None,
        "decode_key_head_tma": key_head_tma if key_head else None,
        "decode_key_head_late_norms": _replay.key_head_decode_late_norms(DTYPES[spec.state]) if key_head else None,
        "decode_max_registers": decode_cap if replay and T == 1 else None,
        "flush_normalised_keys": _replay.FLUSH_NORMALISED_KEYS if replay else None,
        "flush_normalised_window": _replay.FLUSH_NORMALISED_WINDOW if replay else None,
        "window_raw_key_dots": _replay.WINDOW_RAW_KEY_DOTS if replay and T > 1 else None,  # window kernel only
        "window_history_gram_norms": window.history_gram_norms if window else None,
        "window_stages": window.stages if window else None,
        "window_max_registers": window.max_registers if window else None,
        "window_key_products": keyed if replay and T > 1 else None,
        "window_tile": _window_tile_name(spec.B, T, DTYPES[spec.state]) if replay and T > 1 else None,
        "window_query_columns": query_columns if replay and T > 1 else None,
        "window_early_gates": window.early_gates and not _replay.window_preload(B) if window else None,
        "window_raw_state_dot": _replay.window_raw_state_dot(DTYPES[spec.state], X_DTYPE, keyed) if window else None,
        "fold_sums": _config.op_order_name() if replay else None,
        **({"trace": timeline} if timeline is not None else {}),
        **identity,
    }


def _fold_block_v(cursors: ReplayCursors, T: int, B: int) -> int:
    """V rows per fold program in a case's steps: the step fold's, or the per-layer flush launch's."""
    return _replay.STEP_FOLD_BLOCK_V if _replay.step_fold(cursors.step_fold, T, B) else _replay.flush_block_v(B)


def _large_window(B: int, T: int, state_dtype: torch.dtype) -> bool:
    """Whether a step's non-flush window programs take the large tiles (`_replay.large_window`)."""
    preload = _replay.window_preload(B)
    return _replay.large_window(B, preload, fused=_replay.FUSED_FLUSH, T=T, state_dtype=state_dtype)


def _window_key_products(B: int, T: int, state_dtype: torch.dtype) -> bool:
    """Whether a step's non-flush window programs take the key products' pre-pass (`_replay.window_key_products`)."""
    return _replay.window_key_products(T, B, _large_window(B, T, state_dtype), state_dtype)


def _window_build(B: int, T: int, state_dtype: torch.dtype, device: torch.device) -> _replay.WindowBuild:
    """The build of a step's non-flush window programs (`_replay.window_build`): its stages, K chunk, history norms,
    register cap and early gates, as the launch takes them (a preloading launch never takes the early gates)."""
    state = torch.empty(0, dtype=state_dtype, device=device)  # the build reads only its dtype and device
    large = _large_window(B, T, state_dtype)
    return _replay.window_build(T, large, _replay.window_key_products(T, B, large, state_dtype), None, state)


def _window_tile_name(B: int, T: int, state_dtype: torch.dtype) -> str:
    """The non-flush window programs' `VxWARPS` tile of a step (`_replay.window_tile`)."""
    block_v, warps = _replay.window_tile(T, _large_window(B, T, state_dtype))
    return f"{block_v}x{warps}"


SWEEP_RING_LENS = (16, 32, 64, 128)


def ring_len_for(args: argparse.Namespace, T: int, B: int) -> int:
    """`--ring-len` when given (at least 2T), else the measured default for windows of T tokens in a pool that
    runs B rows a step."""
    return default_ring_len(T, max_batch=B) if args.ring_len is None else max(args.ring_len, 2 * T)


SWEEP_BATCH_SIZES = (1, 64, 256)


def sweep_batch_sizes(batch_sizes: list[int]) -> list[int]:
    """The ring sweep's batch sizes: those of `SWEEP_BATCH_SIZES` the grid runs, else the grid's own. Every
    swept cell then has its main row too, so each length is compared with the default in the same cells."""
    return [B for B in batch_sizes if B in SWEEP_BATCH_SIZES] or list(batch_sizes)


def flush_join_for(args: argparse.Namespace, ring_len: int) -> int:
    """`ReplayCursors.flush_join` of a case: `--coalesce-flushes`' fraction of the ring (at least one record;
    0: off), else the measured default, `default_flush_join`."""
    if args.coalesce_flushes is None:
        return default_flush_join(ring_len)
    return max(1, int(ring_len * args.coalesce_flushes)) if args.coalesce_flushes else 0


def plan(args: argparse.Namespace) -> list[Spec]:
    specs: list[Spec] = []
    for state in args.state_dtypes:
        for T in args.tokens:
            for pattern in ["all"] if T == 1 else ["all", "mixed"]:
                for B in args.batch_sizes:
                    L = ring_len_for(args, T, B)
                    join = flush_join_for(args, L)
                    specs.append(Spec("baseline", B, T, state, pattern, L))
                    specs.extend(
                        Spec("replayssm", B, T, state, pattern, L, fold, start=start, flush_join=join)
                        for start in args.starts
                        for fold in args.folds
                    )
    if args.sweep_ring:
        start = "staggered" if "staggered" in args.starts else "lockstep"
        for T in args.tokens:
            for B in sweep_batch_sizes(args.batch_sizes):
                for L in SWEEP_RING_LENS:
                    if ring_len_for(args, T, B) != L and L >= 2 * T:
                        join = flush_join_for(args, L)
                        specs.extend(
                            Spec("replayssm", B, T, "fp32", p, L, sweep="ring_len", start=start, flush_join=join)
                            for p in (["all"] if T == 1 else ["all", "mixed"])
                        )
    return specs


def _group(spec: Spec) -> tuple[str, int, str, int]:
    """The cases one shard keeps together: a baseline and every ReplaySSM case compared with it."""
    return spec.state, spec.T, spec.pattern, spec.B


def shard(specs: list[Spec], k: int, n: int) -> list[Spec]:
    """The K-th of N shards of a plan: every N-th group (`_group`) in the plan's order, from the K-th."""
    groups = list(dict.fromkeys(_group(s) for s in specs))
    mine = set(groups[k::n])
    return [s for s in specs if _group(s) in mine]


def read_runs(paths: list[Path]) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Each `--json` / `--out` file's case rows (one list per file, in order) and every file's identity headers
    (other lines are skipped)."""
    runs, identities = [], []
    for path in paths:
        rows = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("kind") == "identity":
                identities.append(record)
            elif isinstance(record, dict) and "design" in record:
                rows.append(record)
        runs.append(rows)
    return runs, identities


def _start(row: dict[str, Any]) -> str:
    """A ReplaySSM row's start; rows written before `--starts` existed ran in lockstep."""
    return row.get("start") or "lockstep"


def ring_len_suggestions(rows: list[dict[str, Any]]) -> list[str]:
    """Per T and batch class (`B <= SMALL_BATCH_RING_MAX_BATCH` or above, where `default_ring_len` may differ)
    with more than one ring length timed (fp32, exact fold; the sweep and the main rows together): the geo-mean
    of us / the cell's best us over the (B, acceptance, start) cells that timed every length, and the best
    length. Cells missing a length are left out (and counted), never the length: run 18's sweep at B = 1 had no
    main row, and scoring lengths by the cells they have would have hidden the best one."""
    sweep = [r for r in rows if r["design"] == "replayssm" and r["state_dtype"] == "fp32" and r["fold"] == "exact"]
    lines = []
    for T, small in sorted(
        {(r["T"], r["B"] <= SMALL_BATCH_RING_MAX_BATCH) for r in sweep}, key=lambda k: (k[0], not k[1])
    ):
        cells: dict[tuple[int, str, str], dict[int, float]] = {}  # (B, acceptance, start) -> {ring_len: us}
        for r in sweep:
            if r["T"] == T and (r["B"] <= SMALL_BATCH_RING_MAX_BATCH) == small:
                cells.setdefault((r["B"], r["acceptance"], _start(r)), {})[r["ring_len"]] = r["us"]
        where = f"T={T}, B {'<=' if small else '>'} {SMALL_BATCH_RING_MAX_BATCH}"
        lengths = {length for options in cells.values() for length in options}
        if len(lengths) < 2:
            continue
        complete = [options for options in cells.values() if set(options) == lengths]
        if not complete:
            lines.append(f"# ring length, {where}: no cell has every length ({sorted(lengths)}); no suggestion")
            continue
        scores = {
            length: math.exp(sum(math.log(c[length] / min(c.values())) for c in complete) / len(complete))
            for length in sorted(lengths)
        }
        choice = min(scores, key=scores.__getitem__)
        listing = ", ".join(f"L={k}: {v:.3f}" for k, v in scores.items())
        skipped = f", {len(cells) - len(complete)} cells without every length left out" * (len(complete) < len(cells))
        default = default_ring_len(T, max_batch=min(B for B, _, _ in cells))
        lines.append(
            f"# ring length, {where} (geo-mean of us / best us over {len(complete)} cells{skipped}): {listing}"
        )
        lines.append(f"#   suggested ring length for {where}: {choice} (default_ring_len: {default})")
    return lines


def rows_at_defaults(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several runs (oldest first) as one table at today's ring lengths (`--at-defaults`): per cell
    (state, acceptance, T, B), the last run that timed ReplaySSM (exact fold) at `default_ring_len(T, B)`, main
    or sweep row, gives the cell's rows at that length (as main rows) and its baseline, so every ratio still
    comes from one run; every other ReplaySSM row stays as a sweep row (for the ring choice). Cells no run timed
    at the default length keep their rows as they were."""

    def at_default(r: dict[str, Any]) -> bool:
        return r["design"] == "replayssm" and r["fold"] == "exact" and r["ring_len"] == default_ring_len(r["T"], r["B"])

    picked: dict[tuple[str, str, int, int], int] = {}
    for i, rows in enumerate(runs):
        for r in rows:
            if at_default(r):
                picked[(r["state_dtype"], r["acceptance"], r["T"], r["B"])] = i
    merged = []
    for i, rows in enumerate(runs):
        for r in rows:
            cell = (r["state_dtype"], r["acceptance"], r["T"], r["B"])
            if cell not in picked:
                merged.append(r)
            elif r["design"] == "baseline":
                if picked[cell] == i:
                    merged.append(r)
            else:
                merged.append({**r, "sweep": "main" if picked[cell] == i and at_default(r) else "ring_len"})
    return merged


def _table_order(row: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """The plan's order (state, T, all before mixed, B, start), also for rows merged from shards."""
    state = list(DTYPES).index(row["state_dtype"]) if row["state_dtype"] in DTYPES else len(DTYPES)
    return state, row["T"], row["acceptance"] != "all", row["B"], STARTS.index(_start(row))


def _deferred(row: dict[str, Any]) -> str:
    """The summary's `defer` cell: whether the case's steps deferred their fold ("step": to `replayssm_fold`);
    `-` for rows that predate it."""
    value = row.get("deferred_fold")
    if row.get("step_fold"):
        return "step"
    return "-" if value is None else "yes" if value else "no"


def summarize(rows: list[dict[str, Any]]) -> str:
    lines = ["", "# ReplaySSM / baseline, per layer-step (us), ratio = baseline us / replayssm us"]

    def ident(key: str) -> str:  # several values when the rows come from several runs (`--summarize`)
        return ",".join(dict.fromkeys(str(r.get(key)) for r in rows)) if rows else "None"

    lines.append(f"# gpu={ident('gpu')} torch={ident('torch')} triton={ident('triton')} "
                 f"src={ident('src_sha256')} copy_GBps={ident('copy_GBps')}")  # fmt: skip
    lines.append(f"{'state':>5} {'accept':>12} {'start':>9} {'T':>2} {'B':>4} {'base_us':>9} {'rssm_us':>9} "
                 f"{'ratio':>6} {'rssm_GBps':>9} {'%copy':>6} {'flush%':>6} {'join':>4} {'defer':>5}")  # fmt: skip
    main = [r for r in rows if r["sweep"] == "main"]
    base = {(r["state_dtype"], r["acceptance"], r["T"], r["B"]): r for r in main if r["design"] == "baseline"}
    ratios: dict[tuple, float] = {}  # (state, acceptance, T, B, start)
    for r in sorted(main, key=_table_order):
        if r["design"] != "replayssm" or r["fold"] != "exact":
            continue
        key = (r["state_dtype"], r["acceptance"], r["T"], r["B"])
        b = base.get(key)
        ratio = b["us"] / r["us"] if b else float("nan")
        start = _start(r)
        ratios[(*key, start)] = ratio
        lines.append(
            f"{key[0]:>5} {key[1]:>12} {start:>9} {key[2]:>2} {key[3]:>4} {b['us'] if b else float('nan'):>9.1f} "
            f"{r['us']:>9.1f} {ratio:>6.2f} {r['GBps']:>9.0f} {100 * r['frac_copy']:>6.1f} "
            f"{100 * (r['flush_frac'] or 0):>6.1f} {r.get('flush_join') or 0:>4} {_deferred(r):>5}"
        )
    lines.append("# targets (fp32 state, exact fold), per start:")
    starts = sorted({k[4] for k in ratios})
    for label, want, goal in [
        ("verify T=4 ratio >= 3 at B >= 64", lambda k: k[2] == 4 and k[3] >= 64, 3.0),
        ("verify T=4 ratio >= 2 at B = 1", lambda k: k[2] == 4 and k[3] == 1, 2.0),
        ("decode ratio >= 1.6 at B >= 128", lambda k: k[2] == 1 and k[3] >= 128, 1.6),
        ("decode ratio >= 1.0 at B = 1", lambda k: k[2] == 1 and k[3] == 1, 1.0),
    ]:
        for start in starts:
            got = [v for k, v in ratios.items() if k[0] == "fp32" and k[4] == start and want(k)]
            verdict = "n/a" if not got else ("MET" if min(got) >= goal else "MISSED")
            lines.append(f"#   {label}, {start}: {verdict}" + (f" (min {min(got):.2f})" if got else ""))
    for start in starts:
        fracs = [r["frac_copy"] for r in main if r["design"] == "replayssm" and r["B"] >= 64
                 and r["state_dtype"] == "fp32" and _start(r) == start]  # fmt: skip
        if fracs:
            verdict = "MET" if min(fracs) >= 0.8 else "MISSED"
            lines.append(f"#   >= 80% of copy bandwidth at B >= 64, {start}: {verdict} (min {100 * min(fracs):.0f}%)")
    lines.extend(ring_len_suggestions(rows))
    return "\n".join(lines)


def parse_tile(text: str | None, default: TileConfig) -> TileConfig:
    if text is None:
        return default
    bv, nw = (int(p) for p in text.lower().split("x"))
    return TileConfig(block_v=bv, num_warps=nw, num_stages=default.num_stages, dot_precision=default.dot_precision)


def _state_dtypes(text: str) -> list[str]:
    names = text.split(",")
    if bad := [n for n in names if n not in DTYPES]:
        raise argparse.ArgumentTypeError(f"unknown state dtype {', '.join(bad)}: use fp32 and/or bf16")
    return names


def _starts(text: str) -> list[str]:
    names = text.split(",")
    if bad := [n for n in names if n not in STARTS]:
        raise argparse.ArgumentTypeError(f"unknown start {', '.join(bad)}: use lockstep and/or staggered")
    return names


def _folds(text: str) -> list[Fold]:
    folds = text.split(",")
    if bad := [f for f in folds if f not in get_args(Fold)]:
        raise argparse.ArgumentTypeError(f"unknown fold {', '.join(bad)}: use exact and/or open_loop")
    return [cast(Fold, f) for f in folds]


def _int_list(lo: int, hi: int) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
        if bad := [v for v in values if not lo <= v <= hi]:
            raise argparse.ArgumentTypeError(f"{bad} outside {lo}..{hi}")
        return values

    return parse


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    """One integer in lo..hi (argparse type)."""
    many = _int_list(lo, hi)

    def parse(text: str) -> int:
        values = many(text)
        if len(values) != 1:
            raise argparse.ArgumentTypeError(f"{text!r}: one integer, not a list")
        return values[0]

    return parse


# command-line flags that set a `_replay` module switch: (argument, switch, value when the flag is given)
FLAG_SWITCHES = [
    ("fused_flush", "FUSED_FLUSH", True),
    ("deferred_fold", "DEFERRED_FOLD", "always"),
    ("no_deferred_fold", "DEFERRED_FOLD", "never"),
    ("no_concurrent_flush", "CONCURRENT_FLUSH", False),
    ("no_persistent_flush", "PERSISTENT_FLUSH", False),
    ("no_window_raw_key_dots", "WINDOW_RAW_KEY_DOTS", False),
    ("no_flush_normalised_keys", "FLUSH_NORMALISED_KEYS", False),
    ("no_flush_normalised_window", "FLUSH_NORMALISED_WINDOW", False),
    ("no_window_history_gram_norms", "WINDOW_HISTORY_GRAM_NORMS", False),
    ("no_window_key_products", "WINDOW_KEY_PRODUCTS", False),
    ("wide_window_key_products", "WIDE_WINDOW_KEY_PRODUCTS", True),
    ("no_wide_window_key_products", "WIDE_WINDOW_KEY_PRODUCTS", False),
    ("no_wide_window_in_kernel_bf16_state", "WIDE_WINDOW_IN_KERNEL_STATES", (torch.float32,)),
    ("no_window_in_kernel_bf16_state", "WINDOW_IN_KERNEL_STATES", (torch.float32,)),
    ("no_wide_window", "WIDE_WINDOW_TOKENS", ()),
    ("window_query_columns", "WINDOW_QUERY_COLUMNS", "always"),
    ("no_window_query_columns", "WINDOW_QUERY_COLUMNS", "never"),
    ("window_early_gates", "WINDOW_EARLY_GATES", "always"),
    ("no_window_early_gates", "WINDOW_EARLY_GATES", "never"),
    ("no_paired_state", "PAIRED_STATE", False),
    ("key_head_decode_fused_history", "KEY_HEAD_DECODE_FUSED_HISTORY", True),
    ("key_head_decode_prefetch", "KEY_HEAD_DECODE_PREFETCH", True),
    ("no_key_head_decode_prefetch", "KEY_HEAD_DECODE_PREFETCH", False),
    ("key_head_decode_tma", "KEY_HEAD_DECODE_TMA", True),
    ("no_key_head_decode_tma", "KEY_HEAD_DECODE_TMA", False),
    ("key_head_decode_late_norms", "KEY_HEAD_DECODE_LATE_NORMS", "always"),
    ("no_key_head_decode_late_norms", "KEY_HEAD_DECODE_LATE_NORMS", "never"),
    ("no_window_raw_state_dot", "WINDOW_RAW_STATE_DOT", False),
    ("listed_folds", "LISTED_FOLDS", "always"),
    ("no_listed_folds", "LISTED_FOLDS", "never"),
]
# options whose value becomes a `_replay` module switch when given: (argument, switch)
VALUE_SWITCHES = [
    ("persistent_max_registers", "PERSISTENT_MAX_REGISTERS"),
    ("decode_fold_max_registers", "DECODE_FOLD_MAX_REGISTERS"),
    ("listed_fold_max_registers", "LISTED_FOLD_MAX_REGISTERS"),
    ("decode_max_registers", "DECODE_MAX_REGISTERS"),
    ("flush_small_tile_max_batch", "FLUSH_SMALL_TILE_MAX_BATCH"),
    ("decode_history_block", "DECODE_HISTORY_BLOCK"),
    ("decode_first_chunk", "DECODE_FIRST_CHUNK"),
    ("persistent_rows_per_sm", "PERSISTENT_ROWS_PER_SM"),
    ("flush_stream_priority", "FLUSH_STREAM_PRIORITY"),
    ("preload_decode_block_v", "PRELOAD_DECODE_BLOCK_V"),
    ("small_window_block_v", "SMALL_WINDOW_BLOCK_V"),
    ("preload_decode_warps", "PRELOAD_DECODE_WARPS"),
    ("small_window_warps", "SMALL_WINDOW_WARPS"),
    ("small_batch", "SMALL_BATCH"),
    ("preload_decode_max_batch", "PRELOAD_DECODE_MAX_BATCH"),
    ("key_head_decode_min_batch", "KEY_HEAD_DECODE_MIN_BATCH"),
    ("key_head_decode_min_batch", "NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH"),  # one flag for both state widths
    ("key_head_decode_block_v", "KEY_HEAD_DECODE_BLOCK_V"),
    ("key_head_decode_warps", "KEY_HEAD_DECODE_WARPS"),
    ("key_head_decode_k_chunk", "KEY_HEAD_DECODE_K_CHUNK"),
    ("key_head_decode_min_history_block", "KEY_HEAD_DECODE_MIN_HISTORY_BLOCK"),
    ("key_head_decode_stages", "KEY_HEAD_DECODE_STAGES"),
    ("key_head_decode_stages_min_batch", "KEY_HEAD_DECODE_STAGES_MIN_BATCH"),
    ("decode_k_chunk", "DECODE_K_CHUNK"),
    ("deferred_fold_streams", "DEFERRED_FOLD_STREAMS"),
    ("step_fold_block_v", "STEP_FOLD_BLOCK_V"),
    ("window_stages", "WINDOW_STAGES"),
    ("window_in_kernel_max_batch", "WINDOW_IN_KERNEL_MAX_BATCH"),
    ("window_in_kernel_max_batch", "NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH"),  # one flag for both state widths
    ("window_in_kernel_stages", "WINDOW_IN_KERNEL_STAGES"),
    ("window_in_kernel_stages", "NARROW_STATE_WINDOW_IN_KERNEL_STAGES"),  # one flag for both state widths
    ("wide_window_min_batch", "WIDE_WINDOW_MIN_BATCH"),
    ("wide_window_in_kernel_stages", "WIDE_WINDOW_IN_KERNEL_STAGES"),
    ("wide_window_in_kernel_stages", "NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES"),  # one flag for both state widths
    ("wide_window_in_kernel_block_k", "WIDE_WINDOW_IN_KERNEL_BLOCK_K"),
]


def _use_switches(a: argparse.Namespace) -> None:
    """Set the module switches the command line names (each flag's help says which) and the op order."""
    for arg, switch, value in FLAG_SWITCHES:
        if getattr(a, arg):
            setattr(_replay, switch, value)
    for arg, switch in VALUE_SWITCHES:
        if getattr(a, arg) is not None:
            setattr(_replay, switch, getattr(a, arg))
    if a.step_fold_max_batch is not None:
        _replay.STEP_FOLD_DECODE_BATCHES = _replay.STEP_FOLD_VERIFY_BATCHES = range(1, a.step_fold_max_batch + 1)
    global STEP_FOLD  # noqa: PLW0603 (the command line's choice, read by run_case)
    STEP_FOLD = not a.no_step_fold
    _config.use_op_order(a)


def _shard(text: str) -> tuple[int, int]:
    """`K/N`: the K-th of N shards, 0 <= K < N."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use K/N, e.g. 0/3 for the first of three shards") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be in 0..N-1")
    return k, n


def _power_of_two(text: str) -> int:
    """A power of two in 1..128 (argparse type)."""
    value = _int_in(1, 128)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value}: must be a power of two (1, 2, 4, ..., 128)")
    return value


def _power_of_two_or_zero(text: str) -> int:
    """0 (off) or a power of two in 1..128 (argparse type)."""
    return 0 if _int_in(0, 128)(text) == 0 else _power_of_two(text)


def _fraction(text: str) -> float:
    """A number in [0, 1] (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a fraction of the ring, e.g. 0.25") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 0 and at most 1")
    return value


def _positive_float(text: str) -> float:
    """A number of seconds above 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds, e.g. 200") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be above 0")
    return value


def _add_key_head_arguments(p: argparse.ArgumentParser) -> None:
    """The decode kernels' column chunks and the key-head decode's switches (`_replay.KEY_HEAD_DECODE_*`)."""
    p.add_argument("--key-head-decode-fused-history", action="store_true",
                   help="the key-head decode adds its records inside the column chunks' sums "
                        "(KEY_HEAD_DECODE_FUSED_HISTORY)")  # fmt: skip
    _add_switch_pair(p, "key-head-decode-prefetch",
                     "the key-head decode's pipelined loop loads each next tile's token inputs ahead "
                     "(KEY_HEAD_DECODE_PREFETCH, the default)",
                     "each tile of the key-head decode's pipelined loop loads its own token inputs "
                     "(KEY_HEAD_DECODE_PREFETCH off)")  # fmt: skip
    _add_switch_pair(p, "key-head-decode-tma",
                     "the key-head decode reads its state tiles' column chunks through a tensor descriptor "
                     "(KEY_HEAD_DECODE_TMA, the default; on Hopper bulk copies)",
                     "the key-head decode reads its state tiles through pointers "
                     "(KEY_HEAD_DECODE_TMA off)")  # fmt: skip
    _add_switch_pair(p, "key-head-decode-late-norms",
                     "the key-head decode's column chunks take the raw key and query, and their row sums are "
                     "normalised once, on every state (KEY_HEAD_DECODE_LATE_NORMS always; default: bf16 and fp16)",
                     "the key and query normalised in every chunk (KEY_HEAD_DECODE_LATE_NORMS never)")  # fmt: skip
    p.add_argument("--key-head-decode-min-batch", type=_int_in(0, 4096),
                   help="decode launches of at least this many rows run one program per row and key head, both "
                        "state widths (KEY_HEAD_DECODE_MIN_BATCH, NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH)")  # fmt: skip
    for flag, text in (
        ("--key-head-decode-block-v", "V rows of a key-head decode program's tiles (KEY_HEAD_DECODE_BLOCK_V)"),
        ("--key-head-decode-warps", "warps of a key-head decode program (KEY_HEAD_DECODE_WARPS)"),
        (
            "--key-head-decode-min-history-block",
            "fewest rows of a key-head decode program's records tile, which "
            "otherwise holds the ring (KEY_HEAD_DECODE_MIN_HISTORY_BLOCK)",
        ),
    ):
        p.add_argument(flag, type=_power_of_two, help=text)
    for flag, text in (
        ("--key-head-decode-k-chunk", "column chunks of a key-head decode program's state tiles, 0: whole tiles "
                                      "(KEY_HEAD_DECODE_K_CHUNK)"),
        ("--decode-k-chunk", "column chunks of the other decode programs' fp32 state tiles at "
                             "DECODE_K_CHUNK_BATCHES rows, 0: whole tiles (DECODE_K_CHUNK)"),
    ):  # fmt: skip
        p.add_argument(flag, type=_power_of_two_or_zero, help=text)
    p.add_argument("--key-head-decode-stages", type=_int_in(0, 4),
                   help="the key-head decode's tiles in a software-pipelined loop of this many stages, 0: unrolled "
                        "(KEY_HEAD_DECODE_STAGES)")  # fmt: skip
    p.add_argument("--key-head-decode-stages-min-batch", type=_int_in(0, 4096),
                   help="key-head decode launches of at least this many rows pipeline their tiles "
                        "(KEY_HEAD_DECODE_STAGES_MIN_BATCH)")  # fmt: skip


def _add_switch_pair(p: argparse.ArgumentParser, flag: str, on: str, off: str) -> None:
    """`--flag` and `--no-flag`, store_true each and exclusive of each other, with their help texts."""
    pair = p.add_mutually_exclusive_group()
    pair.add_argument(f"--{flag}", action="store_true", help=on)
    pair.add_argument(f"--no-{flag}", action="store_true", help=off)


def _add_window_arguments(p: argparse.ArgumentParser) -> None:
    """The window kernel's switches: its key products and norms, its tiles, its output columns."""
    p.add_argument("--no-window-raw-key-dots", action="store_true",
                   help="key products as TF32 dots on converted keys (WINDOW_RAW_KEY_DOTS)")  # fmt: skip
    p.add_argument("--no-window-history-gram-norms", action="store_true",
                   help="history key norms summed on the CUDA cores (WINDOW_HISTORY_GRAM_NORMS)")  # fmt: skip
    p.add_argument("--no-window-key-products", action="store_true",
                   help="the window's key products in the window kernel (WINDOW_KEY_PRODUCTS)")  # fmt: skip
    p.add_argument("--window-stages", type=_int_in(1, 4),
                   help="pipeline stages of the window kernels other than the 64x2 and wide tiles with the keys' "
                        "side in the kernel, and of the key products' pre-pass (WINDOW_STAGES)")  # fmt: skip
    p.add_argument("--window-in-kernel-max-batch", type=_int_in(0, 4096),
                   help="the 64x2 tile (T = 2) keeps the keys' side in the kernel up to this many rows, 0: never; "
                        "every state dtype (WINDOW_IN_KERNEL_MAX_BATCH, "
                        "NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH)")  # fmt: skip
    p.add_argument("--no-window-in-kernel-bf16-state", action="store_true",
                   help="that tile takes the key products' pre-pass on a bf16 state (WINDOW_IN_KERNEL_STATES: fp32 "
                        "only)")  # fmt: skip
    p.add_argument("--window-in-kernel-stages", type=_int_in(1, 4),
                   help="pipeline stages of that tile's K pass, every state dtype (WINDOW_IN_KERNEL_STAGES, "
                        "NARROW_STATE_WINDOW_IN_KERNEL_STAGES)")  # fmt: skip
    p.add_argument("--wide-window-min-batch", type=_int_in(0, 4096),
                   help="the wide tiles that keep the keys' side in the kernel from this many rows "
                        "(WIDE_WINDOW_MIN_BATCH)")  # fmt: skip
    p.add_argument("--no-wide-window-in-kernel-bf16-state", action="store_true",
                   help="a bf16 state's wide tiles take the key products' pre-pass (WIDE_WINDOW_IN_KERNEL_STATES: "
                        "fp32 and bf16)")  # fmt: skip
    p.add_argument("--wide-window-in-kernel-stages", type=_int_in(1, 4),
                   help="pipeline stages of the wide tiles' K pass with the keys' side in the kernel, every state "
                        "dtype (WIDE_WINDOW_IN_KERNEL_STAGES, NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES)")  # fmt: skip
    p.add_argument("--wide-window-in-kernel-block-k", type=_power_of_two,
                   help="K columns per chunk of that pass (WIDE_WINDOW_IN_KERNEL_BLOCK_K)")  # fmt: skip
    _add_switch_pair(p, "wide-window-key-products",
                     "the key products' pre-pass for the wide tiles too (WIDE_WINDOW_KEY_PRODUCTS)",
                     "the wide tiles' keys' side in the window kernel (the default)")  # fmt: skip
    _add_switch_pair(p, "window-query-columns",
                     "the window's outputs in its query columns in every build (WINDOW_QUERY_COLUMNS always; "
                     "default: not in preloading programs up to T = 4)",
                     "the window's outputs through two selector dots (WINDOW_QUERY_COLUMNS never)")  # fmt: skip
    _add_switch_pair(p, "window-early-gates",
                     "every window build that does not preload loads the gates before its K pass "
                     "(WINDOW_EARLY_GATES always; default: the fp32 wide tile with its keys' side in the kernel)",
                     "no window build does (WINDOW_EARLY_GATES never)")  # fmt: skip
    p.add_argument("--no-window-raw-state-dot", action="store_true",
                   help="the window kernel converts a bf16 state and inputs to float32 for a TF32 dot "
                        "(WINDOW_RAW_STATE_DOT off)")  # fmt: skip
    p.add_argument("--no-wide-window", action="store_true",
                   help="64x2 window programs for every T (WIDE_WINDOW_TOKENS: 128x4 for those T)")  # fmt: skip


def _add_fold_arguments(p: argparse.ArgumentParser) -> None:
    """The persistent fold's register caps and its list of flushing rows (`_replay.LISTED_FOLDS`)."""
    p.add_argument("--persistent-max-registers", type=_int_in(32, 255),
                   help="register cap of the persistent flush launch (PERSISTENT_MAX_REGISTERS)")  # fmt: skip
    p.add_argument("--decode-fold-max-registers", type=_int_in(0, 255),
                   help="register cap of a decode step's in-line persistent fold, 0: none "
                        "(DECODE_FOLD_MAX_REGISTERS)")  # fmt: skip
    _add_switch_pair(p, "listed-folds",
                     "every persistent fold reads the flushing rows from a list a one-program kernel writes "
                     "(LISTED_FOLDS always; default: a decode step's in-line fold)",
                     "every persistent fold scans the batch for its rows (LISTED_FOLDS never)")  # fmt: skip
    p.add_argument("--listed-fold-max-registers", type=_int_in(0, 255),
                   help="register cap of a listed persistent fold that would run uncapped, 0: none "
                        "(LISTED_FOLD_MAX_REGISTERS)")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    """The command line (`main`)."""
    p = argparse.ArgumentParser(prog="python -m gdn_replayssm.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON line per case on stdout")
    p.add_argument("--out", type=Path, help="also write the JSON lines here, and the summary next to it (.md)")
    p.add_argument("--quick", action="store_true", help="fp32 state, B in {1, 64, 256}, T in {1, 4}, no sweep")
    p.add_argument("--sweep-ring", action="store_true", help="with --quick: also sweep the ring length")
    p.add_argument("--state-dtypes", type=_state_dtypes, help="fp32,bf16 (default: fp32 with --quick, else both)")
    p.add_argument("--tokens", type=_int_list(1, 8), help="list of T (default: 1,4 with --quick, else 1,2,4,8)")
    p.add_argument("--batch-sizes", type=_int_list(1, 4096),
                   help="list of B (default: 1,64,256 with --quick, else 1,8,32,64,128,256)")  # fmt: skip
    p.add_argument("--fused-flush", action="store_true", help="non-flush kernels fold their flush rows (FUSED_FLUSH)")
    p.add_argument("--no-paired-state", action="store_true",
                   help="a bf16 state's decode tile loaded as bf16, not as int32 pairs (PAIRED_STATE)")  # fmt: skip
    deferral = p.add_mutually_exclusive_group()
    deferral.add_argument("--deferred-fold", action="store_true",
                          help="every step defers its fold (DEFERRED_FOLD always)")  # fmt: skip
    deferral.add_argument("--no-deferred-fold", action="store_true",
                          help="no step defers its fold (DEFERRED_FOLD never)")  # fmt: skip
    p.add_argument("--no-step-fold", action="store_true",
                   help="cursors allocated step_fold=False: every layer folds its own flushing rows (default: "
                        "replayssm_fold after the last layer, for _replay.step_fold's batch sizes)")  # fmt: skip
    p.add_argument("--step-fold-max-batch", type=_int_in(0, 4096),
                   help="steps of 1 to this many rows, decode and verify, leave their folds to replayssm_fold "
                        "(STEP_FOLD_DECODE_BATCHES, STEP_FOLD_VERIFY_BATCHES)")  # fmt: skip
    p.add_argument("--step-fold-block-v", type=_power_of_two,
                   help="V rows per program of the step fold (STEP_FOLD_BLOCK_V)")  # fmt: skip
    p.add_argument("--deferred-fold-streams", type=_int_in(1, 16),
                   help="side streams the deferred folds are spread over (DEFERRED_FOLD_STREAMS)")  # fmt: skip
    p.add_argument("--no-concurrent-flush", action="store_true", help="flush launch in stream order (CONCURRENT_FLUSH)")
    p.add_argument("--no-persistent-flush", action="store_true", help="flush program per tile (PERSISTENT_FLUSH)")
    _config.add_op_order_arguments(p)
    _add_fold_arguments(p)
    p.add_argument("--decode-max-registers", type=_int_in(32, 255),
                   help="register cap of the decode launch (DECODE_MAX_REGISTERS)")  # fmt: skip
    p.add_argument("--flush-small-tile-max-batch", type=_int_in(0, 4096),
                   help="8-row flush tiles up to this many rows, 16 above (FLUSH_SMALL_TILE_MAX_BATCH)")  # fmt: skip
    p.add_argument("--decode-history-block", type=_power_of_two,
                   help="decode history chunk in records, a power of two (DECODE_HISTORY_BLOCK)")  # fmt: skip
    _add_window_arguments(p)
    p.add_argument("--no-flush-normalised-keys", action="store_true",
                   help="each flush program normalises its keys itself (FLUSH_NORMALISED_KEYS)")  # fmt: skip
    p.add_argument("--no-flush-normalised-window", action="store_true",
                   help="flush programs normalise the window's q, k themselves (FLUSH_NORMALISED_WINDOW)")  # fmt: skip
    p.add_argument("--decode-first-chunk", type=_power_of_two_or_zero,
                   help="short histories in one chunk of this many records, 0: off (DECODE_FIRST_CHUNK)")  # fmt: skip
    p.add_argument("--persistent-rows-per-sm", type=_power_of_two,
                   help="state rows per SM of the persistent flush grid (PERSISTENT_ROWS_PER_SM)")  # fmt: skip
    p.add_argument("--flush-stream-priority", type=_int_in(-8, 0),
                   help="verify steps' flush stream priority, lower is higher (FLUSH_STREAM_PRIORITY)")  # fmt: skip
    for flag, text in (
        ("--preload-decode-block-v", "V rows of a preloading decode program (PRELOAD_DECODE_BLOCK_V)"),
        ("--small-window-block-v", "V rows of a small-batch window program (SMALL_WINDOW_BLOCK_V)"),
        ("--preload-decode-warps", "warps of a preloading decode program (PRELOAD_DECODE_WARPS)"),
        ("--small-window-warps", "warps of a small-batch window program (SMALL_WINDOW_WARPS)"),
    ):
        p.add_argument(flag, type=_power_of_two, help=text)
    _add_key_head_arguments(p)
    p.add_argument("--small-batch", type=_int_in(0, 4096),
                   help="the small-batch path up to this many rows (SMALL_BATCH)")  # fmt: skip
    p.add_argument("--preload-decode-max-batch", type=_int_in(0, 4096),
                   help="decode launches read their rings whole up to this many rows (PRELOAD_DECODE_MAX_BATCH; "
                        "default SMALL_BATCH)")  # fmt: skip
    p.add_argument("--coalesce-flushes", type=_fraction, nargs="?", const=0.5, metavar="FRACTION",
                   help="rows within FRACTION of the ring of their flush join the step's flushes (flush_join = "
                        "FRACTION * L; 0: off; default: default_flush_join(L), half the ring)")  # fmt: skip
    p.add_argument("--ring-len", type=int, help="ring length of every case (default: default_ring_len(T, max_batch=B))")
    p.add_argument("--starts", type=_starts, default=list(STARTS),
                   help="comma list of lockstep,staggered: where the rows' rings stand when timing starts")  # fmt: skip
    p.add_argument("--folds", type=_folds, default=["exact"], help="comma list of exact,open_loop (default exact)")
    p.add_argument("--tile", help="BVxWARPS of the baseline, e.g. 32x4 (default: default_tile)")
    p.add_argument("--dot-precision", choices=["ieee", "tf32", "tf32x3"])
    p.add_argument("--shard", type=_shard, help="K/N: run the K-th of N shards of the plan (module docstring)")
    p.add_argument("--max-seconds", type=_positive_float,
                   help="start no case after this many seconds; the summary is still written")  # fmt: skip
    p.add_argument("--trace", action="store_true",
                   help="one more replay per case under the profiler: span, idle and time per kernel per layer-step "
                        "(the row's trace, and on stderr)")  # fmt: skip
    p.add_argument("--summarize", type=Path, nargs="+", metavar="JSONL",
                   help="measure nothing: one summary of these runs' JSON lines, also to --out's .md")  # fmt: skip
    p.add_argument("--at-defaults", action="store_true",
                   help="with --summarize: each cell from the last run that timed it at today's default ring "
                        "length (runs oldest first)")  # fmt: skip
    return p


def resolve_defaults(a: argparse.Namespace) -> argparse.Namespace:
    """The grid `--quick` and the full run imply where the command line leaves it open (in place)."""
    a.state_dtypes = a.state_dtypes or (["fp32"] if a.quick else ["fp32", "bf16"])
    a.tokens = a.tokens or ([1, 4] if a.quick else [1, 2, 4, 8])
    a.batch_sizes = a.batch_sizes or ([1, 64, 256] if a.quick else [1, 8, 32, 64, 128, 256])
    a.sweep_ring = a.sweep_ring or not a.quick
    return a


class _SigtermFlag:
    """Set by SIGTERM while `_sigterm_requests_stop` is active; `reclaim` puts the flag's handler back.

    The signal is not turned into an exception: one raised at any point of a case (inside CUDA-graph capture,
    with a side stream forked) can leave the process unable to finish. Triton's compiler (LLVM) installs its
    own SIGTERM handler on its first compile in a process; that handler resets to the default action on entry,
    so the second of `timeout`'s two back-to-back SIGTERMs (to the command, then to its process group) killed
    the run with status 143 and no summary (H200 run 19). LLVM does not install it again once replaced, so
    reclaiming before each case leaves only the first compiling case exposed; `--max-seconds` has no window,
    nor has `timeout --foreground`, which sends one SIGTERM (LLVM's handler passes a single one on)."""

    def __init__(self) -> None:
        self.requested = False

    def note(self, signum: int, frame: object) -> None:
        self.requested = True

    def reclaim(self) -> None:
        signal.signal(signal.SIGTERM, self.note)


@contextlib.contextmanager
def _sigterm_requests_stop() -> Iterator[_SigtermFlag]:
    """While inside, a SIGTERM only sets the flag this yields; the previous handler is back afterwards."""
    flag = _SigtermFlag()
    previous = signal.signal(signal.SIGTERM, flag.note)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_plan(
    specs: list[Any],
    run_one: Callable[[Any], dict[str, Any] | None],
    emit: Callable[[dict[str, Any]], None],
    out_of_time: Callable[[], bool] = lambda: False,
) -> tuple[list[dict[str, Any]], int, int]:
    """Run the cases in order and emit each measured row: (rows, failed checks, cases not run). A SIGTERM, or
    `out_of_time()` turning true, ends the run after the case in progress, which is still measured and
    emitted."""
    rows: list[dict[str, Any]] = []
    failed = done = 0
    with _sigterm_requests_stop() as stop:
        for spec in specs:
            stop.reclaim()
            if stop.requested or out_of_time():
                break
            r = run_one(spec)
            if r is None:
                failed += 1
            else:
                rows.append(r)
                emit(r)
            done += 1
    return rows, failed, len(specs) - done


def read_runs_or_exit(
    p: argparse.ArgumentParser, label: str, paths: list[Path]
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """`read_runs` for a command line: a missing or unreadable file, or files without a benchmark row, end
    the program through `p.error` with a message that starts with `label` (the option or operand)."""
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        p.error(f"{label}: no such file: {', '.join(missing)}")
    try:
        runs, identities = read_runs(paths)
    except (OSError, UnicodeDecodeError) as e:
        p.error(f"{label}: cannot read the JSON lines: {e}")
    if not any(runs):
        p.error(f"{label}: no benchmark rows in {', '.join(map(str, paths))} (write them with bench --json or --out)")
    return runs, identities


def read_rows_or_exit(
    p: argparse.ArgumentParser, label: str, paths: list[Path]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`read_runs_or_exit` with the files' rows in one list."""
    runs, identities = read_runs_or_exit(p, label, paths)
    return [row for rows in runs for row in rows], identities


def _summarize_files(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """`--summarize`: the summary of rows measured by earlier runs, with each run's command."""
    runs, identities = read_runs_or_exit(p, "--summarize", a.summarize)
    rows = rows_at_defaults(runs) if a.at_defaults else [row for run in runs for row in run]
    summary = summarize(rows) + f"\n# {len(rows)} cases from {len(a.summarize)} file{'s' * (len(a.summarize) != 1)}"
    for identity in identities:
        summary += f"\n# command: PYTHONPATH=kernels python -m gdn_replayssm.bench {' '.join(identity.get('argv', []))}"
    print(summary)
    if a.out:
        a.out.with_suffix(".md").write_text(summary.lstrip("\n") + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    if a.at_defaults and not a.summarize:
        p.error("--at-defaults: only with --summarize (it picks rows of earlier runs)")
    if a.summarize:
        return _summarize_files(p, a)
    if not torch.cuda.is_available():
        print("gdn_replayssm.bench needs a CUDA device", file=sys.stderr)
        return 2
    _use_switches(a)
    resolve_defaults(a)

    def tile_for(T: int | None) -> TileConfig:
        """`default_tile` for the case's T (the baseline's tile, ReplaySSM's dot precision), with the overrides."""
        tile = default_tile(head_v_dim=QWEN36.V, device=torch.device("cuda"), num_tokens=T, out_dtype=X_DTYPE)
        if a.dot_precision:
            tile = TileConfig(tile.block_v, tile.num_warps, tile.num_stages, a.dot_precision)
        return parse_tile(a.tile, tile)

    identity = run_identity()
    copy_gbps = copy_bandwidth_gbps()
    header = {"kind": "identity", **identity, "copy_GBps": round(copy_gbps, 1), "argv": sys.argv[1:]}
    sink = a.out.open("w") if a.out else None

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        if a.json:
            print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    emit(header)
    started = time.perf_counter()

    def run_one(spec: Spec) -> dict[str, Any] | None:
        r = run_case(spec, tile_for(spec.T), copy_gbps, identity, trace=a.trace)
        if r is not None and "trace" in r:
            label = f"{spec.design} {spec.state} T={spec.T} B={spec.B} {spec.acceptance} {spec.start or ''}"
            print(format_summary(label.strip(), r["trace"]), file=sys.stderr, flush=True)
        if r is not None and not a.json:
            print(f"# {spec.design:>9} {spec.state} T={spec.T} B={spec.B:>3} {spec.acceptance:>12} L={spec.ring_len}: "
                  f"{r['us']:.1f} us {r['GBps']:.0f} GB/s", file=sys.stderr)  # fmt: skip
        return r

    specs = plan(a) if a.shard is None else shard(plan(a), *a.shard)

    def out_of_time() -> bool:
        return a.max_seconds is not None and time.perf_counter() - started > a.max_seconds

    rows, failed, not_run = run_plan(specs, run_one, emit, out_of_time)
    summary = (
        summarize(rows) + f"\n# {len(rows)} cases, {failed} failed correctness, {time.perf_counter() - started:.0f} s"
    )
    if not_run:
        summary += f"\n# cut by SIGTERM or --max-seconds: {not_run} cases of the plan not run"
    summary += f"\n# command: PYTHONPATH=kernels python -m gdn_replayssm.bench {' '.join(sys.argv[1:])}"
    print(summary)
    if sink:
        sink.close()
        a.out.with_suffix(".md").write_text(summary.lstrip("\n") + "\n")
    return 1 if failed else 124 if not_run else 0


if __name__ == "__main__":
    sys.exit(main())
