"""GPU-only: long-run error growth against a float64 trajectory, and CUDA-graph capture of steps."""

from __future__ import annotations

import pytest
import torch
from gdn_replayssm import replayssm_commit, replayssm_decode, replayssm_join, replayssm_verify
from gdn_replayssm.reference import recurrent_ref
from gdn_testing import Case, acceptance, make_problem, rel_rms, require_device

pytestmark = pytest.mark.gpu

LONG_CASES = [
    Case(B=2, T=1, H=2, HV=4, K=64, V=64, L=32, device="cuda", steps=4096),
    Case(B=2, T=4, H=2, HV=4, K=64, V=64, L=16, device="cuda", steps=4096),
]


@pytest.mark.parametrize("case", [c.param() for c in LONG_CASES])
def test_error_does_not_grow_over_4096_steps(case: Case) -> None:
    """fp32 ReplaySSM (exact fold) against the float64 recurrence of the same accepted stream: the output
    error of the last 512 steps is no larger than that of steps 64..575, and every flushed checkpoint stays
    at fp32 rounding level."""
    require_device("cuda")
    T, dev = case.T, case.device
    problem = make_problem(case, pad_rows=False)
    idx = problem.state_indices
    cols, true_pool = problem.baseline_columns(problem.state.double())
    rows = torch.arange(case.B, device=dev)
    n_prev = torch.ones(case.B, dtype=torch.int32, device=dev)
    out_err, state_err = [], []
    for _ in range(case.num_steps):
        x, a, b = problem.inputs()
        committed = true_pool[cols[rows, (n_prev - 1).long()].long()].clone()
        true_out = torch.empty(case.B * T, case.HV, case.V, dtype=torch.float64, device=dev)
        recurrent_ref(
            mixed_qkv=x,
            a=a,
            b=b,
            A_log=problem.A_log,
            dt_bias=problem.dt_bias,
            state=true_pool,
            state_indices=cols,
            num_accepted=n_prev if T > 1 else None,
            out=true_out,
        )
        flushed = problem.flushing()  # every row is live (pad_rows=False)
        out = problem.out()
        step = replayssm_decode if T == 1 else replayssm_verify
        step(
            mixed_qkv=x,
            a=a,
            b=b,
            A_log=problem.A_log,
            dt_bias=problem.dt_bias,
            state=problem.state,
            ring=problem.ring,
            cursors=problem.cursors,
            state_indices=idx,
            out=out,
        )
        n = None if T == 1 else acceptance("random", B=case.B, T=T, generator=problem.generator).to(dev)
        replayssm_commit(cursors=problem.cursors, state_indices=idx, num_accepted=n, num_tokens=T)
        out_err.append(rel_rms(true_out, out))
        for i, slot in enumerate(idx.tolist()):
            if flushed[i]:
                expected = true_pool[slot] if T == 1 else committed[i]
                state_err.append(rel_rms(expected, problem.state[slot]))
        if n is not None:
            n_prev = n
    early = sum(out_err[64:576]) / 512
    late = sum(out_err[-512:]) / 512
    assert late <= 2.0 * early + 1e-7, f"output error grew: steps 64..575 {early:.2e}, last 512 {late:.2e}"
    assert max(state_err) < 1e-5, f"checkpoint error {max(state_err):.2e} above fp32 rounding level"
    assert max(out_err) < 1e-4, f"output error {max(out_err):.2e}"


