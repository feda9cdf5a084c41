"""The benchmark's host-side logic, and one full case per design under the interpreter (no CUDA graph)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from gdn_replayssm import default_tile
from gdn_replayssm.bench import Bytes, Geo, Spec, accepted_counts, ring_len_suggestions, run_case, summarize
from gdn_testing import LaunchSpy, require_device

TINY = Geo(H=1, HV=2, K=16, V=16)


@pytest.mark.parametrize(("design", "T"), [("baseline", 1), ("replayssm", 1), ("baseline", 2), ("replayssm", 2)])
def test_run_case_checks_and_reports(design: str, T: int) -> None:
    require_device("cpu")
    spec = Spec(design, B=2, T=T, state="fp32", pattern="mixed", ring_len=3 * T, geo=TINY)
    config = default_tile(head_v_dim=TINY.V, device=torch.device("cpu"))
    row = run_case(spec, config, 1000.0, {"gpu": "cpu"}, device="cpu", max_layers=2, steps=4)
    assert row is not None
    assert row["design"] == design
    assert row["layers"] == 2
    assert row["us"] > 0
    assert row["bytes_per_step"] > 0
    assert row["check_rel_err"] < 2e-2
    if design == "replayssm":
        assert 0 < row["flush_frac"] < 1


@pytest.mark.parametrize(("T", "state"), [(3, "fp32"), (3, "bf16"), (2, "fp32"), (2, "bf16")])
def test_run_case_reports_the_window_build_it_launched(T: int, state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row names the non-flush window launches' build as launched: the wide tile (T = 3) and T = 2's 64x2 tile
    with their keys' side in the kernel, on fp32 and bf16 states, whose stages, summed norms and early gates differ
    (`_replay.window_build`)."""
    from gdn_replayssm import _replay

    require_device("cpu")
    spy = LaunchSpy(_replay._window_kernel)
    monkeypatch.setattr(_replay, "_window_kernel", spy)
    B = 3
    for switch in ("SMALL_BATCH", "PRELOAD_DECODE_MAX_BATCH"):  # the large tiles at 3 rows
        monkeypatch.setattr(_replay, switch, 0)
    for switch in ("WIDE_WINDOW_MIN_BATCH", "WINDOW_PRODUCTS_MIN_BATCH"):
        monkeypatch.setattr(_replay, switch, B)
    spec = Spec("replayssm", B=B, T=T, state=state, pattern="mixed", ring_len=4 * T, geo=Geo(H=1, HV=2, K=16, V=64))
    config = default_tile(head_v_dim=spec.geo.V, device=torch.device("cpu"))
    row = run_case(spec, config, 1000.0, {"gpu": "cpu"}, device="cpu", max_layers=1, steps=2)
    assert row is not None
    launched = {(w["NUM_STAGES"], w["RAW_KEY_DOTS"], w["EARLY_GATES"], w["PRODUCTS"], w["RAW_STATE_DOT"])
                for _, w in spy.launches}  # fmt: skip
    reported = (row["window_stages"], 1 if row["window_history_gram_norms"] else 2, row["window_early_gates"], False,
                row["window_raw_state_dot"])  # fmt: skip
    assert launched == {reported}
    assert row["window_key_products"] is False and row["window_max_registers"] is None  # no cap on the CPU
    assert row["window_early_gates"] is (T == 3 and state == "fp32")
    assert row["window_stages"] == (2 if state == "fp32" else 3)


@pytest.mark.parametrize(("start", "peak"), [("lockstep", 1.0), ("staggered", 0.25)])
def test_staggered_start_spreads_the_flushes(start: str, peak: float) -> None:
    """All accepted, decode: in lockstep every row flushes in the same step; staggered, the rows' rings stand
    at different positions, so one row in four flushes per step (ring of 4, 4 rows)."""
    require_device("cpu")
    spec = Spec("replayssm", B=4, T=1, state="fp32", pattern="all", ring_len=4, geo=TINY, start=start)
    config = default_tile(head_v_dim=TINY.V, device=torch.device("cpu"))
    row = run_case(spec, config, 1000.0, {"gpu": "cpu"}, device="cpu", max_layers=1, steps=4)
    assert row is not None
    assert row["start"] == start
    assert row["flush_frac"] == 0.25
    assert row["peak_flush_frac"] == peak


@pytest.mark.parametrize(("join", "peak"), [(0, 0.25), (4, 1.0)])
def test_coalesced_flushes_gather_staggered_rows(join: int, peak: float) -> None:
    """Staggered decode rows (ring of 8, rows 1 step apart): alone, one row in four flushes per step at most;
    with `flush_join = 4` the first due row takes the others along (all past the join line), and from then on
    they flush together. The check against the reference passes with the whole batch's rule."""
    require_device("cpu")
    spec = Spec("replayssm", B=4, T=1, state="fp32", pattern="all", ring_len=8, geo=TINY, start="staggered",
                flush_join=join)  # fmt: skip
    config = default_tile(head_v_dim=TINY.V, device=torch.device("cpu"))
    row = run_case(spec, config, 1000.0, {"gpu": "cpu"}, device="cpu", max_layers=1, steps=8)
    assert row is not None
    assert row["flush_join"] == join
    assert row["peak_flush_frac"] == peak


