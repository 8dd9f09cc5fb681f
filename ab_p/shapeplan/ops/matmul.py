"""Matrix products: MatMul, Gemm, Einsum, MatMulInteger, QLinearMatMul, Det.

Integer products run natively on CPU; elsewhere (CUDA has no integer GEMM) they run in float64,
which is exact while |values| < 2**53. uint16/32/64 run in int64.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops._numeric import uint_safe
from shapeplan.ops.registry import register
from shapeplan.ops.shape_fns import matmul_shape


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """matmul with numpy semantics for any numeric dtype."""
    if a.dtype.is_floating_point:
        if a.dtype in (torch.float16, torch.bfloat16) and a.device.type == "cpu":
            return torch.matmul(a.float(), b.float()).to(a.dtype)
        return torch.matmul(a, b)
    if a.device.type != "cpu":
        return torch.matmul(a.to(torch.float64), b.to(torch.float64)).round().to(a.dtype)
    return torch.matmul(a, b)


@register("MatMul", since=1, shape=matmul_shape)
@uint_safe
def matmul(a, b):
    """ONNX MatMul (numpy.matmul: 1-D operands are promoted, batch dims broadcast)."""
    return _mm(a, b)


# ------------------------------------------------------------------------------------------ Gemm

def _gemm_shape(node: Any) -> list:
    a, b = node.inputs[0], node.inputs[1]
    if a.shape is None or b.shape is None:
        return [(a.dtype, None)]
    m = a.shape[1] if node.attrs.get("transA", 0) else a.shape[0]
    ka = a.shape[0] if node.attrs.get("transA", 0) else a.shape[1]
    kb = b.shape[1] if node.attrs.get("transB", 0) else b.shape[0]
    n = b.shape[0] if node.attrs.get("transB", 0) else b.shape[1]
    if isinstance(ka, int) and isinstance(kb, int) and ka != kb:
        raise ShapeError(f"node {node.describe()}: Gemm inner dimensions differ: A{list(a.shape)} "
                         f"(transA={node.attrs.get('transA', 0)}) vs B{list(b.shape)} "
                         f"(transB={node.attrs.get('transB', 0)}): {ka} vs {kb}")
    return [(a.dtype, (m, n))]


@uint_safe
def _gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX names
    a = a.transpose(0, 1) if transA else a
    b = b.transpose(0, 1) if transB else b
    y = _mm(a, b)
    if alpha != 1.0:
        y = (y * alpha).to(y.dtype)
    if c is not None and beta != 0.0:
        y = (y + (c * beta if beta != 1.0 else c)).to(y.dtype)
    return y


@register("Gemm", since=1, shape=_gemm_shape)
def gemm_v1(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):  # noqa: N803
    """ONNX Gemm < 7: C broadcast only with broadcast=1 (numpy rules cover that)."""
    return _gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)


@register("Gemm", since=7, shape=_gemm_shape)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX names
    """ONNX Gemm: alpha * A' B' + beta * C (C optional from opset 11, unidirectional broadcast)."""
    return _gemm(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)


# ---------------------------------------------------------------------------------------- Einsum

@register("Einsum", since=12)
@uint_safe
def einsum(*xs, equation):
    """ONNX Einsum (torch.einsum; ellipsis and implicit output supported)."""
    eq = equation.replace(" ", "")
    if xs and xs[0].dtype in (torch.float16, torch.bfloat16) and xs[0].device.type == "cpu":
        return torch.einsum(eq, *(x.float() for x in xs)).to(xs[0].dtype)
    if xs and not xs[0].dtype.is_floating_point and xs[0].device.type != "cpu":
        return torch.einsum(eq, *(x.to(torch.float64) for x in xs)).round().to(xs[0].dtype)
    return torch.einsum(eq, *xs)


# --------------------------------------------------------------------------- quantized products

def _zp_rows(zp: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A per-row zero point [M] applies along rows of A [..., M, K]."""
    if zp.dim() == 1 and zp.numel() > 1 and a.dim() >= 2 and zp.shape[0] == a.shape[-2]:
        return zp.unsqueeze(-1)
    return zp


def _int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.device.type == "cpu":
        return torch.matmul(a.to(torch.int64), b.to(torch.int64))
    return torch.matmul(a.to(torch.float64), b.to(torch.float64)).round().to(torch.int64)


def _mmi_shape(node: Any) -> list:
    return [(as_dtype("int32"), matmul_shape(node)[0][1])]


@register("MatMulInteger", since=10, shape=_mmi_shape)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """ONNX MatMulInteger: (A - a_zp) @ (B - b_zp) in int32 (zero points per tensor, row or column)."""
    a32 = a.to(torch.int32)
    b32 = b.to(torch.int32)
    if a_zero_point is not None:
        a32 = a32 - _zp_rows(a_zero_point.to(torch.int32), a)
    if b_zero_point is not None:
        b32 = b32 - b_zero_point.to(torch.int32)
    return _int_mm(a32, b32).to(torch.int32)


def _qlmm_shape(node: Any) -> list:
    zp = node.inputs[7] if len(node.inputs) > 7 else None
    dt = zp.dtype if zp is not None else node.inputs[0].dtype
    return [(dt, matmul_shape(node)[0][1])]


@register("QLinearMatMul", since=10, shape=_qlmm_shape)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
    """ONNX QLinearMatMul: requantized int8/uint8 product, rounding half to even, saturating."""
    a32 = a.to(torch.int32)
    b32 = b.to(torch.int32)
    if a_zero_point is not None:
        a32 = a32 - _zp_rows(a_zero_point.to(torch.int32), a)
    if b_zero_point is not None:
        b32 = b32 - b_zero_point.to(torch.int32)
    acc = _int_mm(a32, b32).to(torch.float64)
    factor = (a_scale * b_scale / y_scale).to(torch.float64)   # in the scales' dtype, like numpy
    if factor.dim() == 1 and factor.numel() > 1 and acc.dim() >= 2 and factor.shape[0] == acc.shape[-2] \
            and factor.shape[0] != acc.shape[-1]:
        factor = factor.unsqueeze(-1)
    y = acc * factor
    out_dtype = y_zero_point.dtype if y_zero_point is not None else a.dtype
    if y_zero_point is not None:
        y = y + y_zero_point.to(torch.float64)
    info = torch.iinfo(out_dtype)
    return torch.clamp(torch.round(y), info.min, info.max).to(out_dtype)


# ------------------------------------------------------------------------------------------- Det

def _det_shape(node: Any) -> list:
    x = node.inputs[0]
    return [(x.dtype, None if x.shape is None else tuple(x.shape[:-2]))]


@register("Det", since=11, shape=_det_shape)
def det(x):
    """ONNX Det: determinant of square matrices [..., M, M]."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.det(x.float()).to(x.dtype)
    return torch.linalg.det(x)

