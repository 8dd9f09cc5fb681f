"""Builder API: write graphs in Python.

    g = sp.Graph()
    x = g.placeholder("x", "float32", ("batch", 768))
    w = g.constant(np.random.rand(768, 768).astype("float32"), name="w")
    y = g.op.Relu(g.op.MatMul(x, w))
    g.set_outputs(y)

``g.op.<OpType>(*inputs, **attrs)`` appends a node and returns its output Value (a tuple when the op
has several outputs: pass ``_outputs=n``). Non-Value inputs (numbers, numpy/torch arrays) become
constants; numpy arrays given as attributes become torch tensors (tensor attributes). ``_domain="shapeplan"`` selects the fused-op domain; ``_name`` names the node.
Shapes and dtypes are inferred as nodes are added.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from shapeplan.ir.graph import Graph, Value
from shapeplan.ir.shape_inference import infer_node
from shapeplan.ops.registry import lookup

#: ops whose default output count is more than one
_MULTI_OUTPUT = {"TopK": 2, "Unique": 4, "LSTM": 3, "GRU": 2, "RNN": 2,
                 "DynamicQuantizeLinear": 3, "BatchNormalization": 1}


class OpBuilder:
    __slots__ = ("_g",)

    def __init__(self, graph: Graph) -> None:
        self._g = graph

    def __getattr__(self, op_type: str):
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        g = self._g

        def build(*inputs: Any, _outputs: int | None = None, _domain: str = "", _name: str = "",
                  **attrs: Any) -> Any:
            lookup(op_type, _domain, g.opset(_domain))          # fail fast on an unknown op
            vals: list[Value | None] = []
            for x in inputs:
                if x is None or isinstance(x, Value):
                    vals.append(x)
                else:
                    vals.append(g.constant(x))
            n_out = _outputs if _outputs is not None else _MULTI_OUTPUT.get(op_type, 1)
            # a tensor attribute (ConstantOfShape's value, Constant's value) is a torch tensor in the IR,
            # as the ONNX importer makes it: a numpy array given here becomes one
            attrs = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                     for k, v in attrs.items()}
            node = g.add_node(op_type, vals, attrs, num_outputs=n_out, domain=_domain, name=_name)
            infer_node(node, g.opset(_domain))
            return node.outputs[0] if n_out == 1 else tuple(node.outputs)

        return build
