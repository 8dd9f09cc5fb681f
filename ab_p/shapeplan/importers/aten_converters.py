"""Converters for core-ATen ops, one per overload family, registered into ``CONVERTERS``."""
from __future__ import annotations

import operator
from typing import Any

import torch

from shapeplan.errors import UnsupportedOpError
from shapeplan.ir.graph import Value
from shapeplan.importers.aten_table import CONVERTERS, Converter, _conv, _Ctx, _dim, _dims, aten  # noqa: F401


# ---------------------------------------------------------------------------------------- converters
def _binary(onnx_op: str, compare: bool = False) -> Converter:
    """Elementwise binary with torch's type promotion (scalars take the tensor's dtype)."""
    def fn(cx: _Ctx, a: Any, b: Any, *, alpha: Any = 1) -> Value:
        ma, mb = cx.meta(a), cx.meta(b)
        dt = torch.result_type(ma if ma is not None else a, mb if mb is not None else b) if compare \
            else cx.out_dtype()
        x, y = cx.cast(cx.v(a, dt), dt), cx.cast(cx.v(b, dt), dt)
        if alpha != 1:
            y = cx.op.Mul(y, cx.v(alpha, dt))
        out = getattr(cx.op, onnx_op)(x, y)
        return cx.op.Not(out) if onnx_op == "Equal" and compare == "ne" else out
    return fn


for _names, _op, _cmp in [(("add.Tensor", "add.Scalar"), "Add", False), (("sub.Tensor", "sub.Scalar"), "Sub", False),
                          (("mul.Tensor", "mul.Scalar"), "Mul", False), (("div.Tensor", "div.Scalar"), "Div", False),
                          (("pow.Tensor_Tensor", "pow.Tensor_Scalar"), "Pow", False),
                          (("maximum",), "Max", False), (("minimum",), "Min", False),
                          (("eq.Tensor", "eq.Scalar"), "Equal", True), (("ne.Tensor", "ne.Scalar"), "Equal", "ne"),
                          (("lt.Tensor", "lt.Scalar"), "Less", True), (("le.Tensor", "le.Scalar"), "LessOrEqual", True),
                          (("gt.Tensor", "gt.Scalar"), "Greater", True), (("ge.Tensor", "ge.Scalar"), "GreaterOrEqual", True),
                          (("logical_and",), "And", True), (("logical_or",), "Or", True)]:
    _conv(*_names)(_binary(_op, _cmp))


def _unary(onnx_op: str, **attrs: Any) -> Converter:
    return lambda cx, x: getattr(cx.op, onnx_op)(cx.v(x), **attrs)


