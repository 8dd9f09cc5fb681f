"""Collective ops (domain ``shapeplan``) for tensor parallelism: one process per device, every rank
running the same graph over its shard of the weights, joined by ``torch.distributed`` collectives.

    AllReduce(x, op="sum")              -> x summed over every rank            (same shape as x)
    AllGather(x, axis, world_size)      -> the ranks' x concatenated on axis   (axis size * world_size)

Both run on the default process group (``torch.distributed.init_process_group``; gloo on CPU, NCCL
on CUDA, see ``shapeplan.parallel.launch``). Every rank compiles the same graph into the same plan,
so the collectives are issued in the same order on every rank; the result is bit-identical on every
rank (ring reduce-scatter + all-gather), so replicated values (the residual stream, the logits and
the picked token) never diverge between ranks.

Traits: none that breaks a segment. NCCL collectives are capturable inside CUDA graphs (keep
``NCCL_NVLS_ENABLE=0``: NVLink multicast buffers are not graph-safe on every driver), and on the CPU
``emulated_replay`` re-issues each kernel as a whole: a collective kernel makes more than one torch
call (a copy and the collective), so the capture classifies it as a ``kernel`` step and replays the
real kernel, never a bare ``clone`` (the TP=2 ``auto`` test in tests/parallel would diverge
if it did). The kernels
write into a fresh tensor, never into their input: the plan compiler's buffer reuse and CSE see an
ordinary pure op (two AllReduces of one value are equal, so merging them is correct on every rank).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from shapeplan.errors import ExecutionError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops.registry import register
from shapeplan.ops.shape_fns import same_as

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _require_group(op: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ExecutionError(f"shapeplan::{op} needs torch.distributed initialised on every rank "
                             "(shapeplan.parallel.launch.init_distributed, torchrun, or "
                             "`shapeplan generate --tp N`)")


@register("AllReduce", domain="shapeplan", shape=same_as(0))
def all_reduce(x, *, op: str = "sum"):
    """``x`` reduced (``op``: sum | max | min) over every rank of the default group; a new tensor."""
    _require_group("AllReduce")
    if op not in _REDUCE_OPS:
        raise ExecutionError(f"shapeplan::AllReduce: op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    y = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(y, op=_REDUCE_OPS[op])
    return y


def _gather_shape(node):
    x = node.inputs[0]
    n = int(node.attrs["world_size"])
    if x.shape is None:
        return [(x.dtype, None)]
    axis = int(node.attrs.get("axis", -1)) % len(x.shape)
    d = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = d * n if isinstance(d, int) else None
    return [(x.dtype if x.dtype is not None else as_dtype("float32"), tuple(shape))]


@register("AllGather", domain="shapeplan", shape=_gather_shape)
def all_gather(x, *, world_size: int, axis: int = -1):
    """The ``world_size`` ranks' ``x`` concatenated along ``axis`` in rank order (``world_size`` is
    an attribute so that shapes are known at build time; it must equal the group's size)."""
    _require_group("AllGather")
    if dist.get_world_size() != world_size:
        raise ExecutionError(f"shapeplan::AllGather was built for world_size={world_size}, the process "
                             f"group has {dist.get_world_size()} ranks")
    x = x.contiguous()
    axis = axis % x.dim()
    if x.is_cuda:       # one NCCL call into one buffer (capturable), rank-major along a new axis 0
        out = torch.empty((world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x)
        parts = out.unbind(0)
    else:               # gloo has no all_gather_into_tensor
        parts = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(parts, x)
    return torch.cat(parts, dim=axis)
