"""Graph IR: Value, Node, Graph.

A Graph owns Values (edges) and Nodes (op applications). Values are one of four kinds:

* PLACEHOLDER  -- a per-call input (``graph.inputs``)
* CONSTANT     -- an initializer whose data is known at compile time
* VARIABLE     -- mutable state that persists across calls (e.g. a KV cache); read and written in place
* INTERMEDIATE -- produced by a node

Subgraphs (If/Loop/Scan bodies) are Graphs too. A subgraph may read values of the enclosing graph;
those are listed in ``subgraph.captures`` (by name) and the control-flow node lists the outer values
in ``node.implicit_inputs`` so dataflow (liveness, DCE) stays explicit.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Union

import numpy as np
import torch

from shapeplan.errors import ModelError
from shapeplan.ir.dtypes import DType, dtype as as_dtype

Dim = Union[int, str, None]          # concrete size, symbolic name, or unknown
Shape = tuple[Dim, ...]


class ValueKind(enum.Enum):
    PLACEHOLDER = "placeholder"
    CONSTANT = "constant"
    VARIABLE = "variable"
    INTERMEDIATE = "intermediate"
    CAPTURE = "capture"            # a subgraph's view of an outer-scope value


class TypeKind(enum.Enum):
    TENSOR = "tensor"
    SEQUENCE = "sequence"
    OPTIONAL = "optional"
    MAP = "map"


@dataclass(eq=False, slots=True)
class Value:
    name: str
    dtype: DType | None = None
    shape: Shape | None = None               # None: rank unknown
    kind: ValueKind = ValueKind.INTERMEDIATE
    data: Any = None                          # torch.Tensor for constants / variable initial values
    producer: "Node | None" = None
    type_kind: TypeKind = TypeKind.TENSOR
    elem_type: Any = None                     # for sequence / optional: the ONNX TypeProto of the element

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def __repr__(self) -> str:
        shape = "?" if self.shape is None else "x".join(str(d) for d in self.shape) or "scalar"
        return f"%{self.name}:{self.dtype}[{shape}]"


@dataclass(eq=False, slots=True)
class Node:
    op_type: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    name: str = ""
    implicit_inputs: list[Value] = field(default_factory=list)

    @property
    def all_inputs(self) -> list[Value | None]:
        return self.inputs + list(self.implicit_inputs)

    def subgraphs(self) -> list["Graph"]:
        out: list[Graph] = []
        for v in self.attrs.values():
            if isinstance(v, Graph):
                out.append(v)
            elif isinstance(v, list):
                out.extend(g for g in v if isinstance(g, Graph))
        return out

    def describe(self) -> str:
        ins = ", ".join("None" if v is None else v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        dom = f"{self.domain}::" if self.domain else ""
        return f"{self.name or '<unnamed>'} ({dom}{self.op_type}: {ins} -> {outs})"

    def __repr__(self) -> str:
        return f"Node({self.describe()})"


class Graph:
    """A dataflow graph. ``g.op.<OpType>(...)`` builds nodes (see ir/builder.py)."""

    def __init__(self, name: str = "graph", opset: int | dict[str, int] | None = None) -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []            # placeholders, in order
        self.outputs: list[Value] = []
        self.values: dict[str, Value] = {}
        self.captures: list[Value] = []          # subgraphs only: outer values read by name
        if opset is None:
            opset = {"": DEFAULT_OPSET, "shapeplan": 1}
        elif isinstance(opset, int):
            opset = {"": opset, "shapeplan": 1}
        self.opset_imports: dict[str, int] = dict(opset)
        self.metadata: dict[str, str] = {}
        self._counter = itertools.count()

    # ------------------------------------------------------------------ naming / values
    def fresh_name(self, hint: str = "v") -> str:
        while True:
            name = f"{hint}_{next(self._counter)}"
            if name not in self.values:
                return name

    def _add_value(self, value: Value) -> Value:
        if value.name in self.values:
            raise ModelError(f"value name {value.name!r} is defined twice in graph {self.name!r}")
        self.values[value.name] = value
        return value

    def placeholder(self, name: str, dtype: Any, shape: Iterable[Dim] | None) -> Value:
        v = self._add_value(Value(name, as_dtype(dtype), None if shape is None else tuple(shape),
                                  ValueKind.PLACEHOLDER))
        self.inputs.append(v)
        return v

    def constant(self, data: Any, name: str | None = None, dtype: Any = None) -> Value:
        t = to_tensor(data, dtype)
        name = name or self.fresh_name("const")
        if isinstance(t, torch.Tensor):
            return self._add_value(Value(name, as_dtype(t.dtype), tuple(t.shape), ValueKind.CONSTANT, t))
        return self._add_value(Value(name, as_dtype("string"), tuple(t.shape), ValueKind.CONSTANT, t))

    def variable(self, name: str, data: Any) -> Value:
        """Mutable state that persists across calls; ``data`` is its initial value."""
        t = to_tensor(data)
        return self._add_value(Value(name, as_dtype(t.dtype), tuple(t.shape), ValueKind.VARIABLE, t))

    def capture(self, outer: Value) -> Value:
        """In a subgraph: a reference to a value of the enclosing graph, by name."""
        if outer.name in self.values:
            return self.values[outer.name]
        v = self._add_value(Value(outer.name, outer.dtype, outer.shape, ValueKind.CAPTURE,
                                  type_kind=outer.type_kind, elem_type=outer.elem_type))
        self.captures.append(v)
        return v

    def set_outputs(self, *values: Value) -> None:
        self.outputs = list(values)

    @property
    def constants(self) -> list[Value]:
        return [v for v in self.values.values() if v.kind is ValueKind.CONSTANT]

    @property
    def variables(self) -> list[Value]:
        return [v for v in self.values.values() if v.kind is ValueKind.VARIABLE]

    @property
    def op(self) -> "OpBuilder":
        from shapeplan.ir.builder import OpBuilder
        return OpBuilder(self)

    def opset(self, domain: str = "") -> int:
        return self.opset_imports.get(domain, DEFAULT_OPSET if domain in ("", "ai.onnx") else 1)

    # ------------------------------------------------------------------ nodes
    def add_node(self, op_type: str, inputs: list[Value | None], attrs: dict[str, Any] | None = None,
                 num_outputs: int = 1, domain: str = "", name: str = "",
                 output_names: list[str] | None = None) -> Node:
        outs = []
        for i in range(num_outputs):
            oname = output_names[i] if output_names else self.fresh_name(op_type.lower())
            outs.append(self._add_value(Value(oname)) if oname else Value(""))
        node = Node(op_type, list(inputs), outs, dict(attrs or {}), domain, name or self.fresh_name(op_type))
        for o in outs:
            o.producer = node
        self.nodes.append(node)
        return node

    def remove_node(self, node: Node) -> None:
        self.nodes.remove(node)
        for o in node.outputs:
            if self.values.get(o.name) is o and o not in self.outputs:
                del self.values[o.name]

    def consumers(self) -> dict[int, list[Node]]:
        """id(value) -> nodes that read it (explicit or implicit)."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.all_inputs:
                if v is not None:
                    out.setdefault(id(v), []).append(n)
        return out

    def replace_all_uses(self, old: Value, new: Value) -> None:
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
            n.implicit_inputs = [new if v is old else v for v in n.implicit_inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    def toposort(self) -> None:
        """Reorder ``self.nodes`` topologically (stable); raises ModelError on a cycle."""
        producer = {id(o): n for n in self.nodes for o in n.outputs}
        order: list[Node] = []
        state: dict[int, int] = {}
        for root in self.nodes:
            if id(root) in state:
                continue
            stack: list[tuple[Node, Iterator[Value | None]]] = [(root, iter(root.all_inputs))]
            state[id(root)] = 1
            while stack:
                node, it = stack[-1]
                advanced = False
                for v in it:
                    p = producer.get(id(v)) if v is not None else None
                    if p is None:
                        continue
                    st = state.get(id(p))
                    if st == 1:
                        raise ModelError(f"graph {self.name!r} has a cycle through node {p.describe()}")
                    if st is None:
                        state[id(p)] = 1
                        stack.append((p, iter(p.all_inputs)))
                        advanced = True
                        break
                if not advanced:
                    stack.pop()
                    state[id(node)] = 2
                    order.append(node)
        self.nodes = order

    def verify(self) -> None:
        from shapeplan.ir.verify import verify
        verify(self)

    def copy(self) -> "Graph":
        return clone_graph(self)

    def op_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        for n in self.nodes:
            key = f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
            hist[key] = hist.get(key, 0) + 1
        return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={[v.name for v in self.inputs]}, "
                f"outputs={[v.name for v in self.outputs]})")

    def to_text(self) -> str:
        lines = [f"graph {self.name}({', '.join(map(repr, self.inputs))}):"]
        for n in self.nodes:
            outs = ", ".join(map(repr, n.outputs))
            ins = ", ".join("None" if v is None else f"%{v.name}" for v in n.inputs)
            attrs = "".join(f" {k}={_short(v)}" for k, v in n.attrs.items())
            dom = f"{n.domain}::" if n.domain else ""
            lines.append(f"  {outs} = {dom}{n.op_type}({ins}){attrs}")
        lines.append(f"  return {', '.join('%' + v.name for v in self.outputs)}")
        return "\n".join(lines)


