"""triton: the cuda_graphs backend with fewer, fused kernels inside the captured graph.

``compile`` rewrites a segment's steps before capture:

1. a slot whose op has a hand-written kernel (``triton_lowerings``: RMSNorm, SkipRMSNorm, LayerNorm,
   Softmax, SiluMul, RoPE) launches it instead of the torch kernel;
2. a contiguous run of elementwise slots of one shape becomes one generated kernel
   (``triton_codegen``) when ``fusion_score`` says it pays.

Matmuls and everything else stay on torch (cuBLAS). A segment where nothing applies is captured
exactly like cuda_graphs, so ``auto`` on CUDA resolves per segment triton -> cuda_graphs, and a failed
capture -> slot_by_slot (the runner's fallback).

Correctness: at capture every Triton step runs on the call's real inputs next to its slots' torch
kernels; a step whose outputs differ beyond the dtype's tolerance, or land in another layout, is
replaced by its slots (VERIFY event). A step that passed is recorded on disk (``verdict_key``: the
kernel, its members' ops and attributes, every input/output layout, the GPU, the versions and our
Triton sources), and later processes skip the check for that exact step (start-up time).
``SHAPEPLAN_TRITON_VERIFY=1`` checks every step again, also on random inputs, and compares every
replay's live-outs against slot_by_slot.

Start-up: compiling a Triton kernel takes ~0.3 s, and a plan has several distinct ones. ``compile``
therefore launches each distinct kernel of the chosen steps once, on zero-filled inputs of the recorded
layouts, on a thread pool (``warm_kernels``; Triton's compiler spends most of its time outside the
GIL: MLIR/LLVM passes, ptxas), and ``capture`` waits for them, so the capture-time check finds every
kernel compiled instead of compiling them one after the other. ``background(fn)`` runs other warm-ups
(the pipeline's decode-attention kernel) on the same pool; a capture waits for those too, so no other
thread launches while a graph is recorded. ``SHAPEPLAN_TRITON_WARM=0`` turns this off.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

from shapeplan import diagnostics
from shapeplan.runtime.backends import SegmentContext, register_backend
from shapeplan.runtime.backends.cuda_graphs import (ABSENT, CudaGraphsBackend, GraphHandle, Step, _to_stable,
                                                    _verify_on, run_steps, slot_steps)

#: (atol, rtol) per dtype for a Triton step against the torch kernels it replaces
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 1e-2), torch.bfloat16: (1.6e-2, 2e-2)}


def close(a: Any, b: Any) -> tuple[bool, float]:
    """(within tolerance, max abs error) for two outputs of one step."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a is b or a == b, 0.0
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, float("inf")
    if not a.dtype.is_floating_point:
        return bool(torch.equal(a, b)), 0.0
    atol, rtol = TOLERANCE.get(a.dtype, (1e-6, 1e-6))
    if not a.numel():
        return True, 0.0
    af, bf = a.float(), b.float()
    err = (af - bf).abs()
    ok = torch.all(err <= atol + rtol * bf.abs()) & torch.isfinite(af).eq(torch.isfinite(bf)).all()
    flag, mx = torch.stack([ok.float(), err.nan_to_num(0.0).max()]).tolist()     # one device sync
    return flag == 1.0, mx


