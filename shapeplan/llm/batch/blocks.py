"""The block manager: a pool of fixed-size KV blocks, reference counts, and the prefix cache over them.

Block 0 is the null block (padding writes land there; it is never handed out). Every other block is
either free, held by one or more sequences (``refs > 0``), or *idle*: unreferenced but holding a cached
prefix, kept in LRU order under a byte budget and reclaimed (oldest first) when a sequence needs a
block and no plain free block is left.

Prefix cache: a full block is keyed by its chain, ``(key of the previous block, its 16 token ids)``,
with an integer key per distinct chain node, so a lookup compares token ids exactly (no hash can
collide into a wrong prefix). A block becomes cached once a sequence has filled it; a later sequence
whose prompt starts with the same chain of full blocks shares them by reference (no copy). A block's
content never changes while it is cached: sequences write only into blocks they hold alone, and the
scheduler copies a shared block before writing into it (``copy_on_write``).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

from shapeplan.errors import CapacityError

NULL_BLOCK = 0
ROOT = 0                  # chain key of "no previous block"


@dataclass(slots=True)
class PrefixStats:
    total_lookups: int = 0
    total_hits: int = 0
    total_hit_tokens: int = 0
    total_stored_tokens: int = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, block_bytes: int, *, prefix_cache: bool = True,
                 cache_budget_bytes: int = 256 << 20) -> None:
        if num_blocks < 2:
            raise CapacityError(f"the KV pool needs at least 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks, self.block_size, self.block_bytes = num_blocks, block_size, block_bytes
        self.prefix_cache, self.cache_budget_bytes = prefix_cache, cache_budget_bytes
        self.refs = [0] * num_blocks
        self.free: collections.deque[int] = collections.deque(range(1, num_blocks))
        self.idle: collections.OrderedDict[int, None] = collections.OrderedDict()   # LRU: oldest first
        self._node: dict[tuple[int, tuple[int, ...]], int] = {}    # (parent key, tokens) -> key
        self._block_of: dict[int, int] = {}                        # key -> block
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> its (parent, tokens) entry
        self._next_key = ROOT + 1
        self.stats = PrefixStats()
        self.peak_used = 0                 # most blocks held at once (benchmarks reset it)

    # ------------------------------------------------------------------ capacity
    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def available(self) -> int:
        """Blocks a sequence can get now: free ones plus idle cached ones (reclaimed on demand)."""
        return len(self.free) + len(self.idle)

    @property
    def used(self) -> int:
        """Blocks held by sequences."""
        return self.usable_blocks - self.available

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # ------------------------------------------------------------------ allocation
    def allocate(self, n: int) -> list[int]:
        """``n`` blocks held once each (fresh content), or CapacityError when fewer are available."""
        if n > self.available:
            raise CapacityError(f"{n} KV blocks needed, {self.available} available")
        out = []
        for _ in range(n):
            if self.free:
                b = self.free.popleft()
            else:
                b, _ = self.idle.popitem(last=False)          # reclaim the least recently used cached block
                self._forget(b)
            self.refs[b] = 1
            out.append(b)
        self.peak_used = max(self.peak_used, self.used)
        return out

    def hold(self, block: int) -> None:
        """Take one more reference to ``block`` (a prefix-cache hit, or a session keeping its blocks)."""
        if self.refs[block] == 0:
            self.idle.pop(block, None)
        self.refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; a block nobody holds becomes idle (if cached) or free.
        A sequence's blocks are released tail first, so its chain's tail is the older idle block: LRU
        eviction takes tails before heads, and what stays cached is still reachable from the root."""
        for b in reversed(blocks):
            if b == NULL_BLOCK:
                continue
            self.refs[b] -= 1
            assert self.refs[b] >= 0, f"block {b} released more often than held"
            if self.refs[b] == 0:
                if b in self._key_of:
                    self.idle[b] = None
                else:
                    self.free.append(b)
        self._trim()

    def shared(self, block: int) -> bool:
        """Whether writing into ``block`` could change what another holder (or the cache) sees."""
        return self.refs[block] > 1 or block in self._key_of

    # ------------------------------------------------------------------ prefix cache
    def match(self, tokens: list[int]) -> list[int]:
        """The cached blocks that hold ``tokens``' leading full blocks, in order (no reference taken).
        Counts one lookup; a hit when at least one block matched."""
        if not self.prefix_cache:
            return []
        bs, key, out = self.block_size, ROOT, []
        for i in range(len(tokens) // bs):
            key = self._node.get((key, tuple(tokens[i * bs:(i + 1) * bs])), -1)
            if key < 0:
                break
            out.append(self._block_of[key])
        self.stats.total_lookups += 1
        if out:
            self.stats.total_hits += 1
            self.stats.total_hit_tokens += len(out) * bs
        return out

    def chain_key(self, blocks: list[int]) -> int:
        """The chain key after ``blocks`` (cached, in order): ROOT for none; -1 when one is not cached."""
        if not blocks:
            return ROOT
        entry = self._key_of.get(blocks[-1])
        return self._node.get(entry, -1) if entry is not None else -1

    def register(self, parent: int, tokens: list[int], block: int) -> int:
        """Cache ``block`` (full, holding ``tokens`` after the chain ``parent``). Returns the block's
        chain key, or -1 when the cache is off or the parent chain is gone. A chain already cached in
        another block keeps that block (this one stays private and is freed when released)."""
        if not self.prefix_cache or parent < 0:
            return -1
        entry = (parent, tuple(tokens))
        key = self._node.get(entry)
        if key is not None:
            return key
        if block in self._key_of:                  # already cached under another chain: leave it
            return -1
        key = self._next_key
        self._next_key += 1
        self._node[entry] = key
        self._block_of[key] = block
        self._key_of[block] = entry
        self.stats.total_stored_tokens += len(tokens)
        return key

    def _forget(self, block: int) -> None:
        entry = self._key_of.pop(block, None)
        if entry is not None:
            key = self._node.pop(entry)
            del self._block_of[key]

    def _trim(self) -> None:
        """Idle cached blocks beyond the byte budget go back to the free list, oldest first."""
        limit = self.cache_budget_bytes // max(1, self.block_bytes)
        while len(self.idle) > limit:
            b, _ = self.idle.popitem(last=False)
            self._forget(b)
            self.free.append(b)

    def clear(self) -> None:
        """Forget every cached prefix (blocks held by sequences stay held; idle ones become free)."""
        for b in list(self.idle):
            self._forget(b)
            self.free.append(b)
        self.idle.clear()
        for b in list(self._key_of):
            self._forget(b)

    def cache_stats(self) -> dict:
        s = self.stats
        resident = len(self._key_of)
        return {"block_size": self.block_size, "max_byte_budget": self.cache_budget_bytes,
                "resident_blocks": resident, "current_bytes": resident * self.block_bytes,
                "idle_blocks": len(self.idle), "total_lookups": s.total_lookups, "total_hits": s.total_hits,
                "hit_rate": s.total_hits / s.total_lookups if s.total_lookups else 0.0,
                "total_hit_tokens": s.total_hit_tokens, "total_stored_tokens": s.total_stored_tokens}
