"""ReplaySSM storage: a per-layer ring of SSM inputs and the per-slot cursors shared by all layers.

Every state slot (vLLM block) owns one checkpoint state in the layer's ordinary state pool
`[N, HV, V, K]`, one ring per layer, and one cursor pair shared by all GDN layers:

- `write_pos[slot]`: number of committed records in the ring (the history length `wp`);
- `base[slot]`: physical ring row of logical record 0, so record `c` lives at `(base + c) % L`.

A step never writes the checkpoint unless the row flushes (`wp + 2T > L`, see README.md), and rollback
is a cursor move: `commit` advances `write_pos` by the number of accepted tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

Fold = Literal["exact", "open_loop"]

#: `ReplayRing.allocate`'s and `ReplayCursors.allocate`'s ring length when the caller names none.
DEFAULT_RING_LEN = 32
#: Measured ring lengths (`default_ring_len`): decode, two-token windows, longer windows, and longer windows in a
#: pool that never runs more than `SMALL_BATCH_RING_MAX_BATCH` rows a step.
DECODE_RING_LEN = 16
SHORT_WINDOW_RING_LEN = 32
WINDOW_RING_LEN = 64
SMALL_BATCH_WINDOW_RING_LEN = 32
SMALL_BATCH_RING_MAX_BATCH = 8


def default_ring_len(num_tokens: int, max_batch: int | None = None) -> int:
    """The measured ring length for windows of `num_tokens` tokens (1 + draft tokens; 1 for decode only): 16 for
    decode, 32 for T = 2, 64 for longer windows, or 32 for them where the pool never runs more than 8 rows a
    step (`max_batch`, e.g. vLLM's `max_num_seqs`; None: any batch). A shorter ring means shorter histories for
    every step's kernels and more frequent folds: small batches, bound by latency, and decode, whose kernel reads
    the history beside the state, want it short; at large batches the folds' share grows with T.

    From H200 run 25 (ops/results/h200-replayssm, `h200-bench-25c-*` and `-25d-*`, fp32 state, the run 23
    defaults, us per layer-step): decode L = 32 -> 16 at B = 1 / 8 / 32 / 64 / 128 / 256: 4.8 / 13.1 / 40.4 /
    74.3 / 141.0 / 272.9 -> 4.1 / 13.8 / 39.6 / 71.2 / 134.3 / 266.9 (0.88x -> 1.04x the baseline at B = 1);
    T = 8 L = 128 -> 64, all accepted: 11.3 / 32.0 / 79.9 / 146.9 / 280.6 / 546.1 -> 8.8 / 27.5 / 71.9 / 136.1 /
    252.6 / 494.1, mixed alike (B = 256 407.4 -> 349.4); T = 4 L = 64 -> 32 at B = 1 / 8 / 32: 8.1 / 22.4 /
    52.0 -> 6.7 / 17.3 / 53.4 all accepted, 7.9 / 20.8 / 47.4 -> 6.6 / 15.7 / 48.6 mixed, while the sweep
    at B = 64 and 256 scores 64 best (L = 16 / 32 / 64 / 128: 1.19-1.21 / 1.08 / 1.00 / 1.32) and at B = 1
    32 (T = 8 alike); T = 2 L = 32 stays (16: 6.4 -> 6.8 us at B = 1, 41.1 -> 42.9 at B = 32, level at 8;
    the sweep within 1-3 % at B = 64 and 256). T = 3 and 5-7 were not timed with these kernels (run 18: T = 3
    as T = 4). Re-timed on the kernels of H200 run 40 (`h200-bench-40b-*`, `-40c-*`, `-40d-*`): decode L = 16
    -> 32 at B = 64 / 128 / 256 52.8 / 96.9 / 184.0 -> 58.4 / 107.0 / 202.8; L = 16 -> 8 at B = 1 / 4 / 16 / 32 /
    256 4.0 / 8.0 / 20.9 / 30.3 / 185.7 -> 4.3 / 8.3 / 18.8 / 30.9 / 185.5; T = 4 L = 64 -> 32 at B = 64 / 256
    85.0 / 313.8 -> 88.2 / 335.5. The ring costs memory: per slot and layer `L (2 HV V + H K)` input-dtype
    elements (`u`, `v`, `k`) and `2 HV L` float32 gates beside the `HV V K` state; at Qwen3.6's shapes in bf16
    0.16x the bytes of an fp32 state at L = 16, 0.32x at 32, 0.64x at 64."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be >= 1 (or None for any batch), got {max_batch}")
    if num_tokens == 1:
        return DECODE_RING_LEN
    if num_tokens == 2:
        return SHORT_WINDOW_RING_LEN
    if max_batch is not None and max_batch <= SMALL_BATCH_RING_MAX_BATCH:
        return SMALL_BATCH_WINDOW_RING_LEN
    return WINDOW_RING_LEN


