"""engine.args through vLLM's own parser: equivalent spellings normalize alike; bad ones are refused.

vLLM is imported once per test process (the parser is cached by the module).
"""

from __future__ import annotations

import json

import pytest

from service.guard.engine_args import normalize_engine_args, vllm_available


@pytest.fixture(autouse=True, scope="module")
def _needs_vllm() -> None:
    """Imports vLLM on first use (once per test process), not at collection."""
    if not vllm_available():
        pytest.skip("vLLM is not importable here")


PIECEWISE = {"compilation_config": {"cudagraph_mode": "PIECEWISE"}}
EQUIVALENT = {
    "cudagraph-mode": (
        [
            ["-cc.cudagraph_mode=PIECEWISE"],
            ["-cc.cudagraph_mode", "PIECEWISE"],
            ["--compilation-config", '{"cudagraph_mode":"PIECEWISE"}'],
            ['--compilation-config={"cudagraph_mode": "PIECEWISE"}'],
            ["--compilation_config.cudagraph_mode=PIECEWISE"],
            ["-cc", '{"cudagraph_mode":"PIECEWISE"}'],
        ],
        PIECEWISE,
    ),
    "optimization-level": (
        [["-O3"], ["-O", "3"], ["-O=3"], ["--optimization-level", "3"], ["--optimization_level=3"]],
        {"optimization_level": "O3"},
    ),
    "enforce-eager": ([["--enforce-eager"], ["--enforce_eager"]], {"enforce_eager": True}),
    "no-async": ([["--no-async-scheduling"], ["--no_async_scheduling"]], {"async_scheduling": False}),
    "kv-bytes": (
        [["--kv-cache-memory-bytes=64M"], ["--kv-cache-memory-bytes", "67108864"], ["--kv_cache_memory_bytes=64M"]],
        {"kv_cache_memory_bytes": 67108864},
    ),
    "capture-size": (
        [
            ["--max-cudagraph-capture-size", "128"],
            ["-cc.max_cudagraph_capture_size=128"],
            ['--compilation-config={"max_cudagraph_capture_size":128}'],
        ],
        {"compilation_config": {"max_cudagraph_capture_size": 128}},
    ),
    "memory": (
        [["--gpu-memory-utilization", "0.9"], ["--gpu-memory-utilization=0.90"]],
        {"gpu_memory_utilization": 0.9},
    ),
    "defaults-vanish": ([[], ["--gpu-memory-utilization", "0.92"], ["-O2"], ["--no-enforce-eager"]], {}),
}


@pytest.mark.parametrize("name", sorted(EQUIVALENT))
def test_equivalent_spellings_normalize_alike(name: str) -> None:
    spellings, expected = EQUIVALENT[name]
    for args in spellings:
        parsed = normalize_engine_args(args)
        assert parsed.status == "parsed", (args, parsed.error)
        assert dict(parsed.values) == expected, args


def test_order_and_combination_do_not_matter() -> None:
    a = normalize_engine_args(
        ["-cc.cudagraph_mode=PIECEWISE", "--no-async-scheduling", "-cc.max_cudagraph_capture_size=128"]
    )
    b = normalize_engine_args(
        [
            "--max-cudagraph-capture-size=128",
            "--no_async_scheduling",
            '--compilation-config={"cudagraph_mode":"PIECEWISE"}',
        ]
    )
    assert a.status == b.status == "parsed"
    assert a.values == b.values
    assert a.values == {
        "async_scheduling": False,
        "compilation_config": {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 128},
    }


def test_mixed_compilation_config_prefixes_lose_a_setting_as_in_vllm() -> None:
    """vLLM merges dotted flags per spelling of the option: `--compilation-config.x` and `-cc.y` become
    two whole-JSON arguments and the last wins. The guard sees what the engine would get."""
    parsed = normalize_engine_args(
        ["--compilation-config.cudagraph_mode", "PIECEWISE", "-cc.max_cudagraph_capture_size=128"]
    )
    assert parsed.status == "parsed"
    assert parsed.values == {"compilation_config": {"max_cudagraph_capture_size": 128}}


def test_the_seed_identity_arguments_parse() -> None:
    parsed = normalize_engine_args(
        [
            '--compilation-config={"cudagraph_mode":"PIECEWISE"}',
            "--no-async-scheduling",
            "--uvicorn-log-level",
            "warning",
        ]
    )
    assert parsed.status == "parsed"
    assert parsed.values["uvicorn_log_level"] == "warning"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--enforce-eager=true"], "ignored explicit argument"),  # vLLM's parser rejects it: so does the guard
        (["--no-such-flag"], "unrecognized arguments"),
        (["--gpu-memory-utilization", "lots"], "invalid float value"),
        (["--help"], "help"),
        (["--hel"], "help"),  # argparse would expand the abbreviation and print help
        (["-h"], "help"),
        (["--max-cudagraph-capture-size", "128", "-cc.max_cudagraph_capture_size=64"], "mutually exclusive"),
        (["-cc", "{not json"], ""),
    ],
)
def test_arguments_vllm_rejects_are_invalid(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    parsed = normalize_engine_args(args)
    assert parsed.status == "invalid"
    assert message in (parsed.error or "")
    assert capsys.readouterr().out == ""  # no help text or log lines on stdout


def test_values_are_plain_json() -> None:
    parsed = normalize_engine_args(["-O0", "-cc.cudagraph_mode=NONE", "--gpu-memory-utilization=nan"])
    assert parsed.status == "parsed"
    text = json.dumps(parsed.values, allow_nan=False)
    assert json.loads(text) == parsed.values
    assert parsed.values["optimization_level"] == "O0"
