"""ONNX import/export: round trip, external data, subgraphs, corrupt input."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import shapeplan as sp
from shapeplan.ir.onnx_io import from_model_proto, save_onnx, to_model_proto


def _mlp_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_import_reads_types_and_initializers() -> None:
    g = sp.load(_mlp_model())
    assert [v.name for v in g.inputs] == ["x"]
    assert g.inputs[0].shape == ("n", 3)
    assert g.values["w"].kind is sp.ValueKind.CONSTANT
    assert g.opset() == 17
    assert g.values["h"].shape == ("n", 4)          # from onnx shape inference


def test_round_trip_preserves_structure() -> None:
    g = sp.load(_mlp_model())
    m2 = to_model_proto(g)
    onnx.checker.check_model(m2)
    g2 = from_model_proto(m2)
    assert [n.op_type for n in g2.nodes] == [n.op_type for n in g.nodes]
    assert np.array_equal(g2.values["w"].data.numpy(), g.values["w"].data.numpy())
    assert g2.inputs[0].shape == g.inputs[0].shape


def test_external_data_initializers(tmp_path) -> None:
    model = _mlp_model()
    path = str(tmp_path / "m.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.onnx.data", size_threshold=0)
    assert os.path.exists(tmp_path / "m.onnx.data")
    g = sp.load(path)
    assert np.allclose(g.values["w"].data.numpy(), np.arange(12).reshape(3, 4) / 10)
    # our own exporter writes external data too, and reads it back
    out = str(tmp_path / "ours.onnx")
    save_onnx(g, out, external_data=True)
    assert np.allclose(sp.load(out).values["w"].data.numpy(), g.values["w"].data.numpy())


def test_missing_external_file_is_model_error(tmp_path) -> None:
    path = str(tmp_path / "m.onnx")
    onnx.save_model(_mlp_model(), path, save_as_external_data=True, location="m.data", size_threshold=0)
    os.remove(tmp_path / "m.data")
    with pytest.raises(sp.ModelError, match="external data"):
        sp.load(path)


def test_if_subgraph_captures_outer_values() -> None:
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    g = sp.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    if_node = g.nodes[0]
    assert [v.name for v in if_node.implicit_inputs] == ["x"]
    assert [v.name for v in if_node.attrs["then_branch"].captures] == ["x"]
    m2 = to_model_proto(g)
    onnx.checker.check_model(m2)
    assert m2.graph.node[0].input == ["c"]              # implicit inputs are not exported


@pytest.mark.parametrize("blob", [b"", b"\x08\x07garbage\xff\xff", None])
def test_corrupt_bytes_raise_model_error(blob) -> None:
    if blob is None:
        blob = _mlp_model().SerializeToString()[:40]      # truncated
    with pytest.raises(sp.ModelError):
        g = sp.load(blob)
        sp.compile(g)


@pytest.mark.parametrize("where", ["output", "initializer"])
def test_an_unknown_element_type_names_the_value(where) -> None:
    """A type code no ONNX version defines (a damaged file: one changed byte did it) is a ModelError naming
    the value, not numpy's or our dtype table's ValueError."""
    m = _mlp_model()
    if where == "output":
        m.graph.output[0].type.tensor_type.elem_type = 93
    else:
        m.graph.initializer[0].data_type = 93
    with pytest.raises(sp.ModelError, match=("value 'y'" if where == "output" else "initializer 'w'")
                       + ": unknown ONNX element type code 93"):
        sp.compile(m.SerializeToString(), disk_cache=False)


def _sparse_model(values, indices, dims, as_attribute: bool = False) -> onnx.ModelProto:
    """y = x + W where W [dims] comes as a sparse initializer or a Constant's ``sparse_value``."""
    st = helper.make_sparse_tensor(numpy_helper.from_array(np.asarray(values, np.float32), "w"),
                                   numpy_helper.from_array(np.asarray(indices, np.int64), "w_idx"), dims)
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    if as_attribute:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], sparse_value=st))
    graph = helper.make_graph(nodes, "sparse", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
                              sparse_initializer=[] if as_attribute else [st])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("as_attribute", [False, True])
@pytest.mark.parametrize("indices", [[1, 5], [[0, 1], [1, 2]]], ids=["flat", "coordinates"])
def test_sparse_tensors_are_densified(indices, as_attribute) -> None:
    """A sparse initializer and a Constant's ``sparse_value``: the values at their indices, zeros elsewhere, as
    onnxruntime computes the same model."""
    ort = pytest.importorskip("onnxruntime")
    m = _sparse_model([2.5, -1.0], indices, [2, 3], as_attribute)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = x.copy()
    want.reshape(-1)[[1, 5]] += [2.5, -1.0]
    out = sp.compile(m, disk_cache=False).run({"x": x})["y"]
    np.testing.assert_array_equal(np.asarray(out), want)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ref, want)


@pytest.mark.parametrize("as_attribute", [False, True])
@pytest.mark.parametrize("damage, match", [
    ("type", "unknown ONNX element type code 93"),
    ("index range", "index lies outside"),
    ("coordinate range", "index lies outside its dims"),
    ("index count", r"indices must be int64 \[NNZ\] or \[NNZ, 2\] for 2 values, got int64 \[3\]"),
    ("index type", "indices must be int64"),
])
def test_a_damaged_sparse_tensor_names_it(damage, match, as_attribute) -> None:
    """A sparse tensor with an unknown value type, indices out of range, too many, or not int64 is a ModelError
    naming the initializer or attribute (was numpy's IndexError / ValueError or onnx's KeyError)."""
    indices = {"index range": [1, 6], "coordinate range": [[0, 1], [2, 0]], "index count": [0, 1, 2]}.get(damage,
                                                                                                       [1, 5])
    m = _sparse_model([2.5, -1.0], indices, [2, 3], as_attribute)
    st = m.graph.node[0].attribute[0].sparse_tensor if as_attribute else m.graph.sparse_initializer[0]
    if damage == "type":
        st.values.data_type = 93
    if damage == "index type":
        st.indices.CopyFrom(numpy_helper.from_array(np.asarray([1, 5], np.int32), "w_idx"))
    what = "attribute 'sparse_value'" if as_attribute else "sparse initializer 'w'"
    with pytest.raises(sp.ModelError, match=f"{what}: (a )?(sparse tensor )?{match}"):
        sp.compile(m.SerializeToString(), disk_cache=False)


def test_dangling_value_names_the_node() -> None:
    nodes = [helper.make_node("Relu", ["nope"], ["y"], name="relu0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(sp.ModelError, match="relu0.*nope"):
        sp.load(helper.make_model(graph))


def test_unknown_op_names_op_domain_and_opset() -> None:
    nodes = [helper.make_node("Relux", ["x"], ["y"], name="n0")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(sp.UnsupportedOpError) as ei:
        sp.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    msg = str(ei.value)
    assert "Relux" in msg and "opset 17" in msg and "Relu" in msg and "n0" in msg