def test_the_check_plans_the_whole_batch_and_fails_a_wrong_plan(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With coalesced flushes a step's plan depends on every row, while the reference runs on sampled rows
    (B = 8: rows 0, 2, 5, 7): the check plans the whole batch with the reference and requires the plan
    kernel to agree. Staggered rows then flush together; a plan kernel that marks no step fails the case."""
    require_device("cpu")
    from gdn_replayssm import bench

    spec = Spec("replayssm", B=8, T=1, state="fp32", pattern="all", ring_len=8, geo=TINY, start="staggered",
                flush_join=4)  # fmt: skip
    config = default_tile(head_v_dim=TINY.V, device=torch.device("cpu"))

    def case() -> dict[str, Any] | None:
        return run_case(spec, config, 1000.0, {"gpu": "cpu"}, device="cpu", max_layers=1, steps=8)

    row = case()
    assert row is not None
    assert row["peak_flush_frac"] > 1 / 8  # alone, one staggered row of eight is due per step
    monkeypatch.setattr(bench, "replayssm_plan", lambda **_: None)
    assert case() is None
    assert "FAILED correctness" in capsys.readouterr().err


def test_accepted_counts_patterns() -> None:
    spec = Spec("replayssm", B=64, T=4, state="fp32", pattern="mixed", ring_len=16)
    counts = accepted_counts(spec, 200, seed=1)
    assert counts.min() >= 1
    assert counts.max() <= 4
    expected = 1 + 0.7 + 0.7**2 + 0.7**3
    assert abs(counts.float().mean().item() - expected) < 0.05
    assert (accepted_counts(Spec("replayssm", 3, 4, "fp32", "all", 16), 5, seed=1) == 4).all()


def test_bytes_model() -> None:
    base = Bytes(Spec("baseline", 8, 4, "fp32", "all", 16))
    state = 32 * 128 * 128 * 4
    nbytes, flushed = base.step(0)
    assert nbytes == base.io + 5 * state
    assert not flushed
    replay = Bytes(Spec("replayssm", 8, 4, "fp32", "all", 16))
    quiet, _ = replay.step(4)
    flush, flushed = replay.step(12)
    assert flushed
    assert quiet < 1.2 * (replay.io + state)
    assert flush > quiet + state


def test_summary_reports_ratios_targets_and_ring_choice() -> None:
    def row(
        design: str, B: int, T: int, us: float, *, L: int = 32, sweep: str = "main", start: str = "lockstep"
    ) -> dict:
        return {
            "design": design, "fold": "exact" if design == "replayssm" else None, "B": B, "T": T,
            "state_dtype": "fp32", "acceptance": "all", "us": us, "GBps": 4000.0, "frac_copy": 0.9,
            "flush_frac": 0.1, "ring_len": L, "sweep": sweep, "gpu": "H200", "copy_GBps": 4400.0,
            "start": start if design == "replayssm" else None,
        }  # fmt: skip

    rows = [
        row("baseline", 64, 4, 300.0),
        row("replayssm", 64, 4, 90.0),
        row("replayssm", 64, 4, 150.0, start="staggered"),
    ]
    rows += [
        row("replayssm", 64, 4, 80.0, L=16, sweep="ring_len"),
        row("replayssm", 64, 4, 95.0, L=64, sweep="ring_len"),
    ]
    rows[1].update(flush_join=32, deferred_fold=True)  # the staggered row predates both fields
    text = summarize(rows)
    assert "3.33" in text
    table = [line.split() for line in text.splitlines() if line.startswith(" fp32")]
    assert [(line[2], line[-2], line[-1]) for line in table] == [("lockstep", "32", "yes"), ("staggered", "0", "-")]
    assert "verify T=4 ratio >= 3 at B >= 64, lockstep: MET (min 3.33)" in text
    assert "verify T=4 ratio >= 3 at B >= 64, staggered: MISSED (min 2.00)" in text
    # the lockstep cell has three lengths, the staggered one a single length (left out, and said so)
    assert (
        "# ring length, T=4, B > 8 (geo-mean of us / best us over 1 cells, 1 cells without every length left out): "
        "L=16: 1.000, L=32: 1.125, L=64: 1.188"
    ) in text
    assert "suggested ring length for T=4, B > 8: 16 (default_ring_len: 64)" in text


def test_ring_choice_scores_every_length_over_the_cells_that_timed_them_all() -> None:
    """Run 18's sweep: lengths 16 / 32 / 128 at B = 1, 64 and 256, the default (64) only at B = 64 and 256,
    where it is the fastest. Large batches are scored apart from small ones (their defaults differ), and there
    the choice must be 64, from the two cells that have all four lengths; B = 1's cell has its three."""
    rows = []
    for B, times in {1: {16: 8.9, 32: 7.9, 128: 10.5}, 64: {16: 134.0, 32: 111.5, 64: 98.8, 128: 125.1},
                     256: {16: 518.8, 32: 406.6, 64: 352.1, 128: 449.1}}.items():  # fmt: skip
        for L, us in times.items():
            rows.append({
                "design": "replayssm", "fold": "exact", "B": B, "T": 4, "state_dtype": "fp32", "acceptance": "all",
                "us": us, "ring_len": L, "start": "lockstep", "sweep": "main" if L == 64 else "ring_len",
            })  # fmt: skip
    lines = ring_len_suggestions(rows)
    assert (
        lines[0]
        == "# ring length, T=4, B <= 8 (geo-mean of us / best us over 1 cells): L=16: 1.127, L=32: 1.000, L=128: 1.329"
    )
    assert lines[1] == "#   suggested ring length for T=4, B <= 8: 32 (default_ring_len: 32)"
    assert lines[2].startswith("# ring length, T=4, B > 8 (geo-mean of us / best us over 2 cells)")
    assert "L=64: 1.000" in lines[2]
    assert lines[3] == "#   suggested ring length for T=4, B > 8: 64 (default_ring_len: 64)"
    # no cell with every length: no suggestion rather than one from a part of the lengths
    only_partial = [r for r in rows if (r["B"], r["ring_len"]) in {(64, 32), (64, 128), (256, 64)}]
    assert ring_len_suggestions(only_partial) == [
        "# ring length, T=4, B > 8: no cell has every length ([32, 64, 128]); no suggestion"
    ]


def test_plan_takes_the_measured_ring_length_per_window_unless_one_is_given() -> None:
    from gdn_replayssm import bench
    from gdn_replayssm.ring import default_flush_join, default_ring_len

    assert [default_ring_len(T) for T in range(1, 9)] == [16, 32, 64, 64, 64, 64, 64, 64]
    # pools that never run more than 8 rows take 32 records for windows of 3 tokens and more
    assert [default_ring_len(T, max_batch=8) for T in range(1, 9)] == [16, 32, 32, 32, 32, 32, 32, 32]
    assert [default_ring_len(T, max_batch=9) for T in (1, 2, 4)] == [16, 32, 64]
    with pytest.raises(ValueError, match="num_tokens"):
        default_ring_len(0)
    with pytest.raises(ValueError, match="max_batch"):
        default_ring_len(4, max_batch=0)
    assert [default_flush_join(L) for L in (1, 2, 3, 32, 64, 128)] == [0, 1, 1, 16, 32, 64]
    with pytest.raises(ValueError, match="ring_len"):
        default_flush_join(0)

    def plan(*argv: str) -> list[Spec]:
        return bench.plan(bench.resolve_defaults(bench._parser().parse_args(["--quick", *argv])))

    assert {(s.T, s.B, s.ring_len) for s in plan("--tokens", "1,4,8")} == {
        (1, 1, 16), (1, 64, 16), (1, 256, 16), (4, 1, 32), (4, 64, 64), (4, 256, 64), (8, 1, 32), (8, 64, 64),
        (8, 256, 64)
    }  # fmt: skip
    assert {(s.T, s.ring_len) for s in plan("--tokens", "1,8", "--ring-len", "8")} == {(1, 8), (8, 16)}  # >= 2T
    swept = plan("--tokens", "4", "--sweep-ring")
    # the main rows' length (32 at B = 1, 64 above) is not swept again
    assert {(s.B, s.ring_len) for s in swept if s.sweep == "ring_len"} == {
        (1, 16), (1, 64), (1, 128), (64, 16), (64, 32), (64, 128), (256, 16), (256, 32), (256, 128)
    }  # fmt: skip
    # coalesced flushes by default, half of each ring (default_flush_join); `--coalesce-flushes 0` turns them off
    for argv in [(), ("--coalesce-flushes",), ("--coalesce-flushes", "0.5")]:
        assert {(s.ring_len, s.flush_join) for s in plan("--tokens", "4", "--sweep-ring", *argv)
                if s.design == "replayssm"} == {(16, 8), (32, 16), (64, 32), (128, 64)}  # fmt: skip
    assert {s.flush_join for s in plan("--tokens", "4", "--sweep-ring", "--coalesce-flushes", "0")} == {0}
    assert {(s.ring_len, s.flush_join) for s in plan("--tokens", "1,4", "--coalesce-flushes", "0.25")
            if s.design == "replayssm"} == {(16, 4), (32, 8), (64, 16)}  # fmt: skip
    tiny_fraction = plan("--tokens", "4", "--ring-len", "8", "--coalesce-flushes", "0.01")
    assert {s.flush_join for s in tiny_fraction if s.design == "replayssm"} == {1}  # at least one record

    # the sweep runs at the grid's batch sizes among 1 / 64 / 256, else at the grid's own, so every swept
    # cell has a main row to compare with
    def swept_batch_sizes(*argv: str) -> set[int]:
        return {s.B for s in plan("--tokens", "4", "--sweep-ring", *argv) if s.sweep == "ring_len"}

    assert swept_batch_sizes() == {1, 64, 256}
    assert swept_batch_sizes("--batch-sizes", "64,128") == {64}
    assert swept_batch_sizes("--batch-sizes", "8,32") == {8, 32}


def _parts(T: int, **kwargs: object) -> tuple[int, list[dict]]:
    from gdn_replayssm import bench_parts

    rows: list[dict] = []
    failed = bench_parts.parts(
        2, T, 4 * T, 1000.0, rows.append, g=TINY, device="cpu", max_layers=1,
        window_variants=[("default", {})], flush_variants=[("default", {})], flush_tiles=[("default", {})],
        baseline_tiles=[(16, 1, False)],
        **kwargs,
    )  # fmt: skip
    return failed, rows


@pytest.mark.parametrize("T", [1, 4])
def test_bench_parts_times_every_launch_after_its_check(T: int) -> None:
    """Each part is checked against the reference before it is timed; the pinned cursors put every row on
    the path the part names (window: no flush, flush: all flush, mixed10: both)."""
    require_device("cpu")
    failed, rows = _parts(T)
    assert failed == 0
    parts = [r["part"] for r in rows]
    assert parts.count("window") == 2  # the variant and the fused kernel
    assert parts.count("flush") == 2
    assert [r["variant"] for r in rows if r["part"] == "mixed10"] == [  # the side streams' modes are CUDA only
        "fused (non-flush kernel)", "split default", "split persistent default", "deferred default",
        "deferred persistent default",
    ]  # fmt: skip
    assert {"flush_idle", "window_idle", "baseline"} <= set(parts)
    for r in rows:
        assert r["us"] > 0
        assert r["check_rel_err"] < 2e-2
        L = r["ring_len"]
        if r["part"] in ("window", "flush_idle"):
            assert r["wp"] + 2 * T <= L
        if r["part"] in ("flush", "window_idle"):
            assert r["wp"] + 2 * T > L


def test_bench_parts_window_wp_pins_the_non_flush_history() -> None:
    """`window_wp` puts the non-flush rows at that history length (checked against the reference like any other
    pin); one past the longest non-flush history is refused, since such a row would flush."""
    require_device("cpu")
    failed, rows = _parts(1, window_wp=0, only={"window"}, variants={"default"})
    assert failed == 0
    assert [(r["part"], r["wp"]) for r in rows] == [("window", 0)]
    with pytest.raises(ValueError, match=r"window_wp must be in 0\.\.2"):
        _parts(1, window_wp=3, only={"window"})


def test_bench_parts_plans_each_case_at_its_ring_length(capsys: pytest.CaptureFixture[str]) -> None:
    """The command line's cases: each (T, B) at `default_ring_len(T, max_batch=B)` (or `--ring-len`), and a
    pinned history a non-flush row cannot have at that length skipped with a note, not refused."""
    from gdn_replayssm import bench_parts
    from gdn_replayssm.ring import default_ring_len

    argv = ["--tokens", "1,4", "--batch-sizes", "1,64", "--window-wp", "0,24"]
    cases = list(bench_parts.planned_cases(bench_parts._parser().parse_args(argv)))
    rings = {(T, B): default_ring_len(T, max_batch=B) for T in (1, 4) for B in (1, 64)}
    assert rings[4, 1] != rings[4, 64]  # the batch size matters at T = 4
    expected = [(T, B, rings[T, B], wp) for T in (1, 4) for B in (1, 64) for wp in (0, 24)]
    assert cases == [c for c in expected if c[3] <= c[2] - 2 * c[0]]
    assert (4, 1, rings[4, 1], 24) in cases  # 24 fits a ring of 32 at T = 4
    assert "--window-wp 24: skipped for T=1, B=1" in capsys.readouterr().err
    fixed = bench_parts._parser().parse_args(["--tokens", "4", "--batch-sizes", "1,64", "--ring-len", "16"])
    assert list(bench_parts.planned_cases(fixed)) == [(4, 1, 16, None), (4, 64, 16, None)]


def test_bench_parts_eager_runs_the_named_launches_and_times_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """`--eager` (for a profiler): the kept variants run after their check, nothing is timed or emitted."""
    require_device("cpu")
    failed, rows = _parts(1, variants={"default"}, eager=2, only={"window", "flush"})
    assert failed == 0
    assert rows == []
    err = capsys.readouterr().err
    assert "# eager window default T=1 B=2: 2 launches, not timed" in err
    assert "# eager flush default T=1 B=2: 2 launches, not timed" in err
    assert "fused" not in err


@pytest.mark.parametrize("T", [1, 4])
def test_bench_parts_step_modes_defer_the_fold_as_named(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mixed10 modes set the fold themselves, whatever `_replay.deferred_fold` would choose: "split" folds
    in line, "deferred" hands the flush launch the fold-only work (and both still pass their checks)."""
    require_device("cpu")
    from gdn_replayssm import _replay

    flush = _replay.launch_flush
    calls: list[bool] = []

    def spy(args: list[object], **kw: Any) -> None:
        calls.append(kw.get("defer", False))
        flush(args, **kw)

    monkeypatch.setattr(_replay, "launch_flush", spy)
    for variant, defer in (("split default", False), ("deferred default", True)):
        calls.clear()
        failed, rows = _parts(T, only={"mixed10"}, variants={variant})
        assert failed == 0 and [r["variant"] for r in rows] == [variant]
        assert calls and set(calls) == {defer}, (variant, calls)


def test_bench_parts_prints_nothing_for_a_launch_that_fails_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    require_device("cpu")
    from gdn_replayssm import _replay, bench_parts

    for module in (bench_parts, _replay):  # outputs never written
        monkeypatch.setattr(module, "launch_window", lambda args, **kw: None)
    failed, rows = _parts(4, only={"window", "mixed10", "flush"})
    # every launch through the non-flush launcher fails: the window variant, the fused kernel as flush and as
    # window, and the five mixed10 launches; the flush kernel alone is still right and is the only row
    assert failed == 8
    assert [(r["part"], r["variant"]) for r in rows] == [("flush", "default")]


def test_bench_flags_set_their_module_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each A/B flag sets the `_replay` switch it names, and nothing is set without the flags."""
    from gdn_replayssm import _replay, bench

    switches = [switch for _, switch, _ in bench.FLAG_SWITCHES] + [switch for _, switch in bench.VALUE_SWITCHES]
    for switch in [*switches, "STEP_FOLD_DECODE_BATCHES", "STEP_FOLD_VERIFY_BATCHES"]:  # restored after the test
        monkeypatch.setattr(_replay, switch, getattr(_replay, switch))
    monkeypatch.setattr(bench, "STEP_FOLD", bench.STEP_FOLD)
    before = {switch: getattr(_replay, switch) for switch in switches}
    bench._use_switches(bench._parser().parse_args([]))
    assert {switch: getattr(_replay, switch) for switch in switches} == before
    assert bench.STEP_FOLD is True
    batches = _replay.STEP_FOLD_DECODE_BATCHES, _replay.STEP_FOLD_VERIFY_BATCHES
    assert batches == (range(1, 9), range(2, 33))
    argv = ["--fused-flush", "--no-concurrent-flush", "--no-persistent-flush", "--no-window-raw-key-dots",
            "--no-flush-normalised-keys", "--decode-first-chunk", "0", "--persistent-max-registers", "168",
            "--flush-small-tile-max-batch", "4", "--decode-history-block", "8", "--persistent-rows-per-sm", "64",
            "--flush-stream-priority", "0", "--no-window-history-gram-norms", "--no-window-key-products",
            "--wide-window-key-products", "--window-stages", "2", "--window-in-kernel-max-batch", "0",
            "--no-window-in-kernel-bf16-state", "--window-in-kernel-stages", "3", "--wide-window-min-batch", "12",
            "--no-wide-window-in-kernel-bf16-state", "--wide-window-in-kernel-stages", "4",
            "--wide-window-in-kernel-block-k", "16",
            "--no-flush-normalised-window", "--no-wide-window", "--decode-max-registers", "128",
            "--preload-decode-block-v", "16", "--small-window-block-v", "16", "--preload-decode-warps", "2",
            "--small-window-warps", "1", "--small-batch", "8", "--preload-decode-max-batch", "64", "--deferred-fold",
            "--deferred-fold-streams", "2", "--step-fold-block-v", "8", "--no-step-fold",
            "--step-fold-max-batch", "4", "--no-paired-state", "--key-head-decode-min-batch", "32",
            "--key-head-decode-block-v", "32", "--key-head-decode-warps", "8",
            "--key-head-decode-min-history-block", "16", "--key-head-decode-k-chunk", "16", "--decode-k-chunk", "32",
            "--key-head-decode-fused-history",
            "--no-key-head-decode-prefetch", "--no-key-head-decode-tma", "--no-key-head-decode-late-norms",
            "--no-window-query-columns", "--window-early-gates", "--no-window-raw-state-dot",
            "--key-head-decode-stages", "3", "--key-head-decode-stages-min-batch", "8",
            "--decode-fold-max-registers", "0", "--listed-folds", "--listed-fold-max-registers", "0"]  # fmt: skip
    bench._use_switches(bench._parser().parse_args(argv))
    assert bench.STEP_FOLD is False
    assert _replay.STEP_FOLD_DECODE_BATCHES == _replay.STEP_FOLD_VERIFY_BATCHES == range(1, 5)
    assert {switch: getattr(_replay, switch) for switch in switches} == {
        "FUSED_FLUSH": True,
        "CONCURRENT_FLUSH": False,
        "PERSISTENT_FLUSH": False,
        "WINDOW_RAW_KEY_DOTS": False,
        "FLUSH_NORMALISED_KEYS": False,
        "PERSISTENT_MAX_REGISTERS": 168,
        "DECODE_MAX_REGISTERS": 128,
        "FLUSH_SMALL_TILE_MAX_BATCH": 4,
        "DECODE_HISTORY_BLOCK": 8,
        "DECODE_FIRST_CHUNK": 0,
        "PERSISTENT_ROWS_PER_SM": 64,
        "FLUSH_STREAM_PRIORITY": 0,
        "WINDOW_HISTORY_GRAM_NORMS": False,
        "WINDOW_KEY_PRODUCTS": False,
        "WIDE_WINDOW_KEY_PRODUCTS": True,
        "WINDOW_STAGES": 2,
        "WINDOW_IN_KERNEL_MAX_BATCH": 0,
        "NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH": 0,
        "WINDOW_IN_KERNEL_STATES": (torch.float32,),
        "WINDOW_IN_KERNEL_STAGES": 3,
        "NARROW_STATE_WINDOW_IN_KERNEL_STAGES": 3,
        "WIDE_WINDOW_MIN_BATCH": 12,
        "WIDE_WINDOW_IN_KERNEL_STATES": (torch.float32,),
        "WIDE_WINDOW_IN_KERNEL_STAGES": 4,
        "NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES": 4,
        "WIDE_WINDOW_IN_KERNEL_BLOCK_K": 16,
        "FLUSH_NORMALISED_WINDOW": False,
        "WIDE_WINDOW_TOKENS": (),
        "WINDOW_QUERY_COLUMNS": "never",
        "WINDOW_EARLY_GATES": "always",
        "WINDOW_RAW_STATE_DOT": False,
        "PRELOAD_DECODE_BLOCK_V": 16,
        "SMALL_WINDOW_BLOCK_V": 16,
        "PRELOAD_DECODE_WARPS": 2,
        "SMALL_WINDOW_WARPS": 1,
        "SMALL_BATCH": 8,
        "PRELOAD_DECODE_MAX_BATCH": 64,
        "DEFERRED_FOLD": "always",
        "DEFERRED_FOLD_STREAMS": 2,
        "STEP_FOLD_BLOCK_V": 8,
        "PAIRED_STATE": False,
        "KEY_HEAD_DECODE_MIN_BATCH": 32,
        "NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH": 32,
        "KEY_HEAD_DECODE_BLOCK_V": 32,
        "KEY_HEAD_DECODE_WARPS": 8,
        "KEY_HEAD_DECODE_K_CHUNK": 16,
        "KEY_HEAD_DECODE_MIN_HISTORY_BLOCK": 16,
        "DECODE_K_CHUNK": 32,
        "KEY_HEAD_DECODE_FUSED_HISTORY": True,
        "KEY_HEAD_DECODE_PREFETCH": False,
        "KEY_HEAD_DECODE_TMA": False,
        "KEY_HEAD_DECODE_LATE_NORMS": "never",
        "KEY_HEAD_DECODE_STAGES": 3,
        "KEY_HEAD_DECODE_STAGES_MIN_BATCH": 8,
        "DECODE_FOLD_MAX_REGISTERS": 0,
        "LISTED_FOLDS": "always",
        "LISTED_FOLD_MAX_REGISTERS": 0,
    }
    bench._use_switches(bench._parser().parse_args(["--no-deferred-fold"]))
    assert not any(_replay.deferred_fold(T, B) for T in range(1, 9) for B in (1, 2, 256))
    with pytest.raises(SystemExit):  # argparse: the two are exclusive
        bench._parser().parse_args(["--deferred-fold", "--no-deferred-fold"])
    bench._use_switches(bench._parser().parse_args(["--window-query-columns"]))
    assert all(_replay.window_query_columns(T, preload) for T in (2, 4, 8) for preload in (False, True))
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["--window-query-columns", "--no-window-query-columns"])
    bench._use_switches(bench._parser().parse_args(["--no-listed-folds"]))
    assert not any(_replay.listed_fold(T, defer) for T in (1, 4) for defer in (False, True))
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["--listed-folds", "--no-listed-folds"])
    bench._use_switches(bench._parser().parse_args(["--key-head-decode-prefetch"]))  # back on after the `--no-`
    assert _replay.KEY_HEAD_DECODE_PREFETCH is True
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["--key-head-decode-prefetch", "--no-key-head-decode-prefetch"])
    bench._use_switches(bench._parser().parse_args(["--key-head-decode-tma"]))
    assert _replay.KEY_HEAD_DECODE_TMA is True
    bench._use_switches(bench._parser().parse_args(["--key-head-decode-late-norms"]))
    assert _replay.key_head_decode_late_norms(torch.float32)
    with pytest.raises(SystemExit):
        bench._parser().parse_args(["--key-head-decode-late-norms", "--no-key-head-decode-late-norms"])


