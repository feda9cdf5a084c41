"""GDN ReplaySSM on vLLM's CPU spec path, in process, against vLLM's own per-token-state op as the oracle.

vLLM's op (`fused_sigmoid_gating_delta_rule_update_spec_cpu`) keeps a state per window token in the block-table
columns; `CpuReplaySSM.verify` takes the same arguments and keeps one checkpoint (column 0) and a ring. Same inputs
and acceptance, step after step: the outputs agree to the bf16 output's rounding and, once a row leaves the spec
path, the checkpoint equals the state vLLM would resume from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from gdn_replayssm.vllm_cpu import CpuReplaySSM
from gdn_replayssm.vllm_cpu_shadow import OUTPUT_TOLERANCE, STATE_TOLERANCE, ShadowCheck, relative_deviation


@pytest.fixture(scope="module")
def vllm_op() -> Callable[..., torch.Tensor]:
    """vLLM's per-draft-state CPU verify. Imported when a test runs, not at collection: vLLM imports Triton, and
    the kernel tests' conftest must set TRITON_INTERPRET before Triton is first imported (tests/kernels)."""
    ops = pytest.importorskip("vllm._custom_ops")
    return ops.fused_sigmoid_gating_delta_rule_update_spec_cpu


H, HV, K, V = 2, 4, 64, 32  # K != V: a transposed state would not match
BF16 = torch.bfloat16


