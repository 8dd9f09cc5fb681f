"""The block manager: reference counts, the prefix cache's exact chains, LRU eviction under the budget."""
from __future__ import annotations

import pytest

from shapeplan.errors import CapacityError
from shapeplan.llm.batch.blocks import ROOT, BlockManager


def _fill(bm: BlockManager, tokens: list[int]) -> list[int]:
    """Allocate blocks for ``tokens`` and register every full one, as a finished request leaves them."""
    blocks = bm.allocate(bm.blocks_for(len(tokens)))
    key = ROOT
    for i in range(len(tokens) // bm.block_size):
        key = bm.register(key, tokens[i * 4:(i + 1) * 4], blocks[i])
    return blocks


def test_the_null_block_is_never_handed_out_and_counts_come_back():
    bm = BlockManager(9, 4, 100, prefix_cache=False)
    got = bm.allocate(8)
    assert 0 not in got and sorted(got) == list(range(1, 9))
    with pytest.raises(CapacityError, match="1 KV blocks needed, 0 available"):
        bm.allocate(1)
    bm.release(got)
    assert bm.available == 8 and bm.used == 0


def test_prefix_hits_share_blocks_and_compare_tokens_exactly():
    bm = BlockManager(20, 4, 100, prefix_cache=True)
    a = _fill(bm, list(range(10)))                 # two full blocks + one partial
    assert bm.match(list(range(10))) == a[:2]
    assert bm.match([0, 1, 2, 3, 4, 5, 6, 99]) == a[:1]         # the second block differs in one token
    assert bm.match([9, 1, 2, 3]) == []
    s = bm.cache_stats()
    assert (s["total_lookups"], s["total_hits"], s["total_hit_tokens"]) == (3, 2, 12)
    for b in a[:2]:
        bm.hold(b)                                  # a second request shares them
    bm.release(a)                                   # the first one ends: shared blocks stay held
    assert bm.used == 2 and bm.shared(a[0])
    bm.release(a[:2])
    assert bm.used == 0 and bm.cache_stats()["idle_blocks"] == 2 and bm.match(list(range(8))) == a[:2]


def test_idle_cached_blocks_are_reclaimed_oldest_first_when_blocks_run_out():
    bm = BlockManager(5, 4, 100, prefix_cache=True)                 # 4 usable blocks
    a = _fill(bm, [1] * 8)
    bm.release(a)
    b = _fill(bm, [2] * 8)
    bm.release(b)
    assert bm.available == 4 and bm.cache_stats()["resident_blocks"] == 4
    bm.release(bm.allocate(2))                       # both come from the oldest chain (a's)
    assert bm.match([1] * 8) == [] and bm.match([2] * 8) == b


def test_the_byte_budget_bounds_idle_cached_blocks():
    bm = BlockManager(20, 4, 100, prefix_cache=True, cache_budget_bytes=250)     # 2 idle blocks at most
    a = _fill(bm, list(range(16)))
    bm.release(a)
    s = bm.cache_stats()
    assert s["idle_blocks"] == 2 and s["resident_blocks"] == 2 and bm.available == 19
    assert bm.match(list(range(16))) == a[:2]         # tails go first: the chain's head stays reachable
    bm.clear()
    assert bm.cache_stats()["resident_blocks"] == 0 and bm.cache_stats()["total_lookups"] == 1