class TritonBackend(CudaGraphsBackend):
    name = "triton"

    def __init__(self) -> None:
        self._metas: dict[tuple, dict[int, Any]] = {}
        self._used: dict[tuple, dict[int, Any]] = {}      # the layouts each segment was compiled for
        self._compiled_for: dict[tuple, dict[int, Any]] = {}   # the same, until the segment's capture
        self._triton_error: str | None = None

    def _key(self, seg: SegmentContext) -> tuple:
        return (seg.plan_key, id(seg.plan), seg.segment.index)

    # ---- warm-up: record every register's layout ------------------------------------------------------
    def warmup(self, seg: SegmentContext, regs: list[Any]) -> None:
        from shapeplan.runtime.backends.triton_codegen import Meta
        if seg.device.type == "cuda":
            from shapeplan.runtime.backends import triton_workers
            triton_workers.prestart_if_cold()     # a cold cache: workers start while this call runs
        metas = self._metas.setdefault(self._key(seg), {})
        for r in seg.live_in:
            if isinstance(regs[r], torch.Tensor):
                metas[r] = Meta.of(regs[r])
        for st in slot_steps(seg):
            run_steps([st], regs)
            for r in st.outs:
                if r != ABSENT and isinstance(regs[r], torch.Tensor):
                    metas[r] = Meta.of(regs[r])

    # ---- compile: choose and build Triton steps -------------------------------------------------------
    # ---- frozen-plan records: the warm-up's layouts, on disk -------------------------------------------
    def layouts(self, seg: SegmentContext) -> dict[str, list] | None:
        metas = self._used.pop(self._key(seg), None)
        if not metas:
            return None
        return {str(r): [list(m.shape), list(m.stride), str(m.dtype).replace("torch.", ""), m.offset]
                for r, m in metas.items()}

    def seed(self, seg: SegmentContext, layouts: Any) -> bool:
        """Compile from recorded layouts instead of a warm-up run (False: none recorded: warm up)."""
        from shapeplan.runtime.backends.triton_codegen import Meta
        if not layouts:
            return False
        metas = {}
        for r, (shape, stride, dtype, offset) in layouts.items():
            dt = getattr(torch, str(dtype), None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"not a dtype: {dtype}")
            metas[int(r)] = Meta(tuple(int(x) for x in shape), tuple(int(x) for x in stride), dt, int(offset))
        self._metas[self._key(seg)] = metas
        return True

    def compile(self, seg: SegmentContext) -> list[Step]:
        steps = slot_steps(seg)
        metas = self._metas.pop(self._key(seg), None)
        from shapeplan.runtime import frozen_records
        if metas and frozen_records.enabled(seg.device):    # kept until the runner writes its record
            self._used[self._key(seg)] = metas
        if metas:
            self._compiled_for[self._key(seg)] = metas
        try:
            from shapeplan.runtime.backends import triton_codegen as cg
            from shapeplan.runtime.backends import triton_lowerings as tlow
            _attach()
        except ImportError as e:
            diagnostics.record("FALLBACK", "triton unavailable: segment captured as a plain CUDA graph",
                               plan=seg.plan_key, segment=seg.segment.index, reason=str(e))
            return steps
        if not metas:
            return steps
        out = rewrite(seg, steps, metas, cg, tlow)
        warm_kernels(seg, out, metas)
        return out

    def capture(self, seg: SegmentContext, compiled: list[Step], regs: list[Any]) -> GraphHandle:
        wait_background(seg.device)                 # kernels compiled by warm_kernels; no launch elsewhere
        diagnostics.record("SEGMENT", "Triton warm-ups joined", plan=seg.plan_key, segment=seg.segment.index)
        return super().capture(seg, compiled, regs)

    # ---- capture: every Triton step checked against its slots on real inputs ---------------------------
    def _capture_first(self, seg: SegmentContext, steps: list[Step], regs: list[Any]) -> bool:
        """Capture before any eager run when every Triton step of ``steps`` already passed its check on
        this machine and build with exactly these input layouts (its verdict is on disk): the eager run
        would only run them unchecked. The layouts of registers no step has computed yet are the ones
        the segment was compiled for. Off with ``SHAPEPLAN_TRITON_VERIFY=1`` or
        ``SHAPEPLAN_CAPTURE_FIRST=0``."""
        metas = self._compiled_for.pop(self._key(seg), None)
        if _verify_on() or not _capture_first_on():
            return False
        fused = [st for st in steps if st.kind != "slot"]
        if not fused or not metas:
            return False
        view = [x if x is not None else metas.get(r) for r, x in enumerate(regs)]
        known = verified()
        if any(verdict_key(st, view, seg.device) not in known for st in fused):
            return False
        diagnostics.record("FUSION", "segment uses Triton kernels", plan=seg.plan_key,
                           segment=seg.segment.index, steps=len(steps), slots=len(seg.slots),
                           triton_steps=len(fused), checked="earlier (verdicts on disk)")
        return True

    def _checked_eager(self, seg: SegmentContext, steps: list[Step], regs: list[Any]) -> list[Step]:
        kept: list[Step] = []
        for st in steps:
            if st.kind == "slot":
                run_steps([st], regs)
                kept.append(st)
                continue
            key = verdict_key(st, regs, seg.device)
            if key in verified() and not _verify_on():
                try:                                   # this exact kernel and layout passed before
                    run_steps([st], regs)
                    kept.append(st)
                    continue
                except Exception:  # noqa: BLE001 - e.g. it no longer builds: check it as new
                    pass
            ok, why = self._check(seg, st, regs)
            if ok:
                remember_verdict(key)
                kept.append(st)
            else:
                diagnostics.record("VERIFY", "Triton step disagrees with slot_by_slot: unfused",
                                   plan=seg.plan_key, segment=seg.segment.index, step=st.describe(), reason=why)
                unfused = _unfuse(seg, st)
                run_steps(unfused, regs)
                kept.extend(unfused)
        _to_stable(seg, regs)
        fused = [s for s in kept if s.kind != "slot"]
        if fused:
            diagnostics.record("FUSION", "segment uses Triton kernels", plan=seg.plan_key,
                               segment=seg.segment.index, steps=len(kept), slots=len(seg.slots),
                               triton_steps=len(fused))
        return kept

    def _check(self, seg: SegmentContext, st: Step, regs: list[Any]) -> tuple[bool, str]:
        ref = list(regs)
        run_steps(_unfuse(seg, st, release=False), ref)
        try:
            run_steps([st], regs)
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build or launch is declined
            for r in st.outs:
                if r != ABSENT:
                    regs[r] = ref[r]
            return False, f"{type(e).__name__}: {e}"
        for r in st.outs:
            if r == ABSENT:
                continue
            ok, err = close(regs[r], ref[r])
            lay = isinstance(ref[r], torch.Tensor) and regs[r].stride() != ref[r].stride()
            if not ok or lay:
                for r2 in st.outs:
                    if r2 != ABSENT:
                        regs[r2] = ref[r2]
                return False, ("layout differs" if ok else f"max abs error {err:.3g}") + \
                    f" on {seg.plan.reg_names[r]}"
        if _verify_on() and not self._random_check(st, ref):
            return False, "random-input check failed"
        return True, ""

    def _random_check(self, st: Step, regs: list[Any]) -> bool:
        scratch, ref = list(regs), list(regs)
        for r in set(st.ins):
            x = regs[r] if r != ABSENT else None
            if isinstance(x, torch.Tensor) and x.dtype.is_floating_point and x.numel() > 1:
                scratch[r] = ref[r] = torch.randn_like(x)
        run_steps([Step(m.fn, tuple(m.ins), tuple(m.outs), (), (m,)) for m in st.members], ref)
        run_steps([st], scratch)
        return all(close(scratch[r], ref[r])[0] for r in st.outs if r != ABSENT)

    # ---- replay with the verify switch ------------------------------------------------------------------
    def replay(self, handle: GraphHandle, regs: list[Any]) -> None:
        super().replay(handle, regs)
        if _verify_on() and handle.graph is not None:
            seg = handle.seg
            ref = list(regs)
            run_steps(slot_steps(seg), ref)
            for r in seg.live_out:
                ok, err = close(regs[r], ref[r])
                if not ok:
                    diagnostics.record("VERIFY", "replay disagrees with slot_by_slot", plan=seg.plan_key,
                                       segment=seg.segment.index, register=seg.plan.reg_names[r], max_abs_err=err)


