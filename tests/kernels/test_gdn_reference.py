"""The PyTorch reference against a token-by-token float64 oracle, plus the ReplaySSM invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gdn_replayssm import ReplayCursors, ReplayRing, flush_due, flushing_rows
from gdn_replayssm.reference import (
    corrected_values_ref,
    recurrent_ref,
    replayssm_commit_ref,
    replayssm_decode_ref,
    replayssm_plan_ref,
    replayssm_reset_ref,
    replayssm_verify_ref,
)
from gdn_testing import Case, NaiveOracle, acceptance, assert_close, make_problem

F64 = torch.float64
F32 = torch.float32


def _run_replay_ref(problem, steps: int, pattern: str, oracle: NaiveOracle | None = None):
    """Steps the ReplaySSM reference; yields (outputs, oracle outputs or None, num_accepted, flushed rows,
    rows that joined a flush)."""
    c = problem.case
    step_fn = replayssm_decode_ref if c.T == 1 else replayssm_verify_ref
    for _ in range(steps):
        x, a, b = problem.inputs()
        out = problem.out(dtype=c.state_dtype if c.state_dtype == F64 else F32)
        n = None if c.T == 1 else acceptance(pattern, B=c.B, T=c.T, generator=problem.generator)
        flushed, joined = problem.flushing(), problem.joining()
        replayssm_plan_ref(cursors=problem.cursors, state_indices=problem.state_indices, num_tokens=c.T)
        step_fn(
            mixed_qkv=x,
            a=a,
            b=b,
            A_log=problem.A_log,
            dt_bias=problem.dt_bias,
            state=problem.state,
            ring=problem.ring,
            cursors=problem.cursors,
            state_indices=problem.state_indices,
            out=out,
        )
        expected = oracle.step(x, a, b, n) if oracle is not None else None
        replayssm_commit_ref(
            cursors=problem.cursors, state_indices=problem.state_indices, num_accepted=n, num_tokens=c.T
        )
        yield out, expected, n, flushed, joined


ORACLE_CASES = [
    Case(B=3, T=1, H=1, HV=2, K=8, V=6, L=1, x_dtype=F64, state_dtype=F64),
    Case(B=3, T=1, H=1, HV=2, K=8, V=6, L=5, x_dtype=F64, state_dtype=F64),
    Case(B=3, T=1, H=1, HV=2, K=8, V=6, L=4, x_dtype=F64, state_dtype=F64, fold="open_loop"),
    Case(B=3, T=2, H=1, HV=3, K=8, V=5, L=4, x_dtype=F64, state_dtype=F64),
    Case(B=4, T=3, H=2, HV=4, K=7, V=6, L=7, x_dtype=F64, state_dtype=F64),
    Case(B=3, T=4, H=1, HV=2, K=8, V=6, L=11, x_dtype=F64, state_dtype=F64, fold="open_loop"),
    # coalesced flushes: rows past half the ring fold with the step's due rows
    Case(B=4, T=2, H=1, HV=3, K=8, V=5, L=8, x_dtype=F64, state_dtype=F64, join=4),
    Case(B=4, T=3, H=1, HV=2, K=8, V=6, L=9, x_dtype=F64, state_dtype=F64, fold="open_loop", join=5),
]


ORACLE_PARAMS = [
    pytest.param(c, p, id=f"{c}-{p}")
    for c in ORACLE_CASES
    for p in (["all"] if c.T == 1 else ["none", "all", "random"])
]


@pytest.mark.parametrize(("case", "pattern"), ORACLE_PARAMS)
def test_replayssm_reference_matches_naive_oracle(case: Case, pattern: str) -> None:
    problem = make_problem(case)
    oracle = NaiveOracle(problem)
    joins = 0
    for step, (out, expected, _, _, joined) in enumerate(_run_replay_ref(problem, case.num_steps, pattern, oracle)):
        assert_close(f"step {step} outputs", expected, out.cpu(), 1e-11)
        joins += sum(joined)
    # rows in lockstep ("all", "none") flush together anyway: only random acceptance spreads them
    assert (joins > 0) == (case.join > 0 and pattern == "random"), f"{joins} rows joined a flush"
    # rows that have just flushed hold the committed state in their checkpoint; fold the rest to check them too
    for slot, committed in oracle.committed.items():
        if int(problem.cursors.write_pos[slot]) == 0:
            assert_close(f"slot {slot} checkpoint", committed, problem.state[slot].cpu(), 1e-11)


@pytest.mark.parametrize("T", [1, 3])
def test_recurrent_reference_matches_naive_oracle(T: int) -> None:
    case = Case(B=4, T=T, H=2, HV=4, K=8, V=5, L=2 * T, x_dtype=F64, state_dtype=F64)
    problem = make_problem(case)
    oracle = NaiveOracle(problem)
    # the baseline keeps T slots per row: column t receives the state after token t
    extra = torch.arange(case.T, dtype=torch.int32) * 1000
    cols = problem.state_indices[:, None] + extra[None, :]
    cols[problem.state_indices <= 0] = problem.state_indices[problem.state_indices <= 0, None]
    pool = torch.zeros(1000 * case.T + problem.num_slots, case.HV, case.V, case.K, dtype=F64)
    pool[: problem.num_slots] = problem.state
    n_prev = torch.ones(case.B, dtype=torch.int32)
    for step in range(5):
        x, a, b = problem.inputs()
        out = problem.out()
        n = acceptance("random", B=case.B, T=case.T, generator=problem.generator)
        recurrent_ref(
            mixed_qkv=x,
            a=a,
            b=b,
            A_log=problem.A_log,
            dt_bias=problem.dt_bias,
            state=pool,
            state_indices=cols,
            num_accepted=n_prev,
            out=out,
        )
        assert_close(f"step {step} outputs", oracle.step(x, a, b, n), out, 1e-11)
        n_prev = n
    for i, slot in enumerate(problem.state_indices.tolist()):
        if slot > 0:
            assert_close(f"row {i} state", oracle.committed[slot], pool[int(cols[i, n_prev[i] - 1])], 1e-11)
    assert torch.equal(out[case.T : 2 * case.T], torch.zeros_like(out[case.T : 2 * case.T])), "padded row not zero"


@pytest.mark.parametrize(("T", "join"), [(1, 0), (2, 0), (3, 0), (2, 3)], ids=["T1", "T2", "T3", "T2-joined"])
def test_exact_fold_is_bit_identical_to_recurrent_reference(T: int, join: int) -> None:
    """fp32: every flush leaves the checkpoint bit-identical to the recurrent baseline's committed state,
    and the flush step's outputs bit-identical to the baseline's; also for rows that joined a flush early."""
    L = 3 if T == 1 else 2 * T + 1
    case = Case(B=3, T=T, H=1, HV=2, K=16, V=8, L=L, steps=3 * L, join=join)
    problem = make_problem(case, pad_rows=False)
    cols, base_pool = problem.baseline_columns(problem.state.clone())
    n_prev = torch.ones(case.B, dtype=torch.int32)
    flushes = joins = 0
    for step in range(case.num_steps):
        x, a, b = problem.inputs()
        committed = [base_pool[int(cols[i, n_prev[i] - 1])].clone() for i in range(case.B)]
        base_out = problem.out()
        recurrent_ref(
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
        joins += sum(problem.joining())
        out, n, flushed = _run_replay_ref_once(problem, x, a, b, "random")
        for i, slot in enumerate(problem.state_indices.tolist()):
            if flushed[i]:
                flushes += 1
                rows = slice(i * T, (i + 1) * T)
                assert torch.equal(out[rows], base_out[rows]), f"step {step} row {i}: flush outputs differ"
                expected = base_pool[slot] if T == 1 else committed[i]
                assert torch.equal(problem.state[slot], expected), f"step {step} row {i}: checkpoint differs"
        if T > 1:
            n_prev = n
    assert flushes >= case.B
    assert (joins > 0) == (join > 0), f"{joins} rows joined a flush"


def _run_replay_ref_once(problem, x, a, b, pattern):
    c = problem.case
    n = None if c.T == 1 else acceptance(pattern, B=c.B, T=c.T, generator=problem.generator)
    flushed = problem.flushing()
    out = problem.out()
    step_fn = replayssm_decode_ref if c.T == 1 else replayssm_verify_ref
    replayssm_plan_ref(cursors=problem.cursors, state_indices=problem.state_indices, num_tokens=c.T)
    step_fn(
        mixed_qkv=x,
        a=a,
        b=b,
        A_log=problem.A_log,
        dt_bias=problem.dt_bias,
        state=problem.state,
        ring=problem.ring,
        cursors=problem.cursors,
        state_indices=problem.state_indices,
        out=out,
    )
    replayssm_commit_ref(cursors=problem.cursors, state_indices=problem.state_indices, num_accepted=n, num_tokens=c.T)
    return out, n, flushed


@pytest.mark.parametrize(
    ("T", "L", "J"),
    [(1, 1, 0), (1, 2, 0), (1, 9, 0), (2, 4, 0), (3, 6, 0), (4, 11, 0), (8, 16, 0), (8, 64, 0), (1, 9, 4), (4, 11, 5)],
)
def test_early_flush_keeps_every_window_inside_the_ring(T: int, L: int, J: int) -> None:
    """Cursor walk over random acceptance: wp + T <= L on every step, history never longer than L - T,
    flushes exactly when `flushing_rows` says (`wp + 2T > L`, or joining a due row with `flush_join = J`),
    and decode empties the ring on flush."""
    gen = torch.Generator().manual_seed(T * 100 + L)
    cursors = ReplayCursors.allocate(num_slots=4, ring_len=L, flush_join=J)
    idx = torch.tensor([1, 2, 3], dtype=torch.int32)
    cursors.write_pos[idx] = torch.tensor([0, 1, 2], dtype=torch.int32) % max(L - 2 * T + 1, 1)  # rows apart
    joins = 0
    for _ in range(300):
        before = cursors.write_pos.clone()
        base_before = cursors.base.clone()
        n = None if T == 1 else acceptance("random", B=3, T=T, generator=gen)
        decided = flushing_rows(
            write_pos=[int(before[s]) for s in idx.tolist()], num_tokens=T, ring_len=L, flush_join=J
        )
        replayssm_plan_ref(cursors=cursors, state_indices=idx, num_tokens=T)
        replayssm_commit_ref(cursors=cursors, state_indices=idx, num_accepted=n, num_tokens=T)
        for i, slot in enumerate(idx.tolist()):
            wp = int(before[slot])
            assert wp + T <= max(L, T), f"window [{wp}, {wp + T}) leaves the ring of {L}"
            joins += decided[i] and not flush_due(write_pos=wp, num_tokens=T, ring_len=L)
            if decided[i]:
                if T == 1:
                    assert int(cursors.write_pos[slot]) == 0
                else:
                    assert int(cursors.base[slot]) == (int(base_before[slot]) + wp) % L
                    assert int(cursors.write_pos[slot]) == int(n[i])
            else:
                assert int(cursors.write_pos[slot]) == wp + (1 if n is None else int(n[i]))
    assert int(cursors.write_pos[0]) == 0, "slot 0 was not in the batch"
    assert (joins > 0) == (J > 0), f"{joins} rows joined a flush"


def test_reset_empties_listed_slots_only() -> None:
    cursors = ReplayCursors.allocate(num_slots=5, ring_len=8)
    cursors.write_pos.copy_(torch.tensor([9, 3, 4, 5, 6], dtype=torch.int32))
    cursors.base.copy_(torch.tensor([9, 1, 2, 3, 4], dtype=torch.int32))
    replayssm_reset_ref(cursors=cursors, state_indices=torch.tensor([2, 0, -1, 4], dtype=torch.int32))
    assert cursors.write_pos.tolist() == [9, 3, 0, 5, 0]
    assert cursors.base.tolist() == [9, 1, 0, 3, 0]


def test_corrected_values_make_a_random_ring_a_trajectory() -> None:
    """After `corrected_values_ref` the stored `u`s reconstruct what the exact fold replays from the raw
    records (open-loop fold == exact fold, fp64), for every slot; before it they do not. An open-loop ring,
    which has no raw records, is refused."""
    from gdn_replayssm.reference import _exact_fold, _history, _open_loop_fold

    N, H, HV, K, V, L = 3, 1, 2, 8, 8, 6
    gen = torch.Generator().manual_seed(5)
    ring = ReplayRing.allocate(num_slots=N, num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V,
                               ring_len=L, dtype=F64)  # fmt: skip
    for name, t in ring.tensors().items():
        if name == "g":
            t.uniform_(-0.3, -0.01, generator=gen)
        elif name == "beta":
            t.uniform_(0.1, 0.9, generator=gen)
        else:
            t.normal_(generator=gen)
    state = 0.3 * torch.randn(N, HV, V, K, dtype=F64, generator=gen)

    def gap(slot: int) -> float:
        hist = _history(ring, slot, list(range(L)), HV // H, F64)
        exact = _exact_fold(state[slot], hist)
        return float((_open_loop_fold(state[slot], hist) - exact).norm() / exact.norm())

    assert min(gap(s) for s in range(N)) > 1e-2
    corrected_values_ref(state=state, ring=ring)
    assert max(gap(s) for s in range(N)) < 1e-12
    open_loop = ReplayRing.allocate(num_slots=N, num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V,
                                    ring_len=L, dtype=torch.float32, fold="open_loop")  # fmt: skip
    with pytest.raises(ValueError, match="raw records"):
        corrected_values_ref(state=state.float(), ring=open_loop)


def test_reference_rejects_bad_arguments() -> None:
    case = Case(B=2, T=2, H=1, HV=2, K=8, V=8, L=4)
    problem = make_problem(case, pad_rows=False)
    x, a, b = problem.inputs()
    kwargs = dict(
        mixed_qkv=x,
        a=a,
        b=b,
        A_log=problem.A_log,
        dt_bias=problem.dt_bias,
        state=problem.state,
        ring=problem.ring,
        cursors=problem.cursors,
        state_indices=problem.state_indices,
        out=problem.out(),
    )
    with pytest.raises(ValueError, match="one token per row for decode"):
        replayssm_decode_ref(**kwargs)
    short = ReplayRing.allocate(
        num_slots=problem.num_slots, num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8, ring_len=3, dtype=F32
    )
    with pytest.raises(ValueError, match="ring_len 3 < 2 \\* T = 4"):
        replayssm_verify_ref(
            **{**kwargs, "ring": short, "cursors": ReplayCursors.allocate(num_slots=problem.num_slots, ring_len=3)}
        )
    with pytest.raises(ValueError, match="`a` must be \\[B \\* T, HV\\]"):
        replayssm_verify_ref(**{**kwargs, "a": a[:, :1]})
    with pytest.raises(ValueError, match="width"):
        replayssm_verify_ref(**{**kwargs, "mixed_qkv": x[:, :-1]})
    with pytest.raises(ValueError, match="not a multiple"):
        replayssm_verify_ref(**{**kwargs, "state_indices": problem.state_indices.repeat(3)[:3]})
    with pytest.raises(ValueError, match=r"`cursors.flush_join` must be an int in 0\.\.ring_len = 0\.\.4"):
        replayssm_verify_ref(**{**kwargs, "cursors": replace(problem.cursors, flush_join=5)})
    with pytest.raises(ValueError, match=r"flush_join must be in 0\.\.ring_len = 0\.\.4, got -1"):
        ReplayCursors.allocate(num_slots=2, ring_len=4, flush_join=-1)