def test_only_a_decode_steps_in_line_fold_is_listed_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`listed_fold`: by default a decode step's in-line fold reads its rows from a list (H200 run 31a: B = 256
    193.7 -> 189.9 us); deferred folds and verify steps scan the batch (run 30d: verify T = 4 2 % slower listed);
    "always" and "never" override."""
    from gdn_replayssm import _replay

    assert _replay.LISTED_FOLDS == "auto"
    assert _replay.listed_fold(1, False)
    assert not any(_replay.listed_fold(T, defer) for T, defer in ((1, True), (4, False), (4, True), (8, True)))
    monkeypatch.setattr(_replay, "LISTED_FOLDS", "always")
    assert all(_replay.listed_fold(T, defer) for T in (1, 4) for defer in (False, True))


def test_persistent_grid_follows_the_register_cap() -> None:
    """Without a cap the persistent flush grid holds `PERSISTENT_ROWS_PER_SM` rows per SM; under a cap, as many
    programs as the register file holds at that cap (allocated per thread in steps of 8)."""
    from gdn_replayssm import _replay

    rows = _replay.PERSISTENT_ROWS_PER_SM
    assert _replay.persistent_programs_per_sm(16, 1, None) == rows // 16
    assert _replay.persistent_programs_per_sm(8, 1, None) == rows // 8
    assert _replay.persistent_programs_per_sm(16, 1, 168) == 12  # 65536 // (168 * 32)
    assert _replay.persistent_programs_per_sm(16, 1, 200) == 10
    assert _replay.persistent_programs_per_sm(16, 1, 197) == 10  # 197 registers are allocated as 200
    assert _replay.persistent_programs_per_sm(16, 2, 128) == 8
    assert _replay.persistent_programs_per_sm(16, 8, 255) == 1


def test_decode_steps_cap_their_in_line_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """`persistent_max_registers`: a decode step's in-line persistent fold on CUDA is capped at
    `DECODE_FOLD_MAX_REGISTERS` (168: 12 one-warp programs per SM instead of 8, H200 run 28i); deferred folds,
    verify steps and other devices are not (no `maxnreg` off CUDA); `PERSISTENT_MAX_REGISTERS` wins when set."""
    from gdn_replayssm import _replay

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert _replay.DECODE_FOLD_MAX_REGISTERS == 168
    assert _replay.persistent_max_registers(1, False, cuda) == 168
    assert _replay.persistent_programs_per_sm(16, 1, 168) == 12
    assert _replay.persistent_max_registers(1, True, cuda) is None
    assert _replay.persistent_max_registers(4, False, cuda) is None
    assert _replay.persistent_max_registers(1, False, cpu) is None
    # a listed fold (`LISTED_FOLDS`) that would run uncapped takes `LISTED_FOLD_MAX_REGISTERS` on CUDA: 10 per SM
    assert _replay.persistent_max_registers(4, True, cuda, listed=True) == 200
    assert _replay.persistent_programs_per_sm(16, 1, 200) == 10
    assert _replay.persistent_max_registers(1, True, cuda, listed=True) == 200
    assert _replay.persistent_max_registers(1, False, cuda, listed=True) == 168  # the decode fold keeps its cap
    assert _replay.persistent_max_registers(4, True, cpu, listed=True) is None
    monkeypatch.setattr(_replay, "LISTED_FOLD_MAX_REGISTERS", 0)  # --listed-fold-max-registers 0: none
    assert _replay.persistent_max_registers(4, True, cuda, listed=True) is None
    monkeypatch.setattr(_replay, "PERSISTENT_MAX_REGISTERS", 200)
    assert _replay.persistent_max_registers(1, False, cuda) == 200
    assert _replay.persistent_max_registers(4, True, cpu) == 200
    monkeypatch.setattr(_replay, "PERSISTENT_MAX_REGISTERS", None)


def test_register_caps_are_nvidia_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`maxnreg` is an option of NVIDIA's backend alone: a ROCm build of torch also names its devices "cuda", and
    there no launch takes a cap (Triton's AMD backend would refuse the keyword)."""
    from gdn_replayssm import _replay

    cuda = torch.device("cuda")
    assert _replay.register_caps(cuda) and not _replay.register_caps(torch.device("xpu"))
    assert _replay.decode_max_registers(cuda) == _replay.DECODE_MAX_REGISTERS
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not _replay.register_caps(cuda)
    assert _replay.decode_max_registers(cuda) is None
    assert _replay.persistent_max_registers(1, False, cuda) is None
    assert _replay.persistent_max_registers(4, True, cuda, listed=True) is None
    monkeypatch.setattr(_replay, "DECODE_FOLD_MAX_REGISTERS", 0)  # bench --decode-fold-max-registers 0
    assert _replay.persistent_max_registers(1, False, cuda) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--state-dtypes", "fp64"], "unknown state dtype fp64: use fp32 and/or bf16"),
        (["--tokens", "0,4"], "--tokens: [0] outside 1..8"),
        (["--batch-sizes", "x"], "'x' is not a comma list of integers"),
        (["--persistent-max-registers", "16"], "--persistent-max-registers: [16] outside 32..255"),
        (["--persistent-max-registers", "128,168"], "'128,168': one integer, not a list"),
        (["--starts", "lockstep,random"], "unknown start random: use lockstep and/or staggered"),
        (["--folds", "exact,closed"], "unknown fold closed: use exact and/or open_loop"),
        (["--preload-decode-max-batch", "-1"], "--preload-decode-max-batch: [-1] outside 0..4096"),
        (["--exact-sums", "float32"], "argument --exact-sums: invalid choice: 'float32'"),
        (["--decode-history-block", "12"], "--decode-history-block: 12: must be a power of two"),
        (["--decode-first-chunk", "6"], "--decode-first-chunk: 6: must be a power of two"),
        (["--decode-history-block", "256"], "--decode-history-block: [256] outside 1..128"),
        (["--shard", "3/3"], "'3/3': K must be in 0..N-1"),
        (["--shard", "2"], "'2': use K/N"),
        (["--max-seconds", "0"], "--max-seconds: '0': must be above 0"),
        (["--coalesce-flushes", "1.5"], "--coalesce-flushes: '1.5': must be at least 0 and at most 1"),
        (["--max-seconds", "soon"], "--max-seconds: 'soon': a number of seconds"),
    ],
)
def test_bench_cli_names_the_bad_option(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gdn_replayssm.bench import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_sigterm_ends_the_run_after_the_case_in_progress() -> None:
    """`timeout` ends a run with SIGTERM: the case it arrived in still finishes and is emitted, the rest count
    as not run, no exception is raised inside a case, and the previous SIGTERM handler is back afterwards."""
    from gdn_replayssm import bench

    emitted: list[dict[str, Any]] = []
    reached: list[str] = []

    def run_one(spec: str) -> dict[str, Any] | None:
        reached.append(spec)
        if spec == "third":
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after the signal")
        return None if spec == "second" else {"case": spec}

    before = signal.getsignal(signal.SIGTERM)
    rows, failed, not_run = bench.run_plan(["first", "second", "third", "fourth"], run_one, emitted.append)
    assert rows == emitted == [{"case": "first"}, {"case": "third"}]
    assert (failed, not_run) == (1, 1)
    assert reached == ["first", "second", "third", "after the signal"]
    assert signal.getsignal(signal.SIGTERM) is before
    assert bench.run_plan(["first"], run_one, emitted.append) == ([{"case": "first"}], 0, 0)


_PLAN_THAT_COMPILES = """
import ctypes, json, signal, sys
from gdn_replayssm import bench, sm90_report

libc = ctypes.CDLL(None)


def sigterm_handler_address():
    action = ctypes.create_string_buffer(256)  # a struct sigaction; its first member is the handler
    libc.sigaction(signal.SIGTERM, None, action)
    return int.from_bytes(action.raw[:8], sys.byteorder)


seen = {}


def run_one(spec):
    seen[spec] = sigterm_handler_address()
    if spec == "compiles":
        sm90_report.compile_sm90(sm90_report.builds()[0])
        seen["after the compile"] = sigterm_handler_address()
    return {"case": spec}


bench.run_plan(["compiles", "next"], run_one, lambda row: None)
print(json.dumps(seen))
"""


def test_the_flag_takes_sigterm_back_from_the_compiler_before_the_next_case(tmp_path: Path) -> None:
    """Triton's first compile in a process installs LLVM's SIGTERM handler, which lets a second SIGTERM kill
    the run; the next case starts with the flag's handler installed again. A fresh process and an empty Triton
    cache, so the compile really runs."""
    from triton.backends import nvidia

    if not (Path(nvidia.__file__).parent / "bin" / "ptxas").exists():
        pytest.skip("this Triton install has no NVIDIA backend binaries")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2] / "kernels"), TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _PLAN_THAT_COMPILES], capture_output=True, text=True, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    if seen["after the compile"] == seen["compiles"]:
        pytest.skip("this Triton's compiler installs no SIGTERM handler")
    assert seen["next"] == seen["compiles"]


