"""Slot classification: plan-constant slots and segments (maximal runs of capturable slots).

    slots:     Shape  Gather  MatMul  Add  NonZero  Gather  Relu
    const:       *      *
    segments:  [0: MatMul Add] [1: NonZero (gap)] [2: Gather Relu]

A slot is plan-constant when its value is fixed for one input-shape signature: every input is a
constant or plan-constant, or it only reads shapes (``SHAPE_ONLY_OUTPUT``) of shape-stable values.
A value is shape-stable when its shape cannot change between calls with the same signature (it is not
downstream of a ``DYNAMIC_OUTPUT_SIZE`` op or a value-dependent reshape of non-constant data).
"""
from __future__ import annotations

from dataclasses import dataclass

from shapeplan.ops.registry import SEGMENT_BREAKERS, Trait

ABSENT = -1
_NEVER_CONST = Trait.RANDOM | Trait.MUTATES_INPUT | Trait.CONTROL_FLOW | Trait.SEQUENCE | Trait.HOST_SYNC


@dataclass(slots=True)
class Segment:
    index: int
    slots: range                    # slot indices, contiguous in plan order (plan-constant slots skipped)
    capturable: bool                # False: a gap, run slot by slot
    reason: str                     # why it ends here / why it is a gap
    live_in: tuple[int, ...] = ()   # registers read here, produced before
    live_out: tuple[int, ...] = ()  # registers produced here, read later or plan outputs
    slot_ids: tuple[int, ...] = ()  # the non-constant slot indices inside ``slots``

    def to_json(self) -> dict:
        return {"index": self.index, "first_slot": self.slots.start, "end_slot": self.slots.stop,
                "capturable": self.capturable, "reason": self.reason, "live_in": list(self.live_in),
                "live_out": list(self.live_out), "slots": list(self.slot_ids)}


def classify(plan) -> tuple[frozenset[int], frozenset[int]]:  # noqa: ANN001
    """(plan-constant slot indices, shape-stable registers)."""
    const_regs = {r for r, _ in plan.constants}
    stable = set(const_regs) | {r for _, r in plan.inputs} | {r for _, r in plan.variables} \
        | {r for _, r in plan.captures}
    const_slots: set[int] = set()
    for s in plan.slots:
        t = s.opdef.traits
        ins = [r for r in s.ins if r != ABSENT]
        all_stable = all(r in stable for r in ins)
        if t & Trait.DYNAMIC_OUTPUT_SIZE:
            out_stable = False
        elif t & Trait.VALUE_DEPENDENT_SHAPE:
            rest = ins[1:] if len(ins) > 1 else ins
            out_stable = all_stable and all(r in const_regs for r in rest)
        else:
            out_stable = all_stable
        is_const = False
        if not (t & _NEVER_CONST) and not s.node.implicit_inputs:
            if t & Trait.SHAPE_ONLY_OUTPUT:
                is_const = all_stable
            else:
                is_const = all(r in const_regs for r in ins)
        outs = [r for r in s.outs if r != ABSENT]
        if out_stable or is_const:
            stable.update(outs)
        if is_const:
            const_slots.add(s.index)
            const_regs.update(outs)
    return frozenset(const_slots), frozenset(stable)


def _reason(slot) -> str:  # noqa: ANN001
    t = slot.opdef.traits & SEGMENT_BREAKERS
    names = [f.name for f in Trait if f.value and f in t and f.name] if t else []
    return f"{slot.op_type} is {'|'.join(n.lower() for n in names)}"


def build_segments(plan, const_slots: frozenset[int]) -> list[Segment]:  # noqa: ANN001
    """Maximal runs of capturable non-constant slots; each non-capturable slot is its own gap."""
    segs: list[Segment] = []
    run: list[int] = []
    first = 0

    def close(end: int, reason: str) -> None:
        nonlocal run
        if run:
            segs.append(Segment(len(segs), range(first, end), True, reason, slot_ids=tuple(run)))
            run = []

    for s in plan.slots:
        if s.index in const_slots:
            continue
        if s.opdef.capturable:
            if not run:
                first = s.index
            run.append(s.index)
            continue
        close(s.index, f"boundary before {_reason(s)}")
        segs.append(Segment(len(segs), range(s.index, s.index + 1), False, _reason(s), slot_ids=(s.index,)))
    close(len(plan.slots), "end of plan")
    _liveness(plan, segs)
    return segs


def _liveness(plan, segs: list[Segment]) -> None:  # noqa: ANN001
    produced_in: dict[int, int] = {}
    for seg in segs:
        for i in seg.slot_ids:
            for r in plan.slots[i].outs:
                if r != ABSENT:
                    produced_in[r] = seg.index
    outs = {r for _, r in plan.outputs}
    live_in: list[set[int]] = [set() for _ in segs]
    live_out: list[set[int]] = [set() for _ in segs]
    for seg in segs:
        for i in seg.slot_ids:
            for r in plan.slots[i].ins:
                if r == ABSENT:
                    continue
                p = produced_in.get(r)
                if p != seg.index:
                    live_in[seg.index].add(r)
                    if p is not None:
                        live_out[p].add(r)
    for r in outs:
        p = produced_in.get(r)
        if p is not None:
            live_out[p].add(r)
    for seg in segs:
        seg.live_in = tuple(sorted(live_in[seg.index]))
        seg.live_out = tuple(sorted(live_out[seg.index]))
