"""Triton kernels against the PyTorch reference, and the ReplaySSM flush path against the baseline kernel.

CPU cases run under TRITON_INTERPRET=1 on tiny shapes; `cuda` cases (marker `gpu`) run the same tests at
Qwen3.6 GDN shapes (H=16, HV=32, K=V=128) and odd shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from gdn_replayssm import (
    ReplayCursors,
    ReplayRing,
    flush_due,
    flushing_rows,
    recurrent_step,
    replayssm_commit,
    replayssm_decode,
    replayssm_join,
    replayssm_plan,
    replayssm_reset,
    replayssm_verify,
)
from gdn_replayssm.reference import (
    corrected_values_ref,
    recurrent_ref,
    replayssm_commit_ref,
    replayssm_decode_ref,
    replayssm_plan_ref,
    replayssm_reset_ref,
    replayssm_verify_ref,
)
from gdn_testing import (
    Case,
    LaunchSpy,
    Problem,
    acceptance,
    assert_close,
    assert_untouched,
    make_problem,
    require_device,
)

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TINY = dict(H=1, HV=2, K=16, V=16)

CPU_CASES = [
    Case(B=3, T=1, L=1, **TINY),
    Case(B=3, T=1, L=4, x_dtype=BF16, **TINY),
    Case(B=3, T=1, L=3, fold="open_loop", **TINY),
    Case(B=3, T=1, L=4, x_dtype=BF16, state_dtype=BF16, **TINY),
    Case(B=3, T=2, L=4, **TINY),
    Case(B=3, T=3, L=7, H=1, HV=2, K=12, V=20),
    Case(B=3, T=2, L=5, fold="open_loop", **TINY),
    # bf16 inputs in verify on the small-batch path (B = 2)
    Case(B=2, T=4, L=8, x_dtype=BF16, state_dtype=BF16, **TINY),
    # histories longer than one chunk: the exact fold's 4-record chunks, the open-loop fold's 16-record dots,
    # the decode kernel's 32-record history chunks (L = 40)
    Case(B=2, T=1, L=19, steps=22, **TINY),
    Case(B=2, T=1, L=40, steps=42, **TINY),
    Case(B=2, T=1, L=20, fold="open_loop", steps=22, **TINY),
    Case(B=2, T=2, L=22, steps=14, **TINY),
    # and on the large one (B = 3), whose raw key dots are bf16 x bf16 dots (`interpreter_dots.py` on the CPU)
    Case(B=3, T=4, L=8, x_dtype=BF16, state_dtype=BF16, **TINY),
    Case(B=3, T=3, L=7, x_dtype=BF16, H=1, HV=2, K=12, V=20),
]

QWEN = dict(H=16, HV=32, K=128, V=128)
ODD = dict(H=3, HV=6, K=72, V=40)
GPU_CASES = [
    *(Case(B=B, T=1, L=L, device="cuda", **QWEN) for B, L in [(1, 1), (7, 16), (33, 32)]),
    Case(B=7, T=1, L=16, x_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=1, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=1, L=5, fold="open_loop", device="cuda", **ODD),
    Case(B=33, T=1, L=32, x_dtype=BF16, device="cuda", **ODD),
    *(Case(B=B, T=T, L=L, device="cuda", **QWEN) for B, T, L in [(1, 2, 4), (7, 4, 8), (33, 4, 32), (7, 8, 16)]),
    Case(B=7, T=4, L=32, x_dtype=BF16, device="cuda", **QWEN),
    Case(B=33, T=4, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=8, L=64, x_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=4, L=13, fold="open_loop", device="cuda", **ODD),
    Case(B=33, T=3, L=7, device="cuda", **ODD),
    Case(B=7, T=2, L=9, x_dtype=BF16, fold="open_loop", device="cuda", **ODD),
    # the wide window tile with its keys' side in the kernel at its smallest batch (`_replay.WIDE_WINDOW_MIN_BATCH`)
    Case(B=10, T=4, L=64, x_dtype=BF16, device="cuda", **QWEN),
    # T = 2's 64x2 tile with its keys' side in the kernel (up to `_replay.WINDOW_IN_KERNEL_MAX_BATCH` rows; on a bf16
    # state at `NARROW_STATE_WINDOW_IN_KERNEL_STAGES`)
    Case(B=33, T=2, L=32, device="cuda", **QWEN),
    Case(B=33, T=2, L=32, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
]


def _plain_window_in_kernel_up_to(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """T = 2's 64x2 tile keeps the keys' side in the kernel up to `rows` rows on every state dtype, and takes the
    key products' pre-pass above (0: at every batch size)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "WINDOW_IN_KERNEL_MAX_BATCH", rows)
    monkeypatch.setattr(_replay, "NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH", rows)


def _small_batch_up_to(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Launches of up to `rows` rows take the small-batch path: `SMALL_BATCH`, and the decode's preloading,
    which has its own threshold (`PRELOAD_DECODE_MAX_BATCH`)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "SMALL_BATCH", rows)
    monkeypatch.setattr(_replay, "PRELOAD_DECODE_MAX_BATCH", rows)


def _no_key_head_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode launches take `_decode_kernel` at every batch size and state dtype (no key-head decode)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "KEY_HEAD_DECODE_MIN_BATCH", None)
    monkeypatch.setattr(_replay, "NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH", None)


def _tolerances(case: Case) -> tuple[float, float]:
    """(outputs, state) relative-RMS tolerances: the outputs' tight one needs fp32 inputs and an fp32 state (a bf16
    checkpoint's rounding, which a fold may land on either side of, reaches the next steps' outputs)."""
    fp32_all = case.x_dtype == F32 and (case.u_dtype or case.x_dtype) == F32
    out_tol = 2e-5 if fp32_all and case.state_dtype == F32 else 1.5e-2
    state_exact = case.state_dtype == F32 and (case.fold == "exact" or fp32_all)
    return out_tol, 2e-5 if state_exact else 1.5e-2


def _patterns(case: Case) -> list[str]:
    if case.T == 1:
        return ["all"]
    return ["none", "all", "random"] if case.device == "cuda" or case == CPU_CASES[4] else ["random"]


def _step_kwargs(problem: Problem, inputs: tuple, storage: tuple, out: torch.Tensor) -> dict:
    x, a, b = inputs
    state, ring, cursors = storage
    return dict(
        mixed_qkv=x,
        a=a,
        b=b,
        A_log=problem.A_log,
        dt_bias=problem.dt_bias,
        state=state,
        ring=ring,
        cursors=cursors,
        state_indices=problem.state_indices,
        out=out,
    )


def _assert_ring_close(ref: ReplayRing, got: ReplayRing, live: list[int], tol: float) -> None:
    """Raw records (k, v) are input copies: bit-identical. Computed records (u, g, beta): close, and never
    written where the reference never wrote (the sentinel survives)."""
    idx = torch.tensor(live, dtype=torch.long, device=ref.g.device)
    for name, ref_t in ref.tensors().items():
        r, g = ref_t[idx], got.tensors()[name][idx]
        if name in ("k", "v"):
            assert torch.equal(r, g), f"ring.{name}: raw records differ"
            continue
        unwritten = r.abs() > 1e29
        assert torch.equal(g[unwritten], r[unwritten]), f"ring.{name}: written where the reference did not write"
        assert_close(f"ring.{name}", r[~unwritten], g[~unwritten], tol)


def _assert_committed_records_close(
    ref: ReplayRing, got: ReplayRing, cursors: ReplayCursors, live: list[int], tol: float
) -> None:
    """The records a later step reads, logical `0 .. wp - 1` of each live slot: raw records (k, v)
    bit-identical, computed ones (u, g, beta) close. Records past `wp` are stale and never read."""
    for slot in live:
        wp, base = int(cursors.write_pos[slot]), int(cursors.base[slot])
        rows = torch.tensor([(base + c) % cursors.ring_len for c in range(wp)], dtype=torch.long)
        for name, ref_t in ref.tensors().items():  # [N, heads, L, ...]
            r = ref_t[slot].index_select(1, rows.to(ref_t.device))
            g = got.tensors()[name][slot].index_select(1, rows.to(ref_t.device))
            if name in ("k", "v"):
                assert torch.equal(r, g), f"slot {slot} ring.{name}: raw records differ"
            else:
                assert_close(f"slot {slot} ring.{name}", r, g, tol)


CASE_PATTERNS = [
    pytest.param(c, p, id=f"{c}-{p}", marks=[pytest.mark.gpu] if c.device == "cuda" else [])
    for c in [*CPU_CASES, *GPU_CASES]
    for p in _patterns(c)
]


@pytest.mark.parametrize(("case", "pattern"), CASE_PATTERNS)
def test_replayssm_kernels_match_reference(case: Case, pattern: str) -> None:
    """Multi-step decode / verify + commit against the reference: outputs, checkpoints, rings and cursors,
    across ring wrap and early flush; idle slots stay bit-identical sentinels; no output left unwritten. A
    decode step that defers its fold writes its flush rows' token records, which the reference does not: the
    rings' committed records are compared then."""
    from gdn_replayssm import _replay

    require_device(case.device)
    stale_records = case.T == 1 and _replay.deferred_fold(case.T, case.B)
    problem = make_problem(case)
    ref_state, ref_ring, ref_cursors = problem.clone_storage()
    kernel, reference = (
        (replayssm_decode, replayssm_decode_ref) if case.T == 1 else (replayssm_verify, replayssm_verify_ref)
    )
    out_tol, state_tol = _tolerances(case)
    live = torch.tensor(problem.live, dtype=torch.long, device=case.device)
    flushes = 0
    for step in range(case.num_steps):
        x, a, b = problem.inputs()
        out, ref_out = problem.out(), problem.out()
        flushes += sum(problem.flushing())
        kernel(**_step_kwargs(problem, (x, a, b), (problem.state, problem.ring, problem.cursors), out))
        reference(**_step_kwargs(problem, (x, a, b), (ref_state, ref_ring, ref_cursors), ref_out))
        assert_close(f"step {step} outputs", ref_out, out, out_tol)
        n = None
        if case.T > 1:
            n = acceptance(pattern, B=case.B, T=case.T, generator=problem.generator).to(case.device)
        replayssm_commit(
            cursors=problem.cursors, state_indices=problem.state_indices, num_accepted=n, num_tokens=case.T
        )
        replayssm_commit_ref(
            cursors=ref_cursors, state_indices=problem.state_indices, num_accepted=n, num_tokens=case.T
        )
        assert_close(f"step {step} checkpoints", ref_state[live], problem.state[live], state_tol)
        assert torch.equal(problem.cursors.write_pos, ref_cursors.write_pos), f"step {step}: write_pos differs"
        assert torch.equal(problem.cursors.base, ref_cursors.base), f"step {step}: base differs"
        if stale_records:
            _assert_committed_records_close(ref_ring, problem.ring, problem.cursors, problem.live, out_tol)
    pad_rows = [i for i, s in enumerate(problem.state_indices.tolist()) if s <= 0]
    for i in pad_rows:
        assert torch.equal(out[i * case.T : (i + 1) * case.T], torch.zeros_like(out[i * case.T : (i + 1) * case.T]))
    if not stale_records:
        _assert_ring_close(ref_ring, problem.ring, problem.live, out_tol)
    assert_untouched(problem, problem.state, problem.ring, problem.cursors)
    assert flushes > 0, "the run never flushed: make it longer"


# deferred folds (`_replay.deferred_fold`), decode steps' too, on the CPU cases' paths (exact and open-loop
# folds, decode and verify, ring_len 1, histories of several chunks) and on GPU cases of each window and dtype
DEFERRED_CASES = [CPU_CASES[i] for i in (0, 1, 2, 4, 5, 6, 9, 11)] + [
    GPU_CASES[i] for i in (0, 1, 2, 4, 5, 7, 9, 10, 12, 15)
]


@pytest.mark.parametrize("case", [c.param() for c in DEFERRED_CASES])
def test_deferred_folds_match_reference(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every step's fold deferred (`DEFERRED_FOLD = "always"`) the non-flush launch does the flushing
    rows' steps too and the flush launch only folds, joined at the commit: outputs (a flush step's now
    reconstructed), checkpoints after each commit, the records and cursors still match the reference, and the
    idle slots stay untouched."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "DEFERRED_FOLD", "always")
    test_replayssm_kernels_match_reference(case, _patterns(case)[-1])


