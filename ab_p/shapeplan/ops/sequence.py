"""ONNX sequences and optionals.

At run time a sequence is a Python list of tensors and an empty optional is ``None`` (see
ir/tensors.py). Sequence ops never mutate their input list: a plan may read a register twice.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from shapeplan.errors import ExecutionError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.graph import Node
from shapeplan.ops.registry import Trait, register

SEQ = Trait.SEQUENCE


def _scalar_shape(dt: str) -> Callable[[Any], list[tuple[Any, Any]]]:
    return lambda node: [(as_dtype(dt), ())]


def _device(seq: list, *others: Any) -> torch.device:
    for x in [*seq, *others]:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _pos(position: Any, n: int, what: str, insert: bool = False) -> int:
    p = int(position.reshape(-1)[0]) if isinstance(position, torch.Tensor) else int(position)
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise ExecutionError(f"{what}: position {p} is out of range for a sequence of length {n} "
                             f"(valid: {-n}..{hi})")
    return p + n if p < 0 else p


@register("SequenceEmpty", since=11, traits=SEQ)
def sequence_empty(*, dtype=1):
    return []


@register("SequenceConstruct", since=11, traits=SEQ)
def sequence_construct(*inputs):
    return list(inputs)


@register("SequenceInsert", since=11, traits=SEQ)
def sequence_insert(seq, tensor, position=None):
    out = list(seq)
    out.insert(len(out) if position is None else _pos(position, len(out), "SequenceInsert", insert=True), tensor)
    return out


@register("SequenceErase", since=11, traits=SEQ)
def sequence_erase(seq, position=None):
    out = list(seq)
    del out[len(out) - 1 if position is None else _pos(position, len(out), "SequenceErase")]
    return out


@register("SequenceAt", since=11, traits=SEQ)
def sequence_at(seq, position):
    return seq[_pos(position, len(seq), "SequenceAt")]


@register("SequenceLength", since=11, traits=SEQ, shape=_scalar_shape("int64"))
def sequence_length(seq):
    return torch.tensor(len(seq), dtype=torch.int64, device=_device(seq))


@register("SplitToSequence", since=11, traits=SEQ)
def split_to_sequence(x, split=None, *, axis=0, keepdims=1):
    """Split ``x`` along ``axis`` into a sequence: size-1 pieces (squeezed unless keepdims),
    equal chunks of a scalar ``split`` (last one smaller), or the sizes of a 1-D ``split``."""
    if split is None:
        parts = list(torch.split(x, 1, dim=axis))
        return parts if keepdims else [p.squeeze(axis) for p in parts]
    if split.dim() == 0:
        return list(torch.split(x, int(split), dim=axis))
    return list(torch.split(x, [int(s) for s in split.tolist()], dim=axis))


@register("ConcatFromSequence", since=11, traits=SEQ)
def concat_from_sequence(seq, *, axis=0, new_axis=0):
    if new_axis:
        rank = seq[0].dim() + 1
        return torch.stack(list(seq), axis + rank if axis < 0 else axis)
    return torch.cat(list(seq), axis)


def _bind_sequence_map(node: Node, opset: int) -> Callable[..., tuple]:
    from shapeplan.ops.control import Body, _device_of
    body = Body(node.attrs["body"], [v.name for v in node.implicit_inputs], node)
    n_exp = len(node.inputs)
    n_out = len(node.outputs)

    def call(*args: Any) -> tuple:
        seq, extra, implicit = args[0], args[1:n_exp], args[n_exp:]
        device = _device_of(args)
        outs: list[list[Any]] = [[] for _ in range(n_out)]
        for i in range(len(seq)):
            ins = [seq[i]] + [e[i] if isinstance(e, list) else e for e in extra]
            for k, o in enumerate(body.run(ins, implicit, device)):
                outs[k].append(o)
        return tuple(outs)

    return call


def _unused(*_: Any, **__: Any) -> Any:
    raise ExecutionError("SequenceMap runs through its bind hook")


register("SequenceMap", since=17, traits=SEQ | Trait.CONTROL_FLOW, bind=_bind_sequence_map)(_unused)


# ---------------------------------------------------------------------------------------- Optional


@register("Optional", since=15, traits=SEQ)
def optional(x=None, *, type=None):  # noqa: A002 - the ONNX attribute is called "type"
    """Wrap a value as an optional (the runtime form is the value itself, or None when empty)."""
    return x


@register("OptionalHasElement", since=15, traits=SEQ, shape=_scalar_shape("bool"))
def optional_has_element(x=None):
    dev = x.device if isinstance(x, torch.Tensor) else _device(x) if isinstance(x, list) else torch.device("cpu")
    return torch.tensor(x is not None, device=dev)


@register("OptionalGetElement", since=15, traits=SEQ)
def optional_get_element(x):
    if x is None:
        raise ExecutionError("OptionalGetElement: the optional input is empty")
    return x
