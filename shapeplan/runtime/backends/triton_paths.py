"""Where Triton's compile cache and shapeplan's generated kernel sources live (no Triton import here).

Triton caches compiled kernels on disk under ``TRITON_CACHE_DIR``; unless the user set it, it is
``<shapeplan cache>/triton``, so ``shapeplan cache clear`` clears kernels too and a warm start reuses
them. Generated kernel sources live beside it in ``<shapeplan cache>/triton_src``.
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """shapeplan's cache directory (``SHAPEPLAN_CACHE_DIR`` or ``~/.cache/shapeplan``)."""
    try:                                    # the plan cache owns the location when it exists
        from shapeplan.cache import cache_dir  # type: ignore[attr-defined]
        return Path(cache_dir())
    except Exception:
        env = os.environ.get("SHAPEPLAN_CACHE_DIR")
        base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shapeplan"
        return base


def triton_cache_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or cache_root() / "triton")


def source_dir() -> Path:
    d = cache_root() / "triton_src"
    d.mkdir(parents=True, exist_ok=True)
    return d