# a bf16 state's decode tile loaded as int32 pairs (`_replay.PAIRED_STATE`): the decode paths (preloading up to
# PRELOAD_DECODE_MAX_BATCH rows, chunked history above), K a power of two and not (ODD: K = 72, BK = 128)
PAIRED_CASES = [
    Case(B=3, T=1, L=4, x_dtype=BF16, state_dtype=BF16, **TINY),
    Case(B=2, T=1, L=19, x_dtype=BF16, state_dtype=BF16, steps=22, H=1, HV=2, K=12, V=20),
    Case(B=7, T=1, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=9, T=1, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=33, T=1, L=32, x_dtype=BF16, state_dtype=BF16, device="cuda", **ODD),
]


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "plain"])
@pytest.mark.parametrize("case", [c.param() for c in PAIRED_CASES])
def test_bf16_state_decode_matches_reference_with_either_tile(
    case: Case, paired: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`PAIRED_STATE` (the default): the decode kernel reads a bf16 state as int32 pairs of elements and splits
    them into float32 halves; without it, as a bf16 tile. Outputs, checkpoints and records match the reference
    over many steps either way, and the launches really took the tile asked for (the kernel's `PAIRED_STATE`
    argument)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "PAIRED_STATE", paired)
    _no_key_head_decode(monkeypatch)
    spy = LaunchSpy(_replay._decode_kernel)
    monkeypatch.setattr(_replay, "_decode_kernel", spy)
    test_replayssm_kernels_match_reference(case, "all")
    seen = [bool(kwargs.get("PAIRED_STATE")) for _, kwargs in spy.launches]
    assert seen and all(took == paired for took in seen), f"the decode launches took the pairs {seen}"


def test_paired_state_needs_a_bf16_state_on_4_byte_rows() -> None:
    """`PAIRED_STATE` applies only where int32 loads of element pairs are aligned: bf16, K even, an even slot
    stride and an even element address; anything else takes the plain tile."""
    from gdn_replayssm._replay import paired_state

    pool = torch.zeros(5, 2, 4, 16, dtype=BF16)
    assert paired_state(pool, 16)
    assert not paired_state(pool.float(), 16)
    assert not paired_state(torch.zeros(5, 2, 4, 15, dtype=BF16), 15)
    odd_stride = torch.zeros(5, 2 * 4 * 16 + 1, dtype=BF16)[:, :-1].view(5, 2, 4, 16)  # slot 0 aligned, slot 1 not
    assert odd_stride.stride(0) % 2 == 1 and odd_stride.data_ptr() % 4 == 0 and not paired_state(odd_stride, 16)
    shifted = torch.zeros(5 * 2 * 4 * 16 + 1, dtype=BF16)[1:].view(5, 2, 4, 16)
    assert shifted.data_ptr() % 4 == 2 and not paired_state(shifted, 16)


JOIN_CASES = [
    Case(B=5, T=1, L=8, join=4, **TINY),
    Case(B=5, T=2, L=8, join=4, **TINY),
    Case(B=4, T=3, L=12, join=4, x_dtype=BF16, fold="open_loop", **TINY),
    Case(B=33, T=1, L=32, join=16, device="cuda", **QWEN),
    Case(B=33, T=4, L=64, join=32, steps=40, device="cuda", **QWEN),
    Case(B=7, T=4, L=16, join=8, x_dtype=BF16, device="cuda", **QWEN),
]


# the launch paths that decide flush rows themselves: the default (above SMALL_BATCH rows, as every CPU case
# has: the persistent grid and the normalised-keys pass), the small-batch path (the plain flush grid and the
# preloading kernels), the key products' pre-pass, and the non-flush kernels folding their own flush rows
# (FUSED_FLUSH); the GPU cases take their default paths
JOIN_PATHS = {
    "default": {},
    "small-batch": {"SMALL_BATCH": 1 << 20, "PRELOAD_DECODE_MAX_BATCH": 1 << 20},
    "key-products": {
        "SMALL_BATCH": 0,
        "PRELOAD_DECODE_MAX_BATCH": 0,
        "WINDOW_KEY_PRODUCTS": True,
        "WIDE_WINDOW_KEY_PRODUCTS": True,
        "WINDOW_PRODUCTS_MIN_BATCH": 0,
    },
    "fused": {"FUSED_FLUSH": True},
    "deferred": {"DEFERRED_FOLD": "always"},  # decode at any batch size too (the default: verify, 2-32 rows)
    "listed": {"LISTED_FOLDS": "always"},  # the persistent fold's rows from `_flushing_list_kernel` (reads the plan)
}
JOIN_PARAMS = [
    pytest.param(c, path, id=f"{c}-{path}", marks=[pytest.mark.gpu] if c.device == "cuda" else [])
    for c in JOIN_CASES
    for path in (JOIN_PATHS if c.device == "cpu" else ["default", "deferred"])
    if path != "key-products" or c.T > 1
]


