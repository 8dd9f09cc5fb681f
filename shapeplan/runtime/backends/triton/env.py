"""Import Triton with its compile cache under shapeplan's cache directory; ``patch()`` installs our hooks.

Importing this module imports Triton (ImportError when it is not installed: callers treat that as
"backend unavailable" and record a FALLBACK event). Triton caches compiled kernels on disk under
``TRITON_CACHE_DIR``; unless the user set it, we point it at ``<shapeplan cache>/triton`` before
Triton is imported, so ``shapeplan cache clear --all`` clears kernels too and a warm start reuses them.
Generated kernel sources live beside it in ``<shapeplan cache>/triton_src``. The one other change at
import: Triton's cache key, a SHA-256 of its sources and its 500 MB library that Triton computes at the
first cache lookup of each process (0.47 s of the first kernel call's 0.55 s on the H200 with the
kernel cached, 1.4 s on the 2-core CI box), becomes the installation *stamp* key the compile workers
already use (``workers.stamp``: version, size and mtime of every Triton file, ~1 ms), for every lookup of
the process, patched or not, so a kernel compiled by a worker or by an earlier process is a hit
everywhere (``SHAPEPLAN_TRITON_STAMP_KEY=0``: Triton's own key).

``patch()`` changes Triton for the whole process, and is therefore called only where a triton-mode
engine is created (``warmup.prepare``, on the warm-up pool) and before such an engine compiles a
segment (``TritonBackend.compile``), never by an import:

- ``triton.compile`` is wrapped (``workers``): a kernel the manifest does not list is compiled in a
  worker process, one it lists is loaded straight from Triton's cache;
- Triton's NVIDIA driver gets our ``Utils``/``Launcher`` classes (``launch``): shapeplan's kernels load
  and launch through the CUDA driver API instead of C modules Triton builds first (other kernels keep
  Triton's own launcher).

Both only save start-up time (docs/gpu.md says how much); a kernel computes the same either way.
"""
from __future__ import annotations

import os
import threading

from shapeplan.runtime.backends.triton.paths import source_dir, triton_cache_dir

os.environ.setdefault("TRITON_CACHE_DIR", str(triton_cache_dir()))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:                                        # Triton >= 3.3 reads env through knobs (may be cached)
    if not getattr(triton.knobs.cache, "dir", None):
        triton.knobs.cache.dir = os.environ["TRITON_CACHE_DIR"]
except AttributeError:
    pass


_patch_lock = threading.Lock()
_patched = False


def patch() -> None:
    """Install the compile-worker and driver-API hooks in this process's Triton (idempotent; a thread
    that calls while another installs them waits until they are in place)."""
    global _patched
    if _patched:
        return
    with _patch_lock:
        if _patched:
            return
        from shapeplan.runtime.backends.triton import jit_keys, launch, lazy_gluon, workers
        lazy_gluon.install()                # Gluon imported at its first use, not at the first launch
        jit_keys.install()                  # our kernels' Triton keys from the last process (when on)
        launch.install()                    # kernels load and launch without C builds (start-up time)
        workers.install()                   # new kernels compile in worker processes (start-up time)
        _patched = True


def patched() -> bool:
    return _patched


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _stamp_key() -> None:
    """Triton's cache key from the installation stamp (module doc), unless switched off or interpreting."""
    from shapeplan import env
    if env.get("SHAPEPLAN_TRITON_STAMP_KEY") and not interpreting():
        from shapeplan.runtime.backends.triton import compile_worker, workers
        compile_worker.use_stamp(workers.stamp())


_stamp_key()


__all__ = ["interpreting", "patch", "patched", "source_dir", "tl", "triton", "triton_cache_dir"]