def default_flush_join(ring_len: int) -> int:
    """The measured `ReplayCursors.flush_join` for a ring of `ring_len` records: half the ring (0 for `L = 1`,
    where every step flushes anyway). It takes effect only in steps planned by `replayssm_plan`.

    From H200 run 21 (ops/results/h200-replayssm, fp32 state, `default_ring_len(T)`, all drafts accepted, us
    per layer-step, staggered starts, B = 8 / 32 / 64 / 256): decode 16.5 / 51.8 / 81.6 / 276.8 without a join
    against 14.8 / 40.6 / 74.3 / 272.7 at `L / 2` (`L / 4`: 14.8 / 41.7 / 74.9 / 275.7; `3 L / 4` as `L / 2`);
    verify T = 4 31.2 / 61.6 / 103.8 / 375.9 against 27.3 / 58.0 / 99.5 / 354.9 (`L / 4` and `3 L / 4`
    between the two); T = 8 at B = 8 / 64 51.1 / 185.9 against 39.4 / 164.4. In lockstep, where every row is
    due in the same step and joining changes no flush, within 0.3 % at B = 64 and 256 (T = 1 and 4) and 3 %
    slower at B = 8, T = 4 (26.4 against 27.1 us). The exception is T = 2 at B = 64, 5-7 % slower (76.6
    against 82.0 us all accepted, 75.6 against 79.7 mixed; `L / 4` alike), while B = 8 gains 11-16 % and
    B = 256 0-5 %: with a due row in every step, each row flushes twice as often and writes its state twice
    as often, which the shorter histories repay at T = 1 and 4 but not there."""
    if ring_len < 1:
        raise ValueError(f"ring_len must be >= 1, got {ring_len}")
    return ring_len // 2


