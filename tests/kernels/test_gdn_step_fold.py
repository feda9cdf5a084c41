"""Step fold (`replayssm_fold`, `ReplayLayers`): one launch after the last layer folds every layer's flushing
rows. Compared bit for bit with each layer deferring its own fold, which the other tests hold to the reference
and (checkpoints) to the baseline; CPU cases under the interpreter, `cuda` cases (marker `gpu`) at Qwen3.6
shapes, one of them replayed from a CUDA graph."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from gdn_replayssm import (
    ReplayCursors,
    ReplayLayers,
    ReplayRing,
    replayssm_commit,
    replayssm_decode,
    replayssm_fold,
    replayssm_plan,
    replayssm_verify,
)
from gdn_testing import Case, Problem, acceptance, assert_untouched, make_problem, require_device

BF16 = torch.bfloat16
TINY = dict(H=1, HV=2, K=16, V=16)
QWEN = dict(H=16, HV=32, K=128, V=128)
LAYERS = 3

CASES = [
    Case(B=3, T=1, L=4, **TINY),
    Case(B=3, T=1, L=1, **TINY),
    Case(B=3, T=1, L=3, fold="open_loop", **TINY),
    Case(B=3, T=1, L=4, x_dtype=BF16, state_dtype=BF16, **TINY),
    Case(B=3, T=2, L=4, **TINY),
    Case(B=2, T=3, L=7, join=3, H=1, HV=2, K=12, V=20),
    Case(B=2, T=1, L=19, steps=22, **TINY),  # folds of several 4-record chunks
    Case(B=1, T=1, L=32, device="cuda", **QWEN),
    Case(B=2, T=4, L=64, steps=40, x_dtype=BF16, device="cuda", **QWEN),
    Case(B=7, T=1, L=16, join=8, x_dtype=BF16, state_dtype=BF16, device="cuda", **QWEN),
    Case(B=5, T=2, L=9, x_dtype=BF16, fold="open_loop", device="cuda", H=3, HV=6, K=72, V=40),
]


def _layers(problem: Problem, *, stacked: bool) -> list[tuple[torch.Tensor, ReplayRing]]:
    """`LAYERS` layers: the problem's storage and copies with other live states. `stacked`: views of one
    allocation per tensor (as a pool carved into layers), else one allocation per layer."""
    made = []
    for i in range(LAYERS):
        state, ring = problem.state.clone(), problem.ring.clone()
        for slot in problem.live:
            state[slot] = state[slot].roll(i, dims=-1)
        made.append((state, ring))
    if not stacked:
        return made
    states = torch.stack([s for s, _ in made])
    rings = {name: torch.stack([r.tensors()[name] for _, r in made]) for name in made[0][1].tensors()}
    return [(states[i], ReplayRing(**{name: t[i] for name, t in rings.items()})) for i in range(LAYERS)]


def _clone(layers: list[tuple[torch.Tensor, ReplayRing]]) -> list[tuple[torch.Tensor, ReplayRing]]:
    return [(s.clone(), r.clone()) for s, r in layers]


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_step_fold_matches_each_layer_deferring_its_own(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step: each layer's outputs, and after `replayssm_fold` and the commit every layer's checkpoints,
    rings and the cursors, equal those of per-layer deferred folds bit for bit; slots outside the batch stay
    untouched in every layer; some step flushed. Layers in one allocation (CPU) and apart."""
    from gdn_replayssm import _replay

    require_device(case.device)
    monkeypatch.setattr(_replay, "DEFERRED_FOLD", "always")
    monkeypatch.setattr(_replay, "STEP_FOLD_DECODE_BATCHES", range(1, 1 << 20))
    monkeypatch.setattr(_replay, "STEP_FOLD_VERIFY_BATCHES", range(1, 1 << 20))
    problem = make_problem(case)
    T, idx = case.T, problem.state_indices
    for stacked in (True, False) if case.device == "cpu" else (False,):
        per_layer = _layers(problem, stacked=stacked)
        stepped = _clone(per_layer)
        own = problem.cursors.clone()
        shared = replace(problem.cursors.clone(), step_fold=True)
        registered = ReplayLayers.register(states=[s for s, _ in stepped], rings=[r for _, r in stepped])
        step_fn = replayssm_decode if T == 1 else replayssm_verify
        flushes = 0
        for step in range(case.num_steps):
            flushes += sum(problem.flushing(own))
            inputs = [problem.inputs() for _ in range(LAYERS)]
            n = None if T == 1 else acceptance("random", B=case.B, T=T, generator=problem.generator).to(case.device)
            outputs: list[list[torch.Tensor]] = [[], []]
            for outs, cursors, layers in ((outputs[0], own, per_layer), (outputs[1], shared, stepped)):
                replayssm_plan(cursors=cursors, state_indices=idx, num_tokens=T)
                for (state, ring), (x, a, b) in zip(layers, inputs, strict=True):
                    outs.append(problem.out())
                    step_fn(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state=state,
                            ring=ring, cursors=cursors, state_indices=idx, out=outs[-1])  # fmt: skip
                if cursors is shared:
                    replayssm_fold(layers=registered, cursors=cursors, state_indices=idx, num_tokens=T)
                replayssm_commit(cursors=cursors, state_indices=idx, num_accepted=n, num_tokens=T)
            _assert_same_step(step, outputs=outputs, per_layer=per_layer, stepped=stepped, own=own, shared=shared)
        assert flushes > 0, "the run never flushed: make it longer"
        for state, ring in stepped:
            assert_untouched(problem, state, ring, shared)