DEFAULT_OPSET = 21


def _short(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor{list(v.shape)}"
    if isinstance(v, Graph):
        return f"<graph {v.name}>"
    s = repr(v)
    return s if len(s) < 40 else s[:37] + "..."


def to_tensor(data: Any, dtype: Any = None) -> Any:
    """Python / numpy / torch data -> torch.Tensor (numpy object array for strings)."""
    if isinstance(data, torch.Tensor):
        t = data
    else:
        arr = np.asarray(data)
        if arr.dtype.kind in "SUO":
            return arr.astype(object)
        if dtype is None and arr.dtype == np.float64 and not isinstance(data, np.ndarray):
            arr = arr.astype(np.float32)    # python floats default to float32, like the ONNX builders
        t = torch.from_numpy(np.array(arr, order="C", copy=True))   # ascontiguousarray would make 0-d 1-d
    if dtype is not None:
        t = t.to(as_dtype(dtype).torch)
    return t


def clone_graph(g: Graph) -> Graph:
    """A deep structural copy (tensor data is shared, not copied). Here, not in ``onnx_io``: copying a
    graph must not import onnx (0.7 s with ml_dtypes on the dev box, on every LLM pipeline start)."""
    mapping: dict[int, Value] = {}
    return _clone(g, mapping)


def _clone(g: Graph, mapping: dict[int, Value]) -> Graph:
    new = Graph(g.name, opset=dict(g.opset_imports))
    new.metadata = dict(g.metadata)

    def cv(v: Value | None) -> Value | None:
        if v is None:
            return None
        if id(v) in mapping:
            return mapping[id(v)]
        nv = Value(v.name, v.dtype, v.shape, v.kind, v.data, None, v.type_kind, v.elem_type)
        mapping[id(v)] = nv
        if v.name:
            new.values[v.name] = nv
        return nv

    for v in g.values.values():
        cv(v)
    new.inputs = [cv(v) for v in g.inputs]  # type: ignore[misc]
    new.captures = [cv(v) for v in g.captures]  # type: ignore[misc]
    get = mapping.get                  # values are already mapped: cv() only for the rare unnamed one
    for n in g.nodes:
        attrs = {k: (_clone(v, mapping) if isinstance(v, Graph) else
                     [_clone(x, mapping) for x in v] if isinstance(v, list) and v and isinstance(v[0], Graph)
                     else v) for k, v in n.attrs.items()} if n.attrs else {}
        nn = Node(n.op_type, [None if v is None else get(id(v)) or cv(v) for v in n.inputs],
                  [get(id(o)) or cv(o) for o in n.outputs], attrs,  # type: ignore[misc]
                  n.domain, n.name, [cv(v) for v in n.implicit_inputs] if n.implicit_inputs else [])  # type: ignore[misc]
        for o in nn.outputs:
            o.producer = nn
        new.nodes.append(nn)
    new.outputs = [cv(v) for v in g.outputs]  # type: ignore[misc]
    new._counter = itertools.count(len(new.values))
    return new
