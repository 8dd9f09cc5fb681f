"""Start-up of the triton backend: ``prepare`` and a thread pool that compiles kernels ahead of capture.

Compiling a Triton kernel takes ~0.3 s, and a plan has several distinct ones. ``TritonBackend.compile``
therefore launches each distinct kernel of the chosen steps once, on zero-filled inputs of the recorded
layouts, on a thread pool (``warm_kernels``; Triton's compiler spends most of its time outside the
GIL: MLIR/LLVM passes, ptxas), and ``capture`` waits for them (``wait_background``), so the capture-time
check finds every kernel compiled instead of compiling them one after the other. ``background(fn)`` runs
other warm-ups (the pipeline's decode-attention kernel) on the same pool; a capture waits for those too,
so no other thread launches while a graph is recorded. ``SHAPEPLAN_TRITON_WARM=0`` turns this off.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from shapeplan import diagnostics, env
from shapeplan.runtime.backends import SegmentContext
from shapeplan.runtime.backends.cuda_graphs import ABSENT, Step
from shapeplan.runtime.backends.triton.verdicts import TOLERANCE, close

_pool: ThreadPoolExecutor | None = None
_pending: list[Future] = []
_warmed: set[tuple] = set()
_warm_lock = threading.Lock()


def _warm_on() -> bool:
    return env.get("SHAPEPLAN_TRITON_WARM")


def background(fn: Callable[[], Any], launches: bool = True) -> Future | None:
    """Run ``fn`` (a kernel warm-up) on the warm-up pool; the next capture waits for it unless it
    ``launches`` nothing on the device (compile-only work may run beside a capture). None when off."""
    global _pool
    if not _warm_on():
        return None
    with _warm_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(2, min(8, (os.cpu_count() or 2) - 1)),
                                       thread_name_prefix="shapeplan-triton-warm")
        f = _pool.submit(fn)
        if launches:
            _pending.append(f)
        else:
            f.add_done_callback(_report)
    return f


def _report(f: Future) -> None:
    e = f.exception()
    if e is not None:
        diagnostics.record("FALLBACK", "Triton kernel warm-up failed: compiles at first launch",
                           reason=f"{type(e).__name__}: {e}"[:300])


_prepared = False


def prepare(device: Any = None) -> None:
    """Start-up: start the compile workers when the Triton cache is cold, and on the warm-up pool import
    Triton, install our hooks in it (``env.patch``: the compile wrapper and the driver-API launcher) and
    initialise its driver, so none of it waits in line when the first kernel is needed. Triton's own
    cache key (a hash of its ~500 MB library) is never computed on our path: the manifest and the
    workers key kernels by the installation stamp (``workers``). The torch kernels of the capture-time
    check (``close``) load too, while the plan is still compiled rather than after the last Triton
    kernel. Called when an engine is created in triton mode; idempotent. With
    ``SHAPEPLAN_TRITON_WARM=0`` it does nothing, and ``TritonBackend.compile`` patches Triton instead."""
    global _prepared
    if _prepared or not _warm_on():
        return
    _prepared = True
    from shapeplan.runtime.backends.triton import workers
    workers.prestart_if_cold()

    def check_kernels() -> None:
        if getattr(device, "type", None) != "cuda":
            return
        for dt in TOLERANCE:
            x = torch.zeros(4, dtype=dt, device=device)
            close(x, x)
    background(check_kernels)

    def driver() -> None:
        from shapeplan.runtime.backends.triton import env as triton_env
        triton_env.patch()
        diagnostics.record("COMPILE", "Triton imported and patched in this process")
        try:                                 # the driver's helper module (a C build on a cold cache)
            triton_env.triton.runtime.driver.active.get_current_target()
            diagnostics.record("COMPILE", "Triton driver ready in this process")
        except Exception:  # noqa: BLE001 - no usable driver: kernels fail later and fall back visibly
            pass
    background(driver)


def wait_background(device: Any = None) -> None:
    """Wait for every submitted warm-up (and its launches); a failed one is recorded, never raised: the
    kernel then compiles at its first launch, as without warm-up."""
    with _warm_lock:
        fs = list(_pending)
        _pending.clear()
    if not fs:
        return
    for f in fs:
        try:
            f.result()
        except Exception as e:  # noqa: BLE001
            diagnostics.record("FALLBACK", "Triton kernel warm-up failed: compiles at first launch",
                               reason=f"{type(e).__name__}: {e}"[:300])
    if device is not None and getattr(device, "type", None) == "cuda":
        torch.cuda.synchronize(device)


def _meta_key(m: Any) -> tuple:
    return (m.shape, m.stride, m.dtype, m.offset == 0) if m is not None else ()


def warm_kernels(seg: SegmentContext, steps: list[Step], metas: dict[int, Any]) -> int:
    """Launch each distinct Triton step once on zero-filled inputs of its recorded layouts, on the pool
    (Triton compiles on first launch). Returns how many were submitted. CUDA only (the interpreter
    compiles nothing)."""
    if seg.device.type != "cuda" or not _warm_on():
        return 0
    with _warm_lock:
        todo = distinct_kernels(seg, steps, metas, _warmed)
    for st in todo:
        background(lambda st=st: launch_zeros(st, metas, seg.device))
    if todo:
        diagnostics.record("COMPILE", "Triton kernels warmed in parallel", plan=seg.plan_key,
                           segment=seg.segment.index, kernels=len(todo))
    return len(todo)


def distinct_kernels(seg: SegmentContext, steps: list[Step], metas: dict[int, Any], seen: set[tuple]) -> list[Step]:
    """One step per distinct (kernel, attributes, input/output layouts) not in ``seen`` (which is updated):
    the launches that compile every specialization the segment needs."""
    out: list[Step] = []
    for st in steps:
        if st.kind == "slot" or any(r != ABSENT and metas.get(r) is None for r in st.ins):
            continue
        m0 = st.members[0]
        key = (st.kind, tuple(m.node.op_type for m in st.members), repr(sorted(m0.node.attrs.items())),
               tuple(_meta_key(metas.get(r)) for r in st.ins), tuple(_meta_key(metas.get(r)) for r in st.outs),
               str(seg.device))
        if key not in seen:
            seen.add(key)
            out.append(st)
    return out


def launch_zeros(st: Step, metas: dict[int, Any], device: torch.device) -> tuple:
    """``st`` on zero-filled tensors of its inputs' recorded layouts (zeros: every index is in range),
    16-byte aligned exactly where the recorded inputs were (so the launch compiles the specialization
    the real call will use)."""
    args = [None if r == ABSENT else _zeros_like_meta(metas[r], device) for r in st.ins]
    if device.type == "cuda":
        with torch.cuda.device(device):
            return st.fn(*args)
    return st.fn(*args)


def _zeros_like_meta(m: Any, device: torch.device) -> torch.Tensor:
    size = torch.empty((), dtype=m.dtype).element_size()
    shift = 0 if m.offset == 0 or m.offset % size else max(1, m.offset // size)   # a misaligned start
    base = torch.zeros(_extent(m) + shift, dtype=m.dtype, device=device)
    return base.as_strided(m.shape, m.stride, shift)


def _extent(m: Any) -> int:
    """Elements of storage a strided view of ``m`` needs."""
    if not m.shape or any(n == 0 for n in m.shape):
        return 1
    return 1 + sum((n - 1) * abs(st) for n, st in zip(m.shape, m.stride))


__all__ = ["background", "distinct_kernels", "launch_zeros", "prepare", "wait_background", "warm_kernels"]
