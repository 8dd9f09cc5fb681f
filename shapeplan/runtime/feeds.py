"""Validate and convert user feeds. Errors name the input, what was expected and what was given."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from shapeplan.errors import InputError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.dtypes import dtype_name
from shapeplan.ir.graph import TypeKind, Value
from shapeplan.ir.tensors import numpy_to_runtime


def _given_dtype(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return dtype_name(x.dtype)
    if isinstance(x, np.ndarray):
        try:
            return as_dtype(x.dtype).name
        except ValueError:
            return str(x.dtype)
    return type(x).__name__


def validate_feeds(placeholders: list[Value], feeds: Mapping[str, Any]) -> None:
    expected = {v.name for v in placeholders}
    missing = [v.name for v in placeholders if v.name not in feeds]
    extra = [k for k in feeds if k not in expected]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing input(s) {missing}")
        if extra:
            parts.append(f"unknown input(s) {extra}")
        sig = ", ".join(f"{v.name}: {v.dtype}{list(v.shape) if v.shape is not None else '[?]'}"
                        for v in placeholders)
        raise InputError(f"{' and '.join(parts)}; the model expects ({sig})")
    for v in placeholders:
        x = feeds[v.name]
        if v.type_kind is not TypeKind.TENSOR:
            continue
        if not isinstance(x, (torch.Tensor, np.ndarray)):
            if x is None or isinstance(x, list):
                raise InputError(f"input {v.name!r}: expected a tensor of {v.dtype}, got {type(x).__name__}")
            continue
        if v.dtype is not None:
            got = _given_dtype(x)
            want = v.dtype.name
            if got != want and not (want == "string" and isinstance(x, np.ndarray) and x.dtype.kind in "SUO"):
                raise InputError(f"input {v.name!r}: expected dtype {want}, got {got} "
                                 f"(shape {list(x.shape)})")
        if v.shape is not None:
            shape = tuple(x.shape)
            if len(shape) != len(v.shape):
                raise InputError(f"input {v.name!r}: expected rank {len(v.shape)} "
                                 f"(shape {list(v.shape)}), got shape {list(shape)}")
            for i, (want_d, got_d) in enumerate(zip(v.shape, shape)):
                if isinstance(want_d, int) and want_d != got_d:
                    raise InputError(f"input {v.name!r}: dimension {i} must be {want_d} "
                                     f"(expected shape {list(v.shape)}), got shape {list(shape)}")


def to_runtime(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x if x.device == device else x.to(device)
    return numpy_to_runtime(x, device)