@dataclass(frozen=True)
class ReplayRing:
    """One layer's ring of SSM inputs, one ring of `L` records per state slot.

    Attributes:
        u: delta-corrected values `u_t = beta_t (v_t - alpha_t S_{t-1} k_t)`, shape `[N, HV, L, V]`.
            Read only to reconstruct outputs; any float dtype (the activation dtype is typical).
        k: raw (pre-L2-norm) keys, shape `[N, H, L, K]`, stored once per key head, in the input dtype
            so that storing is lossless.
        g: log-decays `g_t`, shape `[N, HV, L]`, float32 (float64 for a float64 reference).
        v: raw values, shape `[N, HV, L, V]`, in the input dtype; `None` selects the open-loop fold.
        beta: `sigmoid(b_t)`, shape `[N, HV, L]`, float32; `None` exactly when `v` is `None`.
    """

    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    v: torch.Tensor | None = None
    beta: torch.Tensor | None = None

    @property
    def ring_len(self) -> int:
        return int(self.g.shape[2])

    @property
    def fold(self) -> Fold:
        """`"exact"`: flushes replay the raw inputs in the recurrent op order (closed loop, the default).
        `"open_loop"`: flushes fold the stored `u` records with one GEMM (cheaper, error grows with length)."""
        return "exact" if self.v is not None else "open_loop"

    @classmethod
    def allocate(
        cls,
        *,
        num_slots: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        ring_len: int = DEFAULT_RING_LEN,
        dtype: torch.dtype,
        u_dtype: torch.dtype | None = None,
        fold: Fold = "exact",
        device: torch.device | str = "cpu",
    ) -> ReplayRing:
        """Zero-filled ring for `num_slots` state slots; `dtype` is the activation (input) dtype."""
        if fold not in ("exact", "open_loop"):
            raise ValueError(f"fold must be 'exact' or 'open_loop', got {fold!r}")
        if ring_len < 1:
            raise ValueError(f"ring_len must be >= 1, got {ring_len}")
        n, h, hv, k, v, ln = num_slots, num_k_heads, num_v_heads, head_k_dim, head_v_dim, ring_len
        exact = fold == "exact"
        gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # float64: reference only
        return cls(
            u=torch.zeros(n, hv, ln, v, dtype=u_dtype or dtype, device=device),
            k=torch.zeros(n, h, ln, k, dtype=dtype, device=device),
            g=torch.zeros(n, hv, ln, dtype=gate_dtype, device=device),
            v=torch.zeros(n, hv, ln, v, dtype=dtype, device=device) if exact else None,
            beta=torch.zeros(n, hv, ln, dtype=gate_dtype, device=device) if exact else None,
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """The ring's tensors by name, skipping the ones the fold mode does not use."""
        named = {"u": self.u, "k": self.k, "g": self.g, "v": self.v, "beta": self.beta}
        return {name: t for name, t in named.items() if t is not None}

    def clone(self) -> ReplayRing:
        return ReplayRing(**{name: t.clone() for name, t in self.tensors().items()})


@dataclass(frozen=True)
class ReplayCursors:
    """Per-slot ring cursors, shared by every GDN layer of the model.

    Attributes:
        write_pos: committed history length per slot, shape `[N]`, int32.
        base: physical ring row of the oldest committed record per slot, shape `[N]`, int32.
        ring_len: logical and physical ring length `L` of every layer's ring.
        flush_join: `J` of the coalesced-flush rule (`flushing_rows`), 0 to `L`; 0 (`allocate`'s default): a
            row flushes only when it is due. With `J > 0`, `write_pos[0]` (the null slot's entry) holds the
            step's plan (`replayssm_plan`). `default_flush_join(L)` is the measured choice.
        step_fold: True: the model runner calls `replayssm_fold` once per step after the last GDN layer, and
            the layers of steps of `_replay.step_fold`'s batch sizes (decode 1-8 rows, verify 2-32) leave their
            flushing rows' folds to it (one launch for every layer instead of one per layer);
            `replayssm_commit` refuses a step whose layers left folds that were not run. False (`allocate`'s
            default): each layer folds its own.
    """

    write_pos: torch.Tensor
    base: torch.Tensor
    ring_len: int
    flush_join: int = 0
    step_fold: bool = False
    # host-side, at enqueue time: whether layers left folds to `replayssm_fold` since its last call (one item)
    unfolded: list[bool] = field(default_factory=lambda: [False], repr=False, compare=False)

    @classmethod
    def allocate(
        cls,
        *,
        num_slots: int,
        ring_len: int = DEFAULT_RING_LEN,
        flush_join: int = 0,
        step_fold: bool = False,
        device: torch.device | str = "cpu",
    ) -> ReplayCursors:
        if ring_len < 1:
            raise ValueError(f"ring_len must be >= 1, got {ring_len}")
        if not 0 <= flush_join <= ring_len:
            raise ValueError(f"flush_join must be in 0..ring_len = 0..{ring_len}, got {flush_join}")
        zeros = torch.zeros(num_slots, dtype=torch.int32, device=device)
        return cls(write_pos=zeros, base=zeros.clone(), ring_len=ring_len, flush_join=flush_join, step_fold=step_fold)

    def clone(self) -> ReplayCursors:
        return replace(self, write_pos=self.write_pos.clone(), base=self.base.clone(), unfolded=list(self.unfolded))


def flush_due(*, write_pos: int, num_tokens: int, ring_len: int) -> bool:
    """The early-flush rule: a row flushes when its next window could not also be followed by a full one.

    With `T = num_tokens`, a verify step writes its window at logical records `wp .. wp + T - 1`; flushing
    one window early (`wp + 2T > L`) keeps `wp + T <= L` on every step. For decode (`T = 1`) this reads
    `wp == L - 1`, and `L = 1` flushes on every step.
    """
    return write_pos + 2 * num_tokens > ring_len


def flushing_rows(
    *, write_pos: list[int], num_tokens: int, ring_len: int, flush_join: int = 0, step_due: bool | None = None
) -> list[bool]:
    """Which rows of one step flush, given the history lengths of its live rows (slot > 0), in order.

    A row flushes when it is due (`flush_due`), and with coalesced flushes (`J = flush_join > 0`) also when
    some row of the step is due and its own `wp + 2T > L - J`. Folding early is always valid, so a flush that
    must run anyway takes along the rows that would be due soon. Why: a flush's fold is a serial chain over
    the row's records, and at small batches a step waits for it however few rows flush; with staggered rows a
    few flush in most steps (H200 run 18: up to 20 % slower than lockstep at B = 8-64). Joining gathers them
    into fewer flushing steps, at the price of more flushes per row (each folds at least `L - J - 2T + 1`
    records instead of `L - 2T + 1`).

    "Some row of the step is due" is the step's plan: `step_due`, or when None, whether one of these rows is.
    The kernels and `replayssm_commit` read it from the cursors, where `replayssm_plan` writes it for the
    step's `state_indices` before its first layer and the commit clears it (no plan: no row joins).
    """
    due = [flush_due(write_pos=wp, num_tokens=num_tokens, ring_len=ring_len) for wp in write_pos]
    if flush_join == 0 or not (any(due) if step_due is None else step_due):
        return due
    return [flush_due(write_pos=wp, num_tokens=num_tokens, ring_len=ring_len - flush_join) for wp in write_pos]


def step_flushes(cursors: ReplayCursors, slots: list[int], num_tokens: int) -> list[bool]:
    """Per row of a step with these `slots` (`state_indices`): whether it flushes (`flushing_rows` over the
    live rows, with the cursors' `flush_join` and the step's plan in `write_pos[0]`); rows with slot <= 0
    never do. Reads the cursors on the host."""
    write_pos = cursors.write_pos.tolist()
    decided = iter(flushing_rows(write_pos=[write_pos[s] for s in slots if s > 0], num_tokens=num_tokens,
                                 ring_len=cursors.ring_len, flush_join=cursors.flush_join,
                                 step_due=write_pos[0] > 0))  # fmt: skip
    return [s > 0 and next(decided) for s in slots]
