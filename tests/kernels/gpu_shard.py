"""`WARDEN_GPU_SHARD=i/n`: run every n-th GPU case, so the suite fits the device tool's 600 s calls.

Shard i of n (1-based) keeps the `gpu`-marked cases at positions i-1, i-1+n, i-1+2n, ... of the collection
order; the other GPU cases are deselected, the CPU ones are left alone (`-m gpu` drops them). Round robin
rather than contiguous ranges: the slow cases sit together in the file, and interleaving spreads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

ENV = "WARDEN_GPU_SHARD"
Item = TypeVar("Item")


def parse_shard(text: str) -> tuple[int, int]:
    """`"i/n"` -> `(i, n)` with 1 <= i <= n; a `ValueError` naming the variable and the form otherwise."""
    index, sep, count = text.partition("/")
    if sep and index.strip().isdigit() and count.strip().isdigit():
        i, n = int(index), int(count)
        if 1 <= i <= n:
            return i, n
    raise ValueError(f"{ENV}={text!r}: expected i/n with 1 <= i <= n, e.g. {ENV}=1/3 for the first of three shards")


def split_shard(items: Sequence[Item], gpu: Sequence[bool], shard: tuple[int, int]) -> tuple[list[Item], list[Item]]:
    """`(kept, deselected)`: every item that is not a GPU case, and the GPU cases of `shard` (module docstring)."""
    i, n = shard
    kept: list[Item] = []
    dropped: list[Item] = []
    position = 0
    for item, is_gpu in zip(items, gpu, strict=True):
        if is_gpu:
            (kept if position % n == i - 1 else dropped).append(item)
            position += 1
        else:
            kept.append(item)
    return kept, dropped
