"""Import Triton with its compile cache under shapeplan's cache directory.

Triton caches compiled kernels on disk under ``TRITON_CACHE_DIR``; unless the user set it, we point
it at ``<shapeplan cache>/triton`` before Triton is imported, so ``shapeplan cache clear --all`` clears
kernels too and a warm start reuses them. Generated kernel sources live beside it in
``<shapeplan cache>/triton_src``.

Importing it also wraps Triton's compile so new kernels compile in worker processes
(``triton_workers``), and loads and launches our kernels through the CUDA driver API instead of C
modules Triton would build first (``triton_launch``). Importing this module fails with ImportError when Triton is not installed: callers treat that as
"backend unavailable" and record a FALLBACK event.
"""
from __future__ import annotations

import os

from shapeplan.runtime.backends.triton_paths import cache_root, source_dir, triton_cache_dir

os.environ.setdefault("TRITON_CACHE_DIR", str(triton_cache_dir()))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:                                        # Triton >= 3.3 reads env through knobs (may be cached)
    if not getattr(triton.knobs.cache, "dir", None):
        triton.knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
except AttributeError:
    pass

from shapeplan.runtime.backends import triton_launch, triton_workers  # noqa: E402

triton_launch.install()                     # kernels load and launch without C builds (start-up time)
triton_workers.install()                    # new kernels compile in worker processes (start-up time)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


__all__ = ["cache_root", "interpreting", "source_dir", "tl", "triton", "triton_cache_dir"]
