"""`warden bench compare`: two results side by side only when nothing but what --vary names differs (the real-engine
runs that write such files are in tests/integration/test_run_tiny_cpu.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from service.bench.decode import FORMAT, PROMPT
from service.cli import main
from service.identity import fingerprint

FIELDS = {
    "schema": 1,
    "model": {"path": "/models/tiny", "config_sha256": "c0ffee"},
    "engine_args": {"max_num_seqs": 8, "enable_prefix_caching": True},
    "speculative": None,
    "platform": "cpu",
}


def result(rate: float, **changes: Any) -> dict[str, Any]:
    fields = copy.deepcopy(FIELDS)
    fields.update(changes.pop("identity", {}))
    data = {
        "format": FORMAT,
        "identity": {"fingerprint": fingerprint(fields), "identity": fields},
        "placement": {"platform": "cpu", "devices": None, "tensor_parallel": 1},
        "params": {"prompt": PROMPT, "max_tokens": 128, "runs": 5, "warmup": 1},
        "runs": [{"decode_tokens_per_s": rate}] * 5,
        "summary": {"decode_tokens_per_s_median": rate, "ttft_s_median": 0.1},
    }
    data.update(changes)
    return data


def compare(tmp_path: Path, a: dict[str, Any], b: dict[str, Any], *extra: str) -> int:
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    return main(["bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), *extra])


def test_one_identity_gives_the_ratio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert compare(tmp_path, result(20.0), result(30.0, params={"prompt": PROMPT, "max_tokens": 128, "runs": 9})) == 0
    assert "A and B share one identity: B/A decode 1.500x" in capsys.readouterr().out


def test_a_difference_is_refused_until_it_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mtp = {"method": "mtp", "num_speculative_tokens": 3}
    a, b = result(20.0), result(50.0, identity={"speculative": mtp})
    assert compare(tmp_path, a, b) == 3
    out = capsys.readouterr().out
    assert "not comparable: A and B differ in 1 field(s) that --vary does not name" in out
    assert 'differs: speculative: null -> {"method": "mtp"' in out and "remedy:" in out
    assert compare(tmp_path, a, b, "--vary", "speculative") == 0
    out = capsys.readouterr().out
    assert "varies (--vary): speculative" in out and "B/A decode 2.500x" in out


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"identity": {"engine_args": {"max_num_seqs": 16, "enable_prefix_caching": True}}},
            "engine_args.max_num_seqs",
        ),
        ({"placement": {"platform": "cpu", "devices": [0, 1], "tensor_parallel": 2}}, "placement.devices"),
        ({"params": {"prompt": PROMPT, "max_tokens": 64, "runs": 5, "warmup": 1}}, "params.max_tokens"),
    ],
)
def test_what_is_not_named_still_refuses(
    tmp_path: Path, change: dict[str, Any], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(tmp_path, result(20.0), result(20.0, **change), "--vary", "speculative") == 3
    assert f"differs: {field}:" in capsys.readouterr().out


def test_a_result_without_identity_is_not_comparable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unstamped = result(20.0)
    unstamped["identity"] = None  # measured with --url and no --api
    assert compare(tmp_path, result(20.0), unstamped) == 3
    assert "B has no run identity" in capsys.readouterr().out


def test_files_that_are_not_results_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text(json.dumps(result(1.0)))
    assert main(["bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    assert f"is not a warden benchmark ({FORMAT})" in capsys.readouterr().err
    assert main(["bench", "compare", str(tmp_path / "a.json")]) == 2
    assert "or `compare A B`" in capsys.readouterr().err
