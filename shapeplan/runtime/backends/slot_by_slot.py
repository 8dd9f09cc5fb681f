"""The reference executor: run each slot's pre-bound kernel in order over the register file."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from shapeplan.errors import ExecutionError, ShapeplanError
from shapeplan.ir.dtypes import dtype_name
from shapeplan.plan.compiler import ABSENT, Plan, Slot


def describe_inputs(slot: Slot, regs: list[Any]) -> str:
    parts = []
    for v, r in zip(slot.node.all_inputs, slot.ins):
        if r == ABSENT:
            parts.append("None")
            continue
        x = regs[r]
        name = v.name if v is not None else "?"
        if isinstance(x, torch.Tensor):
            parts.append(f"{name}: {dtype_name(x.dtype)}{list(x.shape)}")
        elif isinstance(x, list):
            parts.append(f"{name}: sequence[{len(x)}]")
        else:
            parts.append(f"{name}: {type(x).__name__}")
    return ", ".join(parts)


def call_kernel(fn: Callable[..., tuple], ins: Sequence[int], outs: Sequence[int], regs: list[Any],
                where: Callable[[], str]) -> None:
    """Run one bound kernel over the register file; a failure becomes an ExecutionError that says
    ``where()`` (the node and its input shapes, built only when it fails)."""
    args = [None if r == ABSENT else regs[r] for r in ins]
    try:
        results = fn(*args)
    except ShapeplanError:
        raise
    except Exception as e:
        raise ExecutionError(f"While executing {where()}: {type(e).__name__}: {e}") from e
    for r, o in zip(outs, results):
        if r != ABSENT:
            regs[r] = o


def run_slot(slot: Slot, regs: list[Any]) -> None:
    call_kernel(slot.fn, slot.ins, slot.outs, regs,
                lambda: f"node {slot.node.describe()} with inputs ({describe_inputs(slot, regs)})")


def run_slot_by_slot(plan: Plan, regs: list[Any]) -> list[Any]:
    """Execute ``plan`` over ``regs`` (inputs, constants, variables already placed); return outputs."""
    for slot in plan.slots:
        run_slot(slot, regs)
        for r in slot.release:
            regs[r] = None
    return [regs[r] for _, r in plan.outputs]