@pytest.mark.parametrize(("case", "path"), JOIN_PARAMS)
def test_coalesced_flushes_match_reference(case: Case, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flush_join`: rows whose ring positions were spread by a staggered start (row i runs i % S steps
    alone first) fold together with the step's due rows once past the join line, in the kernels exactly
    as in the reference: outputs, checkpoints, rings and cursors, every step; and some rows did join."""
    from gdn_replayssm import _replay

    require_device(case.device)
    for switch, value in JOIN_PATHS[path].items():
        monkeypatch.setattr(_replay, switch, value)
    problem = make_problem(case)
    ref_state, ref_ring, ref_cursors = problem.clone_storage()
    kernel, reference = (
        (replayssm_decode, replayssm_decode_ref) if case.T == 1 else (replayssm_verify, replayssm_verify_ref)
    )
    out_tol, state_tol = _tolerances(case)
    idx = problem.state_indices
    spread = case.L // case.T
    lead = torch.arange(case.B, device=idx.device) % spread
    joins = 0
    for step in range(spread + case.num_steps):
        rows = torch.where(lead > step, idx, torch.full_like(idx, -1)) if step < spread else idx
        x, a, b = problem.inputs()
        out, ref_out = problem.out(), problem.out()
        joins += sum(problem.joining(state_indices=rows))
        replayssm_plan(cursors=problem.cursors, state_indices=rows, num_tokens=case.T)
        replayssm_plan_ref(cursors=ref_cursors, state_indices=rows, num_tokens=case.T)
        assert torch.equal(problem.cursors.write_pos, ref_cursors.write_pos), f"step {step}: plans differ"
        for fn, storage, o in ((kernel, (problem.state, problem.ring, problem.cursors), out),
                               (reference, (ref_state, ref_ring, ref_cursors), ref_out)):  # fmt: skip
            fn(**{**_step_kwargs(problem, (x, a, b), storage, o), "state_indices": rows})
        assert_close(f"step {step} outputs", ref_out, out, out_tol)
        n = None if case.T == 1 else acceptance("all", B=case.B, T=case.T, generator=problem.generator).to(case.device)
        replayssm_commit(cursors=problem.cursors, state_indices=rows, num_accepted=n, num_tokens=case.T)
        replayssm_commit_ref(cursors=ref_cursors, state_indices=rows, num_accepted=n, num_tokens=case.T)
        for slot in problem.live:  # one row's missed fold must not hide in the others' norm
            assert_close(f"step {step} slot {slot} checkpoint", ref_state[slot], problem.state[slot], state_tol)
        assert torch.equal(problem.cursors.write_pos, ref_cursors.write_pos), f"step {step}: write_pos differs"
        assert torch.equal(problem.cursors.base, ref_cursors.base), f"step {step}: base differs"
    if case.T == 1 and _replay.deferred_fold(1, case.B):  # deferred decode flushes leave stale records
        _assert_committed_records_close(ref_ring, problem.ring, problem.cursors, problem.live, out_tol)
    else:
        _assert_ring_close(ref_ring, problem.ring, problem.live, out_tol)
    assert_untouched(problem, problem.state, problem.ring, problem.cursors)
    assert joins > 0, "no row joined a flush: spread the rows further"


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)])
def test_plan_marks_a_due_step_and_the_commit_spends_it(device: str) -> None:
    """`replayssm_plan` writes the step's "some row is due" into `write_pos[0]` (the null slot's entry) and
    nothing else, as the reference does; padding rows and the null slot count for nothing; the commit clears
    it; without coalesced flushes the plan does nothing."""
    require_device(device)
    L, J, T = 8, 4, 2
    cursors = ReplayCursors.allocate(num_slots=6, ring_len=L, flush_join=J, device=device)
    cursors.write_pos[1:] = torch.tensor([0, 2, 5, 3, 1], dtype=torch.int32)  # slot 3 is due: 5 + 2T > L
    steps = {
        (2, 4, -1): 0,  # nobody due
        (2, 3, 0): 1,  # slot 3 due
        (-1, 0, 1): 0,  # padding and the null slot
    }
    for rows, want in steps.items():
        idx = torch.tensor(rows, dtype=torch.int32, device=device)
        ref = cursors.clone()
        before = cursors.write_pos.clone()
        replayssm_plan(cursors=cursors, state_indices=idx, num_tokens=T)
        replayssm_plan_ref(cursors=ref, state_indices=idx.cpu(), num_tokens=T)
        assert int(cursors.write_pos[0]) == want, rows
        assert torch.equal(cursors.write_pos[1:], before[1:]), "the plan moved a row's cursor"
        assert torch.equal(cursors.write_pos.cpu(), ref.write_pos.cpu()), rows
    replayssm_plan(cursors=cursors, state_indices=torch.tensor([3], dtype=torch.int32, device=device), num_tokens=T)
    replayssm_commit(cursors=cursors, state_indices=torch.tensor([3], dtype=torch.int32, device=device),
                     num_accepted=torch.tensor([2], dtype=torch.int32, device=device), num_tokens=T)  # fmt: skip
    assert int(cursors.write_pos[0]) == 0, "the commit left the plan standing"
    plain = ReplayCursors.allocate(num_slots=6, ring_len=L, device=device)
    plain.write_pos[:] = 7  # every slot due; the null slot's entry must stay as it is
    replayssm_plan(cursors=plain, state_indices=torch.tensor([1, 2], dtype=torch.int32, device=device), num_tokens=T)
    assert int(plain.write_pos[0]) == 7


@pytest.mark.parametrize("T", [1, 3])
def test_unplanned_step_joins_no_row(T: int) -> None:
    """With `flush_join > 0` but no `replayssm_plan` before the step, the kernels and the commit flush only the
    due rows (always valid), as the reference does: a row past the join line keeps its history."""
    case = Case(B=3, T=T, L=4 * T, join=2 * T, **TINY)
    problem = make_problem(case, pad_rows=False)
    due, joiner, far = problem.state_indices.tolist()
    L = case.L
    live = torch.tensor(problem.live)
    gen = problem.generator
    for name, t in problem.ring.tensors().items():  # committed histories: records in every ring row
        shape = (len(problem.live), *t.shape[1:])
        if name == "g":
            records = -torch.empty(shape).uniform_(0.01, 0.3, generator=gen)
        elif name == "beta":
            records = torch.empty(shape).uniform_(0.1, 0.9, generator=gen)
        else:
            records = 0.3 * torch.randn(shape, generator=gen)
        t[live] = records.to(t.dtype)
    corrected_values_ref(state=problem.state, ring=problem.ring)  # a trajectory: the fold and the window agree
    # no plan: write_pos[0] as allocate and every commit leave it
    problem.cursors.write_pos[[0, due, joiner, far]] = torch.tensor([0, L - T, L - 2 * T, 0], dtype=torch.int32)
    ref_state, ref_ring, ref_cursors = problem.clone_storage()
    kernel, reference = (replayssm_decode, replayssm_decode_ref) if T == 1 else (replayssm_verify, replayssm_verify_ref)
    x, a, b = problem.inputs()
    out, ref_out = problem.out(), problem.out()
    kernel(**_step_kwargs(problem, (x, a, b), (problem.state, problem.ring, problem.cursors), out))
    reference(**_step_kwargs(problem, (x, a, b), (ref_state, ref_ring, ref_cursors), ref_out))
    out_tol, state_tol = _tolerances(case)
    assert_close("outputs", ref_out, out, out_tol)
    assert_close("checkpoints", ref_state, problem.state, state_tol)
    n = None if T == 1 else torch.full((3,), T, dtype=torch.int32)
    for commit, cursors in ((replayssm_commit, problem.cursors), (replayssm_commit_ref, ref_cursors)):
        commit(cursors=cursors, state_indices=problem.state_indices, num_accepted=n, num_tokens=T)
    assert torch.equal(problem.cursors.write_pos, ref_cursors.write_pos)
    assert int(problem.cursors.write_pos[joiner]) == L - 2 * T + T, "the row past the join line flushed unplanned"
    assert int(problem.cursors.write_pos[due]) == (0 if T == 1 else T), "the due row did not flush"


PRELOAD_CASES = [
    CPU_CASES[1],  # decode, the ring wraps every 4 steps
    CPU_CASES[8],  # decode, L = 19
    CPU_CASES[5],  # verify, odd shapes
    CPU_CASES[11],  # verify, L = 22
    *(Case(B=33, T=T, L=32, device="cuda", **QWEN) for T in (1, 4)),
]


@pytest.mark.parametrize("case", [c.param() for c in PRELOAD_CASES])
def test_non_flush_kernels_on_their_other_batch_size_path_match_reference(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small batches preload (the decode kernel reads the whole ring in physical order, the window kernel
    issues its side loads before the K pass) and keep the plain flush grid, larger ones do neither: each case
    runs the path its batch size would not take, and must match the reference, with the sentinel-filled rows
    past the history masked."""
    from gdn_replayssm import _replay

    small = _replay.decode_preload(case.B) if case.T == 1 else _replay.window_preload(case.B)
    _small_batch_up_to(monkeypatch, 0 if small else 1 << 20)
    test_replayssm_kernels_match_reference(case, "random" if case.T > 1 else "all")


# verify cases for the window kernel's raw key dots: odd shapes, a masked tail of K, a long ring, and bf16 inputs
# (the dtype that takes the tensor cores' bf16 path), with a masked tail of K on the CPU (the interpreter's bf16 dots
# made exact by `interpreter_dots.py`) and at the Qwen3.6 shapes on the GPU
RAW_KEY_DOT_CASES = [
    CPU_CASES[5],
    CPU_CASES[11],
    Case(B=3, T=2, L=8, H=1, HV=2, K=40, V=24),
    Case(B=3, T=3, L=8, x_dtype=BF16, H=1, HV=2, K=40, V=24),
    Case(B=33, T=4, L=32, x_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=3, L=7, x_dtype=BF16, device="cuda", **ODD),
]


@pytest.mark.parametrize("gram_norms", [True, False], ids=["gram-norms", "summed-norms"])
@pytest.mark.parametrize("case", [c.param() for c in RAW_KEY_DOT_CASES])
def test_window_raw_key_dots_match_reference(case: Case, gram_norms: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`WINDOW_RAW_KEY_DOTS` (above `SMALL_BATCH` rows, forced here for small batches) with the keys' side in
    the window kernel (no `WINDOW_KEY_PRODUCTS`): its key products and key norms as dots on the raw inputs match
    the reference like the default path, with the history keys' norms from their Gram matrix or summed on the
    CUDA cores (`WINDOW_HISTORY_GRAM_NORMS`, `WIDE_WINDOW_HISTORY_GRAM_NORMS` for the GPU's wide tile)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "WINDOW_KEY_PRODUCTS", False)
    monkeypatch.setattr(_replay, "WINDOW_RAW_KEY_DOTS", True)
    monkeypatch.setattr(_replay, "WINDOW_HISTORY_GRAM_NORMS", gram_norms)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_HISTORY_GRAM_NORMS", gram_norms)
    _small_batch_up_to(monkeypatch, 0)
    test_replayssm_kernels_match_reference(case, "random")


def test_bf16_inputs_match_reference_under_a_plain_interpreter(
    monkeypatch: pytest.MonkeyPatch, exact_bf16_dots: Callable[[torch.dtype], bool]
) -> None:
    """Under an interpreter whose bf16 dots multiply bit patterns (Triton's own, without `interpreter_dots.py`),
    bf16 inputs at the defaults still match the reference: the window kernel and the key products' pre-pass dot
    their keys converted to float32 there (`exact_input_dots`), not as stored."""
    from gdn_replayssm import _config, _replay
    from triton.runtime import interpreter

    if not _config.interpreting():
        pytest.skip("the interpreter's dots only matter under TRITON_INTERPRET=1")
    plain = getattr(interpreter.InterpreterBuilder.create_dot, "plain", None)
    assert plain is not None, "conftest installs interpreter_dots.widen_bf16_dots under the interpreter"
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", plain)
    monkeypatch.setattr(_replay, "exact_input_dots", exact_bf16_dots)  # the production rule, not conftest's
    monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", 3)  # the pre-pass at B = 3 too, for the second run
    case = RAW_KEY_DOT_CASES[3]  # bf16 inputs, B = 3: above SMALL_BATCH, where the raw key dots are the default
    test_replayssm_kernels_match_reference(case, "random")
    monkeypatch.setattr(_replay, "WINDOW_KEY_PRODUCTS", False)  # and the keys' side in the window kernel
    test_replayssm_kernels_match_reference(case, "random")


@pytest.mark.parametrize("raw", [False, True], ids=["converted-keys", "raw-key-dots"])
@pytest.mark.parametrize("case", [c.param() for c in RAW_KEY_DOT_CASES])
def test_window_key_products_kernel_matches_reference(case: Case, raw: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`WINDOW_KEY_PRODUCTS` (the default from `WINDOW_PRODUCTS_MIN_BATCH` rows, forced here for small
    batches): with the keys' products, norms and ring appends in `_key_products_kernel` before the window
    kernel, outputs, checkpoints and rings still match the reference (the ring comparison sees a window key
    the pre-pass failed to append)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "WINDOW_KEY_PRODUCTS", True)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_KEY_PRODUCTS", True)  # the wide tiles' too
    _plain_window_in_kernel_up_to(monkeypatch, 0)  # and the 64x2 tile's at every batch size
    monkeypatch.setattr(_replay, "WINDOW_RAW_KEY_DOTS", raw)
    _small_batch_up_to(monkeypatch, 0)
    monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", 0)  # and its 64-row tiles (V >= 64 on the GPU)
    test_replayssm_kernels_match_reference(case, "random")


# the window's outputs in the query columns or through selector dots: odd shapes, a window of more than 4 tokens
# (the UT transform's fourth power of `N`), and on the GPU a preloading T = 8 row and streaming T = 4 rows
QUERY_COLUMN_CASES = [
    CPU_CASES[5],
    Case(B=2, T=6, L=12, steps=8, **TINY),
    Case(B=1, T=8, L=16, device="cuda", **QWEN),
    Case(B=33, T=4, L=32, device="cuda", **QWEN),
]


@pytest.mark.parametrize("columns", ["always", "never"])
@pytest.mark.parametrize("small", [True, False], ids=["preloading", "streaming"])
@pytest.mark.parametrize("case", [c.param() for c in QUERY_COLUMN_CASES])
def test_window_query_columns_match_reference(
    case: Case, small: bool, columns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways to the window's outputs (`WINDOW_QUERY_COLUMNS`), the elementwise terms in each query's own
    column and the two selector dots that move them to the token's column, match the reference in the
    preloading programs and the streaming ones, and the kernel is launched with the one asked for."""
    from gdn_replayssm import _replay

    spy = LaunchSpy(_replay._window_kernel)
    monkeypatch.setattr(_replay, "_window_kernel", spy)
    monkeypatch.setattr(_replay, "WINDOW_QUERY_COLUMNS", columns)
    _small_batch_up_to(monkeypatch, 1 << 20 if small else 0)
    test_replayssm_kernels_match_reference(case, "random")
    assert spy.launches and {kwargs["QUERY_COLUMNS"] for _, kwargs in spy.launches} == {columns == "always"}


def test_window_query_columns_by_default_except_short_preloading_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the outputs come from the query columns (faster in streaming programs at every T and in
    preloading ones at T = 8) except in preloading programs up to T = 4 (measured slower there); the switch's
    other values force one way everywhere."""
    from gdn_replayssm import _replay

    assert [_replay.window_query_columns(T, preload=False) for T in (2, 4, 8)] == [True, True, True]
    assert [_replay.window_query_columns(T, preload=True) for T in (2, 3, 4, 5, 8)] == [False] * 3 + [True] * 2
    for value, expected in (("always", True), ("never", False)):
        monkeypatch.setattr(_replay, "WINDOW_QUERY_COLUMNS", value)
        assert {_replay.window_query_columns(T, p) for T in (2, 8) for p in (False, True)} == {expected}


# every `@triton.jit` kernel the public functions launch, by module
LAUNCHED_KERNELS = {
    "_decode_heads": ["_key_head_decode_kernel"],
    "_replay": ["_decode_kernel", "_window_kernel", "_key_products_kernel", "_flush_kernel",
                "_flush_persistent_kernel", "_normalised_keys_kernel"],
    "commit": ["_commit_kernel", "_plan_kernel"],
    "baseline": ["_recurrent_kernel"],
}  # fmt: skip


@pytest.mark.parametrize("cap", [None, 128], ids=["no-cap", "decode-cap"])
def test_launches_pass_only_options_every_backend_knows(cap: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton refuses a launch keyword that the device's backend does not know, even one set to None, and the
    kernels are meant for Intel XPU too, whose backend (like AMD's) has no `maxnreg`. Every launch's keywords
    are the kernel's parameters or options of the AMD backend that ships with Triton, with or without a decode
    register cap (`maxnreg` goes to CUDA launches only). Small and large batch paths both (plain and persistent
    flush grids)."""
    import importlib

    from gdn_replayssm import _replay
    from triton.backends.amd.compiler import HIPOptions

    spies = {}
    for module_name, names in LAUNCHED_KERNELS.items():
        module = importlib.import_module(f"gdn_replayssm.{module_name}")
        for name in names:
            spies[name] = LaunchSpy(getattr(module, name))
            monkeypatch.setattr(module, name, spies[name])
    monkeypatch.setattr(_replay, "DECODE_MAX_REGISTERS", cap)
    monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", 1)
    _plain_window_in_kernel_up_to(monkeypatch, 0)  # the 64x2 tile (T = 2) with its pre-pass
    for small_batch in (1 << 20, 0):  # every case on the small-batch path, then on the large one
        _small_batch_up_to(monkeypatch, small_batch)
        for case in (CPU_CASES[1], CPU_CASES[4]):  # decode and verify, both with flushes
            test_replayssm_kernels_match_reference(case, "all")
    monkeypatch.setattr(_replay, "KEY_HEAD_DECODE_MIN_BATCH", 1)  # the key-head decode (an fp32 state)
    test_replayssm_kernels_match_reference(CPU_CASES[1], "all")
    test_baseline_kernel_matches_reference(BASELINE_CASES[0])
    joined = ReplayCursors.allocate(num_slots=4, ring_len=4, flush_join=2)  # the plan and the one-program commit
    replayssm_plan(cursors=joined, state_indices=torch.tensor([1, 2], dtype=torch.int32), num_tokens=1)
    replayssm_commit(cursors=joined, state_indices=torch.tensor([1, 2], dtype=torch.int32), num_tokens=1)
    portable = set(HIPOptions.__dataclass_fields__)
    for name, spy in spies.items():
        assert spy.launches, f"{name} was never launched"
        for _, kwargs in spy.launches:
            unknown = set(kwargs) - set(spy.real.arg_names) - portable
            assert unknown == set(), name


def test_decode_register_cap_is_for_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode launch's `maxnreg` (a CUDA option): `DECODE_MAX_REGISTERS` on CUDA for every state dtype
    (H200 run 26 measured 128 faster for fp32 and bf16 states), never elsewhere, and none when it is None."""
    from gdn_replayssm import _replay

    cuda, xpu, cpu = torch.device("cuda"), torch.device("xpu"), torch.device("cpu")
    assert _replay.DECODE_MAX_REGISTERS == 128
    assert _replay.decode_max_registers(cuda) == 128
    assert _replay.decode_max_registers(xpu) is None
    assert _replay.decode_max_registers(cpu) is None
    monkeypatch.setattr(_replay, "DECODE_MAX_REGISTERS", None)
    assert _replay.decode_max_registers(cuda) is None


def test_decode_preloads_up_to_its_own_batch_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode launches read their rings whole up to `PRELOAD_DECODE_MAX_BATCH` rows (H200 run 26: 4) and in
    chunks above, whatever `SMALL_BATCH` (verify's threshold) says; with it None, `SMALL_BATCH` decides. Both
    sides of the line match the reference."""
    from gdn_replayssm import _replay

    assert _replay.PRELOAD_DECODE_MAX_BATCH == 4 and _replay.SMALL_BATCH == 2
    assert [_replay.decode_preload(B) for B in (1, 4, 5)] == [True, True, False]
    spy = LaunchSpy(_replay._decode_kernel)
    monkeypatch.setattr(_replay, "_decode_kernel", spy)
    preloaded = {}
    for B in (4, 5):
        spy.launches.clear()
        test_replayssm_kernels_match_reference(Case(B=B, T=1, L=4, **TINY), "all")
        preloaded[B] = {bool(kwargs["PRELOAD"]) for _, kwargs in spy.launches}
    assert preloaded == {4: {True}, 5: {False}}
    monkeypatch.setattr(_replay, "PRELOAD_DECODE_MAX_BATCH", None)
    assert [_replay.decode_preload(B) for B in (2, 3)] == [True, False]


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [F32, BF16], ids=["fp32-state", "bf16-state"])
def test_cuda_decode_launch_carries_its_register_cap(state_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU the decode launch takes `decode_max_registers` as `maxnreg` (both state dtypes, on the chunked
    path above `PRELOAD_DECODE_MAX_BATCH` rows, where the cap changes the build) and still matches the
    reference."""
    from gdn_replayssm import _replay

    spy = LaunchSpy(_replay._decode_kernel)
    monkeypatch.setattr(_replay, "_decode_kernel", spy)
    test_replayssm_kernels_match_reference(
        Case(B=9, T=1, L=16, x_dtype=BF16, state_dtype=state_dtype, device="cuda", **QWEN), "all"
    )
    assert spy.launches
    caps = {kwargs.get("maxnreg") for _, kwargs in spy.launches}
    assert caps == {_replay.decode_max_registers(torch.device("cuda"))} == {128}


def test_persistent_flush_grid_is_for_cuda_and_the_interpreter() -> None:
    """The persistent flush grid is sized by CUDA's SM count; an XPU (no tensor needed to ask) takes the plain
    grid at every batch size, CUDA and the interpreter's CPU tensors the persistent one above `SMALL_BATCH`."""
    from gdn_replayssm import _replay

    above, at = _replay.SMALL_BATCH + 1, _replay.SMALL_BATCH
    assert _replay.persistent_flush_default(torch.device("cuda"), above)
    assert _replay.persistent_flush_default(torch.device("cpu"), above)
    assert not _replay.persistent_flush_default(torch.device("cuda"), at)
    assert not _replay.persistent_flush_default(torch.device("xpu"), above)


def test_window_key_products_start_at_their_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 64x2 tile's key products' pre-pass (T = 2) runs from `WINDOW_PRODUCTS_MIN_BATCH` rows and above
    `WINDOW_IN_KERNEL_MAX_BATCH` only: below the first the 32x2 tile keeps the keys' side in the window kernel, up
    to the second the 64x2 tile does, at `WINDOW_IN_KERNEL_STAGES` with summed history norms (H200 run 38d-e:
    faster there); every path matches the reference."""
    from gdn_replayssm import _replay

    spies = LaunchSpy(_replay._key_products_kernel), LaunchSpy(_replay._window_kernel)
    case = RAW_KEY_DOT_CASES[2]  # T = 2
    monkeypatch.setattr(_replay, "_key_products_kernel", spies[0])
    monkeypatch.setattr(_replay, "_window_kernel", spies[1])
    _small_batch_up_to(monkeypatch, 0)

    def launches(min_batch: int, in_kernel_max_batch: int) -> tuple[bool, set[tuple[int, int, int]]]:
        monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", min_batch)
        monkeypatch.setattr(_replay, "WINDOW_IN_KERNEL_MAX_BATCH", in_kernel_max_batch)
        for spy in spies:
            spy.launches.clear()
        test_replayssm_kernels_match_reference(case, "random")
        assert all(grid == (case.B, case.H) for grid, _ in spies[0].launches)
        windows = [kwargs for _, kwargs in spies[1].launches]
        assert not any(w["EARLY_GATES"] for w in windows)  # the wide tile's alone (`window_early_gates`)
        return bool(spies[0].launches), {(w["num_warps"], w["NUM_STAGES"], w["RAW_KEY_DOTS"]) for w in windows}

    small, plain = _replay.SMALL_WINDOW_WARPS, _replay.WINDOW_WARPS
    assert launches(case.B + 1, case.B) == (False, {(small, _replay.WINDOW_STAGES, 1)})
    assert launches(case.B, case.B) == (False, {(plain, _replay.WINDOW_IN_KERNEL_STAGES, 2)})
    assert launches(case.B, case.B - 1) == (True, {(plain, _replay.WINDOW_STAGES, 1)})
    assert _replay.WINDOW_IN_KERNEL_STAGES != _replay.WINDOW_STAGES


def test_window_tile_follows_batch_size_and_window() -> None:
    """Small batches take 32x2 programs; from `WIDE_WINDOW_MIN_BATCH` rows the windows `WIDE_WINDOW_TOKENS` names
    take the wide 128x4 ones (measured faster at T = 3, 4 and, at its ring of 64, 8), and from
    `WINDOW_PRODUCTS_MIN_BATCH` rows the rest take 64x2 (faster at T = 2); the benchmark labels its cases with the
    same rule."""
    from gdn_replayssm import _replay, bench

    assert _replay.window_tile(4, large=False) == (32, 2)
    assert [_replay.window_tile(T, large=True) for T in (2, 3, 4, 8)] == [(64, 2), (128, 4), (128, 4), (128, 4)]
    wide, narrow = _replay.WIDE_WINDOW_MIN_BATCH, _replay.WINDOW_PRODUCTS_MIN_BATCH
    assert wide < narrow  # measured: the wide tile without the pre-pass wins from fewer rows
    assert [bench._window_tile_name(B, 4, F32) for B in (wide - 1, wide)] == ["32x2", "128x4"]
    assert [bench._window_tile_name(B, 2, F32) for B in (wide, narrow - 1, narrow)] == ["32x2", "32x2", "64x2"]
    assert [bench._window_tile_name(B, 4, BF16) for B in (wide - 1, wide)] == ["32x2", "128x4"]
    # an fp16 state keeps the pre-pass and its gate (the wide tile without it was timed on fp32 and bf16 states)
    assert [bench._window_tile_name(B, 4, F16) for B in (wide, narrow - 1, narrow)] == ["32x2", "32x2", "128x4"]
    assert not bench._window_key_products(wide, 4, BF16) and bench._window_key_products(narrow, 4, F16)


def test_wide_window_batch_gate_follows_its_key_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """`WIDE_WINDOW_MIN_BATCH` is the wide tiles' gate only while they keep the keys' side in the kernel (fp32 and
    bf16 states); with the pre-pass (`WIDE_WINDOW_KEY_PRODUCTS`, or an fp16 state) they start where the pre-pass
    does, and preloading or fused launches never take the large tiles."""
    from gdn_replayssm import _replay

    wide = _replay.WIDE_WINDOW_MIN_BATCH
    assert _replay.large_window(wide, preload=False, fused=False, T=4, state_dtype=F32)
    assert _replay.large_window(wide, preload=False, fused=False, T=4, state_dtype=BF16)
    assert not _replay.large_window(wide, preload=False, fused=False, T=2, state_dtype=F32)
    assert not _replay.large_window(wide, preload=False, fused=False, T=4, state_dtype=F16)
    assert not _replay.large_window(wide, preload=True, fused=False, T=4, state_dtype=F32)
    assert not _replay.large_window(wide, preload=False, fused=True, T=4, state_dtype=F32)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_KEY_PRODUCTS", True)
    assert not _replay.large_window(wide, preload=False, fused=False, T=4, state_dtype=F32)
    assert _replay.large_window(_replay.WINDOW_PRODUCTS_MIN_BATCH, preload=False, fused=False, T=4, state_dtype=F32)


@pytest.mark.parametrize(
    ("wide", "wide_products"), [((), False), ((3,), False), ((3,), True)], ids=["narrow", "wide", "wide-pre-pass"]
)
def test_window_launch_takes_its_tile_warps(
    wide: tuple[int, ...], wide_products: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrow tile takes the key products' pre-pass, 2 warps each; the wide one keeps the keys' side in the
    window kernel (`WIDE_WINDOW_KEY_PRODUCTS` off, as measured) with 4 warps, `WIDE_WINDOW_IN_KERNEL_STAGES` and
    summed history norms and the gates before its K pass (`window_early_gates`, an fp32 state), or takes the pre-pass
    at 4 warps with the switch on; outputs match the reference each way."""
    from gdn_replayssm import _replay

    spies = LaunchSpy(_replay._key_products_kernel), LaunchSpy(_replay._window_kernel)
    case = RAW_KEY_DOT_CASES[0]  # T = 3
    monkeypatch.setattr(_replay, "_key_products_kernel", spies[0])
    monkeypatch.setattr(_replay, "_window_kernel", spies[1])
    _small_batch_up_to(monkeypatch, 0)
    monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", case.B)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_MIN_BATCH", case.B)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_TOKENS", wide)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_KEY_PRODUCTS", wide_products)
    _plain_window_in_kernel_up_to(monkeypatch, 0)  # the 64x2 tile with its pre-pass at any batch
    test_replayssm_kernels_match_reference(case, "random")
    warps = [kwargs["num_warps"] for spy in spies for _, kwargs in spy.launches]
    assert warps and set(warps) == {4 if wide else 2}
    windows = [kwargs for _, kwargs in spies[1].launches]
    in_kernel = wide and not wide_products
    assert bool(spies[0].launches) is not in_kernel
    assert {(w["PRODUCTS"], w["NUM_STAGES"], w["RAW_KEY_DOTS"], w["EARLY_GATES"]) for w in windows} == (
        {(False, _replay.WIDE_WINDOW_IN_KERNEL_STAGES, 2, True)}
        if in_kernel
        else {(True, _replay.WINDOW_STAGES, 1, False)}
    )
    assert not any("maxnreg" in w for w in windows)  # the register cap is CUDA's alone


def test_plain_window_keeps_keys_in_kernel_up_to_its_batch_size() -> None:
    """T = 2's 64x2 tile keeps the keys' side in the kernel up to `WINDOW_IN_KERNEL_MAX_BATCH` rows on an fp32
    state (measured faster to 96 rows, slower from 128: H200 run 38d-e) and up to
    `NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH` on a bf16 one (faster to 64, slower at 96: run 39a), at 2 and 3 stages,
    and takes the pre-pass above; an fp16 state (not timed) at every batch size, and the wide tiles' T never by this
    rule."""
    from gdn_replayssm import _replay, bench

    top, narrow_top = _replay.WINDOW_IN_KERNEL_MAX_BATCH, _replay.NARROW_STATE_WINDOW_IN_KERNEL_MAX_BATCH
    assert _replay.WINDOW_PRODUCTS_MIN_BATCH <= narrow_top == 64 < top == 96
    assert [_replay.window_keys_in_kernel(2, B, F32) for B in (top, top + 1)] == [True, False]
    assert [_replay.window_keys_in_kernel(2, B, BF16) for B in (narrow_top, narrow_top + 1)] == [True, False]
    assert not _replay.window_keys_in_kernel(2, _replay.WINDOW_PRODUCTS_MIN_BATCH, F16)
    assert not _replay.window_keys_in_kernel(4, _replay.WINDOW_PRODUCTS_MIN_BATCH, F32)
    assert [bench._window_key_products(B, 2, F32) for B in (top, top + 1)] == [False, True]
    assert [bench._window_key_products(B, 2, BF16) for B in (narrow_top, narrow_top + 1)] == [False, True]
    assert [_replay.window_in_kernel_stages(d) for d in (F32, BF16, F16)] == [2, 3, 3]


def test_wide_window_in_kernel_stages_follow_state_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wide tile with its keys' side in the kernel runs `WIDE_WINDOW_IN_KERNEL_STAGES` stages on an fp32 state
    and `NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES` on a bf16 one (half the state tile's shared memory, H200 run
    38a), without the pre-pass; outputs match the reference."""
    from gdn_replayssm import _replay

    assert _replay.wide_window_in_kernel_stages(F32) == _replay.WIDE_WINDOW_IN_KERNEL_STAGES == 2
    narrow = _replay.NARROW_STATE_WIDE_WINDOW_IN_KERNEL_STAGES
    assert [_replay.wide_window_in_kernel_stages(d) for d in (BF16, F16)] == [narrow, narrow] == [3, 3]
    spies = LaunchSpy(_replay._key_products_kernel), LaunchSpy(_replay._window_kernel)
    monkeypatch.setattr(_replay, "_key_products_kernel", spies[0])
    monkeypatch.setattr(_replay, "_window_kernel", spies[1])
    case = Case(B=3, T=3, L=7, x_dtype=BF16, state_dtype=BF16, H=1, HV=2, K=12, V=20)
    _small_batch_up_to(monkeypatch, 0)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_MIN_BATCH", case.B)
    test_replayssm_kernels_match_reference(case, "random")
    assert spies[0].launches == []
    windows = {(w["PRODUCTS"], w["NUM_STAGES"], w["num_warps"], w["EARLY_GATES"]) for _, w in spies[1].launches}
    assert windows == {(False, narrow, _replay.WIDE_WINDOW_WARPS, False)}  # a bf16 state's gates after the K pass


# the gates loaded before the K pass: the wide tile (T = 3) and the 64x2 tile (T = 2) with the keys' side in the
# kernel, the 64x2 tile after the pre-pass, and the wide tile at Qwen3.6 shapes on the GPU (fp32 and bf16 states)
EARLY_GATE_CASES = [
    (RAW_KEY_DOT_CASES[0], 10**6),
    (RAW_KEY_DOT_CASES[2], 10**6),
    (RAW_KEY_DOT_CASES[2], 0),
    (Case(B=17, T=4, L=64, x_dtype=BF16, device="cuda", **QWEN), 10**6),
    (Case(B=17, T=4, L=64, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN), 10**6),
]


@pytest.mark.parametrize(
    ("case", "in_kernel_max_batch"),
    [pytest.param(c, m, marks=c.param().marks, id=f"{c.param().id}-{'in-kernel' if m else 'pre-pass'}")
     for c, m in EARLY_GATE_CASES],
)  # fmt: skip
def test_window_early_gates_match_reference(
    case: Case, in_kernel_max_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `WINDOW_EARLY_GATES` "always" the large window programs load the gates before the K pass, and the
    preloading ones (which load every side input there already) are built without it; outputs match the
    reference."""
    from gdn_replayssm import _replay

    spy = LaunchSpy(_replay._window_kernel)
    monkeypatch.setattr(_replay, "_window_kernel", spy)
    monkeypatch.setattr(_replay, "WINDOW_EARLY_GATES", "always")
    _plain_window_in_kernel_up_to(monkeypatch, in_kernel_max_batch)
    if case.device == "cpu":
        _small_batch_up_to(monkeypatch, 0)
        monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", case.B)
        monkeypatch.setattr(_replay, "WIDE_WINDOW_MIN_BATCH", case.B)
    test_replayssm_kernels_match_reference(case, "random")
    builds = {(kwargs["EARLY_GATES"], kwargs["PRELOAD"], kwargs["PRODUCTS"]) for _, kwargs in spy.launches}
    assert builds == {(True, False, not in_kernel_max_batch and case.T == 2)}
    monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", case.B + 1)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_MIN_BATCH", case.B + 1)
    _small_batch_up_to(monkeypatch, case.B)
    spy.launches.clear()
    test_replayssm_kernels_match_reference(case, "random")
    assert {(kwargs["EARLY_GATES"], kwargs["PRELOAD"]) for _, kwargs in spy.launches} == {(False, True)}


# the window kernel's state dot in the stored dtype: fp16 and bf16 on the CPU, bf16 on the GPU, T = 2's 64x2 tile and
# the wide one of T = 3-8
RAW_STATE_DOT_CASES = [
    Case(B=3, T=2, L=8, H=1, HV=2, K=40, V=24, x_dtype=F16, state_dtype=F16),
    Case(B=3, T=4, L=16, H=1, HV=2, K=40, V=24, x_dtype=F16, state_dtype=F16),
    Case(B=3, T=3, L=8, H=1, HV=2, K=40, V=24, x_dtype=BF16, state_dtype=BF16),
    Case(B=17, T=2, L=32, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=33, T=4, L=64, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=9, T=3, L=7, x_dtype=BF16, state_dtype=BF16, device="cuda", **ODD),
]


@pytest.mark.parametrize("build", ["in-kernel", "pre-pass", "preload"])
@pytest.mark.parametrize("case", [c.param() for c in RAW_STATE_DOT_CASES])
def test_window_raw_state_dot_matches_reference(case: Case, build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-byte state with inputs of its dtype: every window launch with its keys' side in the kernel (the small
    batches' preloading programs too) dots the state as stored (`WINDOW_RAW_STATE_DOT`), every launch after the key
    products' pre-pass in TF32, and the outputs, records and checkpoints match the reference either way. A bf16
    state under the interpreter takes the raw dot here too: the tests' interpreter has exact bf16 dots
    (`interpreter_dots.py`, conftest's `exact_bf16_dots`), which `exact_input_dots` cannot assume of every
    interpreter run."""
    from gdn_replayssm import _replay

    spy = LaunchSpy(_replay._window_kernel)
    monkeypatch.setattr(_replay, "_window_kernel", spy)
    pre_pass = build == "pre-pass"
    _plain_window_in_kernel_up_to(monkeypatch, 0 if pre_pass else 10**6)
    in_kernel = () if pre_pass else (F32, BF16, F16)  # an fp16 state's default is the pre-pass
    monkeypatch.setattr(_replay, "WINDOW_IN_KERNEL_STATES", in_kernel)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_IN_KERNEL_STATES", in_kernel)
    _small_batch_up_to(monkeypatch, case.B if build == "preload" else 0)
    monkeypatch.setattr(_replay, "WINDOW_PRODUCTS_MIN_BATCH", case.B)
    monkeypatch.setattr(_replay, "WIDE_WINDOW_MIN_BATCH", case.B)
    test_replayssm_kernels_match_reference(case, "random")
    assert spy.launches
    builds = {(kwargs["RAW_STATE_DOT"], kwargs["PRODUCTS"], kwargs["PRELOAD"]) for _, kwargs in spy.launches}
    assert builds == {(not pre_pass, pre_pass, build == "preload")}


def test_window_raw_state_dot_needs_one_narrow_dtype(
    monkeypatch: pytest.MonkeyPatch, exact_bf16_dots: Callable[[torch.dtype], bool]
) -> None:
    """`window_raw_state_dot`: a bf16 or fp16 state with inputs of the same dtype in a build with its keys' side in
    the kernel, on by default (H200 run 42d); a bf16 one not under the interpreter; never an fp32 state, mixed
    dtypes or a build after the key products' pre-pass, nor with the switch off."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "exact_input_dots", exact_bf16_dots)  # the production rule
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    rule = _replay.window_raw_state_dot
    assert rule(BF16, BF16, False) and rule(F16, F16, False)
    assert not rule(BF16, BF16, True) and not rule(F16, F16, True)
    mixed = [(F32, F32), (BF16, F32), (BF16, F16), (F16, BF16), (F32, BF16)]
    assert not any(rule(state, inputs, False) for state, inputs in mixed)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not rule(BF16, BF16, False) and rule(F16, F16, False)
    monkeypatch.setattr(_replay, "WINDOW_RAW_STATE_DOT", False)
    assert not rule(F16, F16, False)


def test_window_raw_key_dots_only_where_exact(
    monkeypatch: pytest.MonkeyPatch, exact_bf16_dots: Callable[[torch.dtype], bool]
) -> None:
    """`window_raw_key_dots`: on by default for streaming launches of every input dtype, never when preloading or
    with the switch off, and not for bf16 inputs under the interpreter (`exact_input_dots`)."""
    from gdn_replayssm import _replay

    monkeypatch.setattr(_replay, "exact_input_dots", exact_bf16_dots)  # the production rule
    rule = _replay.window_raw_key_dots
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert rule(False, BF16) and rule(False, F16) and rule(False, F32)
    assert not rule(True, BF16) and not rule(True, F32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not rule(False, BF16) and rule(False, F16) and rule(False, F32)
    monkeypatch.setattr(_replay, "WINDOW_RAW_KEY_DOTS", False)
    assert not rule(False, F32)


def test_state_descriptor_needs_aligned_rows_and_contiguous_slots() -> None:
    """`state_descriptor` gives a descriptor only where a bulk copy can read the pool: 16-byte rows, slot stride
    and box rows, each slot's `[HV, V, K]` contiguous; otherwise the kernels keep their pointers."""
    from gdn_replayssm._descriptors import state_descriptor

    pool = torch.zeros(3, 2, 20, 12)
    desc = state_descriptor(pool, block_v=16, k_chunk=16)
    assert desc is not None and list(desc.shape) == [3, 2, 20, 12] and list(desc.block_shape) == [1, 1, 16, 16]
    assert state_descriptor(torch.zeros(3, 2, 20, 10), block_v=16, k_chunk=16) is None  # 40-byte rows
    assert state_descriptor(pool.to(BF16), block_v=16, k_chunk=16) is None  # 24-byte rows
    assert state_descriptor(pool, block_v=16, k_chunk=2) is None  # 8-byte box rows
    assert state_descriptor(pool[:, :, :, :8], block_v=16, k_chunk=8) is None  # rows not contiguous in a slot
    wide = torch.zeros(3, 2, 20, 16)[1:]  # a view: slot stride 640 elements, base one slot in
    assert state_descriptor(wide, block_v=16, k_chunk=16) is not None


# decode cases for the chunked history path: two history chunks (L = 40), a masked tail of K (K = 40), and the
# Qwen3.6 shapes on the GPU
DECODE_CHUNKED_CASES = [
    *(c for c in PRELOAD_CASES if c.T == 1),
    CPU_CASES[9],
    Case(B=3, T=1, L=6, steps=8, H=1, HV=2, K=40, V=24),
]


@pytest.mark.parametrize("first_chunk", [0, 4], ids=["no-first-chunk", "first4"])
@pytest.mark.parametrize("chunk", [32, 8])
@pytest.mark.parametrize("case", [c.param() for c in DECODE_CHUNKED_CASES])
def test_decode_history_chunks_match_reference(
    case: Case, chunk: int, first_chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode kernel's chunked history (the path above `PRELOAD_DECODE_MAX_BATCH` rows, forced here for
    small batches) matches the reference across chunks, masked records and a masked tail of K: with the default
    chunk of 32 records and with 8 (`DECODE_HISTORY_BLOCK`, several chunks per history), each also with
    histories of up to 4 records read as one chunk of 4 (`DECODE_FIRST_CHUNK`)."""
    from gdn_replayssm import _replay

    _small_batch_up_to(monkeypatch, 0)
    _no_key_head_decode(monkeypatch)
    monkeypatch.setattr(_replay, "DECODE_HISTORY_BLOCK", chunk)
    monkeypatch.setattr(_replay, "DECODE_FIRST_CHUNK", first_chunk)
    test_replayssm_kernels_match_reference(case, "all")


# the key-head decode (`_replay.KEY_HEAD_DECODE_MIN_BATCH`, forced here): ring_len 1, the open-loop fold, bf16
# inputs and a bf16 state (pairs), a ring of 19 records in one 32-record tile, an odd K and V with the V tiles'
# tail masked, and GPU cases at Qwen3.6 shapes and odd ones
KEY_HEAD_CASES = [
    CPU_CASES[0],
    CPU_CASES[1],
    CPU_CASES[2],
    CPU_CASES[3],
    CPU_CASES[8],
    Case(B=3, T=1, L=6, steps=9, H=2, HV=4, K=12, V=20),
    Case(B=2, T=1, L=5, x_dtype=BF16, state_dtype=BF16, steps=8, H=1, HV=2, K=12, V=20),
    *(Case(B=B, T=1, L=16, device="cuda", **QWEN) for B in (9, 64)),
    Case(B=9, T=1, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=33, T=1, L=32, x_dtype=BF16, device="cuda", **ODD),
    Case(B=9, T=1, L=5, fold="open_loop", device="cuda", **ODD),
]
KEY_HEAD_PATHS = {
    "default": {},
    "deferred": {"DEFERRED_FOLD": "always"},
    "v16": {"KEY_HEAD_DECODE_BLOCK_V": 16},  # several V tiles per value head (V = 20: the second one masked)
    "k-chunks": {"KEY_HEAD_DECODE_K_CHUNK": 8},  # the state tiles as column chunks (K = 12: the second one masked)
    "whole-tiles": {"KEY_HEAD_DECODE_K_CHUNK": 0},  # whole state tiles (a bf16 state then read as pairs)
    # the records inside the chunks' sums, where the ring fits one chunk's columns (L <= 16 here)
    "fused-history": {"KEY_HEAD_DECODE_K_CHUNK": 16, "KEY_HEAD_DECODE_FUSED_HISTORY": True},
    # the tiles in a software-pipelined loop (each recomputes its value head's gates), with several V tiles
    "stages": {"KEY_HEAD_DECODE_STAGES_MIN_BATCH": 1, "KEY_HEAD_DECODE_BLOCK_V": 16},
    # ... each tile loading its own token inputs instead of the last tile loading them ahead (the default)
    "no-prefetch": {
        "KEY_HEAD_DECODE_STAGES_MIN_BATCH": 1,
        "KEY_HEAD_DECODE_BLOCK_V": 16,
        "KEY_HEAD_DECODE_PREFETCH": False,
    },
    "unrolled": {"KEY_HEAD_DECODE_STAGES_MIN_BATCH": None},
    # records' tiles of at least 16 rows (the default is 8: L = 5 and 6 here take 8), in the pipelined loop
    "history-16": {"KEY_HEAD_DECODE_MIN_HISTORY_BLOCK": 16, "KEY_HEAD_DECODE_STAGES_MIN_BATCH": 1},
    # the pipelined loop's column chunks through pointers instead of a tensor descriptor (the default, where V = 20
    # and K = 12 end inside a box: zeros past them), with several V tiles
    "pointers": {
        "KEY_HEAD_DECODE_TMA": False,
        "KEY_HEAD_DECODE_STAGES_MIN_BATCH": 1,
        "KEY_HEAD_DECODE_BLOCK_V": 16,
    },
    # the chunks' sums on the raw key and query, normalised once (the default on a bf16 state only), and the key and
    # query normalised in every chunk (the default on an fp32 state only)
    "late-norms": {"KEY_HEAD_DECODE_LATE_NORMS": "always"},
    "early-norms": {"KEY_HEAD_DECODE_LATE_NORMS": "never"},
}


@pytest.mark.parametrize("path", list(KEY_HEAD_PATHS))
@pytest.mark.parametrize("case", [c.param() for c in KEY_HEAD_CASES])
def test_key_head_decode_matches_reference(case: Case, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One program per (row, key head) over every state tile under it (`_decode_heads`): outputs, checkpoints,
    records and cursors match the reference over many steps, with the fold in line or deferred, with several
    V tiles per value head, with column chunks of 8, with whole tiles (the default chunk is 32: one chunk at the
    CPU cases' K), with the records inside the chunks' sums, with the tiles in a pipelined loop (each tile loading
    the next tile's token inputs ahead, the last one's wrapping to the first, or its own), with the records' tile
    of a short ring padded to 16 rows instead of 8, with the pipelined loop's column chunks read through
    pointers instead of the state pool's tensor descriptor, and with the chunks' row sums normalised after the sum
    or the key and query in every chunk; every decode launch took that kernel, reading a bf16 state as pairs only
    with whole tiles, fusing the records only where the ring fits one chunk, reading through the descriptor only in
    the pipelined loop and where the chunks' rows are whole 16-byte units, and normalising late only in chunks
    without the records."""
    from gdn_replayssm import _decode_heads, _replay
    from gdn_replayssm._window import history_block

    _small_batch_up_to(monkeypatch, 0)
    monkeypatch.setattr(_replay, "KEY_HEAD_DECODE_MIN_BATCH", 1)
    monkeypatch.setattr(_replay, "NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH", 1)
    for switch, value in KEY_HEAD_PATHS[path].items():
        monkeypatch.setattr(_replay, switch, value)
    spy, plain = LaunchSpy(_decode_heads._key_head_decode_kernel), LaunchSpy(_replay._decode_kernel)
    monkeypatch.setattr(_decode_heads, "_key_head_decode_kernel", spy)
    monkeypatch.setattr(_replay, "_decode_kernel", plain)
    test_replayssm_kernels_match_reference(case, "all")
    assert spy.launches and not plain.launches
    grid, kwargs = spy.launches[0]
    assert grid == (case.B, case.H)
    assert kwargs["NV"] * kwargs["BV"] >= case.V > (kwargs["NV"] - 1) * kwargs["BV"]
    chunk = _replay.KEY_HEAD_DECODE_K_CHUNK
    assert kwargs["PAIRED_STATE"] == (case.state_dtype == BF16 and chunk == 0)
    assert kwargs["KC"] == min(chunk, 1 << (case.K - 1).bit_length())
    fused = _replay.KEY_HEAD_DECODE_FUSED_HISTORY and kwargs["KC"] > 0 and history_block(case.L) <= kwargs["KC"]
    assert kwargs["FUSED_HISTORY"] == fused
    least = _replay.KEY_HEAD_DECODE_MIN_HISTORY_BLOCK
    assert kwargs["BH"] == (kwargs["KC"] if fused else max(least, 1 << (case.L - 1).bit_length()))
    assert kwargs["STAGES"] == _replay.key_head_decode_stages(case.B)
    assert kwargs["PREFETCH"] == (_replay.KEY_HEAD_DECODE_PREFETCH and kwargs["STAGES"] > 0)
    width = case.state_dtype.itemsize
    aligned = (case.K * width) % 16 == 0 and (kwargs["KC"] * width) % 16 == 0  # the test pools' slots are contiguous
    chunked_loop = kwargs["KC"] > 0 and kwargs["STAGES"] > 0
    assert kwargs["TMA_STATE"] == (_replay.KEY_HEAD_DECODE_TMA and chunked_loop and aligned)
    late = _replay.key_head_decode_late_norms(case.state_dtype) and kwargs["KC"] > 0 and not fused
    assert kwargs["LATE_NORMS"] == late


def test_key_head_decode_takes_rings_it_reads_whole_from_its_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """`key_head_decode`: from `KEY_HEAD_DECODE_MIN_BATCH` rows for an fp32 state (16, H200 run 27), from
    `NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH` (17, run 43) for bf16 and fp16 ones, or never (None); never where the
    decode preloads its ring and never on a ring longer than one 32-record tile. Its tiles run pipelined from
    `KEY_HEAD_DECODE_STAGES_MIN_BATCH` (24) rows (H200 run 28), each loading the next one's token inputs ahead
    (`KEY_HEAD_DECODE_PREFETCH`, run 32) and reading the state through a tensor descriptor (`KEY_HEAD_DECODE_TMA`,
    run 41), normalising the chunks' row sums once on a bf16 or fp16 state (`KEY_HEAD_DECODE_LATE_NORMS`, run 42)."""
    from gdn_replayssm import _replay

    assert _replay.KEY_HEAD_DECODE_MIN_BATCH == 16 and _replay.NARROW_STATE_KEY_HEAD_DECODE_MIN_BATCH == 17
    assert _replay.KEY_HEAD_DECODE_K_CHUNK == 32 and _replay.KEY_HEAD_DECODE_PREFETCH and _replay.KEY_HEAD_DECODE_TMA
    assert [_replay.key_head_decode_stages(B) for B in (16, 23, 24, 256)] == [0, 0, 2, 2]
    assert [_replay.key_head_decode_late_norms(dtype) for dtype in (F32, BF16, F16)] == [False, True, True]
    for dtype, first in ((F32, 16), (BF16, 17), (torch.float16, 17)):
        assert [_replay.key_head_decode(B, 16, dtype) for B in (8, first - 1, first, 256)] == [False, False, True, True]
    monkeypatch.setattr(_replay, "KEY_HEAD_DECODE_MIN_BATCH", None)
    assert not _replay.key_head_decode(256, 16, F32)
    assert _replay.key_head_decode(256, 16, BF16)
    monkeypatch.setattr(_replay, "KEY_HEAD_DECODE_MIN_BATCH", 8)
    assert [_replay.key_head_decode(B, 16, F32) for B in (4, 7, 8, 256)] == [False, False, True, True]
    assert [_replay.key_head_decode(64, L, F32) for L in (1, 32, 33)] == [True, True, False]
    monkeypatch.setattr(_replay, "KEY_HEAD_DECODE_MIN_BATCH", 1)
    assert not _replay.key_head_decode(_replay.PRELOAD_DECODE_MAX_BATCH, 16, F32)


def test_decode_reads_column_chunks_at_its_batch_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_decode_kernel` reads an fp32 state's tile in `DECODE_K_CHUNK` columns at `DECODE_K_CHUNK_BATCHES` rows only
    (a launch there takes the chunks, at most the tile's width), a bf16 state never, and 0 turns them off."""
    from gdn_replayssm import _replay

    first, last = _replay.DECODE_K_CHUNK_BATCHES[0], _replay.DECODE_K_CHUNK_BATCHES[-1]
    chunk = _replay.DECODE_K_CHUNK
    assert chunk > 0
    assert [_replay.decode_k_chunk(B, F32) for B in (first - 1, first, last, last + 1)] == [0, chunk, chunk, 0]
    assert _replay.decode_k_chunk(first, BF16) == 0
    require_device("cpu")
    _no_key_head_decode(monkeypatch)
    spy = LaunchSpy(_replay._decode_kernel)
    monkeypatch.setattr(_replay, "_decode_kernel", spy)
    problem = make_problem(Case(B=first, T=1, L=4, **TINY))
    replayssm_decode(**_step_kwargs(problem, problem.inputs(), problem.clone_storage(), problem.out()))
    assert [kwargs["KC"] for _, kwargs in spy.launches] == [min(chunk, TINY["K"])]
    monkeypatch.setattr(_replay, "DECODE_K_CHUNK", 0)
    assert _replay.decode_k_chunk(first, F32) == 0


# the decode kernel's state tile as column chunks (`_replay.DECODE_K_CHUNK`, forced at every batch size and state
# dtype here): the preloading and the chunked-history paths, a bf16 state, K = 12 (its second chunk of 8 masked),
# and GPU cases at Qwen3.6 and odd shapes
K_CHUNK_CASES = [
    CPU_CASES[1],
    CPU_CASES[3],
    CPU_CASES[8],
    Case(B=3, T=1, L=6, steps=9, H=2, HV=4, K=12, V=20),
    Case(B=9, T=1, L=16, device="cuda", **QWEN),
    Case(B=9, T=1, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=33, T=1, L=32, x_dtype=BF16, device="cuda", **ODD),
]


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "chunked-history"])
@pytest.mark.parametrize("case", [c.param() for c in K_CHUNK_CASES])
def test_decode_state_column_chunks_match_reference(case: Case, preload: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_decode_kernel` reading its state tile as column chunks (`chunked_projections`, 8 columns on the CPU, 32
    on the GPU) matches the reference over many steps on both history paths, and the launches took the chunks."""
    from gdn_replayssm import _replay

    _small_batch_up_to(monkeypatch, case.B if preload else 0)
    _no_key_head_decode(monkeypatch)
    monkeypatch.setattr(_replay, "DECODE_K_CHUNK", 32 if case.device == "cuda" else 8)
    monkeypatch.setattr(_replay, "decode_k_chunk", lambda B, state_dtype: _replay.DECODE_K_CHUNK)  # every launch
    spy = LaunchSpy(_replay._decode_kernel)
    monkeypatch.setattr(_replay, "_decode_kernel", spy)
    test_replayssm_kernels_match_reference(case, "all")
    seen = {(bool(kwargs["PRELOAD"]), kwargs["KC"], bool(kwargs["PAIRED_STATE"])) for _, kwargs in spy.launches}
    assert seen == {(preload and case.L <= _replay.PRELOAD_MAX_RECORDS, _replay.DECODE_K_CHUNK, False)}


BITWISE_CASES = [
    Case(B=3, T=1, L=1, **TINY),
    Case(B=3, T=1, L=1, x_dtype=BF16, state_dtype=BF16, **TINY),
    Case(B=3, T=1, L=3, **TINY),
    Case(B=3, T=3, L=7, H=1, HV=2, K=12, V=20),
    *(Case(B=7, T=1, L=1, device="cuda", x_dtype=x, state_dtype=s, **QWEN) for x, s in [(F32, F32), (BF16, BF16)]),
    Case(B=7, T=1, L=8, device="cuda", x_dtype=BF16, **QWEN),
    Case(B=33, T=4, L=8, device="cuda", x_dtype=BF16, **QWEN),
    Case(B=7, T=8, L=16, device="cuda", **QWEN),
    Case(B=7, T=3, L=7, device="cuda", **ODD),
]


@pytest.mark.parametrize("case", [c.param() for c in BITWISE_CASES])
def test_flush_path_is_bit_identical_to_baseline(
    case: Case, monkeypatch: pytest.MonkeyPatch, deferred: bool = False
) -> None:
    """At every flush the checkpoint equals the baseline kernel's committed state bit for bit, and the flush
    step's outputs equal the baseline's; at ring_len 1 (decode) that is every step. No fold is deferred (by
    default verify steps' and small decode batches' are); `deferred`: every step's is, and the flush steps'
    outputs, reconstructed, are only close to the baseline's."""
    from gdn_replayssm import _replay

    require_device(case.device)
    monkeypatch.setattr(_replay, "DEFERRED_FOLD", "always" if deferred else "never")
    outputs = not deferred
    T, dev = case.T, case.device
    problem = make_problem(case)
    idx = problem.state_indices
    cols, base_pool = problem.baseline_columns(problem.state.clone())
    n_prev = torch.ones(case.B, dtype=torch.int32, device=dev)
    flushes = 0
    for step in range(case.num_steps):
        x, a, b = problem.inputs()
        committed = base_pool[cols[torch.arange(case.B, device=dev), (n_prev - 1).long()].long()].clone()
        base_out, out = problem.out(), problem.out()
        recurrent_step(
            mixed_qkv=x,
            a=a,
            b=b,
            A_log=problem.A_log,
            dt_bias=problem.dt_bias,
            state=base_pool,
            state_indices=cols,
            num_accepted=n_prev if T > 1 else None,
            out=base_out,
        )
        flushed = problem.flushing()
        step_fn = replayssm_decode if T == 1 else replayssm_verify
        step_fn(**_step_kwargs(problem, (x, a, b), (problem.state, problem.ring, problem.cursors), out))
        n = None if T == 1 else acceptance("random", B=case.B, T=T, generator=problem.generator).to(dev)
        replayssm_commit(cursors=problem.cursors, state_indices=idx, num_accepted=n, num_tokens=T)
        for i, slot in enumerate(idx.tolist()):
            if not flushed[i]:
                continue
            flushes += 1
            rows = slice(i * T, (i + 1) * T)
            if outputs:
                assert torch.equal(out[rows], base_out[rows]), f"step {step} row {i}: flush outputs differ"
            else:
                assert_close(f"step {step} row {i} flush outputs", base_out[rows], out[rows], _tolerances(case)[0])
            expected = base_pool[slot] if T == 1 else committed[i]
            assert torch.equal(problem.state[slot], expected), f"step {step} row {i}: checkpoint differs from baseline"
        if n is not None:
            n_prev = n
    assert flushes >= len(problem.live)


# each bit-exactness case with its flush keys taken the ways its batch size does not take them by default
# (`FLUSH_NORMALISED_KEYS`, above SMALL_BATCH rows): the CPU cases (3 rows) with every key source, keys
# normalised before the launch on both flush grids and each flush program normalising its own; the GPU ones
# (7 rows and more) with their own keys
CPU_KEY_SOURCES = ("own", "plain", "persistent", "persistent listed")
OTHER_KEY_CASES = [(c, keys) for c in BITWISE_CASES if c.device == "cpu" for keys in CPU_KEY_SOURCES]
OTHER_KEY_CASES += [(c, "own") for c in BITWISE_CASES if c.device == "cuda"]
# and the window's tokens normalised by the same pass (`FLUSH_NORMALISED_WINDOW`), on both grids
OTHER_KEY_CASES += [(c, f"{grid} window") for c in BITWISE_CASES for grid in ("plain", "persistent")]
# and the persistent grid's rows from a list (`LISTED_FOLDS`) on the GPU, with the window's tokens as decode has them
OTHER_KEY_CASES += [(c, "persistent window listed") for c in BITWISE_CASES if c.device == "cuda"]


def _keyed(pairs: list[tuple[Case, str]]) -> list[Any]:
    """pytest params of (case, key source) pairs, with the case's marks."""
    return [pytest.param(c, keys, id=f"{c}-{keys}", marks=c.param().marks) for c, keys in pairs]


@pytest.mark.parametrize(("case", "keys"), _keyed(OTHER_KEY_CASES))
def test_flush_path_with_other_key_source_is_bit_identical_to_baseline(
    case: Case, keys: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the flush programs read keys that `_normalised_keys_kernel` normalised ("plain" and
    "persistent": on that flush grid; "... window": the window's keys and queries too; "... listed": the
    persistent grid's rows from a list, `LISTED_FOLDS`) or normalise them themselves ("own"), the checkpoints
    and flush outputs equal the baseline's bit for bit."""
    from gdn_replayssm import _replay

    words = keys.split()
    lists = _count_flushing_lists(monkeypatch, listed="listed" in words)
    monkeypatch.setattr(_replay, "FLUSH_NORMALISED_KEYS", keys != "own")
    monkeypatch.setattr(_replay, "FLUSH_NORMALISED_WINDOW", "window" in words)
    if keys != "own":
        _small_batch_up_to(monkeypatch, 0)
        monkeypatch.setattr(_replay, "PERSISTENT_FLUSH", keys.startswith("persistent"))
    test_flush_path_is_bit_identical_to_baseline(case, monkeypatch)
    assert (lists[0] > 0) == ("listed" in words)  # the listed launches did read a list, and only they


def _count_flushing_lists(monkeypatch: pytest.MonkeyPatch, *, listed: bool | None) -> list[int]:
    """Set `LISTED_FOLDS` to "always" or "never" (None: leave it), and return a one-item counter of the
    flushing-row lists the launches build (`_replay._flushing_list`, still run)."""
    from gdn_replayssm import _replay

    if listed is not None:
        monkeypatch.setattr(_replay, "LISTED_FOLDS", "always" if listed else "never")
    built = [0]
    real = _replay._flushing_list

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        built[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_replay, "_flushing_list", counted)
    return built


# each bit-exactness case with deferred folds, and the CPU ones with every key source of the fold too
DEFERRED_KEY_CASES = [(c, keys) for c in BITWISE_CASES if c.device == "cpu" for keys in CPU_KEY_SOURCES]
GPU_DEFERRED_KEY_SOURCES = ("default", "persistent listed")
DEFERRED_KEY_CASES += [(c, keys) for c in BITWISE_CASES if c.device == "cuda" for keys in GPU_DEFERRED_KEY_SOURCES]


@pytest.mark.parametrize(("case", "keys"), _keyed(DEFERRED_KEY_CASES))
def test_deferred_fold_checkpoint_is_bit_identical_to_baseline(
    case: Case, keys: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With deferred folds (decode steps' too) the fold reads a decode row's token from the record the
    non-flush kernel appended, and a verify row's window is the non-flush kernel's: every checkpoint still
    equals the baseline's bit for bit (ring_len 1 included), and the flush steps' reconstructed outputs are
    close to the baseline's."""
    from gdn_replayssm import _replay

    words = keys.split()
    lists = _count_flushing_lists(monkeypatch, listed="listed" in words)
    if keys != "default":
        monkeypatch.setattr(_replay, "FLUSH_NORMALISED_KEYS", keys != "own")
        _small_batch_up_to(monkeypatch, 0 if keys != "own" else 1 << 20)
        monkeypatch.setattr(_replay, "PERSISTENT_FLUSH", keys.startswith("persistent"))
    test_flush_path_is_bit_identical_to_baseline(case, monkeypatch, deferred=True)
    assert (lists[0] > 0) == ("listed" in words)


def test_join_waits_for_the_cursors_device_and_checks_the_cursors(monkeypatch: pytest.MonkeyPatch) -> None:
    """`replayssm_join` hands the cursors' device to the deferred folds' join (on a CPU there is nothing to
    wait for: the folds ran in line) and refuses cursors that are not cursors, naming the field."""
    from gdn_replayssm import commit

    joined: list[torch.device] = []
    monkeypatch.setattr(commit, "join_deferred_folds", joined.append)
    cursors = ReplayCursors.allocate(num_slots=3, ring_len=8)
    before = cursors.write_pos.clone(), cursors.base.clone()
    replayssm_join(cursors=cursors)
    assert joined == [cursors.write_pos.device]
    assert torch.equal(cursors.write_pos, before[0]) and torch.equal(cursors.base, before[1])
    with pytest.raises(ValueError, match=r"cursors\.base"):
        replayssm_join(cursors=replace(cursors, base=cursors.base.long()))
    assert len(joined) == 1


@pytest.mark.parametrize("T", [1, 2])
def test_deferred_fold_launches_the_fold_after_the_step(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch reaches the launcher: with a deferred fold the non-flush launch comes first and takes the
    flushing rows (`defer`), then the flush launch only folds; without it the flush launch comes first, and
    `FUSED_FLUSH` still makes one launch. By default (`deferred_fold`) verify steps defer, and decode steps of
    2-32 rows."""
    from gdn_replayssm import _replay

    calls: list[tuple[str, bool]] = []

    def spy(name: str) -> Any:
        launch = getattr(_replay, name)

        def recorded(args: list[object], **kw: Any) -> None:
            calls.append((name, kw.get("defer", False)))
            launch(args, **kw)

        return recorded

    for name in ("launch_window", "launch_flush"):
        monkeypatch.setattr(_replay, name, spy(name))
    case = Case(B=3, T=T, L=4, **TINY)
    problem = make_problem(case)
    step = replayssm_decode if T == 1 else replayssm_verify
    deferring = [("launch_window", True), ("launch_flush", True)]
    plain = [("launch_flush", False), ("launch_window", False)]
    for mode, fused, want in [
        ("auto", False, deferring),  # 3 rows
        ("always", False, deferring),
        ("never", False, plain),
        ("always", True, [("launch_window", False)]),
    ]:
        monkeypatch.setattr(_replay, "DEFERRED_FOLD", mode)
        monkeypatch.setattr(_replay, "FUSED_FLUSH", fused)
        calls.clear()
        step(**_step_kwargs(problem, problem.inputs(), (problem.state, problem.ring, problem.cursors), problem.out()))
        assert calls == want, (mode, fused)
    monkeypatch.setattr(_replay, "DEFERRED_FOLD", "auto")
    assert [_replay.deferred_fold(1, B) for B in (1, 2, 32, 33, 256)] == [False, True, True, False, False]
    assert all(_replay.deferred_fold(t, B) for t in (2, 8) for B in (1, 33, 256))


def test_a_decode_steps_in_line_fold_reads_its_rows_from_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default (`LISTED_FOLDS` "auto") the persistent fold of a decode step that folds in line builds the list
    of flushing rows and still matches the reference; a deferred decode fold and a verify step's fold scan the
    batch instead. Three rows: above `SMALL_BATCH`, so the persistent grid runs."""
    from gdn_replayssm import _replay

    assert _replay.LISTED_FOLDS == "auto"
    built = _count_flushing_lists(monkeypatch, listed=None)
    for T, deferred, lists in [(1, "never", True), (1, "always", False), (2, "never", False)]:
        monkeypatch.setattr(_replay, "DEFERRED_FOLD", deferred)
        built[0] = 0
        test_replayssm_kernels_match_reference(Case(B=3, T=T, L=2 * T + 2, **TINY), "all")
        assert (built[0] > 0) == lists, (T, deferred)


FLOAT64_SUM_CASES = [BITWISE_CASES[0], BITWISE_CASES[3], BITWISE_CASES[4], BITWISE_CASES[7], BITWISE_CASES[9]]


@pytest.mark.parametrize("case", [c.param() for c in FLOAT64_SUM_CASES])
def test_flush_path_is_bit_identical_to_baseline_with_float64_sums(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_config.FLOAT64_SUMS` (float32 terms added in float64, rounded once; the default is TREE_SUMS) keeps
    the contract: the flush path and the baseline's exact mode round their sums alike, so the checkpoints and
    flush outputs match bit for bit; the baseline stays within the reference's tolerance."""
    from gdn_replayssm import _config

    monkeypatch.setattr(_config, "EXACT_SUM_MODE", _config.FLOAT64_SUMS)
    test_flush_path_is_bit_identical_to_baseline(case, monkeypatch)
    if case.device == "cpu" and case.T > 1:
        test_baseline_kernel_matches_reference(BASELINE_CASES[1])


CHAIN_CASES = [
    pytest.param(case.param().values[0], blocks, id=f"{case.param().id}-chain{blocks}", marks=case.param().marks)
    for case in FLOAT64_SUM_CASES
    for blocks in (2, 4, 8)
]


@pytest.mark.parametrize(("case", "blocks"), CHAIN_CASES)
def test_flush_path_is_bit_identical_to_baseline_with_chain_dots(
    case: Case, blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_config.CHAIN_BLOCKS` (the state dots as FMA chains over 2, 4 or 8 column blocks, then the tree) keeps
    the contract: the fold, the flush's window part and the baseline's exact mode share `exact_dot`, so the
    checkpoints and flush outputs match bit for bit; the baseline stays within the reference's tolerance."""
    from gdn_replayssm import _config

    monkeypatch.setattr(_config, "CHAIN_BLOCKS", blocks)
    test_flush_path_is_bit_identical_to_baseline(case, monkeypatch)
    if case.device == "cpu" and case.T > 1:
        test_baseline_kernel_matches_reference(BASELINE_CASES[1])


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)])
def test_chain_dots_change_the_exact_op_order(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch reaches the kernels: the baseline's exact mode rounds differently with no chain and with
    chains of 2, 4 and 8 blocks, all four pairwise (so the bit-exact cases above compare new paths, not the
    old one again), and within float32 rounding of each other."""
    from gdn_replayssm import _config

    require_device(device)
    case = Case(B=3, T=2, L=4, device=device, H=1, HV=2, K=64, V=16)
    outs = []
    for blocks in _config.CHAIN_BLOCK_CHOICES:
        monkeypatch.setattr(_config, "CHAIN_BLOCKS", blocks)
        problem = make_problem(case)
        cols, pool = problem.baseline_columns(problem.state.clone())
        x, a, b = problem.inputs()
        out = problem.out()
        recurrent_step(
            mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state=pool, state_indices=cols,
            num_accepted=torch.ones(case.B, dtype=torch.int32, device=device), out=out, exact_sums=True,
        )  # fmt: skip
        outs.append((out, pool))
    for i, (out0, pool0) in enumerate(outs):
        for out1, pool1 in outs[i + 1 :]:
            assert not (torch.equal(out0, out1) and torch.equal(pool0, pool1))
            torch.testing.assert_close(out0, out1, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(pool0, pool1, rtol=1e-5, atol=1e-6)


def test_chain_blocks_are_checked() -> None:
    """A chain length the kernels have no code for is refused with the allowed ones named, and each allowed one
    has its own op-order code and benchmark name."""
    from gdn_replayssm import _config

    with pytest.raises(ValueError, match=r"CHAIN_BLOCKS must be one of \(0, 2, 4, 8\), got 3"):
        _config.chain_code(3)
    codes = [_config.chain_code(n) for n in _config.CHAIN_BLOCK_CHOICES]
    assert codes[0] == 0
    assert len(set(codes)) == len(codes)
    assert all(code % _config.CHAIN_FLAG == 0 and code // _config.CHAIN_FLAG < 4 for code in codes)


BASELINE_CASES = [
    Case(B=3, T=1, L=2, **TINY),
    Case(B=3, T=3, L=6, x_dtype=BF16, state_dtype=BF16, H=1, HV=2, K=12, V=20),
    Case(B=7, T=1, L=2, device="cuda", **QWEN),
    Case(B=33, T=4, L=8, x_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=8, L=16, x_dtype=BF16, state_dtype=BF16, device="cuda", **ODD),
]


@pytest.mark.parametrize("case", [c.param() for c in BASELINE_CASES])
def test_baseline_kernel_matches_reference(case: Case) -> None:
    """One state per token: outputs and every written column against the reference; padding rows zero."""
    require_device(case.device)
    T, dev = case.T, case.device
    problem = make_problem(case)
    idx = problem.state_indices
    cols = idx[:, None].repeat(1, T)
    pool = problem.state
    if T > 1:
        extra = problem.num_slots + torch.arange(case.B * (T - 1), dtype=torch.int32, device=dev).view(case.B, T - 1)
        cols[:, 1:] = torch.where(idx[:, None] > 0, extra, idx[:, None])
        pool = torch.cat([pool, torch.zeros_like(pool[:1]).expand(case.B * (T - 1), -1, -1, -1)])
    ref_pool, before = pool.clone(), pool.clone()
    n_prev = None
    out_tol, state_tol = _tolerances(case)
    for step in range(3):
        x, a, b = problem.inputs()
        out, ref_out = problem.out(), problem.out()
        common = dict(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state_indices=cols)
        recurrent_step(**common, state=pool, num_accepted=n_prev, out=out)
        recurrent_ref(**common, state=ref_pool, num_accepted=n_prev, out=ref_out)
        assert_close(f"step {step} outputs", ref_out, out, out_tol)
        assert_close(f"step {step} states", ref_pool[problem.live], pool[problem.live], state_tol)
        if T > 1:
            n_prev = acceptance("random", B=case.B, T=T, generator=problem.generator).to(dev)
    assert torch.equal(out[T : 2 * T], torch.zeros_like(out[T : 2 * T])), "padding row not zero"
    idle = torch.tensor(problem.untouched(), dtype=torch.long, device=dev)
    assert torch.equal(pool[idle], before[idle]), "idle slots changed"


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)])
def test_commit_and_reset_kernels_match_reference(device: str) -> None:
    require_device(device)
    gen = torch.Generator().manual_seed(3)
    joins = 0
    for T, L, J in [(1, 1, 0), (1, 16, 0), (3, 7, 0), (4, 32, 0), (1, 16, 8), (4, 32, 16)]:
        num_slots, B = 300, 260  # more rows than one program's block
        cursors = ReplayCursors.allocate(num_slots=num_slots, ring_len=L, flush_join=J)
        cursors.write_pos.copy_(torch.randint(0, max(L - T, 1) + 1, (num_slots,), generator=gen, dtype=torch.int32))
        cursors.base.copy_(torch.randint(0, L, (num_slots,), generator=gen, dtype=torch.int32))
        idx = (torch.randperm(num_slots - 1, generator=gen)[:B] + 1).to(torch.int32)
        idx[::17] = 0
        idx[5::23] = -1
        n = torch.randint(0, T + 2, (B,), generator=gen, dtype=torch.int32)  # out-of-range values are clamped
        ref = cursors.clone()
        got = replace(cursors, write_pos=cursors.write_pos.to(device), base=cursors.base.to(device))
        wp = [int(cursors.write_pos[s]) for s in idx.tolist() if s > 0]
        joins += sum(flushing_rows(write_pos=wp, num_tokens=T, ring_len=L, flush_join=J)) - sum(
            flush_due(write_pos=w, num_tokens=T, ring_len=L) for w in wp
        )
        replayssm_plan_ref(cursors=ref, state_indices=idx, num_tokens=T)
        replayssm_plan(cursors=got, state_indices=idx.to(device), num_tokens=T)
        assert torch.equal(got.write_pos.cpu(), ref.write_pos), f"T={T} L={L}: plan"
        replayssm_commit_ref(cursors=ref, state_indices=idx, num_accepted=None if T == 1 else n, num_tokens=T)
        replayssm_commit(
            cursors=got, state_indices=idx.to(device), num_accepted=None if T == 1 else n.to(device), num_tokens=T
        )
        assert torch.equal(got.write_pos.cpu(), ref.write_pos), f"T={T} L={L}: write_pos"
        assert torch.equal(got.base.cpu(), ref.base), f"T={T} L={L}: base"
        replayssm_reset_ref(cursors=ref, state_indices=idx[:40])
        replayssm_reset(cursors=got, state_indices=idx[:40].to(device))
        assert torch.equal(got.write_pos.cpu(), ref.write_pos), f"T={T} L={L}: reset write_pos"
        assert torch.equal(got.base.cpu(), ref.base), f"T={T} L={L}: reset base"
    assert joins > 0, "no row joined a flush"


def test_kernels_reject_bad_arguments() -> None:
    require_device("cpu")
    case = Case(B=2, T=2, L=4, **TINY)
    problem = make_problem(case, pad_rows=False)
    x, a, b = problem.inputs()
    kwargs = _step_kwargs(problem, (x, a, b), (problem.state, problem.ring, problem.cursors), problem.out())
    with pytest.raises(ValueError, match="float64 is reference-only"):
        replayssm_verify(**{**kwargs, "state": problem.state.double()})
    with pytest.raises(ValueError, match="2 <= T <= 8"):
        replayssm_verify(**{**kwargs, "state_indices": problem.state_indices.repeat(2)})
    with pytest.raises(ValueError, match="`out` must be contiguous"):
        replayssm_verify(**{**kwargs, "out": problem.out().transpose(1, 2).contiguous().transpose(1, 2)})
    long_case = Case(B=2, T=2, L=129, **TINY)
    long = make_problem(long_case, pad_rows=False)
    long_kwargs = _step_kwargs(long, long.inputs(), (long.state, long.ring, long.cursors), long.out())
    with pytest.raises(ValueError, match="ring_len L=129; spec verify holds at most 128"):
        replayssm_verify(**long_kwargs)
    with pytest.raises(ValueError, match="must be >= 2 \\* num_tokens"):
        replayssm_commit(cursors=problem.cursors, state_indices=problem.state_indices, num_tokens=3)
    with pytest.raises(ValueError, match="`state_indices` must be \\[B, T\\]"):
        recurrent_step(
            mixed_qkv=x,
            a=a,
            b=b,
            A_log=problem.A_log,
            dt_bias=problem.dt_bias,
            state=problem.state,
            state_indices=problem.state_indices[:, None],
            out=problem.out(),
        )


PLAIN_FLUSH = {"PERSISTENT_FLUSH": False, "FLUSH_SMALL_TILE_BLOCK_V": 16}


@pytest.mark.parametrize(
    ("T", "variant"),
    [(1, {}), (3, {}), (3, {"FLUSH_SMALL_TILE_BLOCK_V": 4}), (3, {"PERSISTENT_FLUSH": False})],
    ids=["decode-default", "verify-default", "verify-persistent-4-rows", "verify-plain-8-rows"],
)
def test_flush_launch_variants_fold_what_the_plain_launch_folds(
    T: int, variant: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixed-grid flush launch finds the flushing rows on the device, and a smaller flush tile splits a
    row's fold over more programs; every step they (the defaults, and others) must fold exactly the rows that
    the plain grid of 16-row tiles folds (outputs, checkpoints, rings bit for bit), with programs looping over
    several items and several rows flushing in the same step."""
    require_device("cpu")
    from gdn_replayssm import _replay

    case = Case(B=7, T=T, L=2 * T + 1, steps=10, **TINY)
    problem = make_problem(case)
    plain, varied = problem.clone_storage(), problem.clone_storage()
    variant = {name: variant.get(name, getattr(_replay, name)) for name in PLAIN_FLUSH}
    assert variant != PLAIN_FLUSH
    step_fn = replayssm_decode if T == 1 else replayssm_verify
    most_flushing = 0
    for step in range(case.num_steps):
        x, a, b = problem.inputs()
        flushing = sum(problem.flushing(plain[2]))
        most_flushing = max(most_flushing, flushing)
        outs = []
        for on, storage in ((False, plain), (True, varied)):
            for name, value in (variant if on else PLAIN_FLUSH).items():
                monkeypatch.setattr(_replay, name, value)
            out = problem.out()
            step_fn(**_step_kwargs(problem, (x, a, b), storage, out))
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), f"step {step}: outputs differ"
        assert torch.equal(plain[0], varied[0]), f"step {step}: checkpoints differ"
        for name, t in plain[1].tensors().items():
            assert torch.equal(t, varied[1].tensors()[name]), f"step {step}: ring.{name} differs"
        n = None if T == 1 else acceptance("random", B=case.B, T=T, generator=problem.generator)
        for storage in (plain, varied):
            replayssm_commit(cursors=storage[2], state_indices=problem.state_indices, num_accepted=n, num_tokens=T)
    assert most_flushing >= 2


@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("join", [0, 4])
def test_flushing_list_names_the_steps_flushing_rows(device: str, join: int) -> None:
    """`_flushing_list_kernel` (`LISTED_FOLDS`) writes the count of the step's flushing rows, then each one's row,
    slot, `wp` and ring base in row order, by `flushing_rows`' rule (with the step's plan when joining); padding
    rows and the null slot never appear, and nothing past the last entry is written."""
    import triton
    from gdn_replayssm import _flush

    require_device(device)
    T, L, B = 2, 12, 13
    gen = torch.Generator().manual_seed(7)
    cursors = ReplayCursors.allocate(num_slots=20, ring_len=L, flush_join=join, device=device)
    cursors.write_pos.copy_(torch.randint(0, L - 2 * T + 3, (20,), generator=gen, dtype=torch.int32))
    cursors.base.copy_(torch.randint(0, L, (20,), generator=gen, dtype=torch.int32))
    slots = torch.randperm(19, generator=gen)[:B].to(torch.int32) + 1
    slots[[2, 7]] = torch.tensor([0, -1], dtype=torch.int32)  # the null slot and a padding row
    state_indices = slots.to(device)
    replayssm_plan(cursors=cursors, state_indices=state_indices, num_tokens=T)  # sets write_pos[0] when joining
    sentinel = -12345
    rows = torch.full((_flush.LIST_ENTRY.value * (B + 1),), sentinel, dtype=torch.int32, device=device)
    _flush._flushing_list_kernel[(1,)](
        state_indices, cursors.write_pos, cursors.base, rows, B, T=T, L=L, BB=triton.next_power_of_2(B), JOIN=join
    )
    wp, base = cursors.write_pos.cpu().tolist(), cursors.base.cpu().tolist()
    live = [i for i, s in enumerate(slots.tolist()) if s > 0]
    step_due = bool(cursors.write_pos[0].item()) if join else None
    flushing = flushing_rows(
        write_pos=[wp[slots[i]] for i in live], num_tokens=T, ring_len=L, flush_join=join, step_due=step_due
    )
    expected = [(i, int(slots[i]), wp[slots[i]], base[slots[i]]) for i, f in zip(live, flushing, strict=True) if f]
    assert 0 < len(expected) < len(live)  # the draw has rows on both sides of the rule
    entries = rows.cpu().view(B + 1, _flush.LIST_ENTRY.value)
    assert int(entries[0, 0]) == len(expected)
    assert [tuple(e) for e in entries[1 : len(expected) + 1].tolist()] == expected
    assert (entries[len(expected) + 1 :] == sentinel).all()
