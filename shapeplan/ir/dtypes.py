"""Element types: one table mapping shapeplan names <-> ONNX TensorProto codes <-> torch <-> numpy."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class DType:
    name: str           # "float32"
    onnx: int           # onnx.TensorProto.FLOAT
    torch: torch.dtype | None
    numpy: np.dtype | None
    itemsize: int

    @property
    def is_float(self) -> bool:
        return self.torch is not None and self.torch.is_floating_point

    def __repr__(self) -> str:
        return self.name


def _t(name: str):
    return getattr(torch, name, None)


# (name, onnx code, torch dtype, numpy dtype, itemsize). ONNX codes from onnx.TensorProto.DataType.
_TABLE = [
    ("float32", 1, torch.float32, np.float32, 4),
    ("uint8", 2, torch.uint8, np.uint8, 1),
    ("int8", 3, torch.int8, np.int8, 1),
    ("uint16", 4, _t("uint16"), np.uint16, 2),
    ("int16", 5, torch.int16, np.int16, 2),
    ("int32", 6, torch.int32, np.int32, 4),
    ("int64", 7, torch.int64, np.int64, 8),
    ("string", 8, None, np.object_, 0),
    ("bool", 9, torch.bool, np.bool_, 1),
    ("float16", 10, torch.float16, np.float16, 2),
    ("float64", 11, torch.float64, np.float64, 8),
    ("uint32", 12, _t("uint32"), np.uint32, 4),
    ("uint64", 13, _t("uint64"), np.uint64, 8),
    ("complex64", 14, torch.complex64, np.complex64, 8),
    ("complex128", 15, torch.complex128, np.complex128, 16),
    ("bfloat16", 16, torch.bfloat16, None, 2),
    ("float8e4m3fn", 17, _t("float8_e4m3fn"), None, 1),
    ("float8e4m3fnuz", 18, _t("float8_e4m3fnuz"), None, 1),
    ("float8e5m2", 19, _t("float8_e5m2"), None, 1),
    ("float8e5m2fnuz", 20, _t("float8_e5m2fnuz"), None, 1),
    ("uint4", 21, None, None, 1),
    ("int4", 22, None, None, 1),
    ("float4e2m1", 23, None, None, 1),
    ("float8e8m0", 24, _t("float8_e8m0fnu"), None, 1),
    ("uint2", 25, None, None, 1),
    ("int2", 26, None, None, 1),
]

DTYPES: dict[str, DType] = {}
_BY_ONNX: dict[int, DType] = {}
_BY_TORCH: dict[torch.dtype, DType] = {}
_BY_NUMPY: dict[np.dtype, DType] = {}
for _name, _code, _td, _nd, _size in _TABLE:
    _dt = DType(_name, _code, _td, np.dtype(_nd) if _nd is not None else None, _size)
    DTYPES[_name] = _dt
    _BY_ONNX[_code] = _dt
    if _td is not None:
        _BY_TORCH[_td] = _dt
    if _nd is not None:
        _BY_NUMPY[np.dtype(_nd)] = _dt

# ml_dtypes (ships with onnx) gives numpy dtypes to the types numpy lacks; they are mapped on first
# need (an array of one of them exists, so ml_dtypes is imported already): importing ml_dtypes takes
# 0.8-1.1 s on the dev box, which the LLM path never needs
_ML_NAMES = (("bfloat16", "bfloat16"), ("float8e4m3fn", "float8_e4m3fn"), ("float8e4m3fnuz", "float8_e4m3fnuz"),
             ("float8e5m2", "float8_e5m2"), ("float8e5m2fnuz", "float8_e5m2fnuz"), ("float8e8m0", "float8_e8m0fnu"),
             ("int4", "int4"), ("uint4", "uint4"), ("int2", "int2"), ("uint2", "uint2"),
             ("float4e2m1", "float4_e2m1fn"))
_ml_mapped = False


def _map_ml_dtypes() -> None:
    global _ml_mapped
    _ml_mapped = True
    try:
        import ml_dtypes as _ml
    except ImportError:  # pragma: no cover - ml_dtypes ships with onnx
        return
    for name, ml_name in _ML_NAMES:
        if hasattr(_ml, ml_name):
            _BY_NUMPY.setdefault(np.dtype(getattr(_ml, ml_name)), DTYPES[name])


_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16",
            "fp16": "float16", "fp32": "float32", "long": "int64", "int": "int32"}


def dtype(x: object) -> DType:
    """Resolve a DType from a name, ONNX code, torch dtype, numpy dtype or DType."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        name = _ALIASES.get(x, x)
        if name in DTYPES:
            return DTYPES[name]
        raise ValueError(f"unknown dtype {x!r}; known: {', '.join(DTYPES)}")
    if isinstance(x, torch.dtype):
        if x in _BY_TORCH:
            return _BY_TORCH[x]
        raise ValueError(f"torch dtype {x} has no shapeplan equivalent")
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        if int(x) in _BY_ONNX:
            return _BY_ONNX[int(x)]
        raise ValueError(f"unknown ONNX element type code {x}")
    try:
        nd = np.dtype(x)  # type: ignore[call-overload]
    except TypeError as e:
        raise ValueError(f"cannot interpret {x!r} as a dtype") from e
    if nd.kind in "SUO":
        return DTYPES["string"]
    if nd not in _BY_NUMPY and not _ml_mapped:
        _map_ml_dtypes()
    if nd in _BY_NUMPY:
        return _BY_NUMPY[nd]
    raise ValueError(f"numpy dtype {nd} has no shapeplan equivalent")


def dtype_name(x: object) -> str:
    """A torch dtype's name as torch spells it, without the module: ``torch.bfloat16`` -> ``"bfloat16"``,
    ``torch.float8_e4m3fn`` -> ``"float8_e4m3fn"`` (``getattr(torch, name)`` gives the dtype back; not
    always a shapeplan ``DType`` name). Anything else as ``str`` writes it."""
    return str(x).removeprefix("torch.")


def from_onnx(code: int) -> DType:
    return dtype(int(code))


def to_torch(x: object) -> torch.dtype:
    d = dtype(x)
    if d.torch is None:
        raise ValueError(f"dtype {d.name} has no torch equivalent")
    return d.torch
