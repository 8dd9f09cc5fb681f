"""Buffer reuse: registers whose lifetimes do not overlap share one physical buffer.

Runs once shapes are frozen (it needs every register's byte size). Greedy interval assignment in plan
order: a register is born at the slot that writes it and dies at the slot that last reads it
(``plan.release_at_step``); at birth it takes the smallest free buffer that fits (best fit), else the
largest free buffer, grown to fit, else a new buffer. Pinned registers (placeholders, constants,
variables, outputs) never share.

    regs:     a(0..2)  b(1..3)  c(3..5)  d(4..6)
    buffers:  #0 = a, c        #1 = b, d
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

ABSENT = -1


@dataclass(slots=True)
class BufferPlan:
    assign: dict[int, int] = field(default_factory=dict)    # register -> buffer index
    sizes: list[int] = field(default_factory=list)          # buffer index -> bytes
    n_intermediates: int = 0                                 # registers considered
    intermediate_bytes: int = 0                              # their bytes without reuse

    @property
    def n_buffers(self) -> int:
        return len(self.sizes)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def summary(self) -> dict[str, Any]:
        return {"intermediates": self.n_intermediates, "buffers": self.n_buffers,
                "bytes_without_reuse": self.intermediate_bytes, "bytes_with_reuse": self.total_bytes,
                "reuse_factor": round(self.n_intermediates / max(1, self.n_buffers), 2)}


def plan_buffers(plan: Any, nbytes: dict[int, int], only: set[int] | None = None) -> BufferPlan:
    """Assign the registers in ``nbytes`` (register -> byte size; tensors only) to shared buffers.

    ``only``: restrict to these registers (e.g. the ones a backend needs stable). Pinned registers are
    skipped.
    """
    birth: dict[int, int] = {}
    death: dict[int, int] = {}
    for s in plan.slots:
        for r in s.outs:
            if r != ABSENT and r in nbytes and r not in plan.pinned and (only is None or r in only):
                birth.setdefault(r, s.index)
                death[r] = s.index
        for r in s.ins:
            if r in birth:
                death[r] = max(death[r], s.index)
    bp = BufferPlan(n_intermediates=len(birth), intermediate_bytes=sum(nbytes[r] for r in birth))
    by_birth: dict[int, list[int]] = {}
    by_death: dict[int, list[int]] = {}
    for r, b in birth.items():
        by_birth.setdefault(b, []).append(r)
        by_death.setdefault(death[r], []).append(r)
    free: list[tuple[int, int]] = []          # sorted (size, buffer)
    for s in plan.slots:
        for r in by_birth.get(s.index, ()):
            need = nbytes[r]
            i = bisect.bisect_left(free, (need, -1))
            if i < len(free):
                _, buf = free.pop(i)
            elif free:
                _, buf = free.pop()           # the largest free buffer, grown
                bp.sizes[buf] = need
            else:
                buf = len(bp.sizes)
                bp.sizes.append(need)
            bp.assign[r] = buf
        # a register dies after its last reader ran; its buffer is free for the next slot's outputs
        for r in by_death.get(s.index, ()):
            buf = bp.assign[r]
            bisect.insort(free, (bp.sizes[buf], buf))
    return bp
