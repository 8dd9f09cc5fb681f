"""Model repository layout, config.json keys, and the model spec (batch dimension, -1 dims)."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("google.protobuf")
from shapeplan.errors import ModelError  # noqa: E402
from shapeplan.serve.kserve.repository import CONFIG_KEYS, ModelConfig, discover, single  # noqa: E402
from tests.serve.conftest import fixed_onnx, mlp_onnx  # noqa: E402


def test_discover_layout(tmp_path) -> None:
    mlp_onnx(str(tmp_path / "a.onnx"))
    os.makedirs(tmp_path / "b")
    mlp_onnx(str(tmp_path / "b" / "whatever.onnx"))
    (tmp_path / "b" / "config.json").write_text(json.dumps({"max_batch_size": 4, "device": "cpu"}))
    os.makedirs(tmp_path / "c")
    mlp_onnx(str(tmp_path / "c" / "model.onnx"))
    mlp_onnx(str(tmp_path / "c" / "other.onnx"))
    os.makedirs(tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    os.makedirs(tmp_path / "empty")
    found = {s.name: s for s in discover(str(tmp_path))}
    assert sorted(found) == ["a", "b", "c"]
    assert found["b"].config.max_batch_size == 4 and found["b"].path.endswith("whatever.onnx")
    assert found["c"].path.endswith(os.path.join("c", "model.onnx")) and found["a"].config == ModelConfig()
    assert single(str(tmp_path / "a.onnx"))[0].name == "a"


def test_discover_errors(tmp_path) -> None:
    with pytest.raises(ModelError, match="is not a directory"):
        discover(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="holds no .onnx or .pt2 model"):
        discover(str(tmp_path))
    os.makedirs(tmp_path / "two")
    mlp_onnx(str(tmp_path / "two" / "x.onnx"))
    mlp_onnx(str(tmp_path / "two" / "y.onnx"))
    with pytest.raises(ModelError, match="several model files"):
        discover(str(tmp_path))
    with pytest.raises(ModelError, match="is not an .onnx or .pt2 file"):
        single(str(tmp_path / "two"))


@pytest.mark.parametrize("doc,words", [
    ({"max_batch_sizes": 4}, ["unknown key(s) ['max_batch_sizes']", "max_batch_size"]),
    ({"max_batch_size": "4"}, ["'max_batch_size' must be int, got '4'"]),
    ({"dynamic_batching": 1}, ["'dynamic_batching' must be bool"]),
    ({"max_batch_size": -1}, ["must be >= 0"]),
    ({"instance_count": 0}, ["'instance_count' >= 1"]),
    ([1], ["expected a JSON object"]),
])
def test_config_errors(doc, words) -> None:
    with pytest.raises(ModelError) as e:
        ModelConfig.from_dict(doc, "m/config.json")
    for w in words:
        assert w in str(e.value)
    assert str(e.value).startswith("m/config.json")


def test_config_keys_table_is_the_dataclass() -> None:
    assert [k.name for k in CONFIG_KEYS] == list(ModelConfig().to_dict())
    assert all(k.meaning for k in CONFIG_KEYS)


def test_spec_batching_rules(tmp_path) -> None:
    import shapeplan as sp
    from shapeplan.serve.kserve.model import ModelSpec
    mlp_onnx(str(tmp_path / "m.onnx"))
    fixed_onnx(str(tmp_path / "f.onnx"))
    g = sp.load(str(tmp_path / "m.onnx"))
    s = ModelSpec.from_graph(g, ModelConfig(), "m")
    assert s.max_batch_size == 32 and s.batching and s.buckets == (1, 2, 4, 8, 16, 32)
    assert s.inputs[0].metadata() == {"name": "x", "datatype": "FP32", "shape": [-1, 8]}
    s = ModelSpec.from_graph(g, ModelConfig(max_batch_size=0), "m")
    assert s.max_batch_size == 0 and not s.batching
    f = sp.load(str(tmp_path / "f.onnx"))
    assert ModelSpec.from_graph(f, ModelConfig(), "f").max_batch_size == 0
    with pytest.raises(ModelError, match="max_batch_size is 8 but input 'x' has shape \\[2, 3\\]"):
        ModelSpec.from_graph(f, ModelConfig(max_batch_size=8), "f")


def test_a_model_that_fails_to_load_is_a_clean_start_error(tmp_path) -> None:
    from shapeplan.serve.kserve import KServeServer, ModelRepository
    (tmp_path / "bad.onnx").write_bytes(b"not onnx")
    with pytest.raises(ModelError):
        KServeServer(ModelRepository(discover(str(tmp_path))), http_port=0, grpc_port=0).start()