def _unfuse(seg: SegmentContext, st: Step, release: bool = True) -> list[Step]:
    keep = set(seg.live_out) | set(seg.live_in)
    inside = {r for s in seg.slots for r in s.outs if r != ABSENT}
    return [Step(m.fn, tuple(m.ins), tuple(m.outs),
                 tuple(r for r in m.release if r in inside and r not in keep) if release else (), (m,))
            for m in st.members]


# ---- verdicts of the capture-time check, kept on disk (start-up time) ----------------------------------------

_build: str | None = None


def _build_id() -> str:
    """Versions and the Triton-side sources: a verdict holds for this exact build only."""
    global _build
    if _build is None:
        import hashlib
        import importlib.util
        h = hashlib.sha256()
        try:
            from importlib.metadata import version
            h.update(version("triton").encode())
        except Exception:  # noqa: BLE001
            pass
        h.update(torch.__version__.encode())
        for mod in ("shapeplan", "shapeplan.runtime.backends.triton_jit", "shapeplan.runtime.backends.triton_kernels",
                    "shapeplan.runtime.backends.triton_lowerings", "shapeplan.runtime.backends.triton_codegen",
                    "shapeplan.runtime.backends.triton_backend"):
            spec = importlib.util.find_spec(mod)
            if spec is not None and spec.origin and os.path.exists(spec.origin):
                with open(spec.origin, "rb") as f:
                    h.update(f.read())
        _build = h.hexdigest()
    return _build


