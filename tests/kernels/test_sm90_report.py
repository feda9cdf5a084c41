"""`gdn_replayssm.sm90_report` compiles a kernel for sm_90 with the local Triton and reads its resources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler, not the interpreter
    env["PYTHONPATH"] = str(REPO / "kernels")
    return subprocess.run(
        [sys.executable, "-m", "gdn_replayssm.sm90_report", *argv],
        check=False, capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip


def test_report_compiles_a_kernel_for_sm90_and_reads_its_registers() -> None:
    from triton.backends import nvidia

    if not (Path(nvidia.__file__).parent / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton install has no NVIDIA backend binaries")
    plain, capped = (
        _run("--kernels", "decode 32x4 preload"),
        _run("--kernels", "decode 32x4 preload", "--max-registers", "64"),
    )
    assert plain.returncode == 0, plain.stderr
    rows = [line.split() for line in plain.stdout.splitlines() if line.startswith("decode")]
    assert len(rows) == 1
    registers = int(rows[0][rows[0].index("registers") + 1])
    assert 32 <= registers <= 255
    assert 0 < float(rows[0][rows[0].index("shared") + 1]) <= 228  # KB: some, and no more than an SM holds
    assert 1 <= int(rows[0][rows[0].index("per") - 1]) <= 32  # programs per SM
    capped_rows = [line.split() for line in capped.stdout.splitlines() if line.startswith("decode")]
    assert all(int(r[r.index("registers") + 1]) <= 64 for r in capped_rows) and len(capped_rows) == 1
    assert int(capped_rows[0][capped_rows[0].index("stack") + 1]) > 0  # a cap that low spills


def test_report_names_the_configurations_when_none_matches() -> None:
    result = _run("--kernels", "nonesuch")
    assert result.returncode == 2
    assert "--kernels nonesuch: no configuration starts with that" in result.stderr
    assert "flush T=1 8x1" in result.stderr


def test_loops_are_the_innermost_backward_branches_with_their_instruction_mix() -> None:
    """A loop is closed by a backward `BRA`; an outer loop around an inner one is not reported, and the counts
    are those of the inner body (target to branch)."""
    from gdn_replayssm.sm90_report import loops

    body = [
        (0x00, "MOV R1, R2"),
        (0x10, "FMUL R3, R3, R4"),  # outer loop starts here
        (0x20, "FFMA R5, R3, R4, R5"),  # inner loop starts here
        (0x30, "SHFL.BFLY PT, R6, R5, 0x1, 0x1f"),
        (0x40, "@P0 FADD R5, R5, R6"),
        (0x50, "@P1 BRA 0x20"),  # closes the inner loop
        (0x60, "IADD3 R7, R7, 0x1, RZ"),
        (0x70, "@!P2 BRA 0x10"),  # closes the outer loop
        (0x80, "EXIT"),
    ]
    sass = "\n".join(f"        /*{addr:04x}*/                   {text} ;" for addr, text in body)
    found = loops(sass)
    assert len(found) == 1
    (inner,) = found
    assert inner["instructions"] == 4 and inner["float"] == 2 and inner["shuffles"] == 1
    assert dict(inner["top"]) == {"FFMA": 1, "SHFL": 1, "FADD": 1, "BRA": 1}


def test_programs_per_sm_matches_cuda_occupancy_on_the_h200() -> None:
    """`programs_per_sm` against CUDA's occupancy calculator on the H200 (run 43c, the key-head decode's 4-warp
    build at several register caps, 2 and 3 stages): a warp's registers round up to 256, so 100-128 registers keep
    four programs where 96 gives five, and the third stage's shared memory leaves three."""
    import json

    from gdn_replayssm.sm90_report import programs_per_sm

    measured = REPO / "ops/results/h200-replayssm/h200-occupancy-43c.jsonl"
    rows = [json.loads(line) for line in measured.read_text().splitlines() if line.strip()]
    assert {r["programs_per_sm"] for r in rows} == {3, 4, 5}  # the file still says what the test claims
    for r in rows:
        assert programs_per_sm(r["n_regs"], r["shared"], 4) == r["programs_per_sm"], r
    assert programs_per_sm(168, 0, 1) == 12  # the persistent fold: one warp at 168 registers, 3 per scheduler
    assert programs_per_sm(32, 0, 1) == 32  # the programs' own limit
    assert programs_per_sm(255, 240 * 1024, 4) == 0  # more shared memory than an SM has
    with pytest.raises(ValueError, match="registers and num_warps must be >= 1"):
        programs_per_sm(0, 0, 4)