def _assert_same_step(
    step: int,
    *,
    outputs: list[list[torch.Tensor]],
    per_layer: list[tuple[torch.Tensor, ReplayRing]],
    stepped: list[tuple[torch.Tensor, ReplayRing]],
    own: ReplayCursors,
    shared: ReplayCursors,
) -> None:
    for i, (a, b) in enumerate(zip(*outputs, strict=True)):
        assert torch.equal(a, b), f"step {step} layer {i}: outputs differ"
    for i, ((s0, r0), (s1, r1)) in enumerate(zip(per_layer, stepped, strict=True)):
        assert torch.equal(s0, s1), f"step {step} layer {i}: checkpoints differ"
        for name, t in r0.tensors().items():
            assert torch.equal(t, r1.tensors()[name]), f"step {step} layer {i}: ring.{name} differs"
    assert torch.equal(own.write_pos, shared.write_pos), f"step {step}: write_pos differs"
    assert torch.equal(own.base, shared.base), f"step {step}: base differs"


def test_reference_in_the_model_runners_call_order_matches_the_step_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model step in the reference (`replayssm_plan_ref`, each layer's step, `replayssm_fold_ref`, the commit)
    and in the kernels with the step fold: every layer's outputs and checkpoints agree every step, through
    flushes. `replayssm_fold_ref` takes the kernel's arguments and checks the slots it is given."""
    from gdn_replayssm import _replay
    from gdn_replayssm.reference import (
        replayssm_commit_ref,
        replayssm_fold_ref,
        replayssm_plan_ref,
        replayssm_verify_ref,
    )
    from gdn_testing import assert_close

    monkeypatch.setattr(_replay, "STEP_FOLD_VERIFY_BATCHES", range(1, 1 << 20))
    case = Case(B=3, T=2, L=6, join=2, **TINY)
    problem = make_problem(case)
    idx = problem.state_indices
    kernel_layers = _layers(problem, stacked=False)
    ref_layers = _clone(kernel_layers)
    kernel_cursors = replace(problem.cursors.clone(), step_fold=True)
    ref_cursors = problem.cursors.clone()
    registered = ReplayLayers.register(states=[s for s, _ in kernel_layers], rings=[r for _, r in kernel_layers])
    flushes = 0
    for step in range(case.num_steps):
        flushes += sum(problem.flushing(ref_cursors))
        n = acceptance("random", B=case.B, T=case.T, generator=problem.generator)
        replayssm_plan(cursors=kernel_cursors, state_indices=idx, num_tokens=case.T)
        replayssm_plan_ref(cursors=ref_cursors, state_indices=idx, num_tokens=case.T)
        for i, ((state, ring), (ref_state, ref_ring)) in enumerate(zip(kernel_layers, ref_layers, strict=True)):
            x, a, b = problem.inputs()
            out, ref_out = problem.out(), problem.out()
            common = dict(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state_indices=idx)
            replayssm_verify(**common, state=state, ring=ring, cursors=kernel_cursors, out=out)
            replayssm_verify_ref(**common, state=ref_state, ring=ref_ring, cursors=ref_cursors, out=ref_out)
            assert_close(f"step {step} layer {i} outputs", ref_out, out, 2e-5)
        replayssm_fold(layers=registered, cursors=kernel_cursors, state_indices=idx, num_tokens=case.T)
        replayssm_fold_ref(layers=registered, cursors=ref_cursors, state_indices=idx, num_tokens=case.T)
        replayssm_commit(cursors=kernel_cursors, state_indices=idx, num_accepted=n, num_tokens=case.T)
        replayssm_commit_ref(cursors=ref_cursors, state_indices=idx, num_accepted=n, num_tokens=case.T)
        for i, ((state, _), (ref_state, _)) in enumerate(zip(kernel_layers, ref_layers, strict=True)):
            for slot in problem.live:
                assert_close(f"step {step} layer {i} slot {slot} checkpoint", ref_state[slot], state[slot], 2e-5)
    assert flushes > 0, "the run never flushed: make it longer"
    with pytest.raises(ValueError, match="state_indices"):
        replayssm_fold_ref(layers=registered, cursors=ref_cursors, state_indices=idx[:, None], num_tokens=case.T)


def test_step_fold_is_refused_where_it_cannot_be_right() -> None:
    """A commit after layers that left their folds, before `replayssm_fold`, is refused and names the remedy
    (the cursors stay as they were); layers that do not match layer 0, and cursors of other layers, are
    refused naming the argument."""
    require_device("cpu")
    problem = make_problem(Case(B=2, T=1, L=4, **TINY))  # a step fold batch
    idx = problem.state_indices
    cursors = replace(problem.cursors, step_fold=True)
    layers = ReplayLayers.register(states=[problem.state], rings=[problem.ring])
    x, a, b = problem.inputs()
    replayssm_decode(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state=problem.state,
                     ring=problem.ring, cursors=cursors, state_indices=idx, out=problem.out())  # fmt: skip
    before = cursors.write_pos.clone()
    with pytest.raises(ValueError, match=r"replayssm_fold\(layers="):
        replayssm_commit(cursors=cursors, state_indices=idx, num_tokens=1)
    assert torch.equal(cursors.write_pos, before)
    replayssm_fold(layers=layers, cursors=cursors, state_indices=idx, num_tokens=1)
    replayssm_commit(cursors=cursors, state_indices=idx, num_tokens=1)

    with pytest.raises(ValueError, match=r"`states\[1\]` must have layer 0's shape"):
        ReplayLayers.register(states=[problem.state, problem.state[:, :1]], rings=[problem.ring] * 2)
    with pytest.raises(ValueError, match=r"`rings\[1\]\.g` must have layer 0's shape"):
        ReplayLayers.register(
            states=[problem.state] * 2, rings=[problem.ring, replace(problem.ring, g=problem.ring.g.double())]
        )
    with pytest.raises(ValueError, match="the same layers, at least one"):
        ReplayLayers.register(states=[problem.state], rings=[])
    other = ReplayCursors.allocate(num_slots=problem.num_slots, ring_len=8, step_fold=True)
    with pytest.raises(ValueError, match="register the layers these cursors serve"):
        replayssm_fold(layers=layers, cursors=other, state_indices=idx, num_tokens=1)


@pytest.mark.parametrize("T", [1, 2])
def test_layers_of_a_step_fold_leave_their_folds_by_batch_size(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `step_fold` cursors a step of `step_fold`'s batch sizes launches its non-flush kernel alone, for every
    row (`defer`), and `replayssm_fold` launches the one fold; other batch sizes, and cursors without
    `step_fold`, launch as before and `replayssm_fold` launches nothing."""
    from gdn_replayssm import _replay, fold

    require_device("cpu")
    calls: list[tuple[str, bool]] = []

    def spy(name: str, launch: Any) -> Any:
        def recorded(*args: Any, **kw: Any) -> None:
            calls.append((name, kw.get("defer", False)))
            launch(*args, **kw)

        return recorded

    for name in ("launch_window", "launch_flush"):
        monkeypatch.setattr(_replay, name, spy(name, getattr(_replay, name)))

    kernel = fold._layers_fold_kernel

    class FoldSpy:
        def __getitem__(self, grid: Any) -> Any:
            return spy("layers_fold", kernel[grid])

    monkeypatch.setattr(fold, "_layers_fold_kernel", FoldSpy())
    problem = make_problem(Case(B=3, T=T, L=4, **TINY))
    layers = ReplayLayers.register(states=[problem.state], rings=[problem.ring])
    step = replayssm_decode if T == 1 else replayssm_verify
    idx = problem.state_indices
    per_layer = [("launch_window", True), ("launch_flush", True)]  # 3 rows defer by default, decode too
    for step_fold, batches, want in [
        (True, range(1, 4), [("launch_window", True), ("layers_fold", False)]),
        (True, range(1, 3), per_layer),  # 3 rows
        (False, range(1, 4), per_layer),
    ]:
        monkeypatch.setattr(_replay, "STEP_FOLD_DECODE_BATCHES" if T == 1 else "STEP_FOLD_VERIFY_BATCHES", batches)
        cursors = replace(problem.cursors.clone(), step_fold=step_fold)
        calls.clear()
        x, a, b = problem.inputs()
        step(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state=problem.state,
             ring=problem.ring, cursors=cursors, state_indices=idx, out=problem.out())  # fmt: skip
        replayssm_fold(layers=layers, cursors=cursors, state_indices=idx, num_tokens=T)
        assert calls == want, (step_fold, batches)
    monkeypatch.undo()
    assert [_replay.step_fold(True, 1, B) for B in (1, 8, 9)] == [True, True, False]
    assert [_replay.step_fold(True, T, B) for T in (2, 8) for B in (1, 2, 32, 33)] == [False, True, True, False] * 2
    assert not _replay.step_fold(False, 1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 4])
def test_step_fold_replayed_from_a_cuda_graph_matches_eager(T: int) -> None:
    """A graph of a whole step (plan, every layer, `replayssm_fold`, commit) captures on one stream and,
    replayed with new inputs, gives the eager trajectory bit for bit: outputs, every layer's checkpoints,
    cursors."""
    require_device("cuda")
    case = Case(B=1, T=T, L=8 if T > 1 else 5, join=2, x_dtype=BF16, device="cuda", **QWEN)
    problem = make_problem(case)
    idx = problem.state_indices
    steps = 3 * case.L  # every layer's row flushes more than once
    inputs = [[problem.inputs() for _ in range(LAYERS)] for _ in range(steps)]
    accepted = [
        acceptance("random", B=1, T=T, generator=problem.generator).cuda() if T > 1 else None for _ in range(steps)
    ]
    step_fn = replayssm_decode if T == 1 else replayssm_verify
    static_in = [[t.clone() for t in layer] for layer in inputs[0]]
    static_n = accepted[0].clone() if T > 1 else None

    def make_world() -> tuple[list[tuple[torch.Tensor, ReplayRing]], ReplayCursors, ReplayLayers]:
        layers = _layers(problem, stacked=False)
        registered = ReplayLayers.register(states=[s for s, _ in layers], rings=[r for _, r in layers])
        return layers, replace(problem.cursors.clone(), step_fold=True), registered

    def model_step(world: Any, step_inputs: list[Any], n: torch.Tensor | None, outs: list[torch.Tensor]) -> None:
        layers, cursors, registered = world
        replayssm_plan(cursors=cursors, state_indices=idx, num_tokens=T)
        for (state, ring), (x, a, b), out in zip(layers, step_inputs, outs, strict=True):
            step_fn(mixed_qkv=x, a=a, b=b, A_log=problem.A_log, dt_bias=problem.dt_bias, state=state, ring=ring,
                    cursors=cursors, state_indices=idx, out=out)  # fmt: skip
        replayssm_fold(layers=registered, cursors=cursors, state_indices=idx, num_tokens=T)
        replayssm_commit(cursors=cursors, state_indices=idx, num_accepted=n, num_tokens=T)

    eager, graphed, warm = make_world(), make_world(), make_world()
    eager_out = [problem.out() for _ in range(LAYERS)]
    graph_out = [problem.out() for _ in range(LAYERS)]
    model_step(warm, static_in, static_n, [problem.out() for _ in range(LAYERS)])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model_step(graphed, static_in, static_n, graph_out)
    for s in range(steps):
        model_step(eager, inputs[s], accepted[s], eager_out)
        for buffers, values in zip(static_in, inputs[s], strict=True):
            for buffer, value in zip(buffers, values, strict=True):
                buffer.copy_(value)
        if static_n is not None:
            static_n.copy_(accepted[s])
        graph.replay()
        torch.cuda.synchronize()
        for i in range(LAYERS):
            assert torch.equal(graph_out[i], eager_out[i]), f"step {s} layer {i}: outputs differ"
            assert torch.equal(graphed[0][i][0], eager[0][i][0]), f"step {s} layer {i}: checkpoints differ"
        assert torch.equal(graphed[1].write_pos, eager[1].write_pos), f"step {s}: cursors differ"
