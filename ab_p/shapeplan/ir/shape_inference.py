"""Fill in output dtypes/shapes of nodes.

Order of preference: the op's own (symbolic) shape function; else, when every input shape is
concrete, run the kernel on torch "meta" tensors (no data, no compute); else leave the output unknown.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ShapeError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.graph import Graph, Node, TypeKind
from shapeplan.ops.registry import Trait, bind_kernel, lookup


def infer_node(node: Node, opset: int, *, overwrite: bool = False) -> None:
    opdef = lookup(node.op_type, node.domain, opset)
    results: list[Any] | None = None
    if opdef.shape is not None:
        try:
            results = opdef.shape(node)
        except ShapeError:
            raise
        except Exception:  # a shape fn that cannot handle unknowns just gives up
            results = None
    if results is None and not opdef.has(Trait.VALUE_DEPENDENT_SHAPE | Trait.DYNAMIC_OUTPUT_SIZE
                                          | Trait.CONTROL_FLOW | Trait.SEQUENCE | Trait.SHAPE_ONLY_OUTPUT):
        results = _meta_infer(node, opdef, opset)
    if not results:
        return
    for out, (dt, shape) in zip(node.outputs, results):
        if overwrite or out.dtype is None:
            out.dtype = dt if dt is not None else out.dtype
        if overwrite or out.shape is None:
            out.shape = shape if shape is not None else out.shape


def _meta_infer(node: Node, opdef: Any, opset: int) -> list[Any] | None:
    args = []
    for v in node.inputs:
        if v is None:
            args.append(None)
            continue
        if v.type_kind is not TypeKind.TENSOR or v.dtype is None or v.dtype.torch is None or not v.is_static:
            return None
        args.append(torch.empty(tuple(v.shape), dtype=v.dtype.torch, device="meta"))  # type: ignore[arg-type]
    try:
        outs = bind_kernel(opdef, node, opset)(*args)
    except Exception:
        return None
    res = []
    for o in outs:
        if isinstance(o, torch.Tensor):
            res.append((as_dtype(o.dtype), tuple(o.shape)))
        else:
            res.append((None, None))
    return res


def infer_graph(graph: Graph, *, overwrite: bool = False) -> None:
    for node in graph.nodes:
        infer_node(node, graph.opset(node.domain), overwrite=overwrite)
