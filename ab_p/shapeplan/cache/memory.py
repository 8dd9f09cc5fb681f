"""PlanCache: in-memory LRU of plan runners with pinning, a count cap and a byte budget.

A pinned entry (a runner executing right now) is never evicted; when only pinned entries are left the
cache may sit over budget until they are unpinned (a CACHE event says so).
"""
from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Hashable, Iterator

from shapeplan import diagnostics


class PlanCache:
    def __init__(self, max_entries: int = 64, max_bytes: int = 1 << 30,
                 on_evict: Callable[[Hashable, Any], None] | None = None) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._d: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._pins: dict[Hashable, int] = {}
        self._lock = threading.RLock()
        self._on_evict = on_evict
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._d)

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._d.values())

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return v

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            self._evict()

    def get_or_create(self, key: Hashable, create: Callable[[], Any]) -> Any:
        with self._lock:
            v = self.get(key)
            if v is None:
                v = create()
                self.put(key, v)
            return v

    @contextlib.contextmanager
    def pinned(self, key: Hashable) -> Iterator[None]:
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                n = self._pins[key] - 1
                if n:
                    self._pins[key] = n
                else:
                    del self._pins[key]
                self._evict()

    def is_pinned(self, key: Hashable) -> bool:
        return key in self._pins

    def nbytes(self) -> int:
        with self._lock:
            return sum(int(getattr(v, "nbytes", 0)) for v in self._d.values())

    def _evict(self) -> None:
        while len(self._d) > self.max_entries or (self.max_bytes is not None and len(self._d) > 1
                                                  and self.nbytes() > self.max_bytes):
            victim = next((k for k in self._d if k not in self._pins), None)
            if victim is None:
                diagnostics.record("CACHE", "plan cache over budget but every entry is pinned",
                                   entries=len(self._d), max_entries=self.max_entries)
                return
            value = self._d.pop(victim)
            self.evictions += 1
            reason = "count cap" if len(self._d) >= self.max_entries else "byte budget"
            diagnostics.record("CACHE", "plan evicted", reason=reason, key=str(victim)[:200])
            if self._on_evict is not None:
                self._on_evict(victim, value)

    def clear(self) -> None:
        with self._lock:
            for k in [k for k in self._d if k not in self._pins]:
                v = self._d.pop(k)
                if self._on_evict is not None:
                    self._on_evict(k, v)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._d), "hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "pinned": len(self._pins), "max_entries": self.max_entries, "max_bytes": self.max_bytes}
