"""Stable buffers: placeholder staging buffers and the physical buffers of the buffer plan."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shapeplan.plan.buffers import BufferPlan
from shapeplan.runtime import faults


@dataclass(slots=True)
class RegMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    contiguous: bool
    dense: bool                 # non-overlapping and dense (a buffer with these strides can hold it)

    @classmethod
    def of(cls, t: torch.Tensor) -> "RegMeta":
        shape, stride = tuple(t.shape), tuple(t.stride())
        contiguous = t.is_contiguous()
        dense = contiguous or _dense(shape, stride)
        return cls(shape, stride, t.dtype, t.numel() * t.element_size(), contiguous, dense)


def _dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    dims = sorted((st, sz) for sz, st in zip(shape, stride) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def allocate(meta: dict[int, RegMeta], bplan: BufferPlan, regs: set[int], device: torch.device) -> dict[int, Any]:
    """register -> stable tensor for each register in ``regs``; registers assigned by ``bplan`` share
    physical byte buffers, the others (non-contiguous dense) get their own."""
    faults.check("allocation")
    physical = [torch.empty(max(1, n), dtype=torch.uint8, device=device) for n in bplan.sizes]
    out: dict[int, Any] = {}
    for r in sorted(regs):
        m = meta[r]
        b = bplan.assign.get(r)
        if b is not None and m.contiguous and m.dtype.itemsize and m.nbytes <= bplan.sizes[b]:
            out[r] = physical[b][:m.nbytes].view(m.dtype).view(m.shape)
        else:
            out[r] = torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=device)
    return out


def staging_buffers(inputs: list[tuple[str, int]], feeds: list[Any], device: torch.device) -> dict[int, Any]:
    """register -> a buffer with the feed's shape/dtype (contiguous), for tensor placeholders."""
    faults.check("allocation")
    out = {}
    for (_, r), x in zip(inputs, feeds):
        if isinstance(x, torch.Tensor):
            out[r] = torch.empty(tuple(x.shape), dtype=x.dtype, device=device)
    return out