def test_time_budget_ends_the_run_after_the_case_that_used_it_up() -> None:
    """`--max-seconds`: once the budget is spent no case starts; the case that spent it is still emitted."""
    from gdn_replayssm import bench

    clock = [0.0]

    def run_one(spec: float) -> dict[str, Any] | None:
        clock[0] += spec
        return {"took": spec}

    emitted: list[dict[str, Any]] = []
    rows, failed, not_run = bench.run_plan([4.0, 4.0, 4.0, 4.0], run_one, emitted.append, lambda: clock[0] > 6.0)
    assert rows == emitted == [{"took": 4.0}, {"took": 4.0}]
    assert (failed, not_run, clock[0]) == (0, 2, 8.0)


def test_shards_split_the_plan_and_keep_each_baseline_with_its_cases() -> None:
    """`--shard K/N` shards partition the plan, and a shard holds every ReplaySSM case (starts, swept ring
    lengths) of each baseline it runs, so every ratio and ring comparison comes from one run."""
    from gdn_replayssm import bench

    argv = ["--quick", "--tokens", "1,4", "--sweep-ring", "--starts", "lockstep,staggered"]
    specs = bench.plan(bench.resolve_defaults(bench._parser().parse_args(argv)))
    shards = [bench.shard(specs, k, 4) for k in range(4)]
    assert sorted(map(repr, (s for part in shards for s in part))) == sorted(map(repr, specs))
    assert all(shards)
    for part in shards:
        cells = {(s.state, s.T, s.pattern, s.B) for s in part}
        assert cells == {(s.state, s.T, s.pattern, s.B) for s in part if s.design == "baseline"}
        assert all(s in part for s in specs if (s.state, s.T, s.pattern, s.B) in cells)


