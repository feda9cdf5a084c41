"""`WARDEN_GPU_SHARD`: the shards of a GPU suite cover every GPU case once, and bad values are refused."""

from __future__ import annotations

import pytest
from gpu_shard import parse_shard, split_shard


def test_shards_partition_the_gpu_cases_and_keep_the_cpu_ones() -> None:
    items = [f"case{k}" for k in range(11)]
    gpu = [k % 4 != 0 for k in range(11)]  # cases 0, 4, 8 run on the CPU
    gpu_items = [it for it, g in zip(items, gpu, strict=True) if g]
    kept = [split_shard(items, gpu, (i, 3))[0] for i in (1, 2, 3)]
    for shard in kept:
        assert {"case0", "case4", "case8"} <= set(shard)
    per_shard = [[it for it in shard if it in gpu_items] for shard in kept]
    assert sorted(it for shard in per_shard for it in shard) == sorted(gpu_items)
    assert per_shard[0] == gpu_items[0::3]
    assert [len(s) for s in per_shard] == [3, 3, 2]
    assert split_shard(items, gpu, (1, 1)) == (items, [])


@pytest.mark.parametrize("text", ["", "3", "0/3", "4/3", "a/3", "1/0", "-1/3", "1/3/5"])
def test_bad_shards_are_refused_with_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"WARDEN_GPU_SHARD=.*expected i/n with 1 <= i <= n"):
        parse_shard(text)


def test_a_good_shard_parses() -> None:
    assert parse_shard("2/3") == (2, 3)
