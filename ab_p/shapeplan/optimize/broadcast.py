"""BroadcastElimination and commutative canonicalization.

    before:  e = Expand(x:[4,8], shape=[4,8]);  y = Add(Expand(b:[8], [4,8]), x:[4,8])
    after:   e -> x;                            y = Add(x, b)          # the Add broadcasts anyway

* ``Expand`` to the shape the input already has is removed.
* ``Expand`` feeding (only) an ELEMENTWISE op is dropped when the op's output shape is unchanged
  without it (the op broadcasts on its own).
* COMMUTATIVE binary ops get a canonical input order: a constant goes second, otherwise inputs
  are ordered by value name, so CSE and patterns see one form.
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph, Node, Value, ValueKind
from shapeplan.ir.shape_inference import infer_node
from shapeplan.ops.registry import Trait
from shapeplan.optimize.rewrite import Rewriter, shapes_equal

_ELEMENTWISE = Trait.ELEMENTWISE.value        # plain ints: enum.Flag arithmetic is slow per node
_COMMUTATIVE = Trait.COMMUTATIVE.value


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "BroadcastElimination")
    count = 0
    for node in list(graph.nodes):
        if node in rw.dead or not node.outputs:
            continue
        if node.op_type == "Expand" and node.domain in ("", "ai.onnx"):
            x, out = node.inputs[0], node.outputs[0]
            if x is not None and x.is_static and shapes_equal(x.shape, out.shape):
                if rw.replace(out, x, before=node):
                    count += 1
                    rw.emit(f"removed no-op {node.describe()}", node=node.name)
            continue
        traits = rw.traits(node)
        if not traits & _ELEMENTWISE or len(node.inputs) < 2:
            continue
        count += _drop_expand_inputs(rw, node)
        if len(node.inputs) == 2 and traits & _COMMUTATIVE:
            a, b = node.inputs
            if a is not None and b is not None and _key(a) > _key(b):
                node.inputs = [b, a]
                count += 1
                rw.changed += 1
    rw.commit()
    return count


def _shape_without(rw: Rewriter, node, i: int, src):  # noqa: ANN001, ANN202
    """The op's own shape function on the new inputs must give the same output shape."""
    probe = Node(node.op_type, [src if j == i else w for j, w in enumerate(node.inputs)],
                 [Value("")], dict(node.attrs), node.domain)
    try:
        infer_node(probe, rw.g.opset(node.domain))
    except Exception:  # noqa: BLE001
        return None
    shp = probe.outputs[0].shape
    return shp if shapes_equal(shp, node.outputs[0].shape) else None


def _key(v) -> tuple[int, str]:  # noqa: ANN001
    return (1 if v.kind is ValueKind.CONSTANT else 0, v.name)


def _drop_expand_inputs(rw: Rewriter, node) -> int:  # noqa: ANN001
    out = node.outputs[0]
    if out.shape is None or not all(isinstance(d, int) for d in out.shape):
        return 0
    n = 0
    for i, v in enumerate(node.inputs):
        p = rw.producer(v)
        if p is None or p.op_type != "Expand" or p.domain not in ("", "ai.onnx") or not rw.single_use(v):
            continue
        src = p.inputs[0]
        if src is None or src.shape is None or src.dtype != v.dtype:
            continue
        if _shape_without(rw, node, i, src) is None:
            continue
        node.inputs = [src if j == i else w for j, w in enumerate(node.inputs)]
        rw.users.setdefault(src, []).append(node)
        rw.users.get(v, []).remove(node)
        rw.sweep(p)
        rw.changed += 1
        rw.emit(f"dropped {p.describe()} feeding {node.describe()}", node=node.name)
        n += 1
    return n
