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
    capped_rows = [line.split() for line in capped.stdout.splitlines() if line.startswith("decode")]
    assert all(int(r[r.index("registers") + 1]) <= 64 for r in capped_rows) and len(capped_rows) == 1
    assert int(capped_rows[0][capped_rows[0].index("stack") + 1]) > 0  # a cap that low spills


def test_report_names_the_configurations_when_none_matches() -> None:
    result = _run("--kernels", "nonesuch")
    assert result.returncode == 2
    assert "--kernels nonesuch: no configuration starts with that" in result.stderr
    assert "flush T=1 8x1" in result.stderr