def test_summarize_merges_the_shards_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--summarize` measures nothing: it reads the shards' JSON lines (skipping other lines) and writes one
    table with every run's source and command, its rows in the plan's order whatever the files' order; a
    missing file is named."""
    from gdn_replayssm import bench

    def case(design: str, us: float, src: str, B: int = 64) -> str:
        return json.dumps({
            "design": design, "fold": "exact" if design == "replayssm" else None, "B": B, "T": 4,
            "state_dtype": "fp32", "acceptance": "all", "us": us, "GBps": 4000.0, "frac_copy": 0.5,
            "flush_frac": 0.1, "ring_len": 64, "sweep": "main", "gpu": "H200", "copy_GBps": 4400.0,
            "src_sha256": src, "start": "lockstep" if design == "replayssm" else None,
        })  # fmt: skip

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"

    def identity(shard: str) -> str:
        return json.dumps({"kind": "identity", "argv": ["--shard", shard]})

    first.write_text(identity("0/2") + "\n" + case("baseline", 300.0, "s1") + "\n" + case("replayssm", 100.0, "s1"))
    second.write_text("not json\n" + identity("1/2") + "\n" + case("baseline", 40.0, "s2", B=8) + "\n"
                      + case("replayssm", 20.0, "s2", B=8) + "\n")  # fmt: skip
    out = tmp_path / "merged.jsonl"
    assert bench.main(["--summarize", str(first), str(second), "--out", str(out)]) == 0
    table = out.with_suffix(".md").read_text()
    assert "  3.00 " in table and "src=s1,s2" in table and "# 4 cases from 2 files" in table
    assert table.index("  2.00 ") < table.index("  3.00 ")  # B = 8 before B = 64
    assert "bench --shard 0/2" in table and "bench --shard 1/2" in table
    assert table.strip() == capsys.readouterr().out.strip()
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--summarize", str(tmp_path / "missing.jsonl")])
    assert exit_info.value.code == 2
    assert "--summarize: no such file: " in capsys.readouterr().err
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe")
    with pytest.raises(SystemExit):
        bench.main(["--summarize", str(tmp_path / "binary.jsonl")])
    assert "--summarize: cannot read the JSON lines" in capsys.readouterr().err


def test_summarize_at_defaults_takes_each_cell_from_the_last_run_at_the_default_ring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--summarize --at-defaults`: a grid timed at older ring lengths and a later run at today's default
    (decode, B = 64: `default_ring_len(1) = 16`) make one table whose ratio pairs the later run's ReplaySSM row
    with the later run's baseline; the grid's row at the old length stays for the ring choice. A cell no run
    timed at the default keeps its rows. `--at-defaults` alone is refused."""
    from gdn_replayssm import bench

    def case(design: str, us: float, *, T: int = 1, L: int | None = None, sweep: str = "main") -> dict[str, Any]:
        return {
            "design": design, "fold": "exact" if design == "replayssm" else None, "B": 64, "T": T,
            "state_dtype": "fp32", "acceptance": "all", "us": us, "GBps": 4000.0, "frac_copy": 0.5,
            "flush_frac": 0.1, "ring_len": L, "sweep": sweep, "start": "lockstep" if L else None,
        }  # fmt: skip

    grid = [case("baseline", 80.0), case("replayssm", 100.0, L=32), case("baseline", 200.0, T=2),
            case("replayssm", 100.0, T=2, L=128)]  # fmt: skip
    later = [case("baseline", 72.0), case("replayssm", 90.0, L=16)]
    old, new = _bench_file(tmp_path / "grid.jsonl", grid, []), _bench_file(tmp_path / "later.jsonl", later, [])
    rows = bench.rows_at_defaults([grid, later])
    main = sorted((r["design"], r["T"], r["us"]) for r in rows if r["sweep"] == "main")
    assert main == [("baseline", 1, 72.0), ("baseline", 2, 200.0), ("replayssm", 1, 90.0), ("replayssm", 2, 100.0)]
    assert [(r["ring_len"], r["us"]) for r in rows if r["sweep"] == "ring_len"] == [(32, 100.0)]
    assert bench.main(["--summarize", str(old), str(new), "--at-defaults"]) == 0
    table = capsys.readouterr().out
    assert "    72.0      90.0   0.80 " in table and "   200.0     100.0   2.00 " in table
    assert "suggested ring length for T=1, B > 8: 16 (default_ring_len: 16)" in table
    with pytest.raises(SystemExit):
        bench.main(["--at-defaults"])
    assert "--at-defaults: only with --summarize" in capsys.readouterr().err


def _bench_file(path: Path, rows: list[dict[str, Any]], argv: list[str]) -> Path:
    """A `bench --out` file: the identity line, then the rows."""
    identity = {"kind": "identity", "src_sha256": "abc", "gpu": "H200", "argv": argv}
    path.write_text("\n".join(json.dumps(r) for r in [identity, *rows]) + "\n")
    return path


def _case(design: str, B: int, us: float, **extra: Any) -> dict[str, Any]:
    replay = design == "replayssm"
    return {
        "design": design, "state_dtype": "fp32", "acceptance": "all", "T": 4, "B": B, "us": us,
        "fold": "exact" if replay else None, "ring_len": 64 if replay else None, "sweep": "main",
        "start": "lockstep" if replay else None, **extra,
    }  # fmt: skip


def test_compare_matches_the_cells_both_runs_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Cells match on the case, not the switches; each shows both times and the change, the baseline's change
    is reported as the runs' noise, and cells only one run timed are counted, not shown."""
    from gdn_replayssm import bench_compare

    a = _bench_file(tmp_path / "a.jsonl", [
        _case("baseline", 64, 300.0), _case("replayssm", 64, 100.0, deferred_fold=False),
        _case("replayssm", 64, 150.0, start="staggered"), _case("replayssm", 64, 120.0, ring_len=16, sweep="ring_len"),
    ], ["--quick"])  # fmt: skip
    b = _bench_file(tmp_path / "b.jsonl", [
        _case("baseline", 64, 303.0), _case("replayssm", 64, 90.0, deferred_fold=True), _case("replayssm", 8, 30.0),
    ], ["--quick", "--deferred-fold"])  # fmt: skip
    assert bench_compare.main([str(a), str(b), "--out", str(tmp_path / "ab.txt")]) == 0
    text = capsys.readouterr().out
    table = [line.split() for line in text.splitlines() if not line.startswith("#")][1:]
    assert table == [
        ["baseline", "fp32", "all", "-", "4", "64", "-", "300.0", "303.0", "+1.0%"],
        ["replayssm", "fp32", "all", "lockstep", "4", "64", "64", "100.0", "90.0", "-10.0%"],
    ]
    assert "# 2 cells in both runs, 2 only in A, 1 only in B" in text
    assert "# baseline change (run-to-run noise): +1.0% .. +1.0% over 1 cells" in text
    assert "command: bench --quick --deferred-fold" in text
    assert (tmp_path / "ab.txt").read_text() == text