def _spec_pool(B: int, T: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's CPU state pool `[N, HV, K, V]` with each request's T blocks, column 0 holding a state."""
    table = torch.arange(1, 1 + B * T, dtype=torch.int32).view(B, T)
    pool = torch.zeros(1 + B * T, HV, K, V)
    pool[table[:, 0].long()] = torch.randn(B, HV, K, V, generator=generator) * 0.1
    return table, pool


def _acceptance(pattern: str, B: int, T: int, generator: torch.Generator) -> torch.Tensor:
    if pattern == "all":
        return torch.full((B,), T, dtype=torch.int32)
    if pattern == "none":
        return torch.ones(B, dtype=torch.int32)
    return torch.randint(1, T + 1, (B,), generator=generator, dtype=torch.int32)


def _tokens(n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random bf16 inputs of `n` tokens, as vLLM's CPU GDN ops take them: q, k `[n, H, K]`, v `[n, HV, V]`, the
    gate inputs a, b `[n, HV]` (drawn in that order)."""
    return {
        "q": torch.randn(n, H, K, generator=generator).to(BF16),
        "k": torch.randn(n, H, K, generator=generator).to(BF16),
        "v": torch.randn(n, HV, V, generator=generator).to(BF16),
        "a": torch.randn(n, HV, generator=generator).to(BF16),
        "b": torch.randn(n, HV, generator=generator).to(BF16),
    }


@pytest.mark.parametrize(
    ("T", "ring_len", "pattern"),
    [(4, 8, "mixed"), (4, 8, "all"), (4, 8, "none"), (2, 16, "mixed"), (3, 6, "mixed")],
)
def test_replayssm_matches_vllms_cpu_spec_op(
    T: int, ring_len: int, pattern: str, vllm_op: Callable[..., torch.Tensor]
) -> None:
    generator = torch.Generator().manual_seed(T * 100 + ring_len)
    B, steps = 3, 30
    table, vllm_pool = _spec_pool(B, T, generator)
    ours = vllm_pool.clone()
    replay = CpuReplaySSM(ring_len=ring_len)
    cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.int32)
    A_log = torch.randn(HV, generator=generator).to(BF16)
    dt_bias = torch.randn(HV, generator=generator).to(BF16)
    accepted = torch.ones(B, dtype=torch.int32)  # the first window after prefill
    for step in range(steps):
        args = {"A_log": A_log, "dt_bias": dt_bias, **_tokens(B * T, generator), "spec_state_indices": table,
                "num_accepted_tokens": accepted, "cu_seqlens": cu_seqlens, "use_qk_l2norm_in_kernel": True}  # fmt: skip
        expected = vllm_op(initial_state_source=vllm_pool, **args)
        got = replay.verify(initial_state_source=ours, **args)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        scale = expected.float().abs().max()
        error = float((got.float() - expected.float()).abs().max() / scale)
        assert error < 1e-2, f"step {step}: output differs by {error:.3g} of its largest value"
        accepted = _acceptance(pattern, B, T, generator)

    assert replay.folded_rows > 0  # the rings did fill and fold into the checkpoint
    assert replay.verified_rows == B * steps
    assert torch.count_nonzero(ours[table[:, 1:].long()]) == 0  # only column 0 was ever written
    assert torch.count_nonzero(vllm_pool[table[:, 1:].long()]) > 0

    # the rows go to vLLM's own path (the safety net: vLLM's runner keeps a decode without drafts on the spec path):
    # vLLM resumes from column 0, the state after the last window's first token; ReplaySSM folds its ring into the
    # checkpoint to the same state
    checkpoints = table[:, 0].tolist()
    replay.leave(ours, checkpoints, [True] * B)
    torch.testing.assert_close(ours[table[:, 0].long()], vllm_pool[table[:, 0].long()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ring_len", [2, 8])
def test_windows_trimmed_by_the_scheduler_down_to_no_drafts_match_vllms_op(
    ring_len: int, vllm_op: Callable[..., torch.Tensor]
) -> None:
    """vLLM's scheduler trims a row's drafts to the step's token budget or the model length, down to none: that
    row stays on the spec path with a window of 1 (vLLM's model runner counts a decode without drafts as a spec row,
    which applies the last window's accepted count). Rows of 1 to 4 tokens in one call, every step, ring wraps and
    folds included; a ring of 2 takes only windows of 1, which here come every step."""
    generator = torch.Generator().manual_seed(ring_len + 40)
    B, T_max, steps = 4, 4 if ring_len >= 8 else 1, 40
    table, vllm_pool = _spec_pool(B, T_max, generator)
    ours = vllm_pool.clone()
    replay = CpuReplaySSM(ring_len=ring_len)
    A_log = torch.randn(HV, generator=generator).to(BF16)
    dt_bias = torch.randn(HV, generator=generator).to(BF16)
    accepted = torch.ones(B, dtype=torch.int32)
    windows_seen: set[int] = set()
    for step in range(steps):
        lengths = torch.randint(1, T_max + 1, (B,), generator=generator)
        lengths[step % B] = 1  # a row without drafts in every call
        windows_seen.update(lengths.tolist())
        cu_seqlens = torch.cat([torch.zeros(1), lengths.cumsum(0)]).to(torch.int32)
        args = {"A_log": A_log, "dt_bias": dt_bias, **_tokens(int(lengths.sum()), generator),
                "spec_state_indices": table, "num_accepted_tokens": accepted, "cu_seqlens": cu_seqlens,
                "use_qk_l2norm_in_kernel": True}  # fmt: skip
        expected = vllm_op(initial_state_source=vllm_pool, **args)
        got = replay.verify(initial_state_source=ours, **args)
        error = relative_deviation(got, expected)
        assert error < 1e-2, f"step {step}, windows {lengths.tolist()}: output differs by {error:.3g}"
        accepted = torch.stack([torch.randint(1, int(n) + 1, (1,), generator=generator)[0] for n in lengths])
        accepted = accepted.to(torch.int32)
    assert windows_seen == set(range(1, T_max + 1))
    assert replay.folded_rows > 0 and replay.undrafted_rows >= steps

    # the rows' states, once their last windows are committed, are the ones vLLM resumes from
    replay.leave(ours, table[:, 0].tolist(), [True] * B)  # commits each pending window as vLLM's column 0 holds it
    vllm_resume = vllm_pool[table[:, 0].long()]
    assert relative_deviation(ours[table[:, 0].long()], vllm_resume) < 1e-4


def test_a_slot_reused_by_a_new_request_starts_with_an_empty_ring(vllm_op: Callable[..., torch.Tensor]) -> None:
    """A finished request's slot is taken by a new one, whose prefill writes column 0 with no prior state: the
    old ring must not be folded into it, and its first verify starts from the new checkpoint alone."""
    generator = torch.Generator().manual_seed(7)
    T, B = 2, 1
    table, vllm_pool = _spec_pool(B, T, generator)
    ours = vllm_pool.clone()
    replay = CpuReplaySSM(ring_len=8)
    cu_seqlens = torch.tensor([0, T], dtype=torch.int32)
    A_log, dt_bias = torch.zeros(HV, dtype=BF16), torch.zeros(HV, dtype=BF16)

    def step(pool: torch.Tensor, verify: object, accepted: int) -> torch.Tensor:
        args = {"A_log": A_log, "dt_bias": dt_bias, **_tokens(T, generator), "spec_state_indices": table,
                "num_accepted_tokens": torch.tensor([accepted], dtype=torch.int32), "cu_seqlens": cu_seqlens,
                "use_qk_l2norm_in_kernel": True}  # fmt: skip
        return verify(initial_state_source=pool, **args)  # type: ignore[operator]

    for accepted in (1, 2, 2):
        state = generator.get_state()
        expected = step(vllm_pool, vllm_op, accepted)
        generator.set_state(state)
        got = step(ours, replay.verify, accepted)
        assert float((got.float() - expected.float()).abs().max() / expected.float().abs().max()) < 1e-2
    rings = next(iter(replay.layers.values()))
    assert int(rings.cursors.write_pos[int(table[0, 0])]) > 0

    fresh = torch.randn(HV, K, V, generator=generator) * 0.1  # the new request's prefill, no prior state
    slot = table[0, 0].long()
    replay.leave(ours, [int(slot)], [False])
    ours[slot] = fresh
    replay.entered(ours, [int(slot)])
    vllm_pool[slot] = fresh
    state = generator.get_state()
    expected = step(vllm_pool, vllm_op, 1)
    generator.set_state(state)
    got = step(ours, replay.verify, 1)
    error = float((got.float() - expected.float()).abs().max() / expected.float().abs().max())
    assert error < 1e-2, f"the new request's first window differs by {error:.3g}: the old ring leaked into it"


def test_a_ring_shorter_than_two_windows_is_refused_by_name() -> None:
    replay = CpuReplaySSM(ring_len=4)
    table = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"window of 3 tokens needs ring_len >= 6.*replayssm.ring_len"):
        replay.verify(A_log=torch.zeros(HV, dtype=BF16), dt_bias=torch.zeros(HV, dtype=BF16),
                      q=torch.zeros(3, H, K, dtype=BF16), k=torch.zeros(3, H, K, dtype=BF16),
                      v=torch.zeros(3, HV, V, dtype=BF16), a=torch.zeros(3, HV, dtype=BF16),
                      b=torch.zeros(3, HV, dtype=BF16), initial_state_source=torch.zeros(4, HV, K, V),
                      spec_state_indices=table, num_accepted_tokens=torch.ones(1, dtype=torch.int32),
                      cu_seqlens=torch.tensor([0, 3], dtype=torch.int32), use_qk_l2norm_in_kernel=True)  # fmt: skip


def _run_with_shadow(replay: CpuReplaySSM, *, steps: int, sabotage_at: int | None = None) -> tuple[torch.Tensor, list]:
    generator = torch.Generator().manual_seed(11)
    T, B = 4, 2
    table, pool = _spec_pool(B, T, generator)
    cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.int32)
    A_log = torch.randn(HV, generator=generator).to(BF16)
    dt_bias = torch.randn(HV, generator=generator).to(BF16)
    accepted = torch.ones(B, dtype=torch.int32)
    for step in range(steps):
        if step == sabotage_at:  # a checkpoint changed behind ReplaySSM's back, as a lost record would
            pool[int(table[0, 0])] *= 2
        replay.verify(A_log=A_log, dt_bias=dt_bias, **_tokens(B * T, generator), initial_state_source=pool,
                      spec_state_indices=table, num_accepted_tokens=accepted, cu_seqlens=cu_seqlens,
                      use_qk_l2norm_in_kernel=True)  # fmt: skip
        accepted = _acceptance("mixed", B, T, generator)
    return table, pool


