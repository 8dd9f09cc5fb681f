"""`shapeplan run / inspect / demo` end to end through the CLI entry point."""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from shapeplan.cli import main


def _model(path: str) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Add", ["h", "h"], ["y"]),
             helper.make_node("NonZero", ["y"], ["nz"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
                           helper.make_tensor_value_info("nz", TensorProto.INT64, [2, None])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_run_writes_outputs(tmp_path, capsys) -> None:
    model = str(tmp_path / "m.onnx")
    _model(model)
    np.save(tmp_path / "x.npy", np.array([[-1, 2, 3]], np.float32))
    assert main(["run", model, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]) == 0
    assert np.load(tmp_path / "out" / "y.npy").tolist() == [[0, 4, 6]]
    assert np.load(tmp_path / "out" / "nz.npy").tolist() == [[0, 0], [1, 2]]
    assert "y: float32[1, 3]" in capsys.readouterr().out


def test_run_bad_input_is_a_clean_error(tmp_path, capsys) -> None:
    model = str(tmp_path / "m.onnx")
    _model(model)
    np.save(tmp_path / "x.npy", np.zeros((1, 3), np.float64))
    assert main(["run", model, "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert "InputError: input 'x': expected dtype float32, got float64" in capsys.readouterr().err
    assert main(["run", model, "--input", "x"]) == 1


def test_inspect_lists_ops_and_plan_segments(tmp_path, capsys) -> None:
    model = str(tmp_path / "m.onnx")
    _model(model)
    assert main(["inspect", model, "--plan", "--dim", "n=4"]) == 0
    out = capsys.readouterr().out
    assert "x: float32[n, 3]" in out and "NonZero" in out and "unsupported ops: none" in out
    assert "phase" in out and "seg" in out          # the segment table
    assert main(["inspect", model, "--json", "--optimize"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["op_histogram"]["Relu"] == 1 and "optimizer_report" in doc


def test_inspect_flags_unsupported_ops(tmp_path, capsys) -> None:
    g = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = str(tmp_path / "u.onnx")
    onnx.save(helper.make_model(g), path)
    assert main(["inspect", path]) == 1
    assert "UNSUPPORTED ops: NoSuchOp x1" in capsys.readouterr().out


def test_demo_graph_part(capsys) -> None:
    assert main(["demo", "--skip-llm", "--calls", "6"]) == 0
    out = capsys.readouterr().out
    assert "REPLAYING" in out and "slot_by_slot" in out
