"""Kernel lowerings: ops that one hand-written Triton kernel computes (row reductions, RoPE, SiLU*mul).

``KERNEL_LOWERINGS[(domain, op)] = bind`` where ``bind(slot, metas) -> callable(*inputs) -> tuple``,
or None when this node's attributes or layouts are outside what the kernel does (the slot then keeps
its torch kernel). Outputs are allocated with the strides the torch kernel produced during warm-up,
so the layouts every later (generated) kernel was specialised for do not move.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from shapeplan.runtime.backends.triton.codegen import FLOATS, Meta

ABSENT = -1


def _out(meta: Meta, device: torch.device) -> torch.Tensor:
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device)


def _row_major(m: Meta) -> bool:
    """Last dim contiguous and rows evenly strided (a [rows, N] view exists)."""
    if not m.shape:
        return False
    expect = m.shape[-1]
    if m.stride[-1] != 1:
        return False
    for size, st in zip(reversed(m.shape[:-1]), reversed(m.stride[:-1])):
        if size != 1 and st != expect:
            return False
        expect *= size
    return True


def _metas(slot: Any, metas: dict[int, Meta]) -> tuple[list[Meta | None], list[Meta | None]]:
    return ([metas.get(r) if r != ABSENT else None for r in slot.ins],
            [metas.get(r) if r != ABSENT else None for r in slot.outs])


def _last_axis(axis: int, rank: int) -> bool:
    return axis == -1 or axis == rank - 1


def _norm_ok(ins: list[Meta | None], outs: list[Meta | None], n_weights: int) -> bool:
    x = ins[0]
    if x is None or x.dtype not in FLOATS or not 0 < x.shape[-1] <= 65536:
        return False
    if any(o is None or o.shape != x.shape or o.dtype != x.dtype or not _row_major(o) for o in outs):
        return False
    for w in ins[len(ins) - n_weights:]:
        if w is not None and (w.shape[-1:] != x.shape[-1:] or w.numel != x.shape[-1]):
            return False
    return True


def bind_rms(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    a = slot.node.attrs
    ins, outs = _metas(slot, metas)
    if a.get("stash_type", 1) != 1 or ins[0] is None or not _last_axis(a.get("axis", -1), len(ins[0].shape)) \
            or len(outs) != 1 or not _norm_ok(ins, outs, 1):
        return None
    from shapeplan.runtime.backends.triton.kernels import rows as K
    eps, meta = float(a.get("epsilon", 1e-5)), outs[0]

    def run(x: torch.Tensor, w: torch.Tensor) -> tuple:
        return K.rms_norm(x, w, eps, out=_out(meta, x.device))
    return run


def bind_skip_rms(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    a = slot.node.attrs
    ins, outs = _metas(slot, metas)
    if a.get("stash_type", 1) != 1 or ins[0] is None or not _last_axis(a.get("axis", -1), len(ins[0].shape)) \
            or ins[1] is None or len(outs) != 2 or not _norm_ok(ins, [o for o in outs if o is not None], 1):
        return None
    from shapeplan.runtime.backends.triton.kernels import rows as K
    eps, m_y, m_s = float(a.get("epsilon", 1e-5)), outs[0], outs[1]

    def run(x: torch.Tensor, skip: torch.Tensor, w: torch.Tensor) -> tuple:
        dev = x.device
        return K.rms_norm(x, w, eps, skip=skip, out=_out(m_y, dev),
                          sum_out=_out(m_s, dev) if m_s is not None else None)
    return run


def bind_layer_norm(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    a = slot.node.attrs
    ins, outs = _metas(slot, metas)
    if a.get("stash_type", 1) != 1 or ins[0] is None or not _last_axis(a.get("axis", -1), len(ins[0].shape)) \
            or len([o for o in outs if o is not None]) != 1 or not _norm_ok(ins, outs[:1], len(ins) - 1):
        return None
    from shapeplan.runtime.backends.triton.kernels import rows as K
    eps, meta = float(a.get("epsilon", 1e-5)), outs[0]

    def run(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> tuple:
        return (K.layer_norm(x, w, b, eps, out=_out(meta, x.device)),)
    return run


def bind_softmax(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    ins, outs = _metas(slot, metas)
    x = ins[0]
    default_axis = -1 if slot.opdef.since >= 13 else 1      # opset < 13: coerced to 2-D at axis 1
    if x is None or not x.shape or not _last_axis(slot.node.attrs.get("axis", default_axis), len(x.shape)):
        return None
    if not _norm_ok(ins, outs, 0):
        return None
    from shapeplan.runtime.backends.triton.kernels import rows as K
    meta = outs[0]

    def run(x: torch.Tensor) -> tuple:
        return (K.softmax(x, out=_out(meta, x.device)),)
    return run


def bind_silu_mul(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    ins, outs = _metas(slot, metas)
    g = ins[0]
    up = ins[1] if len(ins) > 1 else None
    o = outs[0]
    if g is None or o is None or g.dtype not in FLOATS or not _row_major(o) or o.dtype != g.dtype:
        return None
    if up is not None and (up.shape != g.shape or up.dtype != g.dtype):
        return None
    from shapeplan.runtime.backends.triton.kernels import rows as K

    def run(gate: torch.Tensor, up_: torch.Tensor | None = None) -> tuple:
        return (K.silu_mul(gate, up_, out=_out(o, gate.device)),)
    return run


def bind_rope(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    a = slot.node.attrs
    ins, outs = _metas(slot, metas)
    x, cos, o = ins[0], ins[1], outs[0]
    pos = ins[3] if len(ins) > 3 else None
    if x is None or cos is None or o is None or x.dtype not in FLOATS or o.dtype != x.dtype:
        return None
    rank = len(x.shape)
    heads = int(a.get("num_heads", 0) or 0)
    if rank == 4:
        b, h, s, d = x.shape
    elif rank == 3 and heads and x.shape[2] % heads == 0:
        b, s = x.shape[:2]
        h, d = heads, x.shape[2] // heads
    else:
        return None
    rot = int(a.get("rotary_embedding_dim", 0) or 0) or d
    if rot != d or d % 2 or cos.shape[-1] != d // 2:
        return None
    if pos is None and (len(cos.shape) != 3 or cos.shape[:2] != (b, s)):
        return None
    if pos is not None and (len(cos.shape) != 2 or pos.shape != (b, s)):
        return None
    interleaved = bool(a.get("interleaved", 0))
    from shapeplan.runtime.backends.triton.kernels import rows as K

    def run(x_: torch.Tensor, c: torch.Tensor, sn: torch.Tensor, p: torch.Tensor | None = None) -> tuple:
        y = _out(o, x_.device)
        if rank == 4:                              # [B, H, S, D]: rows (b, h, s)
            if p is not None:
                return (K.rope(x_, c, sn, interleaved, positions=p, pos_strides=(s, 0, 1), out=y),)
            return (K.rope(x_, c.unsqueeze(1), sn.unsqueeze(1), interleaved, out=y),)
        xv, yv = x_.view(b, s, h, d), y.view(b, s, h, d)     # [B, S, H, D]: rows (b, s, h)
        if p is not None:
            K.rope(xv, c, sn, interleaved, positions=p, pos_strides=(s, 1, 0), out=yv)
        else:
            K.rope(xv, c.unsqueeze(2), sn.unsqueeze(2), interleaved, out=yv)
        return (y,)
    if rank == 3 and not (_row_major(x) and _row_major(o)):
        return None
    return run


def bind_cache_write_kv(slot: Any, metas: dict[int, Meta]) -> Callable[..., tuple] | None:
    """A decode step's K and V writes (and k's rotation, with cos/sin) in one launch: caches [B, H, L, D],
    updates [B, H, 1, D] written at the one-element position, last dims contiguous. Prefill writes
    (S > 1) keep the torch kernels."""
    ins, outs = _metas(slot, metas)
    ins = ins + [None] * (7 - len(ins))
    if any(m is None for m in ins[:5]) or int(slot.node.attrs.get("axis", 2)) not in (2, -2):
        return None
    kc, vc, k, v, pos, cos, sin = ins
    if len(kc.shape) != 4 or vc.shape != kc.shape or pos.numel != 1 or pos.dtype.is_floating_point:
        return None
    b, h, _, d = kc.shape
    for upd, cache in ((k, kc), (v, vc)):
        if upd.shape != (b, h, 1, d) or upd.stride[-1] != 1 or cache.stride[-1] != 1 \
                or upd.dtype not in FLOATS or cache.dtype not in FLOATS:
            return None
    if (cos is None) != (sin is None):
        return None
    if cos is not None and (d % 2 or cos.shape != (b, 1, d // 2) or sin.shape != cos.shape
                            or cos.stride != sin.stride or cos.stride[-1] != 1):
        return None
    interleaved = bool(slot.node.attrs.get("interleaved", 0))
    from shapeplan.runtime.backends.triton.kernels import rows as K

    def run(k_cache: torch.Tensor, v_cache: torch.Tensor, k_: torch.Tensor, v_: torch.Tensor,
            position: torch.Tensor, c: torch.Tensor | None = None, s: torch.Tensor | None = None) -> tuple:
        return K.cache_write_kv(k_cache, v_cache, k_, v_, position, c, s, interleaved)
    return run


KERNEL_LOWERINGS: dict[tuple[str, str], Callable[..., Callable[..., tuple] | None]] = {
    ("", "RMSNormalization"): bind_rms,
    ("shapeplan", "RMSNormalization"): bind_rms,
    ("shapeplan", "SkipRMSNormalization"): bind_skip_rms,
    ("", "LayerNormalization"): bind_layer_norm,
    ("", "Softmax"): bind_softmax,
    ("shapeplan", "SiluMul"): bind_silu_mul,
    ("", "RotaryEmbedding"): bind_rope,
    ("shapeplan", "RotaryEmbedding"): bind_rope,
    ("shapeplan", "CacheWriteKV"): bind_cache_write_kv,
}


class KernelLowering:
    __slots__ = ("bind",)

    def __init__(self, bind: Callable[..., Any]) -> None:
        self.bind = bind


def attach_lowerings() -> None:
    from shapeplan.ops.registry import set_triton_lowering
    for (domain, op), bind in KERNEL_LOWERINGS.items():
        set_triton_lowering(op, KernelLowering(bind), domain=domain)
