"""The decode's ceiling: how fast a kernel that does nothing but read the state reads it on this GPU.

    PYTHONPATH=kernels python -m gdn_replayssm.bench_stream [--batch-sizes 64,256] [--json] [--out PATH]

A non-flush decode must read every row's `[HV, V, K]` state once and take two row sums of each tile (`S0 k` and
`S0 q`). This times kernels that do exactly that at Qwen3.6's GDN shapes, fp32 state, and nothing else: no
history, no gates, no records. Their time is what the decode kernels can hope for, and the gap to them is the
price of the decode's other work:

- `tile BVxW`: one program per (row, value head, V tile), the state slot read from `state_indices` (`cursor`:
  then the row's `write_pos` and a branch on it before the tile, as the decode kernels check for flush rows);
- `key head BVxW sS`: one program per (row, key head) over its `HV / H x V / BV` tiles, in a loop of `S` stages
  that the compiler software-pipelines (0: unrolled), as `_decode_heads._key_head_decode_kernel` walks them.

Each variant is checked against `torch.einsum` first and prints nothing if it is wrong. Times are per launch under
CUDA-graph replay (`bench_parts.time_launches`); `frac_read` is against `torch.sum` over 4 GiB in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from .bench import _int_list, copy_bandwidth_gbps, run_identity
from .bench_parts import time_launches

H, HV, K, V = 16, 32, 128, 128
TILES = [(64, 4), (32, 8), (32, 4), (16, 2)]
KEY_HEAD_TILES = [(64, 4, 0), (64, 4, 2), (64, 4, 3), (64, 8, 2), (32, 4, 2)]


@triton.jit
def _tile_dots(b_h, kq, out, i_b, i_hv, o_k, o_v, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):  # noqa: PLR0917
    """Store `(S0 k, S0 q)` of a `[BV, K]` tile, k and q row `i_b, i_hv` of `kq`, as `out[i_b, i_hv, o_v, :]`."""
    p_kq = kq + (i_b * HV + i_hv) * 2 * K
    b_k = tl.load(p_kq + o_k)
    b_q = tl.load(p_kq + K + o_k)
    p_o = out + ((i_b * HV + i_hv) * V + o_v) * 2
    tl.store(p_o, tl.sum(b_h * b_k[None, :], axis=1))
    tl.store(p_o + 1, tl.sum(b_h * b_q[None, :], axis=1))


@triton.jit
def _stream_tile_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    state, kq, out, state_indices, write_pos, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, CURSOR: tl.constexpr,
):  # fmt: skip
    """Grid `(NV * HV * B,)`: one `[BV, K]` tile of row `i_b`'s slot."""
    pid = tl.program_id(0)
    i_v = pid % NV
    i_hv = (pid // NV) % HV
    i_b = pid // (NV * HV)
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if CURSOR:  # noqa: SIM102 (a constexpr branch: the load only where it is compiled in)
        if tl.load(write_pos + slot) < 0:  # never: the decode kernels' flush-row branch, on a loaded cursor
            return
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    b_h = tl.load(state + slot * HV * V * K + i_hv * V * K + o_v[:, None] * K + o_k[None, :])
    _tile_dots(b_h, kq, out, i_b, i_hv, o_k, o_v, HV, K, V)


@triton.jit
def _stream_key_head_kernel(  # noqa: PLR0917 (Triton passes arguments positionally)
    state, kq, out, state_indices, write_pos, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Grid `(B, H)`: the `G * NV` tiles under key head `i_h` of row `i_b`, one after the other."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    slot = tl.load(state_indices + i_b).to(tl.int64)
    if tl.load(write_pos + slot) < 0:
        return
    o_k = tl.arange(0, K)
    if STAGES > 0:
        for j in tl.range(0, G * NV, num_stages=STAGES):
            i_hv = i_h * G + j // NV
            o_v = (j % NV) * BV + tl.arange(0, BV)
            b_h = tl.load(state + slot * HV * V * K + i_hv * V * K + o_v[:, None] * K + o_k[None, :])
            _tile_dots(b_h, kq, out, i_b, i_hv, o_k, o_v, HV, K, V)
    else:
        for j in tl.static_range(G * NV):
            i_hv = i_h * G + j // NV
            o_v = (j % NV) * BV + tl.arange(0, BV)
            b_h = tl.load(state + slot * HV * V * K + i_hv * V * K + o_v[:, None] * K + o_k[None, :])
            _tile_dots(b_h, kq, out, i_b, i_hv, o_k, o_v, HV, K, V)


Launch = Callable[[dict[str, torch.Tensor]], None]


def _tile_launch(B: int, bv: int, warps: int, cursor: bool) -> Launch:
    def launch(t: dict[str, torch.Tensor]) -> None:
        _stream_tile_kernel[(V // bv * HV * B,)](
            t["state"], t["kq"], t["out"], t["slots"], t["write_pos"], HV=HV, K=K, V=V, BV=bv, NV=V // bv,
            CURSOR=cursor, num_warps=warps,
        )  # fmt: skip

    return launch


def _key_head_launch(B: int, bv: int, warps: int, stages: int) -> Launch:
    def launch(t: dict[str, torch.Tensor]) -> None:
        _stream_key_head_kernel[(B, H)](
            t["state"], t["kq"], t["out"], t["slots"], t["write_pos"], HV=HV, K=K, V=V, BV=bv, NV=V // bv,
            G=HV // H, STAGES=stages, num_warps=warps,
        )  # fmt: skip

    return launch


def variants(B: int) -> list[tuple[str, Launch]]:
    """(name, launch) of every variant for `B` rows; a launch takes `problem(B)`'s tensors."""
    out = [
        (f"tile {bv}x{warps}" + (" cursor" if cursor else ""), _tile_launch(B, bv, warps, cursor))
        for bv, warps in TILES
        for cursor in (False, True)
    ]
    out += [(f"key head {bv}x{w} s{s}", _key_head_launch(B, bv, w, s)) for bv, w, s in KEY_HEAD_TILES]
    return out


def problem(B: int, device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A pool of `B + 1` fp32 state slots (0 unused), the rows' slots in a shuffled order, their keys and queries
    `[B, HV, 2, K]`, the cursors (all 0) and the output `[B, HV, V, 2]`."""
    state = torch.randn(B + 1, HV, V, K, generator=generator).to(device)
    slots = (torch.randperm(B, generator=generator) + 1).to(torch.int32).to(device)
    kq = torch.randn(B, HV, 2, K, generator=generator).to(device)
    write_pos = torch.zeros(B + 1, dtype=torch.int32, device=device)
    return {
        "state": state,
        "slots": slots,
        "kq": kq,
        "write_pos": write_pos,
        "out": torch.empty(B, HV, V, 2, device=device),
    }


def expected(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """`(S0 k, S0 q)` of every row and value head, `[B, HV, V, 2]`."""
    return torch.einsum("bhvk,bhck->bhvc", t["state"][t["slots"].long()], t["kq"])


def read_bandwidth_gbps(nbytes: int = 1 << 32) -> float:
    """`torch.sum` over `nbytes` of fp32, bytes read over the time of one replayed sum."""
    x = torch.ones(nbytes // 4, device="cuda")

    def read() -> None:
        x.sum()

    return nbytes / time_launches(read) / 1e9


def measure(B: int, device: str, emit: Callable[[dict[str, Any]], None], read_gbps: float) -> int:
    """Time every variant at `B` rows; returns how many failed their check (those print nothing)."""
    t = problem(B, device, torch.Generator().manual_seed(B))
    want = expected(t)
    nbytes = B * HV * V * K * 4
    failed = 0
    for name, launch in variants(B):
        t["out"].fill_(math.nan)
        launch(t)
        if not torch.allclose(t["out"], want, rtol=1e-4, atol=1e-3):
            print(f"{name} B={B}: wrong sums, not timed", file=sys.stderr)
            failed += 1
            continue
        seconds = time_launches(partial(launch, t))
        gbps = nbytes / seconds / 1e9
        emit({"variant": name, "B": B, "us": round(seconds * 1e6, 2), "GBps": round(gbps, 1),
              "frac_read": round(gbps / read_gbps, 3) if read_gbps else None})  # fmt: skip
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=_int_list(1, 4096), default=[64, 256])
    p.add_argument("--json", action="store_true", help="one JSON line per measurement")
    p.add_argument("--out", type=Path, help="also write the JSON lines here")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_stream: needs a CUDA device (the kernels' own tests run under the interpreter)", file=sys.stderr)
        return 2
    read_gbps, copy_gbps = read_bandwidth_gbps(), copy_bandwidth_gbps()
    header = {**run_identity(), "read_GBps": round(read_gbps, 1), "copy_GBps": round(copy_gbps, 1)}
    lines = [json.dumps(header)]
    print(f"# {json.dumps(header)}")

    def emit(row: dict[str, Any]) -> None:
        lines.append(json.dumps(row))
        if a.json:
            print(lines[-1], flush=True)
        else:
            print(f"{row['variant']:<22} B={row['B']:>4}: {row['us']:8.1f} us {row['GBps']:7.0f} GB/s "
                  f"({100 * row['frac_read']:.0f}% of read)", flush=True)  # fmt: skip

    failed = sum(measure(B, "cuda", emit, read_gbps) for B in a.batch_sizes)
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
