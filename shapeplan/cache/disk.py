"""DiskCache: compiled plans (optimized graph + plan wiring) under the user cache directory.

* directory: ``<cache root>/plans`` (``shapeplan.cache.paths``: the root is ``$SHAPEPLAN_CACHE_DIR``, else
  ``shapeplan`` under the user cache directory; Triton's caches sit beside the plans)
* read-only override directory ``$SHAPEPLAN_CACHE_OVERRIDE_DIR``: looked up first, never written
* ``$SHAPEPLAN_CACHE_FORCE_RECOMPILE=1`` (or ``force_recompile=True``): ignore entries, write fresh ones
* entries are written atomically (temp file in the same directory + ``os.replace``)
* a truncated, tampered, foreign or other-build entry is reported (CACHE event), removed when it is
  ours to remove, and the plan is recompiled; it is never loaded
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from shapeplan import diagnostics, env
from shapeplan.cache.paths import plans_dir
from shapeplan.errors import CacheError
from shapeplan.plan.serialize import deserialize_plan, serialize_plan, unpack

SUFFIX = ".plan"


def default_dir() -> str:
    return str(plans_dir())


class DiskCache:
    def __init__(self, directory: str | None = None, override_dir: str | None = None,
                 force_recompile: bool | None = None) -> None:
        self.directory = directory or default_dir()
        self.override_dir = override_dir if override_dir is not None else env.get("SHAPEPLAN_CACHE_OVERRIDE_DIR")
        if force_recompile is None:
            force_recompile = env.get("SHAPEPLAN_CACHE_FORCE_RECOMPILE")
        self.force_recompile = force_recompile
        self.hits = self.misses = self.rejected = self.writes = 0

    def path(self, key: str, directory: str | None = None) -> str:
        return os.path.join(directory or self.directory, key + SUFFIX)

    def get(self, key: str, fingerprint: dict[str, Any]) -> Any | None:
        """The cached Plan for ``key``, or None (missing, forced recompile, or a bad entry)."""
        if self.force_recompile:
            diagnostics.record("CACHE", "disk cache: force recompile", key=key)
            self.misses += 1
            return None
        for d, writable in ((self.override_dir, False), (self.directory, True)):
            if not d:
                continue
            p = self.path(key, d)
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            except OSError as e:
                diagnostics.record("CACHE", "disk cache entry unreadable", path=p, error=str(e))
                continue
            try:
                header, _ = unpack(data, p)
                got = header.get("fingerprint")
                if got != fingerprint:
                    raise CacheError(f"{p}: built by another build ({got}), this build is {fingerprint}")
                plan = deserialize_plan(data, p)
            except CacheError as e:
                self.rejected += 1
                diagnostics.record("CACHE", "disk cache entry rejected; recompiling", path=p, reason=str(e))
                if writable:
                    try:
                        os.remove(p)
                    except OSError:
                        pass
                continue
            self.hits += 1
            diagnostics.record("CACHE", "disk cache hit", path=p, override=not writable)
            return plan
        self.misses += 1
        diagnostics.record("CACHE", "disk cache miss", key=key)
        return None

    def put(self, key: str, plan: Any, fingerprint: dict[str, Any], meta: dict[str, Any] | None = None) -> str | None:
        data = serialize_plan(plan, fingerprint, meta)
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, self.path(key))
            except BaseException:
                try:
                    os.remove(tmp)
                except OSError:
                    pass
                raise
        except OSError as e:
            diagnostics.record("CACHE", "disk cache write failed", key=key, error=str(e))
            return None
        self.writes += 1
        diagnostics.record("CACHE", "disk cache write", key=key, bytes=len(data))
        return self.path(key)

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for d, ro in ((self.override_dir, True), (self.directory, False)):
            if not d or not os.path.isdir(d):
                continue
            for name in sorted(os.listdir(d)):
                if not name.endswith(SUFFIX) or name.startswith(".tmp-"):
                    continue
                p = os.path.join(d, name)
                st = os.stat(p)
                info: dict[str, Any] = {"key": name[:-len(SUFFIX)], "path": p, "bytes": st.st_size,
                                        "modified": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)),
                                        "read_only": ro}
                try:
                    with open(p, "rb") as f:
                        header, _ = unpack(f.read(), p)
                    info.update(valid=True, fingerprint=header.get("fingerprint"), meta=header.get("meta"))
                except CacheError as e:
                    info.update(valid=False, error=str(e))
                out.append(info)
        return out

    def clear(self) -> int:
        """Remove every entry of the writable directory; returns how many."""
        n = 0
        if os.path.isdir(self.directory):
            for name in os.listdir(self.directory):
                if name.endswith(SUFFIX):
                    try:
                        os.remove(os.path.join(self.directory, name))
                        n += 1
                    except OSError:
                        pass
        diagnostics.record("CACHE", "disk cache cleared", removed=n)
        return n
