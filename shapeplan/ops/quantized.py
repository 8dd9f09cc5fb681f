"""Ops over packed quantized weights (domain ``shapeplan``): the linear layer and the embedding lookup
of a model whose weights stay in GGUF blocks (or shapeplan's INT8/INT4 groups) in device memory.

A quantized weight W [N, K] is a graph constant holding its packed bytes, uint8 ``[N, K / block *
type_size]`` (shapeplan/quant/formats.py), with the type and logical shape as attributes:

    QuantMatMul(x [..., K], packed; qtype, n, k)          -> x @ W.T   [..., N]   (x's dtype)
    QuantGather(packed, ids [...]; qtype, n, k, dtype)    -> W[ids]    [..., K]   (dtype)

and the quantized forms of the fused linear layers of shapeplan/ops/fused_linear.py (a decoder block's
norm + projection (+ SiLU gate) and projection + residual add, one kernel at batch 1):

    QuantRMSNormMatMul(x [..., K], scale [K], packed; qtype, n, k, epsilon, activation)
        = RMSNorm(x) * scale @ W.T           [..., N]   (activation="silu_mul": silu(y[:N/2]) * y[N/2:])
    QuantMatMulAdd(a [..., K], packed, residual [..., N][, x_codes]; qtype, n, k, prefetch) = residual + a @ W.T
        (x_codes: a's row as int8 codes, which the one-row kernel may read instead of quantizing a)

Kernels: on CUDA tensors the Triton kernels of shapeplan/runtime/backends/triton/kernels/gguf.py (GEMV
for M <= 8 rows, prefill GEMM, row dequantization), which capture into the decode plan's CUDA graph;
up to 8 rows of Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / IQ4 run qgemv.py's one-row kernel (a program per row, each
row's result that of a one-row call), which also does the fused ops' norm prologue and gate / residual epilogue
(other types and rows: the norm, QuantMatMul and the gate or add, unfused). A decode step's 5-16 rows (x [B, 1,
K]; Q8_0_R 3-16) of a Q8_0_R / Q4_K_R / Q6_K_R matrix whose one-row kernel reads x as int8 codes run mmq.py's
integer tensor-core GEMM instead (the norm where it quantizes x, then the gate or add); each row agrees with its
single stream to float rounding.
Elsewhere, the torch reference: dequantize the weight per call (the fused ops: the unfused ops' kernels
in sequence, so their values are bit for bit those of the unfused graph) (shapeplan/quant/dequant.py, equal to
gguf-py's dequantization) and multiply in x's dtype, so memory stays packed everywhere and CPU runs
test the same graph. ``set_quant_kernels("triton")`` runs the Triton kernels on CPU tensors too (under
``TRITON_INTERPRET=1``: tests); a Triton failure falls back to torch with a FALLBACK event.
"""
from __future__ import annotations

import torch

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops._common import KernelChoice
from shapeplan.ops.registry import register

#: the quantized ops' Triton switch (auto: on CUDA; ``set_quant_kernels``) and its failures
_KERNELS = KernelChoice("Triton quantized kernel", "dequantizing in torch")
_triton_failed = _KERNELS.failed
set_quant_kernels = _KERNELS.set


def _triton(t: torch.Tensor):
    """The kernels module when the Triton path applies to ``t``, else None."""
    if not _KERNELS.applies(t):
        return None
    from shapeplan.runtime.backends.triton.kernels import gguf
    return gguf if gguf.AVAILABLE else None


_fallback = _KERNELS.fallback


def _check_packed(node, packed, qtype: str, n: int, k: int) -> None:
    from shapeplan.quant.formats import QuantTypeError, qtype as lookup
    try:
        q = lookup(qtype, tensor=packed.name)
    except QuantTypeError as e:               # shape inference reports ShapeErrors (others mean "unknown")
        raise ShapeError(f"node {node.describe()}: {e}") from None
    if k % q.block:
        raise ShapeError(f"node {node.describe()}: k={k} is not a multiple of the {qtype} block size {q.block}")
    want = (n, q.row_bytes(k))
    if packed.shape is not None and tuple(packed.shape) != want:
        raise ShapeError(f"node {node.describe()}: packed weight {packed.name!r} has shape {list(packed.shape)}, "
                         f"expected {list(want)} for a {qtype} [{n}, {k}] weight")


