"""Linear layers fused with what a transformer block puts around them (domain ``shapeplan``), so a
decode step runs one kernel where it ran three:

    RMSNormMatMul(x [..., K], scale [K], w_t [K, N]; epsilon, activation)
        = RMSNorm(x) * scale @ w_t                               [..., N]
        activation="silu_mul": silu(y[..., :N/2]) * y[..., N/2:]  [..., N/2]   (w_t = [gate | up])
    MatMulAdd(a [..., K], w_t [K, N], residual [..., N]; prefetch) = residual + a @ w_t

The LLM builder (shapeplan/llm/model.py) emits them for a decoder block: the input norm and the
q/k/v projection, the attention output projection and the residual add, the post-attention norm with
the gate/up projection and SiLU gate, the down projection and the residual add, the final norm and
the LM head. Their values are the unfused ops' (RMSNormalization, MatMul, SiluMul, Add), rounded
where those round. ``prefetch=1`` (the builder sets it on MatMulAdd of the attention's output projection)
lets the GEMV ask L2 for its weight while the kernel before it runs (kernels/gemv.py,
``SHAPEPLAN_LLM_GEMV_PREFETCH``); values unchanged.

Kernels: with at most 8 rows on CUDA, the fused Triton GEMV of
shapeplan/runtime/backends/triton/kernels/gemv.py (one kernel: norm prologue, weight read once,
epilogue); otherwise the unfused ops' torch kernels (on CUDA the norm and the gate run as Triton row
kernels and the residual add rides in cuBLAS's addmm). ``SHAPEPLAN_LLM_FUSED_GEMV=0`` turns the GEMV
off (every call takes the unfused path); ``set_gemv("triton")`` runs it on CPU tensors too (under
``TRITON_INTERPRET=1``: tests).
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import DType
from shapeplan.ir.graph import Shape
from shapeplan.ops._common import KernelChoice
from shapeplan.ops.registry import register
from shapeplan.ops.transformer import _rms_norm, dim_div

#: the fused GEMV's switch (auto: on CUDA; ``set_gemv``) and its failures (then the unfused kernels)
_GEMV = KernelChoice("the fused Triton GEMV", "running the unfused kernels")
_failed = _GEMV.failed
set_gemv = _GEMV.set


def _gemv(x2: torch.Tensor, w: torch.Tensor):
    """The GEMV launcher module when it applies to x2 [M, K] and w [N, K], else None."""
    if not _GEMV.applies(x2):
        return None
    from shapeplan import env
    if not env.get("SHAPEPLAN_LLM_FUSED_GEMV"):
        return None
    try:
        from shapeplan.runtime.backends.triton.kernels import gemv
    except ImportError:
        return None
    return gemv if gemv.supports(x2, w) else None


_fallback = _GEMV.fallback


def _rows_kernels(x: torch.Tensor):
    """The Triton row kernels for the unfused path on CUDA, else None."""
    if not x.is_cuda or _GEMV.mode == "torch":
        return None
    try:
        from shapeplan.runtime.backends.triton.kernels import rows
    except ImportError:
        return None
    return rows if rows.supports_rows(x) else None


def _check(node: Any, x: Any, w_t: Any, what: str) -> None:
    if x.shape is None or w_t.shape is None:
        return
    if len(w_t.shape) != 2:
        raise ShapeError(f"node {node.describe()}: {what} weight {w_t.name!r} must be [K, N], got {list(w_t.shape)}")
    kx, kw = x.shape[-1], w_t.shape[0]
    if isinstance(kx, int) and isinstance(kw, int) and kx != kw:
        raise ShapeError(f"node {node.describe()}: input {x.name!r} has {kx} features, weight {w_t.name!r} "
                         f"expects {kw}")


def _norm_matmul_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    x, w_t = node.inputs[0], node.inputs[2]
    _check(node, x, w_t, "RMSNormMatMul")
    act = node.attrs.get("activation", "")
    if act not in ("", "silu_mul"):
        raise ShapeError(f"node {node.describe()}: activation must be '' or 'silu_mul', got {act!r}")
    if x.shape is None or w_t.shape is None:
        return [(x.dtype, None)]
    n = w_t.shape[1]
    if act:
        if isinstance(n, int) and n % 2:
            raise ShapeError(f"node {node.describe()}: silu_mul needs an even N, weight {w_t.name!r} has {n}")
        n = dim_div(n, 2)
    return [(x.dtype, (*x.shape[:-1], n))]


@register("RMSNormMatMul", domain="shapeplan", since=1, shape=_norm_matmul_shape)
def rms_norm_matmul(x, scale, w_t, *, epsilon=1e-5, activation=""):
    """``RMSNorm(x) * scale @ w_t``; with activation="silu_mul" the SiLU gate of its two halves."""
    k = x.shape[-1]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    glu = activation == "silu_mul"
    kern = _gemv(x2, w_t.t())
    if kern is not None:
        try:
            y = kern.gemv(x2, w_t.t(), norm_w=scale, eps=float(epsilon), glu=glu)
            return y.reshape(*lead, y.shape[-1])
        except Exception as e:  # noqa: BLE001 - e.g. an unsupported GPU: fall back, visibly
            _fallback(e, "RMSNormMatMul")
    rows = _rows_kernels(x2)
    if rows is not None and scale.dtype == x.dtype:
        xn = rows.rms_norm(x2, scale, float(epsilon))[0]
    else:
        xn = _rms_norm(x2, scale, -1, float(epsilon), 1, "RMSNormMatMul")
    y = xn @ w_t
    if glu:
        gate, up = y.chunk(2, dim=-1)
        y = rows.silu_mul(gate, up) if rows is not None else torch.nn.functional.silu(gate) * up
    return y.reshape(*lead, y.shape[-1])


def _matmul_add_shape(node: Any) -> list[tuple[DType | None, Shape | None]]:
    a, w_t, r = node.inputs
    _check(node, a, w_t, "MatMulAdd")
    if a.shape is not None and w_t.shape is not None and r.shape is not None:
        n, rn = w_t.shape[1], r.shape[-1]
        if isinstance(n, int) and isinstance(rn, int) and n != rn:
            raise ShapeError(f"node {node.describe()}: residual {r.name!r} has {rn} features, the product has {n}")
    return [(r.dtype, r.shape)]


@register("MatMulAdd", domain="shapeplan", since=1, shape=_matmul_add_shape)
def matmul_add(a, w_t, residual, *, prefetch=0):
    """``residual + a @ w_t``: the product rounded to the dtype first, as MatMul then Add (on CUDA
    above 8 rows, cuBLAS's addmm, which rounds once). ``prefetch``: the GEMV's weight prefetch (module doc)."""
    k = a.shape[-1]
    a2 = a.reshape(-1, k)
    r2 = residual.reshape(-1, residual.shape[-1])
    if r2.shape[0] == a2.shape[0]:
        kern = _gemv(a2, w_t.t())
        if kern is not None:
            try:
                return kern.gemv(a2, w_t.t(), residual=r2, prefetch=bool(prefetch)).reshape(residual.shape)
            except Exception as e:  # noqa: BLE001
                _fallback(e, "MatMulAdd")
        if a2.is_cuda and r2.is_contiguous() and r2.dtype == a2.dtype == w_t.dtype:
            return torch.addmm(r2, a2, w_t).reshape(residual.shape)    # the add in cuBLAS's epilogue
    return residual + a @ w_t