def test_compare_refuses_what_it_cannot_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file, a file without rows and a file with one case twice (merged runs) each end with a
    message that names the side and the problem, and exit status 2; no traceback."""
    from gdn_replayssm import bench_compare

    good = _bench_file(tmp_path / "good.jsonl", [_case("baseline", 64, 300.0)], [])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json\n")
    twice = _bench_file(tmp_path / "twice.jsonl", [_case("baseline", 64, 300.0), _case("baseline", 64, 301.0)], [])
    for argv, message in [
        ([str(tmp_path / "none.jsonl"), str(good)], "A: no such file"),
        ([str(good), str(empty)], "B: no benchmark rows"),
        ([str(twice), str(good)], "A: two rows for one case"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            bench_compare.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def _event(name: str, stream: int, ts: float, dur: float, cat: str = "kernel") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_trace_summary_counts_overlap_once_and_idle_between_launches() -> None:
    """Two layer-steps: a main stream with gaps and a side-stream kernel under one of its kernels."""
    from gdn_replayssm.bench_trace import format_summary, kernels_of, trace_summary

    trace = {
        "traceEvents": [
            _event("_decode_kernel", 7, 0.0, 4.0),
            _event("_flush_kernel", 9, 1.0, 10.0),  # overlaps the decode kernel and the gap after it
            _event("_decode_kernel", 7, 12.0, 4.0),
            _event("Memset (Device)", 7, 17.0, 1.0, cat="gpu_memset"),
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.0, "dur": 30.0},  # host side
            {"ph": "i", "cat": "kernel", "name": "marker", "ts": 3.0},
        ]
    }
    kernels = kernels_of(trace)
    assert [k.name for k in kernels] == ["_decode_kernel", "_flush_kernel", "_decode_kernel", "Memset (Device)"]
    summary = trace_summary(kernels, layer_steps=2)
    assert summary["span_us"] == 9.0  # 0 .. 18
    assert summary["busy_us"] == 8.0  # 0 .. 11, 12 .. 16, 17 .. 18
    assert summary["idle_us"] == 1.0
    assert summary["streams"] == 2
    assert summary["by_kernel"]["_flush_kernel"] == {"launches": 0.5, "us": 5.0, "mean_us": 10.0}
    assert summary["by_kernel"]["_decode_kernel"]["us"] == 4.0
    text = format_summary("decode B=1", summary)
    assert "9.00 us span" in text and "1.00 us idle" in text and "_flush_kernel: 0.50 launches" in text


def test_trace_of_a_run_without_kernels_says_so() -> None:
    """The real profiler path on a machine whose run launches no device work."""
    from gdn_replayssm.bench_trace import format_summary, profile_kernels, short_name, trace_summary

    kernels = profile_kernels(lambda: torch.ones(4).sum(), lambda: None)
    summary = trace_summary(kernels, layer_steps=4)
    if torch.cuda.is_available():
        assert summary["kernels"] >= 1
    else:
        assert summary == {"kernels": 0}
        assert "recorded no kernel" in format_summary("x", summary)
    name = "void at::native::vectorized_elementwise_kernel<4, Fn>(int, Fn)"
    assert short_name(name) == "vectorized_elementwise_kernel"


@pytest.mark.parametrize("T", [1, 2])
def test_run_case_with_a_step_fold_checks_and_reports_it(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step fold (the default; `--no-step-fold` turns it off): the case's layers leave their folds to
    `replayssm_fold` (checked against the reference across flushes, with its one layer registered), and the row
    says so; the summary's defer cell reads "step"."""
    from gdn_replayssm import _replay, bench

    require_device("cpu")
    monkeypatch.setattr(bench, "STEP_FOLD", True)
    monkeypatch.setattr(_replay, "STEP_FOLD_DECODE_BATCHES", range(1, 3))
    monkeypatch.setattr(_replay, "STEP_FOLD_VERIFY_BATCHES", range(1, 3))
    spec = Spec("replayssm", B=2, T=T, state="fp32", pattern="mixed", ring_len=3 * T, geo=TINY)
    config = default_tile(head_v_dim=TINY.V, device=torch.device("cpu"))
    row = run_case(spec, config, 1000.0, {"gpu": "cpu"}, device="cpu", max_layers=2, steps=4)
    assert row is not None and row["check_rel_err"] < 2e-2
    assert row["step_fold"] is True and 0 < row["flush_frac"] < 1
    assert bench._deferred(row) == "step"