def verdict_key(st: Step, regs: list[Any], device: Any) -> str:
    """What a check of ``st`` depends on: the kernel (generated source name or op + attributes), its
    members' ops, every input's layout, how many outputs it writes, the device and the build. An input
    is a tensor, or the ``Meta`` layout recorded for it (``_capture_first`` keys a step before it runs);
    the outputs' layouts follow from the inputs' (the check rejects a step whose layout differs)."""
    import hashlib

    from shapeplan.runtime.backends.triton_codegen import Meta

    def lay(r: int) -> str:
        x = regs[r] if r != ABSENT else None
        if isinstance(x, torch.Tensor):
            return f"{tuple(x.shape)}{tuple(x.stride())}{x.dtype}"
        if isinstance(x, Meta):
            return f"{tuple(x.shape)}{tuple(x.stride)}{x.dtype}"
        return repr(x)[:64]
    dev = _device_name(device)
    parts = [st.kind, str(getattr(st.fn, "name", "")), dev, _build_id(),
             ";".join(f"{m.node.op_type}{sorted(m.node.attrs.items())!r}" for m in st.members),
             ",".join(lay(r) for r in st.ins), str(sum(1 for r in st.outs if r != ABSENT))]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


_device_names: dict[str, str] = {}


def _device_name(device: Any) -> str:
    key = str(device)
    name = _device_names.get(key)
    if name is None:
        name = torch.cuda.get_device_name(device) if getattr(device, "type", None) == "cuda" else key
        _device_names[key] = name
    return name


def _verdict_path() -> str:
    from shapeplan.runtime.backends.triton_paths import kernel_cache_paths
    return str(kernel_cache_paths()["verdicts"])


def verified() -> set[str]:
    """Keys of steps that passed the capture-time check on this machine (``<cache>/triton_verified.txt``)."""
    from shapeplan.runtime.backends.triton_paths import keys_in
    return keys_in(_verdict_path())


def remember_verdict(key: str) -> None:
    from shapeplan.runtime.backends.triton_paths import add_key
    add_key(_verdict_path(), key)


# ---- parallel kernel warm-up (start-up time) --------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pending: list[Future] = []
_warmed: set[tuple] = set()
_warm_lock = threading.Lock()


def _capture_first_on() -> bool:
    return os.environ.get("SHAPEPLAN_CAPTURE_FIRST", "1").strip().lower() not in ("0", "false", "off", "no")


