"""IdentityRemoval: ops that return their input unchanged are bypassed.

    before:  y = Identity(x); z = Dropout(y); w = Transpose(z, perm=[0,1]); v = Concat(w)
    after:   readers of v read x

Covers Identity, inference-mode Dropout (mask output unused, no ``training_mode`` true),
Transpose with the identity permutation, single-input Concat / Sum / Max / Min / Mean,
Pad with all-zero pads, Slice/Expand/Reshape/Squeeze/Unsqueeze/Flatten whose output provably has
the input's static shape. A graph output keeps its name (an Identity stays where it must).
"""
from __future__ import annotations

from shapeplan.ir.graph import Graph, Node
from shapeplan.optimize.rewrite import Rewriter, int_list, shapes_equal

_SHAPE_PRESERVING_IF_SAME = ("Reshape", "Expand", "Squeeze", "Unsqueeze", "Flatten", "Slice")


def run(graph: Graph) -> int:
    rw = Rewriter.get(graph, "IdentityRemoval")
    count = 0
    for node in list(graph.nodes):
        if node in rw.dead or node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        src = _passthrough(rw, node)
        if src is None:
            continue
        if src.dtype is not None and node.outputs[0].dtype is not None and src.dtype != node.outputs[0].dtype:
            continue
        if rw.replace(node.outputs[0], src, before=node):
            count += 1
            rw.emit(f"removed {node.describe()}", node=node.name, op=node.op_type)
    rw.commit()
    return count


def _passthrough(rw: Rewriter, node: Node):  # noqa: ANN202
    op, ins, out = node.op_type, node.inputs, node.outputs[0]
    x = ins[0] if ins else None
    if x is None:
        return None
    if op == "Identity":
        return x
    if op == "Dropout":
        if any(o.name and (rw.readers(o) or rw.pinned(o)) for o in node.outputs[1:]):
            return None
        if len(ins) > 2 and ins[2] is not None:
            t = rw.const_value(ins[2])
            if t is None or bool(t.reshape(-1)[0]):
                return None
        if int(node.attrs.get("is_test", 1)) == 0 and rw.g.opset("") < 7:
            return None
        return x
    if op == "Transpose":
        perm = node.attrs.get("perm")
        if perm is not None and list(perm) == list(range(len(perm))):
            return x
        if perm is None and x.rank is not None and x.rank <= 1:
            return x
        return None
    if op in ("Concat", "Sum", "Max", "Min", "Mean") and len([v for v in ins if v is not None]) == 1:
        return x if shapes_equal(x.shape, out.shape) or op == "Concat" else None
    if op == "Pad":
        pads = int_list(rw, node, "pads", 1)
        return x if pads is not None and pads and not any(pads) else None
    if op in _SHAPE_PRESERVING_IF_SAME and x.is_static and shapes_equal(x.shape, out.shape):
        if op == "Slice":
            steps = int_list(rw, node, "steps", 4)
            if steps is None or any(s < 0 for s in steps):
                return None                     # a reversing slice keeps the shape, not the data
        return x
    return None