def _qmm_shape(node):
    x, packed = node.inputs[0], node.inputs[1]
    n, k = int(node.attrs["n"]), int(node.attrs["k"])
    _check_packed(node, packed, node.attrs["qtype"], n, k)
    if x.shape is None:
        return [(x.dtype, None)]
    if isinstance(x.shape[-1], int) and x.shape[-1] != k:
        raise ShapeError(f"node {node.describe()}: input {x.name!r} has {x.shape[-1]} features, the quantized "
                         f"weight {packed.name!r} expects k={k}")
    return [(x.dtype, (*x.shape[:-1], n))]


@register("QuantMatMul", domain="shapeplan", shape=_qmm_shape)
def quant_matmul(x, packed, *, qtype: str, n: int, k: int):
    """``x @ W.T`` with W [n, k] packed as ``qtype`` blocks: x [..., k] -> [..., n] in x's dtype."""
    from shapeplan.quant.formats import QTYPES
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)                                                   # [M, K]
    kern = _triton(x)
    if kern is not None:
        try:
            mm = _mmq_kernel(x, packed, qtype, n, k)
            if mm is not None:
                return mm.mmq(x2, packed, qtype, n, k).reshape(*lead, n)
            return kern.matmul(x2, packed, QTYPES[qtype], n, k).reshape(*lead, n)
        except Exception as e:  # noqa: BLE001 - e.g. an unsupported GPU: fall back, visibly
            _fallback(e, "QuantMatMul")
    from shapeplan.quant.dequant import dequantize
    w = dequantize(packed, qtype).to(x.dtype)                               # [N, K]
    return (x2 @ w.t()).reshape(*lead, n)


def _qgather_shape(node):
    packed, ids = node.inputs[0], node.inputs[1]
    n, k = int(node.attrs["n"]), int(node.attrs["k"])
    _check_packed(node, packed, node.attrs["qtype"], n, k)
    dt = as_dtype(node.attrs.get("dtype", "float32"))
    return [(dt, None if ids.shape is None else (*ids.shape, k))]


@register("QuantGather", domain="shapeplan", shape=_qgather_shape)
def quant_gather(packed, indices, *, qtype: str, n: int, k: int, dtype: str = "float32"):
    """Rows ``indices`` of W [n, k] packed as ``qtype`` (an embedding lookup): ids [...] -> [..., k]."""
    from shapeplan.quant.formats import QTYPES
    dt = as_dtype(dtype).torch
    idx = indices.reshape(-1).to(torch.int64)
    kern = _triton(packed)
    if kern is not None:
        try:
            idx = torch.where(idx < 0, idx + n, idx)
            return kern.dequantize_rows(packed, QTYPES[qtype], k, dt, idx).reshape(*indices.shape, k)
        except Exception as e:  # noqa: BLE001
            _fallback(e, "QuantGather")
    from shapeplan.quant.dequant import dequantize
    return dequantize(packed[idx], qtype).to(dt).reshape(*indices.shape, k)


def quant_x_codes(x: torch.Tensor) -> torch.Tensor:
    """x [1, K] as int8 codes (``shapeplan.quant.quantize.x_codes``' layout): qgemv's x quantizer where the
    Triton quantized kernels run, else the torch form."""
    if _triton(x) is not None:
        try:
            from shapeplan.runtime.backends.triton.kernels import qgemv
            buf = qgemv.x_code_buffer(x.shape[1], x.device)
            qgemv.quantize_x(x.contiguous(), None, 0.0, x.shape[1], out=buf)
            return buf
        except Exception as e:  # noqa: BLE001
            _fallback(e, "x codes")
    from shapeplan.quant.quantize import x_codes
    return x_codes(x)