def test_the_shadow_check_agrees_on_a_correct_run_and_reports_a_broken_one(
    caplog: pytest.LogCaptureFixture, vllm_op: Callable[..., torch.Tensor]
) -> None:
    """The shadow check runs vLLM's op on its own copy of the pool: silent (under tolerance) while ReplaySSM
    is right, an ERROR line and a count once the checkpoint no longer matches what vLLM's path would hold."""
    shadow = ShadowCheck(vllm_op)
    replay = CpuReplaySSM(ring_len=8, shadow=shadow)
    with caplog.at_level(logging.INFO, logger="vllm.gdn_replayssm"):
        table, pool = _run_with_shadow(replay, steps=20)
        replay.leave(pool, table[:, 0].tolist(), [True, True])
    assert shadow.verify_calls == 20 and shadow.state_checks == 2
    assert shadow.over_tolerance == 0, (shadow.worst_output, shadow.worst_state)
    assert 0 < shadow.worst_output < OUTPUT_TOLERANCE and shadow.worst_state < STATE_TOLERANCE
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (
        "shadow check: 16 verify calls, 0 decode calls, 0 over tolerance" in caplog.text
    )  # the summaries come at 1, 2, 4, ...

    caplog.clear()
    broken = ShadowCheck(vllm_op)
    with caplog.at_level(logging.INFO, logger="vllm.gdn_replayssm"):
        _run_with_shadow(CpuReplaySSM(ring_len=8, shadow=broken), steps=20, sabotage_at=10)
    assert broken.over_tolerance > 0
    assert "verify outputs differ from vLLM's by" in caplog.text


