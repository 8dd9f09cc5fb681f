"""torch.export ExportedProgram -> shapeplan Graph.

``sp.load(ep)`` calls ``load_exported(ep)``:

* the program is first run through ``ep.run_decompositions(table)``, where ``table`` is torch's
  default (core ATen) table minus every op that ``CONVERTERS`` converts directly: in-place ops are
  functionalized and exotic ops decomposed, while linear / layer_norm / scaled_dot_product_attention
  / conv2d stay whole (they map to one ONNX op each instead of a dozen);
* user inputs become placeholders (dtype and shape from ``node.meta["val"]``; a SymInt size becomes
  a symbolic dim named after its symbol, e.g. ``"s77"``); parameters, buffers and lifted constants
  become graph constants; a buffer the program mutates is refused (``ModelError``);
* every call_function node goes through ONE table, ``CONVERTERS``: ATen overload -> converter
  ``fn(cx, *args, **kwargs) -> Value | tuple``. SymInt-valued nodes (``sym_size``, ``s0 * 4``)
  become int64 tensors of shape ``[1]`` so shapes built from them stay dynamic;
* an op outside the table raises ``UnsupportedOpError`` naming the op, the fx node and the table.
"""
from __future__ import annotations

from typing import Any

import torch

from shapeplan.errors import ModelError, UnsupportedOpError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.graph import Graph, Value, ValueKind

from shapeplan.importers.aten_table import (CONVERTERS, OPSET, Converter, _Ctx, _dim,  # noqa: F401
                                          _sym_name, supported_aten_ops)
import shapeplan.importers.aten_converters  # noqa: E402,F401  (fills CONVERTERS)


# ---------------------------------------------------------------------------------------- driver
def _decompose(ep: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    table = torch.export.default_decompositions()
    for op in CONVERTERS:
        if isinstance(op, torch._ops.OpOverload) and op in table:
            del table[op]                                 # keep the ops we convert whole
    return ep.run_decompositions(table)


def _shape(cx: _Ctx, val: torch.Tensor, owner: Value | None = None) -> tuple:
    dims: list[Any] = []
    for axis, d in enumerate(val.shape):
        if isinstance(d, int):
            dims.append(d)
            continue
        name = _sym_name(d)
        dims.append(name)
        if owner is not None and name not in cx.sym_src:
            cx.sym_src[name] = (owner, axis)
    return tuple(dims)


def _claim(g: Graph, v: Value, name: str) -> None:
    """Rename ``v`` to the fx node's name (moving a helper value that holds it out of the way)."""
    if v.name == name or v.kind is not ValueKind.INTERMEDIATE:
        return
    other = g.values.get(name)
    if other is not None:
        if other.kind is not ValueKind.INTERMEDIATE:
            return
        del g.values[name]
        other.name = g.fresh_name(name)
        g.values[other.name] = other
    del g.values[v.name]
    v.name = name
    g.values[name] = v


def load_exported(ep: "torch.export.ExportedProgram", *, decompose: bool = True, name: str = "torch_export") -> Graph:
    from torch.export.graph_signature import InputKind, OutputKind
    if decompose:
        ep = _decompose(ep)
    sig = ep.graph_signature
    g = Graph(name, opset={"": OPSET, "shapeplan": 1})
    g.metadata["producer"] = f"torch.export (torch {torch.__version__})"
    cx = _Ctx(g)
    specs = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
    for out in sig.output_specs:
        if out.kind is not OutputKind.USER_OUTPUT:
            raise ModelError(f"torch.export import: the program mutates {out.target!r} ({out.kind.name}); "
                             "mutated buffers / inputs are not supported (export a functional forward, "
                             "or build the state as graph variables with the builder)")
    output_node = None
    for node in ep.graph_module.graph.nodes:
        cx.node = node
        if node.op == "placeholder":
            spec = specs.get(node.name)
            val = node.meta.get("val")
            if spec is None or spec.kind is InputKind.USER_INPUT:
                if not isinstance(val, torch.Tensor):
                    raise ModelError(f"torch.export import: input {node.name!r} is {type(val).__name__}, "
                                     "not a tensor (only tensor user inputs become placeholders)")
                v = g.placeholder(node.name, as_dtype(val.dtype), ())
                v.shape = _shape(cx, val, v)
                cx.env[node] = v
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                src = ep.state_dict if spec.target in ep.state_dict else ep.constants
                cx.env[node] = g.constant(src[spec.target].detach().cpu().contiguous(), name=node.name)
            else:
                raise ModelError(f"torch.export import: input {node.name!r} of kind {spec.kind.name} is not supported")
        elif node.op == "call_function":
            fn = CONVERTERS.get(node.target)
            if fn is None:
                raise UnsupportedOpError(
                    f"torch.export import: node {node.name!r} calls {node.target}, which has no converter "
                    f"(format: {node.format_node()}); supported ATen ops: {', '.join(supported_aten_ops())}")
            try:
                out = fn(cx, *node.args, **node.kwargs)
            except (ModelError, UnsupportedOpError):
                raise
            except Exception as e:
                raise ModelError(f"torch.export import: converting node {node.name!r} ({node.target}) "
                                 f"failed: {type(e).__name__}: {e}") from e
            cx.env[node] = out
            if isinstance(out, Value):
                _claim(g, out, node.name)
                val = node.meta.get("val")
                if out.shape is None and isinstance(val, torch.Tensor):   # inference gave up: meta knows
                    out.shape = _shape(cx, val)
                if isinstance(node.meta.get("val"), torch.SymInt):
                    cx.sym.setdefault(_sym_name(node.meta["val"]), out)
        elif node.op == "output":
            output_node = node
        else:
            raise ModelError(f"torch.export import: fx node {node.name!r} has op {node.op!r} (not supported)")
    outs: list[Value] = []
    for spec, arg in zip(sig.output_specs, output_node.args[0]):
        v = cx.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(v, Value):
            raise ModelError(f"torch.export import: output {spec.arg.name!r} is not a tensor ({arg!r})")
        if v.kind is not ValueKind.INTERMEDIATE or v in outs:                 # an input / weight / repeat: copy it
            v = g.op.Identity(v)
        _claim(g, v, spec.arg.name)
        outs.append(v)
    g.set_outputs(*outs)
    return g
