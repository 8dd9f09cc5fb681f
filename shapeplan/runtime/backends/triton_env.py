"""Import Triton with its compile cache under shapeplan's cache directory.

Triton caches compiled kernels on disk under ``TRITON_CACHE_DIR``; unless the user set it, we point
it at ``<shapeplan cache>/triton`` before Triton is imported, so ``shapeplan cache clear`` clears
kernels too and a warm start reuses them. Generated kernel sources live beside it in
``<shapeplan cache>/triton_src``.

Importing this module fails with ImportError when Triton is not installed: callers treat that as
"backend unavailable" and record a FALLBACK event.
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


os.environ.setdefault("TRITON_CACHE_DIR", str(cache_root() / "triton"))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:                                        # Triton >= 3.3 reads env through knobs (may be cached)
    if not getattr(triton.knobs.cache, "dir", None):
        triton.knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
except AttributeError:
    pass


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


__all__ = ["cache_root", "interpreting", "source_dir", "tl", "triton", "triton_cache_dir"]
