"""The triton backend's segment rewrite: which slots become Triton steps.

1. a contiguous run of elementwise slots of one shape becomes one generated kernel (``codegen``) when
   ``fusion_score`` says it pays (launches saved against bytes moved);
2. a slot whose op has a hand-written kernel (``lowerings``: RMSNorm, SkipRMSNorm, LayerNorm, Softmax,
   SiluMul, RoPE, a decode step's CacheWriteKV) launches it instead of the torch kernel.

Everything else keeps its slot (torch: cuBLAS, SDPA, ...). Every choice is a FUSION event.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan import diagnostics
from shapeplan.runtime.backends import SegmentContext
from shapeplan.runtime.backends.cuda_graphs import Step
from shapeplan.runtime.backends.triton import codegen as cg
from shapeplan.runtime.backends.triton import lowerings as tlow

_attached = False


def attach() -> None:
    """Attach the Triton lowerings to the op table (once)."""
    global _attached
    if not _attached:
        cg.attach_lowerings()
        tlow.attach_lowerings()
        _attached = True


def rewrite(seg: SegmentContext, steps: list[Step], metas: dict[int, Any]) -> list[Step]:
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


__all__ = ["attach", "rewrite"]