def test_a_commit_off_by_one_token_is_far_outside_the_shadow_tolerance(vllm_op: Callable[..., torch.Tensor]) -> None:
    """The margin the shadow check's tolerance relies on: ReplaySSM told one accepted token more than vLLM
    (where that is possible) drifts from vLLM's outputs by far more than bf16 rounding."""
    generator = torch.Generator().manual_seed(3)
    T, B = 4, 3
    table, vllm_pool = _spec_pool(B, T, generator)
    ours = vllm_pool.clone()
    replay = CpuReplaySSM(ring_len=8)
    cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.int32)
    A_log = torch.randn(HV, generator=generator).to(BF16)
    dt_bias = torch.randn(HV, generator=generator).to(BF16)
    accepted = torch.ones(B, dtype=torch.int32)
    worst = 0.0
    for _ in range(12):
        args = {"A_log": A_log, "dt_bias": dt_bias, **_tokens(B * T, generator), "spec_state_indices": table,
                "cu_seqlens": cu_seqlens, "use_qk_l2norm_in_kernel": True}  # fmt: skip
        expected = vllm_op(initial_state_source=vllm_pool, num_accepted_tokens=accepted, **args)
        wrong = torch.clamp(accepted + 1, max=T)
        got = replay.verify(initial_state_source=ours, num_accepted_tokens=wrong, **args)
        worst = max(worst, relative_deviation(got, expected))
        accepted = torch.randint(1, T, (B,), generator=generator, dtype=torch.int32)  # < T: one more is possible
    assert worst > 10 * OUTPUT_TOLERANCE


