"""ONNX ModelProto <-> Graph, both ways (round trip), including external data and subgraphs."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from shapeplan.errors import ModelError
from shapeplan.ir.dtypes import dtype as as_dtype, from_onnx
from shapeplan.ir.graph import Graph, Node, TypeKind, Value, ValueKind, clone_graph  # noqa: F401 - re-exported
from shapeplan.ir.tensors import numpy_to_runtime, runtime_to_numpy


# ---------------------------------------------------------------------------------------- import
def load_onnx(src: Any, base_dir: str | None = None) -> Graph:
    """Import an ONNX model from a path, bytes or ModelProto."""
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        if not os.path.exists(path):
            raise ModelError(f"ONNX model file {path!r} does not exist")
        try:
            with open(path, "rb") as f:
                proto = onnx.load_model_from_string(f.read())
        except Exception as e:
            raise ModelError(f"{path!r} is not a valid ONNX model (protobuf decode failed: {e})") from e
        base_dir = base_dir or os.path.dirname(os.path.abspath(path))
        return from_model_proto(proto, base_dir)
    if isinstance(src, (bytes, bytearray)):
        try:
            proto = onnx.load_model_from_string(bytes(src))
        except Exception as e:
            raise ModelError(f"bytes are not a valid ONNX model (protobuf decode failed: {e})") from e
        return from_model_proto(proto, base_dir)
    if isinstance(src, onnx.ModelProto):
        return from_model_proto(src, base_dir)
    raise ModelError(f"cannot load an ONNX model from {type(src).__name__}")


def from_model_proto(model: onnx.ModelProto, base_dir: str | None = None) -> Graph:
    if not model.HasField("graph"):
        raise ModelError("ONNX model has no graph (empty or truncated file?)")
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    if "" not in opsets:
        opsets[""] = 1 if not model.opset_import else opsets.get("", 21)
    opsets.setdefault("shapeplan", 1)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:
        inferred = model
    functions = {(f.domain, f.name): f for f in model.functions}
    if functions:
        from shapeplan.ops.control import register_function   # calls run through a bind hook
        for f in model.functions:
            register_function(f)
    g = _import_graph(inferred.graph, opsets, base_dir, outer=None, functions=functions)
    g.metadata = {p.key: p.value for p in model.metadata_props}
    return g


def _dtype_of(code: int, what: str) -> Any:
    """An ONNX element type code as a DType, or a ModelError naming ``what`` carries it."""
    try:
        return from_onnx(code)
    except ValueError as e:
        raise ModelError(f"{what}: {e} (a damaged file, or a type this ONNX reader does not know)") from None


def _type_of(v: Value, tp: onnx.TypeProto) -> None:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tt = tp.tensor_type
        if tt.elem_type:
            v.dtype = _dtype_of(tt.elem_type, f"value {v.name!r}")
        if tt.HasField("shape"):
            dims: list[Any] = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
            v.shape = tuple(dims)
        v.type_kind = TypeKind.TENSOR
    elif which == "sequence_type":
        v.type_kind = TypeKind.SEQUENCE
        v.elem_type = tp.sequence_type.elem_type
    elif which == "optional_type":
        v.type_kind = TypeKind.OPTIONAL
        v.elem_type = tp.optional_type.elem_type
    elif which == "map_type":
        v.type_kind = TypeKind.MAP


def tensor_from_proto(t: onnx.TensorProto, base_dir: str | None) -> Any:
    _dtype_of(t.data_type, f"initializer {t.name!r}")         # a code onnx's reader would meet as a bare KeyError
    if t.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if base_dir is None:
            raise ModelError(f"initializer {t.name!r} lives in external file {loc!r} but the model "
                             "was given without a directory; load it from a path or pass base_dir")
        path = os.path.join(base_dir, loc)
        if not os.path.exists(path):
            raise ModelError(f"initializer {t.name!r}: external data file {path!r} is missing")
        try:
            arr = numpy_helper.to_array(t, base_dir=base_dir)
        except Exception as e:
            raise ModelError(f"initializer {t.name!r}: cannot read external data {path!r}: {e}") from e
    else:
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:
            raise ModelError(f"initializer {t.name!r} is malformed: {e}") from e
    return numpy_to_runtime(arr)


def _attr_value(a: onnx.AttributeProto, opsets: dict[str, int], base_dir: str | None,
                scope: "_Scope", functions: dict) -> Any:
    T = onnx.AttributeProto
    if a.ref_attr_name:
        raise ModelError(f"attribute {a.name!r} refers to a function attribute {a.ref_attr_name!r}")
    if a.type == T.FLOAT:
        return float(a.f)
    if a.type == T.INT:
        return int(a.i)
    if a.type == T.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == T.TENSOR:
        return tensor_from_proto(a.t, base_dir)
    if a.type == T.GRAPH:
        return _import_graph(a.g, opsets, base_dir, outer=scope, functions=functions)
    if a.type == T.FLOATS:
        return [float(x) for x in a.floats]
    if a.type == T.INTS:
        return [int(x) for x in a.ints]
    if a.type == T.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    if a.type == T.TENSORS:
        return [tensor_from_proto(t, base_dir) for t in a.tensors]
    if a.type == T.GRAPHS:
        return [_import_graph(x, opsets, base_dir, outer=scope, functions=functions) for x in a.graphs]
    if a.type == T.SPARSE_TENSOR:
        return numpy_to_runtime(_densify(a.sparse_tensor, f"attribute {a.name!r}"))
    if a.type == T.TYPE_PROTO:
        return a.tp
    raise ModelError(f"attribute {a.name!r} has unsupported type {a.type}")


def _densify(sp: onnx.SparseTensorProto, what: str) -> np.ndarray:
    """A sparse tensor as its dense array: ``values`` [NNZ] at ``indices`` (int64, [NNZ] flat or [NNZ, rank]) in a
    tensor of ``dims``, zeros elsewhere. A damaged one (unknown type code, indices of the wrong type, shape or
    range) is a ModelError naming ``what``."""
    _dtype_of(sp.values.data_type, what)
    dims = tuple(int(d) for d in sp.dims)
    try:
        vals = numpy_helper.to_array(sp.values).reshape(-1)
        idx = numpy_helper.to_array(sp.indices) if sp.HasField("indices") else np.zeros((0,), np.int64)
    except Exception as e:
        raise ModelError(f"{what}: malformed sparse tensor: {e}") from e
    size = int(np.prod(dims, dtype=np.int64)) if all(d >= 0 for d in dims) else -1
    if size < 0:
        raise ModelError(f"{what}: sparse tensor dims must be >= 0, got {list(dims)}")
    if idx.dtype != np.int64 or idx.ndim not in (1, 2) or idx.shape[0] != vals.size or \
            (idx.ndim == 2 and idx.shape[1] != len(dims)):
        raise ModelError(f"{what}: sparse tensor indices must be int64 [NNZ] or [NNZ, {len(dims)}] for "
                         f"{vals.size} values, got {idx.dtype} {list(idx.shape)}")
    if idx.ndim == 2:
        if idx.size and ((idx < 0).any() or (idx >= np.asarray(dims, np.int64)).any()):
            raise ModelError(f"{what}: a sparse tensor index lies outside its dims {list(dims)}")
        idx = np.ravel_multi_index(idx.T, dims) if idx.size else idx.reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise ModelError(f"{what}: a sparse tensor index lies outside its {size} elements (dims {list(dims)})")
    dense = np.zeros(size, dtype=vals.dtype)
    dense[idx] = vals
    return dense.reshape(dims)


class _Scope:
    def __init__(self, graph: Graph, outer: "_Scope | None") -> None:
        self.graph, self.outer = graph, outer

    def resolve(self, name: str) -> Value | None:
        if name in self.graph.values:
            return self.graph.values[name]
        if self.outer is None:
            return None
        outer_v = self.outer.resolve(name)
        if outer_v is None:
            return None
        return self.graph.capture(outer_v)


def _import_graph(gp: onnx.GraphProto, opsets: dict[str, int], base_dir: str | None,
                  outer: _Scope | None, functions: dict) -> Graph:
    g = Graph(gp.name or "graph", opset=dict(opsets))
    scope = _Scope(g, outer)
    types = {vi.name: vi.type for vi in list(gp.value_info) + list(gp.output)}
    init_names = set()
    for t in gp.initializer:
        data = tensor_from_proto(t, base_dir)                 # (which checked the type code)
        v = Value(t.name, from_onnx(t.data_type), tuple(int(d) for d in t.dims), ValueKind.CONSTANT, data)
        g._add_value(v)
        init_names.add(t.name)
    for st in gp.sparse_initializer:
        name = st.values.name
        data = numpy_to_runtime(_densify(st, f"sparse initializer {name!r}"))      # (which checked the type code)
        g._add_value(Value(name, from_onnx(st.values.data_type), tuple(int(d) for d in st.dims), ValueKind.CONSTANT,
                           data))
        init_names.add(name)
    for vi in gp.input:
        if vi.name in init_names:
            continue            # old-style models list initializers as inputs too
        v = Value(vi.name, kind=ValueKind.PLACEHOLDER)
        _type_of(v, vi.type)
        g._add_value(v)
        g.inputs.append(v)
    for i, np_ in enumerate(gp.node):
        ins: list[Value | None] = []
        for name in np_.input:
            if name == "":
                ins.append(None)
                continue
            v = scope.resolve(name)
            if v is None:
                raise ModelError(f"node {np_.name or i} ({np_.op_type}) reads {name!r}, which no node, "
                                 f"input or initializer of graph {g.name!r} defines")
            ins.append(v)
        attrs = {a.name: _attr_value(a, opsets, base_dir, scope, functions) for a in np_.attribute}
        domain = np_.domain if np_.domain != "ai.onnx" else ""
        node = Node(np_.op_type, ins, [], attrs, domain, np_.name or f"{np_.op_type}_{i}")
        for name in np_.output:
            if name == "":
                out = Value("", producer=node)         # unused optional output
            else:
                if name in g.values:
                    raise ModelError(f"node {node.name} ({np_.op_type}) writes {name!r}, "
                                     f"which is already defined in graph {g.name!r}")
                out = g._add_value(Value(name, producer=node))
                if name in types:
                    _type_of(out, types[name])
            node.outputs.append(out)
        # outer values that this node's subgraphs read become implicit inputs
        for sub in node.subgraphs():
            for cap in _all_captures(sub):
                outer_v = scope.resolve(cap.name)
                if outer_v is not None and outer_v not in node.implicit_inputs:
                    node.implicit_inputs.append(outer_v)
        if (domain, np_.op_type) in functions:
            node.attrs["__function__"] = functions[(domain, np_.op_type)]
        g.nodes.append(node)
    outs = []
    for vi in gp.output:
        v = scope.resolve(vi.name)
        if v is None:
            raise ModelError(f"graph {g.name!r} output {vi.name!r} is not produced by any node")
        if v.dtype is None or v.shape is None:
            _type_of(v, vi.type) if v.dtype is None else None
        outs.append(v)
    g.outputs = outs
    return g


def _all_captures(sub: Graph) -> list[Value]:
    return list(sub.captures)


# ---------------------------------------------------------------------------------------- export
def _value_info(v: Value) -> onnx.ValueInfoProto:
    if v.type_kind is TypeKind.SEQUENCE and v.elem_type is not None:
        tp = onnx.TypeProto()
        tp.sequence_type.elem_type.CopyFrom(v.elem_type)
        return onnx.helper.make_value_info(v.name, tp)
    if v.type_kind is TypeKind.OPTIONAL and v.elem_type is not None:
        tp = onnx.TypeProto()
        tp.optional_type.elem_type.CopyFrom(v.elem_type)
        return onnx.helper.make_value_info(v.name, tp)
    elem = v.dtype.onnx if v.dtype is not None else 0
    shape = None if v.shape is None else [d if d is not None else None for d in v.shape]
    return onnx.helper.make_tensor_value_info(v.name, elem, shape)


def tensor_to_proto(name: str, data: Any) -> onnx.TensorProto:
    arr = runtime_to_numpy(data)
    t = numpy_helper.from_array(arr if arr.dtype.kind != "O" else arr.astype(object), name)
    return t


def _attr_to_proto(name: str, v: Any) -> onnx.AttributeProto:
    if isinstance(v, Graph):
        return onnx.helper.make_attribute(name, _export_graph(v))
    if isinstance(v, (torch.Tensor, np.ndarray)):
        return onnx.helper.make_attribute(name, tensor_to_proto("", v))
    if isinstance(v, onnx.TypeProto):
        return onnx.helper.make_attribute(name, v)
    if isinstance(v, list) and v and isinstance(v[0], Graph):
        return onnx.helper.make_attribute(name, [_export_graph(x) for x in v])
    if isinstance(v, list) and v and isinstance(v[0], (torch.Tensor, np.ndarray)):
        return onnx.helper.make_attribute(name, [tensor_to_proto("", x) for x in v])
    if isinstance(v, bool):
        v = int(v)
    return onnx.helper.make_attribute(name, v)


def _export_graph(g: Graph) -> onnx.GraphProto:
    nodes = []
    for n in g.nodes:
        attrs = [_attr_to_proto(k, v) for k, v in n.attrs.items() if not k.startswith("__")]
        np_ = onnx.helper.make_node(n.op_type, ["" if v is None else v.name for v in n.inputs],
                                    [o.name for o in n.outputs], name=n.name, domain=n.domain)
        np_.attribute.extend(attrs)
        nodes.append(np_)
    inits = [tensor_to_proto(v.name, v.data) for v in g.values.values()
             if v.kind in (ValueKind.CONSTANT, ValueKind.VARIABLE)]
    vinfo = [_value_info(v) for v in g.values.values()
             if v.kind is ValueKind.INTERMEDIATE and (v.dtype is not None or v.type_kind is not TypeKind.TENSOR)
             and v not in g.outputs]
    return onnx.helper.make_graph(nodes, g.name, [_value_info(v) for v in g.inputs],
                                  [_value_info(v) for v in g.outputs], inits, value_info=vinfo)


def to_model_proto(g: Graph, ir_version: int | None = None) -> onnx.ModelProto:
    """Export a Graph as an ONNX ModelProto. Variables become initializers (their current value)."""
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in g.opset_imports.items()
              if d == "" or any(n.domain == d for n in _walk_nodes(g))]
    model = onnx.helper.make_model(_export_graph(g), opset_imports=opsets, producer_name="shapeplan")
    if ir_version is not None:
        model.ir_version = ir_version
    for k, v in g.metadata.items():
        model.metadata_props.add(key=k, value=v)
    return model


def _walk_nodes(g: Graph):
    for n in g.nodes:
        yield n
        for s in n.subgraphs():
            yield from _walk_nodes(s)


def save_onnx(g: Graph, path: str, external_data: bool = False) -> None:
    model = to_model_proto(g)
    if external_data:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, path)


__all__ = ["load_onnx", "from_model_proto", "to_model_proto", "save_onnx", "clone_graph", "as_dtype"]
