"""triton: the cuda_graphs backend with fewer, fused kernels inside the captured graph.

``compile`` rewrites a segment's steps before capture (``fusion.rewrite``): slots whose op has a
hand-written kernel launch it (``lowerings``), contiguous runs of elementwise slots become one generated
kernel (``codegen``) when that pays. Matmuls and everything else stay on torch (cuBLAS). A segment where
nothing applies is captured exactly like cuda_graphs, so ``auto`` on CUDA resolves per segment triton ->
cuda_graphs, and a failed capture -> slot_by_slot (the runner's fallback).

Correctness: at capture every Triton step runs on the call's real inputs next to its slots' torch
kernels; a step whose outputs differ beyond the dtype's tolerance, or land in another layout, is
replaced by its slots (VERIFY event). A step that passed is recorded on disk (``verdicts``), and later
processes skip the check for that exact step (start-up time). ``SHAPEPLAN_TRITON_VERIFY=1`` checks
every step again, also on random inputs, and compares every replay's live-outs against slot_by_slot.

Start-up (``warmup``): ``compile`` launches each distinct kernel once on the warm-up pool and
``capture`` waits for them, so the capture-time check finds every kernel compiled.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan import diagnostics, env
from shapeplan.ir.dtypes import dtype_name
from shapeplan.runtime.backends import SegmentContext, register_backend
from shapeplan.runtime.backends.cuda_graphs import (ABSENT, CudaGraphsBackend, GraphHandle, Step, _to_stable,
                                                    _verify_on, run_steps, slot_steps)
from shapeplan.runtime.backends.triton import warmup, workers
from shapeplan.runtime.backends.triton.codegen import Meta
from shapeplan.runtime.backends.triton.verdicts import close, remember_verdict, verdict_key, verified


class TritonBackend(CudaGraphsBackend):
    name = "triton"

    def __init__(self) -> None:
        self._metas: dict[tuple, dict[int, Any]] = {}
        self._used: dict[tuple, dict[int, Any]] = {}      # the layouts each segment was compiled for
        self._compiled_for: dict[tuple, dict[int, Any]] = {}   # the same, until the segment's capture
        self._warmed: set[tuple] = set()         # segments whose warm-up ran every step in this process
        self._triton_error: str | None = None

    def _key(self, seg: SegmentContext) -> tuple:
        return (seg.plan_key, id(seg.plan), seg.segment.index)

    # ---- warm-up: record every register's layout ------------------------------------------------------
    def warmup(self, seg: SegmentContext, regs: list[Any]) -> None:
        if seg.device.type == "cuda":
            workers.prestart_if_cold()            # a cold cache: workers start while this call runs
        metas = self._metas.setdefault(self._key(seg), {})
        self._warmed.add(self._key(seg))
        for r in seg.live_in:
            if isinstance(regs[r], torch.Tensor):
                metas[r] = Meta.of(regs[r])
        for st in slot_steps(seg):
            run_steps([st], regs)
            for r in st.outs:
                if r != ABSENT and isinstance(regs[r], torch.Tensor):
                    metas[r] = Meta.of(regs[r])

    # ---- frozen-plan records: the warm-up's layouts, on disk -------------------------------------------
    def layouts(self, seg: SegmentContext) -> dict[str, list] | None:
        metas = self._used.pop(self._key(seg), None)
        if not metas:
            return None
        return {str(r): [list(m.shape), list(m.stride), dtype_name(m.dtype), m.offset]
                for r, m in metas.items()}

    def seed(self, seg: SegmentContext, layouts: Any) -> bool:
        """Compile from recorded layouts instead of a warm-up run (False: none recorded: warm up)."""
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

    # ---- compile: choose and build Triton steps -------------------------------------------------------
    def compile(self, seg: SegmentContext) -> list[Step]:
        steps = slot_steps(seg)
        metas = self._metas.pop(self._key(seg), None)
        from shapeplan.runtime import frozen_records
        if metas and frozen_records.enabled(seg.device):    # kept until the runner writes its record
            self._used[self._key(seg)] = metas
        if metas:
            self._compiled_for[self._key(seg)] = metas
        try:
            from shapeplan.runtime.backends.triton import env as triton_env
            from shapeplan.runtime.backends.triton import fusion
            triton_env.patch()                      # done by prepare() on the warm-up pool, or now
            fusion.attach()
        except ImportError as e:
            diagnostics.record("FALLBACK", "triton unavailable: segment captured as a plain CUDA graph",
                               plan=seg.plan_key, segment=seg.segment.index, reason=str(e))
            return steps
        if not metas:
            return steps
        out = fusion.rewrite(seg, steps, metas)
        warmup.warm_kernels(seg, out, metas)
        return out

    def capture(self, seg: SegmentContext, compiled: list[Step], regs: list[Any]) -> GraphHandle:
        warmup.wait_background(seg.device)          # kernels compiled by warm_kernels; no launch elsewhere
        diagnostics.record("SEGMENT", "Triton warm-ups joined", plan=seg.plan_key, segment=seg.segment.index)
        return super().capture(seg, compiled, regs)

    # ---- capture: every Triton step checked against its slots on real inputs ---------------------------
    def _capture_first(self, seg: SegmentContext, steps: list[Step], regs: list[Any]) -> bool:
        """Capture before any eager run when every Triton step of ``steps`` already passed its check on
        this machine and build with exactly these input layouts (its verdict is on disk): the eager run
        would only run them unchecked. The layouts of registers no step has computed yet are the ones
        the segment was compiled for. Off with ``SHAPEPLAN_TRITON_VERIFY=1`` or
        ``SHAPEPLAN_CAPTURE_FIRST=0``. A segment without fused steps has nothing to check: with
        ``SHAPEPLAN_TRITON_PRELOAD`` it is captured first when its kernels are loaded (its warm-up ran
        here, or the start-up's kernels were preloaded: ``preload``); a kernel that is not stops the capture
        (``KernelNotLoaded``) and the segment runs eagerly first."""
        key = self._key(seg)
        metas = self._compiled_for.pop(key, None)
        warmed = key in self._warmed
        self._warmed.discard(key)
        if _verify_on() or not _capture_first_on():
            return False
        fused = [st for st in steps if st.kind != "slot"]
        if not fused:
            from shapeplan.runtime.backends.triton import preload
            return bool(metas) and seg.device.type == "cuda" and preload.enabled() and (warmed or preload.preloaded())
        if not metas:
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
        if handle.verify and handle.graph is not None:
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


def _capture_first_on() -> bool:
    return env.get("SHAPEPLAN_CAPTURE_FIRST")


register_backend("triton", TritonBackend)

__all__ = ["TritonBackend"]