def _fused_kernel(x2: torch.Tensor, packed: torch.Tensor, qtype: str, k: int):
    """qgemv.py when its one-row kernel applies to x2 [M, K] (M <= 8: a program per row; and the fused GEMV is
    switched on), else None."""
    if _triton(x2) is None:
        return None
    from shapeplan import env
    if not env.get("SHAPEPLAN_LLM_FUSED_GEMV"):
        return None
    from shapeplan.runtime.backends.triton.kernels import qgemv
    return qgemv if qgemv.supports(x2, packed, qtype, k) else None


def _mmq_kernel(x: torch.Tensor, packed: torch.Tensor, qtype: str, n: int, k: int, glu: bool = False):
    """mmq.py (the integer tensor-core GEMM) where it takes x's rows of this weight, else None: the rows of a
    decode step (x [B, 1, K], one token of each of B sequences; never a prefill's, so that a prompt's logits do not
    depend on the prompts packed into its call) where ``mmq.wanted``: 5-16 rows (Q8_0_R 3-16) of a matrix whose
    one-row kernel reads x as int8 codes (then each row agrees with its single stream to float rounding)."""
    m = x.numel() // k
    if x.dim() < 3 or x.shape[-2] != 1 or m < 2 or _triton(x) is None:       # (single streams stop here)
        return None
    from shapeplan.runtime.backends.triton.kernels import mmq
    ok = mmq.wanted(m, qtype, n // 2 if glu else n, k) and mmq.supports(x.reshape(m, k), packed, qtype, k)
    return mmq if ok else None


def _qnorm_shape(node):
    x, packed = node.inputs[0], node.inputs[2]
    n, k = int(node.attrs["n"]), int(node.attrs["k"])
    _check_packed(node, packed, node.attrs["qtype"], n, k)
    act = node.attrs.get("activation", "")
    if act not in ("", "silu_mul"):
        raise ShapeError(f"node {node.describe()}: activation must be '' or 'silu_mul', got {act!r}")
    if act and n % 2:
        raise ShapeError(f"node {node.describe()}: silu_mul needs an even n, weight {packed.name!r} has n={n}")
    if x.shape is None:
        return [(x.dtype, None)]
    if isinstance(x.shape[-1], int) and x.shape[-1] != k:
        raise ShapeError(f"node {node.describe()}: input {x.name!r} has {x.shape[-1]} features, the quantized "
                         f"weight {packed.name!r} expects k={k}")
    return [(x.dtype, (*x.shape[:-1], n // 2 if act else n))]


@register("QuantRMSNormMatMul", domain="shapeplan", shape=_qnorm_shape)
def quant_rms_norm_matmul(x, scale, packed, *, qtype: str, n: int, k: int, epsilon=1e-5, activation=""):
    """``RMSNorm(x) * scale @ W.T`` (W [n, k] packed as ``qtype``); activation="silu_mul": the SiLU gate
    of the two halves of the product."""
    from shapeplan.ops.fused_linear import _rms_norm, _rows_kernels
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)                                                   # [M, K]
    glu = activation == "silu_mul"
    mm = _mmq_kernel(x, packed, qtype, n, k, glu)
    if mm is not None:
        try:                                     # the norm where mmq quantizes x; the gate after
            y = mm.mmq(x2, packed, qtype, n, k, norm_w=scale, eps=float(epsilon))
            return _silu_mul(y, _rows_kernels(x2)).reshape(*lead, n // 2) if glu else y.reshape(*lead, n)
        except Exception as e:  # noqa: BLE001
            _fallback(e, "QuantRMSNormMatMul")
    kern = _fused_kernel(x2, packed, qtype, k)
    if kern is not None:
        try:
            y = kern.gemv1(x2, packed, qtype, n, k, norm_w=scale, eps=float(epsilon), glu=glu)
            return y.reshape(*lead, y.shape[-1])
        except Exception as e:  # noqa: BLE001
            _fallback(e, "QuantRMSNormMatMul")
    rows = _rows_kernels(x2)
    if rows is not None and scale.dtype == x.dtype:
        xn = rows.rms_norm(x2, scale, float(epsilon))[0]
    else:
        xn = _rms_norm(x2, scale, -1, float(epsilon), 1, "QuantRMSNormMatMul")
    y = quant_matmul(xn, packed, qtype=qtype, n=n, k=k)                    # [M, N]
    if glu:
        y = _silu_mul(y, rows)
    return y.reshape(*lead, y.shape[-1])


def _silu_mul(y: torch.Tensor, rows) -> torch.Tensor:
    """SiLU(gate) * up of y's halves: with ``rows`` (fused_linear's ``_rows_kernels``) its kernel, else torch."""
    gate, up = y.chunk(2, dim=-1)
    return rows.silu_mul(gate, up) if rows is not None else torch.nn.functional.silu(gate) * up


def _qadd_shape(node):
    a, packed, r = node.inputs[:3]
    n, k = int(node.attrs["n"]), int(node.attrs["k"])
    _check_packed(node, packed, node.attrs["qtype"], n, k)
    if a.shape is not None and isinstance(a.shape[-1], int) and a.shape[-1] != k:
        raise ShapeError(f"node {node.describe()}: input {a.name!r} has {a.shape[-1]} features, the quantized "
                         f"weight {packed.name!r} expects k={k}")
    if r.shape is not None and isinstance(r.shape[-1], int) and r.shape[-1] != n:
        raise ShapeError(f"node {node.describe()}: residual {r.name!r} has {r.shape[-1]} features, the product "
                         f"has n={n}")
    if len(node.inputs) > 3:
        from shapeplan.quant.quantize import x_code_words
        c = node.inputs[3]
        if c.dtype is not None and c.dtype != as_dtype("int32") or c.shape is not None and \
                isinstance(c.shape[-1], int) and tuple(c.shape) != (x_code_words(k),):
            raise ShapeError(f"node {node.describe()}: x codes {c.name!r} must be int32 [{x_code_words(k)}] for "
                             f"k={k}, got {c.dtype} {None if c.shape is None else list(c.shape)}")
    return [(r.dtype, r.shape)]


@register("QuantMatMulAdd", domain="shapeplan", shape=_qadd_shape)
def quant_matmul_add(a, packed, residual, x_codes=None, *, qtype: str, n: int, k: int, prefetch: int = 0):
    """``residual + a @ W.T``, the product rounded to the dtype first (as QuantMatMul then Add).
    ``x_codes``: ``a``'s first row as int8 codes (``shapeplan.quant.quantize.x_codes``; PagedWriteAttention
    writes them), which the one-row kernel reads where its tile takes x as codes (XQ = 2 / 3) instead of
    quantizing ``a`` itself; every other kernel reads ``a``. ``prefetch=1``: the one-row kernel asks L2 for
    the weight while the kernel before it runs (set on the attention's output projection; values unchanged)."""
    a2 = a.reshape(-1, k)
    r2 = residual.reshape(-1, n)
    mm = _mmq_kernel(a, packed, qtype, n, k)
    if mm is not None:
        try:
            return (residual + mm.mmq(a2, packed, qtype, n, k).reshape(*a.shape[:-1], n)).reshape(residual.shape)
        except Exception as e:  # noqa: BLE001
            _fallback(e, "QuantMatMulAdd")
    kern = _fused_kernel(a2, packed, qtype, k) if r2.shape[0] == a2.shape[0] and r2.dtype == a2.dtype else None
    if kern is not None:
        try:
            codes = x_codes if a2.shape[0] == 1 else None          # the attention writes one row's codes
            return kern.gemv1(a2, packed, qtype, n, k, residual=r2, x_codes=codes,
                              prefetch=bool(prefetch)).reshape(residual.shape)
        except Exception as e:  # noqa: BLE001
            _fallback(e, "QuantMatMulAdd")
    return residual + quant_matmul(a, packed, qtype=qtype, n=n, k=k)