@pytest.mark.parametrize("deferred", [False, True], ids=["", "deferred"])
@pytest.mark.parametrize("T", [1, 4])
def test_cuda_graph_replay_matches_eager(T: int, deferred: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured sequence of steps (kernel + commit, flushes included) replays like eager execution,
    and replaying it again continues the same trajectory: cursors live on the device. With deferred folds
    the folds run on side streams that each commit joins, inside the capture too."""
    from gdn_replayssm import _replay

    require_device("cuda")
    monkeypatch.setattr(_replay, "DEFERRED_FOLD", "always" if deferred else "never")
    case = Case(B=9, T=T, H=16, HV=32, K=128, V=128, L=8 if T > 1 else 5, x_dtype=torch.bfloat16, device="cuda")
    problem = make_problem(case)
    steps = 6
    inputs = [problem.inputs() for _ in range(steps)]
    accepted = [
        acceptance("random", B=case.B, T=T, generator=problem.generator).cuda() if T > 1 else None for _ in range(steps)
    ]
    step_fn = replayssm_decode if T == 1 else replayssm_verify

    def run(state, ring, cursors, outs) -> None:
        for s in range(steps):
            x, a, b = inputs[s]
            step_fn(
                mixed_qkv=x,
                a=a,
                b=b,
                A_log=problem.A_log,
                dt_bias=problem.dt_bias,
                state=state,
                ring=ring,
                cursors=cursors,
                state_indices=problem.state_indices,
                out=outs[s],
            )
            assert bool(_replay._PENDING_FOLDS) == deferred, "deferred folds must wait for the commit"
            replayssm_commit(
                cursors=cursors, state_indices=problem.state_indices, num_accepted=accepted[s], num_tokens=T
            )
            assert not _replay._PENDING_FOLDS, "the commit left deferred folds unjoined"

    eager = problem.clone_storage()
    eager_outs = [problem.out() for _ in range(steps)]
    graphed = problem.clone_storage()
    graph_outs = [problem.out() for _ in range(steps)]
    run(*problem.clone_storage(), [problem.out() for _ in range(steps)])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(*graphed, graph_outs)
    for replay in range(2):
        run(*eager, eager_outs)
        graph.replay()
        torch.cuda.synchronize()
        for s in range(steps):
            assert torch.equal(graph_outs[s], eager_outs[s]), f"replay {replay} step {s}: outputs differ"
        assert torch.equal(graphed[0], eager[0]), f"replay {replay}: checkpoints differ"
        assert torch.equal(graphed[2].write_pos, eager[2].write_pos), f"replay {replay}: cursors differ"
        assert torch.equal(graphed[2].base, eager[2].base), f"replay {replay}: cursors differ"


@pytest.mark.parametrize("T", [1, 4])
def test_forward_graph_joined_without_its_commit_matches_eager(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM captures the forward pass without the commit: a graph of one step's layers that ends with
    `replayssm_join` captures (the deferred folds' side streams joined inside it), and replaying it with new
    inputs, the commit run eagerly after each replay, gives the eager trajectory bit for bit."""
    from gdn_replayssm import _replay

    require_device("cuda")
    monkeypatch.setattr(_replay, "DEFERRED_FOLD", "always")
    case = Case(B=9, T=T, H=16, HV=32, K=128, V=128, L=8 if T > 1 else 5, x_dtype=torch.bfloat16, device="cuda")
    problem = make_problem(case)
    steps = 2 * case.L  # flushes every row at least once
    inputs = [problem.inputs() for _ in range(steps)]
    accepted = [
        acceptance("random", B=case.B, T=T, generator=problem.generator).cuda() if T > 1 else None for _ in range(steps)
    ]
    step_fn = replayssm_decode if T == 1 else replayssm_verify
    static_in = [t.clone() for t in inputs[0]]

    def forward(storage, x, a, b, out) -> None:
        state, ring, cursors = storage
        step_fn(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state=state, ring=ring,
                cursors=cursors, state_indices=problem.state_indices, out=out)  # fmt: skip
        replayssm_join(cursors=cursors)
        assert not _replay._PENDING_FOLDS, "the join left deferred folds pending"

    def commit(cursors, s: int) -> None:
        replayssm_commit(cursors=cursors, state_indices=problem.state_indices, num_accepted=accepted[s], num_tokens=T)

    eager, graphed = problem.clone_storage(), problem.clone_storage()
    eager_out, graph_out = problem.out(), problem.out()
    warm = problem.clone_storage()
    forward(warm, *static_in, problem.out())  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward(graphed, *static_in, graph_out)
    for s in range(steps):
        forward(eager, *inputs[s], eager_out)
        commit(eager[2], s)
        for buffer, value in zip(static_in, inputs[s], strict=True):
            buffer.copy_(value)
        graph.replay()
        commit(graphed[2], s)
        torch.cuda.synchronize()
        assert torch.equal(graph_out, eager_out), f"step {s}: outputs differ"
        assert torch.equal(graphed[0], eager[0]), f"step {s}: checkpoints differ"
        assert torch.equal(graphed[2].write_pos, eager[2].write_pos), f"step {s}: cursors differ"