def test_the_shadow_check_skips_padding_rows(vllm_op: Callable[..., torch.Tensor]) -> None:
    """A padding row (null slot 0) has no output: ReplaySSM writes zeros, vLLM's op computes from slot 0's state.
    Neither is compared."""
    generator = torch.Generator().manual_seed(5)
    T = 2
    table = torch.tensor([[1, 2], [0, 0]], dtype=torch.int32)
    pool = torch.randn(3, HV, K, V, generator=generator) * 0.1  # slot 0 holds something, as a pool's null block may
    shadow = ShadowCheck(vllm_op)
    replay = CpuReplaySSM(ring_len=8, shadow=shadow)
    out = replay.verify(A_log=torch.zeros(HV, dtype=BF16), dt_bias=torch.zeros(HV, dtype=BF16),
                        **_tokens(2 * T, generator), initial_state_source=pool, spec_state_indices=table,
                        num_accepted_tokens=torch.ones(2, dtype=torch.int32),
                        cu_seqlens=torch.tensor([0, T, 2 * T], dtype=torch.int32),
                        use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert torch.count_nonzero(out[T:]) == 0  # the padding row's outputs
    assert shadow.verify_calls == 1 and shadow.over_tolerance == 0, shadow.worst_output


@pytest.fixture(scope="module")
def vllm_decode_op() -> Callable[..., torch.Tensor]:
    """vLLM's recurrent CPU decode (one token per row, the state updated in place); imported as `vllm_op` is."""
    ops = pytest.importorskip("vllm._custom_ops")
    return ops.fused_sigmoid_gating_delta_rule_update_cpu


def _decode_step(B: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """`_tokens` for one token per row, with q, k, v `[1, B, ...]` as vLLM's recurrent decode takes them."""
    return {name: x.unsqueeze(0) if name in ("q", "k", "v") else x for name, x in _tokens(B, generator).items()}


@pytest.mark.parametrize("ring_len", [2, 4, 16])
def test_replayssm_decode_matches_vllms_cpu_decode_op(
    ring_len: int, vllm_decode_op: Callable[..., torch.Tensor]
) -> None:
    """Without speculation: vLLM's op updates the state in place every token; ReplaySSM appends a record, folds
    when the ring is full, and its outputs agree. A row that then goes to vLLM's own prefill code (a chunked
    prefill continuing it) has its ring folded in first: the checkpoint is vLLM's state."""
    generator = torch.Generator().manual_seed(ring_len)
    B, steps = 3, 41  # a count no ring length divides: records are left in every ring
    vllm_pool = torch.zeros(1 + B, HV, K, V)
    vllm_pool[1:] = torch.randn(B, HV, K, V, generator=generator) * 0.1
    ours = vllm_pool.clone()
    replay = CpuReplaySSM(ring_len=ring_len)
    fixed = {"A_log": torch.randn(HV, generator=generator).to(BF16),
             "dt_bias": torch.randn(HV, generator=generator).to(BF16),
             "initial_state_indices": torch.arange(1, B + 1, dtype=torch.int32),
             "cu_seqlens": torch.arange(B + 1, dtype=torch.int32), "use_qk_l2norm_in_kernel": True}  # fmt: skip
    for step in range(steps):
        args = {**fixed, **_decode_step(B, generator)}
        expected = vllm_decode_op(initial_state_source=vllm_pool, **args)
        got = replay.decode(initial_state_source=ours, **args)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        error = relative_deviation(got, expected)
        assert error < 1e-2, f"step {step}: decode output differs by {error:.3g} of its largest value"
    assert replay.decoded_rows == B * steps and replay.folded_rows > 0
    rings = next(iter(replay.layers.values()))
    assert int(rings.cursors.write_pos[1:].min()) > 0  # records still in the ring, not yet in the state

    replay.leave(ours, [1, 2, 3], [True, True, True])
    # vLLM's recurrent CPU decode rounds inside: after 40 such steps its states were 0.37 % (of the largest) from a
    # float64 recurrence, and ReplaySSM's folded checkpoints were that far from vLLM's (spec verify: 1e-7)
    assert relative_deviation(ours[1:], vllm_pool[1:]) < STATE_TOLERANCE
    assert int(rings.cursors.write_pos[1:].max()) == 0


def test_replayssm_decode_takes_one_token_per_row() -> None:
    replay = CpuReplaySSM(ring_len=16)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="one token per row"):
        replay.decode(A_log=torch.zeros(HV, dtype=BF16), dt_bias=torch.zeros(HV, dtype=BF16),
                      initial_state_source=torch.zeros(3, HV, K, V),
                      initial_state_indices=torch.tensor([1, 2], dtype=torch.int32),
                      cu_seqlens=torch.tensor([0, 2, 2], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                      **_decode_step(2, generator))  # fmt: skip


def test_the_shadow_check_follows_decode_too(
    vllm_op: Callable[..., torch.Tensor], vllm_decode_op: Callable[..., torch.Tensor]
) -> None:
    generator = torch.Generator().manual_seed(9)
    B = 2
    pool = torch.zeros(1 + B, HV, K, V)
    pool[1:] = torch.randn(B, HV, K, V, generator=generator) * 0.1
    shadow = ShadowCheck(vllm_op, decode_op=vllm_decode_op)
    replay = CpuReplaySSM(ring_len=4, shadow=shadow)
    fixed = {"A_log": torch.zeros(HV, dtype=BF16), "dt_bias": torch.zeros(HV, dtype=BF16),
             "initial_state_indices": torch.arange(1, B + 1, dtype=torch.int32),
             "cu_seqlens": torch.arange(B + 1, dtype=torch.int32), "use_qk_l2norm_in_kernel": True}  # fmt: skip
    for step in range(12):
        if step == 8:
            pool[1] *= 2  # behind ReplaySSM's back: from here on the two disagree
        replay.decode(initial_state_source=pool, **fixed, **_decode_step(B, generator))
    assert shadow.decode_calls == 12 and shadow.verify_calls == 0
    assert shadow.over_tolerance > 0 and shadow.over_tolerance <= 4