for _name, _op in [("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("exp", "Exp"), ("log", "Log"),
                   ("sqrt", "Sqrt"), ("neg", "Neg"), ("abs", "Abs"), ("erf", "Erf"), ("reciprocal", "Reciprocal"),
                   ("sin", "Sin"), ("cos", "Cos"), ("floor", "Floor"), ("ceil", "Ceil"), ("logical_not", "Not")]:
    _conv(_name)(_unary(_op))


@_conv("rsqrt")
def _rsqrt(cx, x):
    return cx.op.Reciprocal(cx.op.Sqrt(cx.v(x)))


@_conv("silu")
def _silu(cx, x):
    x = cx.v(x)
    return cx.op.Mul(x, cx.op.Sigmoid(x))


@_conv("gelu")
def _gelu(cx, x, approximate="none"):
    return cx.op.Gelu(cx.v(x), approximate=approximate)


@_conv("clamp", "hardtanh")
def _clamp(cx, x, min=None, max=None):
    dt = cx.out_dtype()
    return cx.op.Clip(cx.v(x), None if min is None else cx.v(min, dt), None if max is None else cx.v(max, dt))


@_conv("linear")
def _linear(cx, x, w, b=None):
    y = cx.op.MatMul(cx.v(x), cx.op.Transpose(cx.v(w), perm=[1, 0]))      # [..., in] @ [in, out]
    return y if b is None else cx.op.Add(y, cx.v(b))


@_conv("addmm")
def _addmm(cx, bias, a, b, *, beta=1, alpha=1):
    return cx.op.Gemm(cx.v(a), cx.v(b), cx.v(bias), alpha=float(alpha), beta=float(beta))


@_conv("mm", "bmm", "matmul")
def _matmul(cx, a, b):
    return cx.op.MatMul(cx.v(a), cx.v(b))


@_conv("softmax.int", "_softmax", "log_softmax.int", "_log_softmax")
def _softmax(cx, x, dim, dtype_or_half=None):
    x = cx.v(x)
    if isinstance(dtype_or_half, torch.dtype) or dtype_or_half is True:
        x = cx.cast(x, cx.out_dtype())
    op = "LogSoftmax" if "log_softmax" in str(cx.node.target) else "Softmax"
    return getattr(cx.op, op)(x, axis=dim)


def _ones(cx: _Ctx, shape: list[int], fill: float = 1.0) -> Value:
    return cx.g.constant(torch.full(shape, fill, dtype=cx.out_dtype()))


@_conv("layer_norm", "native_layer_norm")
def _layer_norm(cx, x, shape, w=None, b=None, eps=1e-5, cudnn_enable=True):
    w = cx.v(w) if w is not None else _ones(cx, list(shape))
    b = cx.v(b) if b is not None else _ones(cx, list(shape), 0.0)
    if cx.node.target == aten.native_layer_norm.default:         # (out, mean, rstd)
        return cx.op.LayerNormalization(cx.v(x), w, b, axis=-len(shape), epsilon=float(eps), _outputs=3)
    return cx.op.LayerNormalization(cx.v(x), w, b, axis=-len(shape), epsilon=float(eps))


@_conv("rms_norm")
def _rms_norm(cx, x, shape, w=None, eps=None):
    eps = torch.finfo(cx.out_dtype()).eps if eps is None else eps
    w = cx.v(w) if w is not None else _ones(cx, list(shape))
    return cx.op.RMSNormalization(cx.v(x), w, axis=-len(shape), epsilon=float(eps))


@_conv("view", "reshape", "_unsafe_view", "unflatten.int", "flatten.using_ints", "view_as", "reshape_as")
def _reshape(cx, x, *_):
    shape = cx.shape_of_meta()
    return cx.op.Reshape(cx.v(x), shape, allowzero=int(0 in cx.meta().shape))


@_conv("permute")
def _permute(cx, x, dims):
    return cx.op.Transpose(cx.v(x), perm=_dims(dims, cx.rank(x)))


@_conv("transpose.int")
def _transpose(cx, x, d0, d1):
    r = cx.rank(x)
    perm = list(range(r))
    d0, d1 = _dim(d0, r), _dim(d1, r)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return cx.op.Transpose(cx.v(x), perm=perm)


@_conv("t", "numpy_T")
def _t(cx, x):
    return cx.op.Transpose(cx.v(x), perm=[1, 0]) if cx.rank(x) == 2 else cx.v(x)


@_conv("unsqueeze")
def _unsqueeze(cx, x, dim):
    return cx.op.Unsqueeze(cx.v(x), cx.ints([_dim(dim, cx.rank(x) + 1)]))


@_conv("squeeze", "squeeze.dim", "squeeze.dims")
def _squeeze(cx, x, dims=None):
    shape = cx.meta(x).shape
    dims = range(len(shape)) if dims is None else _dims(dims, len(shape))
    axes = [d for d in dims if isinstance(shape[d], int) and shape[d] == 1]   # aten ignores non-1 dims
    return cx.op.Squeeze(cx.v(x), cx.ints(axes)) if axes else cx.v(x)


@_conv("cat")
def _cat(cx, xs, dim=0):
    dt = cx.out_dtype()
    return cx.op.Concat(*[cx.cast(cx.v(x), dt) for x in xs], axis=dim)


@_conv("slice.Tensor")
def _slice(cx, x, dim=0, start=None, end=None, step=1):
    start = 0 if start is None else start
    end = 2**63 - 1 if end is None else min(end, 2**63 - 1) if isinstance(end, int) else end
    return cx.op.Slice(cx.v(x), cx.ints([start]), cx.ints([end]), cx.ints([dim]), cx.ints([step]))


@_conv("select.int")
def _select(cx, x, dim, index):
    idx = cx.g.constant(torch.tensor(index, dtype=torch.int64)) if isinstance(index, int) \
        else cx.op.Squeeze(cx.sym_value(index), cx.ints([0]))
    return cx.op.Gather(cx.v(x), idx, axis=dim)


@_conv("index_select")
def _index_select(cx, x, dim, index):
    return cx.op.Gather(cx.v(x), cx.v(index), axis=dim)


@_conv("expand", "expand_as")
def _expand(cx, x, sizes):
    if isinstance(sizes, torch.fx.Node):                          # expand_as(other)
        return cx.op.Expand(cx.v(x), cx.op.Shape(cx.v(sizes)))
    return cx.op.Expand(cx.v(x), cx.ints([1 if s == -1 else s for s in sizes]))   # -1 keeps: broadcast with 1


@_conv("embedding")
def _embedding(cx, w, idx, *_):
    return cx.op.Gather(cx.v(w), cx.v(idx), axis=0)


def _reduce(onnx_op: str) -> Converter:
    def fn(cx, x, dim=None, keepdim=False, *, dtype=None):
        r = cx.rank(x)
        x = cx.cast(cx.v(x), cx.out_dtype())
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
            dim = list(range(r))
        return getattr(cx.op, onnx_op)(x, cx.ints(_dims(dim, r)), keepdims=int(keepdim))
    return fn


_conv("mean.dim", "mean.default")(_reduce("ReduceMean"))
_conv("sum.dim_IntList", "sum.default")(_reduce("ReduceSum"))
_conv("amax")(_reduce("ReduceMax"))
_conv("amin")(_reduce("ReduceMin"))


def _pair(v: Any, n: int) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


@_conv("conv1d", "conv2d", "conv2d.padding", "convolution")
def _convolution(cx, x, w, b=None, stride=1, padding=0, dilation=1, *rest):
    n = cx.rank(w) - 2
    if cx.node.target == aten.convolution.default:
        transposed, output_padding, groups = rest
    else:
        transposed, output_padding, groups = False, 0, (rest[0] if rest else 1)
    attrs: dict[str, Any] = dict(strides=_pair(stride, n), dilations=_pair(dilation, n), group=groups)
    if padding == "same":
        attrs["auto_pad"] = "SAME_UPPER"
    elif padding != "valid":
        attrs["pads"] = _pair(padding, n) * 2
    args = [cx.v(x), cx.v(w)] + ([cx.v(b)] if b is not None else [])
    if transposed:
        return cx.op.ConvTranspose(*args, output_padding=_pair(output_padding, n), **attrs)
    return cx.op.Conv(*args, **attrs)


@_conv("max_pool2d", "max_pool2d_with_indices")
def _max_pool(cx, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    y = cx.op.MaxPool(cx.v(x), kernel_shape=_pair(kernel, 2), strides=_pair(stride or kernel, 2),
                      pads=_pair(padding, 2) * 2, dilations=_pair(dilation, 2), ceil_mode=int(ceil_mode))
    return (y, None) if cx.node.target == aten.max_pool2d_with_indices.default else y   # indices: unsupported


@_conv("avg_pool2d")
def _avg_pool(cx, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise UnsupportedOpError(f"torch.export import: node {cx.node}: avg_pool2d divisor_override")
    return cx.op.AveragePool(cx.v(x), kernel_shape=_pair(kernel, 2), strides=_pair(stride or kernel, 2),
                             pads=_pair(padding, 2) * 2, ceil_mode=int(ceil_mode),
                             count_include_pad=int(count_include_pad))


@_conv("adaptive_avg_pool2d", "_adaptive_avg_pool2d")
def _adaptive_avg_pool(cx, x, output_size):
    if list(output_size) == [1, 1]:
        return cx.op.GlobalAveragePool(cx.v(x))
    hw = list(cx.meta(x).shape[-2:])
    if all(isinstance(s, int) for s in hw) and all(s % o == 0 for s, o in zip(hw, output_size)):
        k = [s // o for s, o in zip(hw, output_size)]
        return cx.op.AveragePool(cx.v(x), kernel_shape=k, strides=k)
    raise UnsupportedOpError(f"torch.export import: node {cx.node}: adaptive_avg_pool2d to {list(output_size)} "
                             f"from {hw} (only 1x1 or an exact divisor of a static size)")


@_conv("_native_batch_norm_legit_no_training", "batch_norm")
def _batch_norm(cx, x, w, b, mean, var, *rest):
    if cx.node.target == aten.batch_norm.default:                    # (training, momentum, eps, cudnn)
        if rest[0]:
            raise UnsupportedOpError(f"torch.export import: node {cx.node}: batch_norm in training mode")
        eps = rest[2]
    else:                                                             # (momentum, eps)
        eps = rest[1]
    c = list(cx.meta(mean).shape)
    w = cx.v(w) if w is not None else _ones(cx, c)
    b = cx.v(b) if b is not None else _ones(cx, c, 0.0)
    y = cx.op.BatchNormalization(cx.v(x), w, b, cx.v(mean), cx.v(var), epsilon=float(eps))
    return (y, None, None) if cx.node.target != aten.batch_norm.default else y


@_conv("scaled_dot_product_attention")
def _sdpa(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if cx.rank(q) != 4:
        raise UnsupportedOpError(f"torch.export import: node {cx.node}: scaled_dot_product_attention "
                                 f"on rank {cx.rank(q)} (4-D [B, H, S, D] only)")
    attrs: dict[str, Any] = {"is_causal": int(is_causal)}
    if scale is not None:
        attrs["scale"] = float(scale)
    mask = None if attn_mask is None else cx.v(attn_mask)
    return cx.op.Attention(cx.v(q), cx.v(k), cx.v(v), mask, **attrs)          # [B, H, S, D]


@_conv("dropout", "alias", "clone", "contiguous", "detach", "lift_fresh_copy", "lift_fresh")
def _identity(cx, x, *_, **__):
    return cx.v(x)


@_conv("_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_assert_async.msg")
def _check_only(cx, *_, **__):
    return None                                          # export-time checks: nothing to run


@_conv("_to_copy", "to.dtype", "type_as")
def _to(cx, x, *_, **__):
    return cx.cast(cx.v(x), cx.out_dtype())


@_conv("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where(cx, cond, a, b):
    dt = cx.out_dtype()
    return cx.op.Where(cx.v(cond), cx.cast(cx.v(a, dt), dt), cx.cast(cx.v(b, dt), dt))


@_conv("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(cx, x, mask, value):
    dt = cx.out_dtype()
    return cx.op.Where(cx.v(mask), cx.cast(cx.v(value, dt), dt), cx.v(x))


@_conv("arange", "arange.start", "arange.start_step")
def _arange(cx, *args, **_):
    start, end, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
    dt = cx.out_dtype()

    def scalar(a):
        if isinstance(a, (int, float)):
            return cx.g.constant(torch.tensor(a, dtype=dt))
        return cx.cast(cx.op.Squeeze(cx.sym_value(a), cx.ints([0])), dt)
    return cx.op.Range(scalar(start), scalar(end), scalar(step))


@_conv("full", "scalar_tensor", "zeros", "ones")
def _full(cx, *args, **_):
    shape = list(cx.meta().shape)
    value = {"zeros": 0, "ones": 1}.get(cx.node.target.__name__.split(".")[0], args[-1] if args else 0)
    fill = cx.g.constant(torch.tensor(value, dtype=cx.out_dtype()))
    if all(isinstance(d, int) for d in shape):
        return cx.g.constant(torch.full(shape, value, dtype=cx.out_dtype()))
    return cx.op.Expand(fill, cx.shape_of_meta())


@_conv("full_like", "zeros_like", "ones_like")
def _full_like(cx, x, *args, **_):
    name = cx.node.target.__name__.split(".")[0]
    value = {"zeros_like": 0, "ones_like": 1}.get(name, args[0] if args else 0)
    return cx.op.Expand(cx.g.constant(torch.tensor(value, dtype=cx.out_dtype())), cx.op.Shape(cx.v(x)))


@_conv("split_with_sizes", "split.Tensor")
def _split(cx, x, sizes, dim=0):
    parts = [v.shape[_dim(dim, v.dim())] for v in cx.meta()]
    if not all(isinstance(p, int) for p in parts):
        raise UnsupportedOpError(f"torch.export import: node {cx.node}: split with symbolic sizes {parts}")
    out = cx.op.Split(cx.v(x), cx.ints(parts), axis=dim, _outputs=len(parts))
    return out if isinstance(out, tuple) else (out,)


@_conv("sym_size.int")
def _sym_size(cx, x, dim):
    return cx.op.Shape(cx.v(x), start=_dim(dim, cx.rank(x)), end=_dim(dim, cx.rank(x)) + 1)   # int64 [1]


def _getitem(cx, seq, i):
    out = cx.env[seq][i]
    if out is None:
        raise UnsupportedOpError(f"torch.export import: node {cx.node}: output {i} of {seq} ({seq.target}) "
                                 "is not supported (only the main output converts)")
    return out


def _sym_binary(onnx_op: str) -> Converter:
    return lambda cx, a, b: getattr(cx.op, onnx_op)(cx.sym_value(a), cx.sym_value(b))    # int64 [1]


CONVERTERS[operator.getitem] = _getitem
for _fn, _op in [(operator.mul, "Mul"), (operator.add, "Add"), (operator.sub, "Sub"), (operator.floordiv, "Div")]:
    CONVERTERS[_fn] = _sym_binary(_op)
