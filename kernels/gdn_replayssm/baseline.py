"""Recurrent GDN baseline: one state read per row, one state written per token (vLLM's spec path today).

For decode (`state_indices` `[B, 1]`) it reads and writes the row's slot in place, like vLLM's packed decode
kernel; for spec verify (`[B, T]`) it starts from column `num_accepted - 1` and writes the state after token
`t` into column `t`, so rollback means reading another column next step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _config
from ._common import load_token, recurrent_token
from ._config import FP_FUSION, TileConfig, check_device, default_tile
from ._validate import MAX_TOKENS, check_kernel_state_dtype, check_recurrent_step

__all__ = ["recurrent_step"]


@triton.heuristics({"HAS_NUM_ACCEPTED": lambda args: args["num_accepted"] is not None})
@triton.jit
def _recurrent_kernel(  # noqa: PLR0917 (Triton passes kernel arguments positionally)
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    state,
    state_indices,
    num_accepted,
    out,
    scale,
    stride_x,
    stride_a,
    stride_b,
    stride_state,
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_NUM_ACCEPTED: tl.constexpr,
    EXACT_SUMS: tl.constexpr,
):
    i_v, i_b, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    p_out = out + (i_b * T * HV + i_hv) * V + o_v

    slot0 = tl.load(state_indices + i_b * T).to(tl.int64)
    if slot0 <= 0:  # padding row or null slot: zero output, no state traffic
        for t in tl.static_range(T):
            tl.store(p_out + t * HV * V, tl.zeros([BV], dtype=tl.float32).to(out.dtype.element_ty), mask=mask_v)
        return

    if HAS_NUM_ACCEPTED:
        n_acc = tl.minimum(tl.maximum(tl.load(num_accepted + i_b), 1), T)
        slot_src = tl.load(state_indices + i_b * T + n_acc - 1).to(tl.int64)
    else:
        slot_src = slot0
    o_h = i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(state + slot_src * stride_state + o_h, mask=mask_h, other=0).to(tl.float32)
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)

    for t in tl.static_range(T):
        b_q, b_k, _, b_v_raw, b_g, b_beta = load_token(
            mixed_qkv, a, b, i_b * T + t, i_h, i_hv, o_k, o_v, mask_k, mask_v, b_A_log, b_dt_bias, scale,
            stride_x, stride_a, stride_b, H, K, HV, V, EXACT_SUMS,
        )  # fmt: skip
        b_h, _, b_o = recurrent_token(b_h, b_q, b_k, b_v_raw.to(tl.float32), b_g, b_beta, EXACT_SUMS)
        tl.store(p_out + t * HV * V, b_o.to(out.dtype.element_ty), mask=mask_v)
        slot_dst = tl.load(state_indices + i_b * T + t).to(tl.int64)
        k_dst = K * (slot_dst > 0).to(tl.int32)  # no store for a padded column (index comparison, not `&`)
        m_dst = mask_v[:, None] & (o_k < k_dst)[None, :]
        tl.store(state + slot_dst * stride_state + o_h, b_h.to(state.dtype.element_ty), mask=m_dst)


def _recurrent_fwd(
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None,
    out: torch.Tensor,
    scale: float,
    T: int,
    H: int,
    config: TileConfig,
    exact_sums: bool,
) -> None:
    _, HV, V, K = state.shape
    B = state_indices.shape[0]
    grid = (triton.cdiv(V, config.block_v), B, HV)
    _recurrent_kernel[grid](
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        state_indices=state_indices,
        num_accepted=num_accepted,
        out=out,
        scale=scale,
        stride_x=mixed_qkv.stride(0),
        stride_a=a.stride(0),
        stride_b=b.stride(0),
        stride_state=state.stride(0),
        T=T,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=triton.next_power_of_2(K),
        BV=config.block_v,
        EXACT_SUMS=_config.op_order(exact_sums),  # read per call: the fold's op order
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        enable_fp_fusion=FP_FUSION if exact_sums else True,  # vLLM's order: its compiler fuses as it likes
    )


def recurrent_step(
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    num_accepted: torch.Tensor | None = None,
    out: torch.Tensor,
    scale: float | None = None,
    config: TileConfig | None = None,
    exact_sums: bool = True,
) -> None:
    """Recurrent GDN decode / spec verify that writes one state per token (the baseline).

    Args:
        mixed_qkv: `[B * T, 2 * H * K + HV * V]` post-conv q | k | v, last dim contiguous (rows may be strided).
        a, b: `[B * T, HV]` gate inputs, last dim contiguous.
        A_log, dt_bias: `[HV]`.
        state: `[N, HV, V, K]` pool (float32 / bfloat16 / float16), updated in place.
        state_indices: `[B, T]` int32/int64 slots; the state after token `t` goes to column `t`.
            A row whose column 0 is `<= 0` (padding, null slot 0) gets zero outputs and touches no state.
        num_accepted: `[B]` tokens accepted in the previous step (1..T, clamped): the row starts from
            column `num_accepted - 1`. None starts from column 0.
        out: `[B * T, HV, V]` contiguous, fully written.
        scale: query scale, default `K ** -0.5`.
        config: tile configuration, default `default_tile`.
        exact_sums: add every reduction in `_config.EXACT_SUM_MODE` (a fixed float32 tree by default; or
            float64, rounded once): the op order the ReplaySSM flush reproduces bit for bit. False adds in
            float32 in the compiler's order, as vLLM's kernel does (the benchmark times that). Either way
            the state update is fused under `_config.FUSED_UPDATE`; without `exact_sums` the kernel is
            also compiled with FP fusion on, as vLLM compiles its own (the benchmark's baseline).
    """
    geo = check_recurrent_step(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        state_indices=state_indices,
        num_accepted=num_accepted,
        out=out,
    )
    if not 1 <= geo.T <= MAX_TOKENS:
        raise ValueError(f"`mixed_qkv` must hold 1 <= T <= {MAX_TOKENS} tokens per row, got T={geo.T}")
    check_kernel_state_dtype(state)
    check_device(state.device)
    _recurrent_fwd(
        mixed_qkv=mixed_qkv,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        state=state,
        state_indices=state_indices,
        num_accepted=num_accepted,
        out=out,
        scale=geo.K**-0.5 if scale is None else scale,
        T=geo.T,
        H=geo.H,
        config=config or default_tile(head_v_dim=geo.V, device=state.device, num_tokens=geo.T),
        exact_sums=exact_sums,
    )