def _small_stream_geometry(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench_stream` at a geometry the interpreter runs quickly, with tiles that fit it."""
    from gdn_replayssm import bench_stream

    for name, value in {"H": 2, "HV": 4, "K": 16, "V": 16, "TILES": [(8, 1), (16, 2)],
                        "KEY_HEAD_TILES": [(8, 1, 0), (8, 1, 2)]}.items():  # fmt: skip
        monkeypatch.setattr(bench_stream, name, value)


def test_bench_stream_times_every_variant_after_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every state-stream kernel (`bench_stream`: tiles with and without the cursor's branch, key-head loops
    unrolled and staged) takes the two row sums of each row's own, shuffled slot, and is timed once checked."""
    from gdn_replayssm import bench_stream

    _small_stream_geometry(monkeypatch)
    rows: list[dict[str, Any]] = []
    assert bench_stream.measure(3, "cpu", rows.append, read_gbps=0.0) == 0
    names = ["tile 8x1", "tile 8x1 cursor", "tile 16x2", "tile 16x2 cursor", "key head 8x1 s0", "key head 8x1 s2"]
    assert [r["variant"] for r in rows] == names
    assert all(r["B"] == 3 and r["us"] > 0 for r in rows)


def test_bench_stream_prints_nothing_for_a_wrong_variant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A variant whose sums differ from `torch.einsum`'s is reported on stderr and not timed."""
    from gdn_replayssm import bench_stream

    _small_stream_geometry(monkeypatch)
    monkeypatch.setattr(bench_stream, "TILES", [(8, 1)])
    monkeypatch.setattr(bench_stream, "KEY_HEAD_TILES", [])
    monkeypatch.setattr(bench_stream, "expected", lambda t: torch.zeros_like(t["out"]))
    rows: list[dict[str, Any]] = []
    assert bench_stream.measure(2, "cpu", rows.append, read_gbps=0.0) == 2
    assert rows == []
    assert "tile 8x1 B=2: wrong sums, not timed" in capsys.readouterr().err
