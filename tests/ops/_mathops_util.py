"""Helpers for the math op tests: build a one-node ONNX model, run it through shapeplan
(slot_by_slot) and through ONNX's reference evaluator."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp


def _vi(name: str, arr: Any) -> onnx.ValueInfoProto:
    arr = np.asarray(arr)
    elem = onnx.TensorProto.STRING if arr.dtype.kind in "SUO" else helper.np_dtype_to_tensor_dtype(arr.dtype)
    return helper.make_tensor_value_info(name, elem, list(arr.shape))


def node_model(op: str, inputs: dict[str, Any], attrs: dict[str, Any] | None = None, *,
               outputs: Any = 1, opset: int | None = None, domain: str = "",
               out_types: list[int] | None = None) -> onnx.ModelProto:
    """A model with one ``op`` node; inputs named by ``inputs`` (None = absent optional input)."""
    out_names = [f"y{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
    in_names = [k if v is not None else "" for k, v in inputs.items()]
    node = helper.make_node(op, in_names, out_names, domain=domain, **(attrs or {}))
    graph = helper.make_graph(
        [node], "t", [_vi(k, v) for k, v in inputs.items() if v is not None],
        [helper.make_tensor_value_info(n, (out_types or [0] * len(out_names))[i], None)
         for i, n in enumerate(out_names)])
    imports = [helper.make_opsetid("", opset or 22)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def run_ours(model: onnx.ModelProto, inputs: dict[str, Any]) -> list[Any]:
    engine = sp.compile(model, mode="slot_by_slot", optimize=False)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    res = engine.run(feeds)
    return [res[n] for n in engine.output_names]


def run_ref(model: onnx.ModelProto, inputs: dict[str, Any]) -> list[Any]:
    feeds = {k: v for k, v in inputs.items() if v is not None}
    return list(ReferenceEvaluator(model).run(None, feeds))


def check(op: str, inputs: dict[str, Any], attrs: dict[str, Any] | None = None, *, outputs: int = 1,
          opset: int | None = None, domain: str = "", rtol: float = 1e-5, atol: float = 1e-6) -> list[Any]:
    """Run ``op`` both ways and assert equal dtypes, shapes and values; returns our outputs."""
    model = node_model(op, inputs, attrs, outputs=outputs, opset=opset, domain=domain)
    ours, ref = run_ours(model, inputs), run_ref(model, inputs)
    for o, r in zip(ours, ref):
        assert_same(o, r, rtol=rtol, atol=atol)
    return ours


def assert_same(got: Any, want: Any, *, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind in "SUO":
        assert (got.astype(str) == want.astype(str)).all()
        return
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind in "fc" or "float" in want.dtype.name:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)
