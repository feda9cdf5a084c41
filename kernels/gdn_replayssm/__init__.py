"""GDN ReplaySSM: checkpoint + ring of SSM inputs for Gated-DeltaNet decode and spec verify.

Kernels (Triton): `replayssm_decode`, `replayssm_verify`, `replayssm_commit`, `replayssm_reset`,
`replayssm_plan` (coalesced flushes), `replayssm_join` (deferred folds), `replayssm_fold` with `ReplayLayers`
(one fold launch per step for every layer), and the recurrent baseline
`recurrent_step`. Oracle (PyTorch): the `*_ref` functions of `gdn_replayssm.reference`, with the same
keyword-only arguments in the same order. See README.md for the math and the cursor rules.

Names are imported on first use, so `gdn_replayssm.vllm_plugin` loads without torch or Triton.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._config import TileConfig, default_tile
    from .baseline import recurrent_step
    from .commit import replayssm_commit, replayssm_join, replayssm_plan, replayssm_reset
    from .decode import replayssm_decode
    from .fold import ReplayLayers, replayssm_fold
    from .ring import (
        DEFAULT_RING_LEN,
        ReplayCursors,
        ReplayRing,
        default_flush_join,
        default_ring_len,
        flush_due,
        flushing_rows,
    )
    from .verify import replayssm_verify

_EXPORTS = {
    "DEFAULT_RING_LEN": ".ring",
    "ReplayCursors": ".ring",
    "ReplayLayers": ".fold",
    "ReplayRing": ".ring",
    "TileConfig": "._config",
    "default_flush_join": ".ring",
    "default_ring_len": ".ring",
    "default_tile": "._config",
    "flush_due": ".ring",
    "flushing_rows": ".ring",
    "recurrent_step": ".baseline",
    "replayssm_commit": ".commit",
    "replayssm_decode": ".decode",
    "replayssm_fold": ".fold",
    "replayssm_join": ".commit",
    "replayssm_plan": ".commit",
    "replayssm_reset": ".commit",
    "replayssm_verify": ".verify",
}

__all__ = [
    "DEFAULT_RING_LEN",
    "ReplayCursors",
    "ReplayLayers",
    "ReplayRing",
    "TileConfig",
    "default_flush_join",
    "default_ring_len",
    "default_tile",
    "flush_due",
    "flushing_rows",
    "recurrent_step",
    "replayssm_commit",
    "replayssm_decode",
    "replayssm_fold",
    "replayssm_join",
    "replayssm_plan",
    "replayssm_reset",
    "replayssm_verify",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
