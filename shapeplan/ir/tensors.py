"""Runtime values <-> numpy. Tensors run as torch.Tensors; ONNX strings stay numpy object arrays;
sequences are Python lists; an empty optional is None. Exotic numpy dtypes from ``ml_dtypes``
(bfloat16, float8, int4) are mapped to torch by reinterpreting their bits."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shapeplan.ir.dtypes import dtype_name


class _LazyMlDtypes:
    """``ml_dtypes``, imported on first use (0.8-1.1 s on the dev box: the LLM path never needs it);
    falsy when it is not installed."""

    _mod: Any = False

    def _get(self) -> Any:
        if _LazyMlDtypes._mod is False:
            try:
                import ml_dtypes as mod
            except ImportError:  # pragma: no cover - ml_dtypes ships with onnx
                mod = None
            _LazyMlDtypes._mod = mod
        return _LazyMlDtypes._mod

    def __bool__(self) -> bool:
        return self._get() is not None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


ml_dtypes: Any = _LazyMlDtypes()

_ML_TO_TORCH: dict[str, tuple[Any, torch.dtype | None]] = {
    # ml_dtypes name -> (bits view dtype, torch dtype to view as; None = widen by value)
    "bfloat16": (np.uint16, torch.bfloat16),
    "float8_e4m3fn": (np.uint8, getattr(torch, "float8_e4m3fn", None)),
    "float8_e4m3fnuz": (np.uint8, getattr(torch, "float8_e4m3fnuz", None)),
    "float8_e5m2": (np.uint8, getattr(torch, "float8_e5m2", None)),
    "float8_e5m2fnuz": (np.uint8, getattr(torch, "float8_e5m2fnuz", None)),
    "int4": (np.int8, None),
    "uint4": (np.uint8, None),
    "float4_e2m1fn": (np.float32, None),
    "float8_e8m0fnu": (np.uint8, getattr(torch, "float8_e8m0fnu", None)),
    "int2": (np.int8, None),
    "uint2": (np.uint8, None),
}

#: shapeplan dtypes that run widened (see _ML_TO_TORCH) -> their ml_dtypes name, for output
WIDENED = {"int4": "int4", "uint4": "uint4", "int2": "int2", "uint2": "uint2",
           "float4e2m1": "float4_e2m1fn"}


#: numpy / torch dtypes that convert as they are (no ml_dtypes view, no widening): every call's fast path
_PLAIN_NP = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int64, np.int32, np.int16,
                                             np.int8, np.uint8, np.bool_))
_PLAIN_TORCH = frozenset((torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16,
                          torch.int8, torch.uint8, torch.bool))


def numpy_to_runtime(a: Any, device: str | torch.device = "cpu") -> Any:
    """numpy array (or scalar / list for sequences / None) -> runtime value."""
    if type(a) is np.ndarray and a.dtype in _PLAIN_NP:     # the usual feed: a copy, on the device
        return torch.from_numpy(np.array(a, order="C", copy=True)).to(device)
    if a is None:
        return None
    if isinstance(a, list):
        return [numpy_to_runtime(x, device) for x in a]
    if isinstance(a, torch.Tensor):
        return a.to(device)
    arr = np.asarray(a)
    if arr.dtype.kind in "SUO":
        return arr.astype(object)
    name = arr.dtype.name
    if name in _ML_TO_TORCH:
        bits, tdt = _ML_TO_TORCH[name]
        if tdt is not None:
            return torch.from_numpy(np.array(arr, order="C", copy=True).view(bits)).view(tdt).to(device)
        return torch.from_numpy(arr.astype(bits)).to(device)
    if arr.dtype == np.uint16 or arr.dtype == np.uint32 or arr.dtype == np.uint64:
        return torch.from_numpy(np.array(arr, order="C", copy=True)).to(device)
    return torch.from_numpy(np.array(arr, order="C", copy=True)).to(device)  # keeps 0-d (ascontiguousarray does not)


def runtime_to_numpy(v: Any, dtype: Any = None) -> Any:
    """runtime value -> numpy (bfloat16/float8 become ml_dtypes arrays when ml_dtypes is present).

    ``dtype`` (the value's declared DType) restores the types that run widened (int4, float4...)."""
    if v is None:
        return None
    name = getattr(dtype, "name", None)
    if name in WIDENED and isinstance(v, torch.Tensor) and ml_dtypes:
        return runtime_to_numpy(v).astype(getattr(ml_dtypes, WIDENED[name]))
    if type(v) is torch.Tensor and v.dtype in _PLAIN_TORCH and v.device.type == "cpu":
        return v.detach().numpy()                           # the usual result (no conj / neg bits: not complex)
    if isinstance(v, list):
        return [runtime_to_numpy(x) for x in v]
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            bits = t.contiguous().view(torch.int16).numpy().view(np.uint16)
            return bits.view(ml_dtypes.bfloat16) if ml_dtypes else t.float().numpy()
        if t.dtype.is_floating_point and t.element_size() == 1:
            name = dtype_name(t.dtype)
            bits = t.contiguous().view(torch.uint8).numpy()
            if ml_dtypes and hasattr(ml_dtypes, name):
                return bits.view(getattr(ml_dtypes, name))
            return t.float().numpy()
        return t.resolve_conj().resolve_neg().numpy()
    return np.asarray(v)