def _warm_on() -> bool:
    return os.environ.get("SHAPEPLAN_TRITON_WARM", "1") not in ("", "0")


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
    Triton (which installs the worker hook) and initialise its driver, so neither waits in line when
    the first kernel is needed. Triton's own cache key (a hash of its ~500 MB library) is never
    computed on our path: the manifest and the workers key kernels by the installation stamp
    (``triton_workers``). The torch kernels of the capture-time check (``close``) load too, while the
    plan is still compiled rather than after the last Triton kernel. Called when an engine is created
    in triton mode; idempotent."""
    global _prepared
    if _prepared or not _warm_on():
        return
    _prepared = True
    from shapeplan.runtime.backends import triton_workers
    triton_workers.prestart_if_cold()

    def check_kernels() -> None:
        if getattr(device, "type", None) != "cuda":
            return
        for dt in TOLERANCE:
            x = torch.zeros(4, dtype=dt, device=device)
            close(x, x)
    background(check_kernels)

    def driver() -> None:
        from shapeplan.runtime.backends import triton_env
        diagnostics.record("COMPILE", "Triton imported in this process")
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


_attached = False


def _attach() -> None:
    global _attached
    if not _attached:
        from shapeplan.runtime.backends import triton_codegen, triton_lowerings
        triton_codegen.attach_lowerings()
        triton_lowerings.attach_lowerings()
        _attached = True


def rewrite(seg: SegmentContext, steps: list[Step], metas: dict[int, Any], cg: Any, tlow: Any) -> list[Step]:
    """Replace slots by Triton steps where a lowering applies and fusing pays."""
    plan = seg.plan
    consts: dict[int, float] = {}
    for r, data in plan.constants:
        if isinstance(data, torch.Tensor) and data.numel() == 1 and data.dtype.is_floating_point:
            consts[r] = float(data.reshape(()))
    slots = seg.slots
    read_at: dict[int, list[int]] = {}
    for pos, s in enumerate(slots):
        for r in s.ins:
            read_at.setdefault(r, []).append(pos)
    live_out = set(seg.live_out)
    replaced: dict[int, Step | None] = {}      # position -> new step (None: absorbed into a fused step)
    n_fused = n_kernels = 0
    for run in cg.find_runs(slots, metas):
        first, last = run.positions[0], run.positions[-1]
        produced = [n.out for n in run.nodes]
        outputs = [r for r in produced
                   if r in live_out or any(p < first or p > last for p in read_at.get(r, ()))]
        if any(not _contiguous(metas[r]) for r in outputs):
            continue
        unfused, fused = cg.run_bytes(run.nodes, metas, outputs)
        score = cg.fusion_score(len(run.nodes), unfused, fused)
        if score < cg.MIN_GAIN_US:
            continue
        try:
            k = cg.build_fused(run.nodes, metas, outputs, consts)
        except Exception as e:  # noqa: BLE001 - codegen declines, the slots stay
            diagnostics.record("FUSION", "fused kernel not built", plan=seg.plan_key, reason=f"{type(e).__name__}: {e}")
            k = None
        if k is None:
            continue
        k.score = score
        members = tuple(slots[p] for p in run.positions)
        rel = tuple(r for st in (steps[p] for p in run.positions) for r in st.release)
        replaced[first] = Step(k, k.inputs, k.outputs, rel, members, kind="fused")
        for p in run.positions[1:]:
            replaced[p] = None
        n_fused += 1
        diagnostics.record("FUSION", "fused elementwise run", plan=seg.plan_key, segment=seg.segment.index,
                           ops=list(k.op_types), kernel=k.name, score_us=round(score, 2))
    for pos, s in enumerate(slots):
        if pos in replaced:
            continue
        low = getattr(s.opdef, "triton", None)
        if isinstance(low, tlow.KernelLowering):
            try:
                fn = low.bind(s, metas)
            except Exception:  # noqa: BLE001 - an unexpected layout: keep torch
                fn = None
            if fn is not None:
                replaced[pos] = Step(fn, tuple(s.ins), tuple(s.outs), steps[pos].release, (s,), kind="kernel")
                n_kernels += 1
    if not replaced:
        return steps
    out = [replaced.get(p, st) for p, st in enumerate(steps) if not (p in replaced and replaced[p] is None)]
    diagnostics.record("FUSION", "segment rewritten for Triton", plan=seg.plan_key, segment=seg.segment.index,
                       slots=len(slots), steps=len(out), fused_runs=n_fused, kernels=n_kernels)
    return out


def _contiguous(m: Any) -> bool:
    expect = 1
    for size, st in zip(reversed(m.shape), reversed(m.stride)):
        if size != 1 and st != expect:
            return False
        expect *= size
    return True


register_backend("triton", TritonBackend)

__all__ = ["TOLERANCE", "TritonBackend", "background", "close", "rewrite", "wait_background", "warm_kernels"]
