"""Fixtures for the GDN ReplaySSM kernel tests (self-contained: torch, triton, numpy, pytest only).

Without CUDA the Triton kernels run under the interpreter: TRITON_INTERPRET=1 is set here, before the
kernels are imported, unless the caller chose a value; interpreted, bfloat16 dots are made exact
(`interpreter_dots.py`), and the kernels are told so (`exact_bf16_dots`). Tests marked `gpu` are skipped without
CUDA.
`WARDEN_GPU_SHARD=i/n` keeps every n-th GPU case (`gpu_shard.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import torch
from gpu_shard import ENV, parse_shard, split_shard
from interpreter_dots import widen_bf16_dots

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    widen_bf16_dots()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENV):
        try:
            shard = parse_shard(os.environ[ENV])
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        items[:], deselected = split_shard(items, ["gpu" in item.keywords for item in items], shard)
        config.hook.pytest_deselected(items=deselected)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA device here (run on the H200 with `-m gpu`)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def poison_torch_empty(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Floating-point `torch.empty` / `empty_like` / `Tensor.new_empty` come back NaN-filled, so any output
    element a kernel forgets to write shows up as NaN."""
    real_empty, real_empty_like, real_new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: poison(real_empty_like(*a, **k)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: poison(real_new_empty(self, *a, **k)))
    yield


@pytest.fixture(autouse=True)
def exact_bf16_dots(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[torch.dtype], bool]]:
    """Interpreted, this suite's bf16 dots are exact (`interpreter_dots.py`), so the kernels dot bf16 inputs as
    stored, as on the GPU, rather than converted as under a plain interpreter (`_replay.exact_input_dots`). Yields
    the production rule, for the tests of it and of the plain interpreter."""
    from gdn_replayssm import _replay

    rule = _replay.exact_input_dots
    if os.environ.get("TRITON_INTERPRET") == "1":
        monkeypatch.setattr(_replay, "exact_input_dots", lambda dtype: True)
    yield rule


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(42)
