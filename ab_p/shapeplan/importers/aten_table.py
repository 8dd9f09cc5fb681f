"""The ATen -> shapeplan conversion table and the per-import context (used by torch_export.py)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from shapeplan.errors import ModelError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ir.graph import Graph, Value

#: ONNX opset of imported graphs (ONNX Attention / RMSNormalization need 23)
OPSET = 23

aten = torch.ops.aten
Converter = Callable[..., Any]
CONVERTERS: dict[Any, Converter] = {}


def _conv(*names: str) -> Callable[[Converter], Converter]:
    """Register a converter for ``aten.<name>`` overloads ("add.Tensor"); absent overloads are skipped."""
    def deco(fn: Converter) -> Converter:
        for name in names:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(aten, packet, None), overload or "default", None)
            if op is not None:
                CONVERTERS[op] = fn
        return fn
    return deco


def supported_aten_ops() -> list[str]:
    return sorted(str(op) for op in CONVERTERS if isinstance(op, torch._ops.OpOverload))


# ---------------------------------------------------------------------------------------- context
class _Ctx:
    """Per-import state: the graph being built, fx node -> converted value, symbol -> [1] int64 value."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.op = g.op
        self.env: dict[torch.fx.Node, Any] = {}
        self.sym: dict[str, Value] = {}                       # "s77" -> int64 [1]
        self.sym_src: dict[str, tuple[Value, int]] = {}      # "s77" -> (placeholder, axis)
        self.node: torch.fx.Node | None = None

    # fx arguments -> graph values
    def v(self, a: Any, like: Any = None) -> Value:
        """Tensor argument -> Value; a Python scalar becomes a constant of ``like``'s dtype."""
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, Value):
            return a
        dt = like if isinstance(like, torch.dtype) else self.out_dtype()
        return self.g.constant(torch.tensor(a, dtype=dt))

    def meta(self, a: Any = None) -> Any:
        n = self.node if a is None else a
        return n.meta.get("val") if isinstance(n, torch.fx.Node) else None

    def out_dtype(self) -> torch.dtype:
        val = self.meta()
        val = val[0] if isinstance(val, (tuple, list)) else val
        return val.dtype if isinstance(val, torch.Tensor) else torch.float32

    def rank(self, a: Any) -> int:
        return self.meta(a).dim()

    def cast(self, x: Value, dt: torch.dtype) -> Value:
        return x if x.dtype == as_dtype(dt) else self.op.Cast(x, to=as_dtype(dt).onnx)

    def ints(self, items: Any) -> Value:
        """A list of ints / SymInt nodes -> an int64 1-D Value (constant when every item is an int)."""
        items = list(items)
        if all(isinstance(i, int) for i in items):
            return self.g.constant(torch.tensor(items, dtype=torch.int64))
        parts = [self.sym_value(i) for i in items]
        return parts[0] if len(parts) == 1 else self.op.Concat(*parts, axis=0)

    def sym_value(self, i: Any) -> Value:
        if isinstance(i, Value):
            return i
        if isinstance(i, int):
            return self.g.constant(torch.tensor([i], dtype=torch.int64))
        if isinstance(i, torch.fx.Node):
            return self.env[i]
        return self.sym_expr(i)

    def sym_expr(self, s: Any) -> Value:
        """A SymInt (from meta) -> int64 [1]; its symbol must be known (a placeholder dim or a sym node)."""
        key = _sym_name(s)
        if key not in self.sym and key in self.sym_src:
            x, axis = self.sym_src[key]
            self.sym[key] = self.op.Shape(x, start=axis, end=axis + 1)
        if key not in self.sym:
            raise ModelError(f"torch.export import: node {self.node}: no runtime value for symbolic size {key!r}")
        return self.sym[key]

    def shape_of_meta(self) -> Value:
        """The output shape of the current node as an int64 Value; one unknown symbolic dim becomes -1."""
        shape = list(self.meta().shape)
        unknown = [i for i, d in enumerate(shape) if not isinstance(d, int) and _sym_name(d) not in self.sym
                   and _sym_name(d) not in self.sym_src]
        if len(unknown) == 1:
            shape[unknown[0]] = -1
        return self.ints([d if isinstance(d, int) else self.sym_expr(d) for d in shape])


def _sym_name(s: Any) -> str:
    return str(s.node.expr if isinstance(s, torch.SymInt) else s).replace(" ", "")


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims(ds: Any, rank: int) -> list[int]:
    return [_dim(d, rank) for d in ([ds] if isinstance(ds, int) else ds)]
