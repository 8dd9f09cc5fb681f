"""Mode ``shape_inference_only``: outputs' shapes and dtypes without computing them.

Every slot runs on torch "meta" tensors (no data, no compute); constants stay real so value-dependent
shapes that only read constants resolve. A slot that cannot run on meta leaves its outputs unknown.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.plan.compiler import ABSENT, Plan


@dataclass(frozen=True, slots=True)
class TensorSpec:
    shape: tuple[int, ...] | None      # None: unknown
    dtype: Any                          # shapeplan DType or None

    def __iter__(self):  # (shape, dtype) unpacking
        return iter((self.shape, self.dtype))


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def infer_outputs(plan: Plan, feeds: list[Any], constants: dict[str, Any],
                  variables: dict[str, Any]) -> dict[str, TensorSpec]:
    regs: list[Any] = [None] * plan.n_regs
    unknown = set()
    for (_, r), x in zip(plan.inputs, feeds):
        regs[r] = _meta(x)
    for r, d in plan.constants:
        regs[r] = constants.get(plan.reg_names[r], d)
    for name, r in plan.variables:
        regs[r] = _meta(variables[name])
    for slot in plan.slots:
        if any(r in unknown for r in slot.ins if r != ABSENT):
            unknown.update(slot.outs)
            continue
        args = [None if r == ABSENT else regs[r] for r in slot.ins]
        try:
            try:
                outs = slot.fn(*args)
            except Exception:  # noqa: BLE001 - mixed real/meta inputs: retry all-meta
                outs = slot.fn(*[_meta(a) for a in args])
            for r, o in zip(slot.outs, outs):
                if r != ABSENT:
                    regs[r] = o
        except Exception:  # noqa: BLE001 - data-dependent: the shape is not knowable without data
            unknown.update(slot.outs)
    res = {}
    for name, r in plan.outputs:
        x = regs[r]
        if r in unknown or not isinstance(x, torch.Tensor):
            res[name] = TensorSpec(None, None)
        else:
            res[name] = TensorSpec(tuple(x.shape), as_dtype(x.dtype))
    return res
