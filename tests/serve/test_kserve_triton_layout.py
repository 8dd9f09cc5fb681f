"""A Triton model repository served as it is: NAME/config.pbtxt and NAME/<version>/model.onnx, the version
policy, config.pbtxt's fields mapped onto ours, and the served version seen through tritonclient."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

pytest.importorskip("google.protobuf")
from shapeplan.errors import ModelError  # noqa: E402
from shapeplan.serve.kserve.repository import ModelConfig, discover, find  # noqa: E402
from tests.serve.conftest import export_pt2, mlp_onnx, mlp_ref  # noqa: E402

CONFIG = """
# a config as Triton users write them: list syntax, fields shapeplan does not read
name: "net"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  {
    name: "x"
    data_type: TYPE_FP32
    format: FORMAT_NONE
    dims: [ 8 ]
  }
]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ], label_filename: "labels.txt" } ]
dynamic_batching { max_queue_delay_microseconds: 250 preferred_batch_size: [ 4, 8 ] }
instance_group [ { count: 2 kind: KIND_CPU } ]
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 8 ] zero_data: true } } } ]
parameters { key: "note" value: { string_value: "a [bracket] and a # hash in a string" } }
"""


def _triton_repo(root, config: str = CONFIG, versions=(1, 3), name: str = "net", filename: str = "model.onnx") -> str:
    d = root / name
    d.mkdir(parents=True)
    for v in versions:
        (d / str(v)).mkdir()
        mlp_onnx(str(d / str(v) / filename))
    (d / "config.pbtxt").write_text(config)
    return str(root)


def test_layout_and_config_mapping(tmp_path) -> None:
    (s,) = discover(_triton_repo(tmp_path))
    assert s.name == "net" and s.version == "3" and s.path.endswith(os.path.join("net", "3", "model.onnx"))
    assert s.config == ModelConfig(max_batch_size=16, dynamic_batching=True, max_queue_delay_us=250, device="cpu",
                                   instance_count=2)


@pytest.mark.parametrize("extra,want", [
    ("", ModelConfig(max_batch_size=0, dynamic_batching=False)),                     # Triton's defaults
    ("max_batch_size: 8 dynamic_batching { }", ModelConfig(max_batch_size=8, max_queue_delay_us=0)),
    ('backend: "onnxruntime" instance_group [ { kind: KIND_GPU gpus: [ 1 ] count: 2 } ]',
     ModelConfig(max_batch_size=0, dynamic_batching=False, device="cuda:1", instance_count=2)),
    ("instance_group [ { kind: KIND_GPU } ]", ModelConfig(max_batch_size=0, dynamic_batching=False, device="cuda")),
    ("instance_group [ { count: 1 }, { count: 2 } ]", ModelConfig(max_batch_size=0, dynamic_batching=False,
                                                                  instance_count=3)),
])
def test_config_fields(tmp_path, extra, want) -> None:
    (s,) = discover(_triton_repo(tmp_path, extra))
    assert s.config == want


@pytest.mark.parametrize("policy,version,warns", [
    ("version_policy: { specific: { versions: [ 1 ] } }", "1", False),
    ("version_policy: { specific { versions: [ 1, 3 ] } }", "3", True),
    ("version_policy: { latest: { num_versions: 2 } }", "3", True),
    ("version_policy: { all { } }", "3", True),
    ("version_policy: { latest: { num_versions: 1 } }", "3", False),
])
def test_version_policy(tmp_path, caplog, policy, version, warns) -> None:
    with caplog.at_level(logging.WARNING, logger="shapeplan.serve"):
        (s,) = discover(_triton_repo(tmp_path, policy))
    assert s.version == version
    assert ("serves one version per model: 3" in caplog.text) == warns


def test_default_model_filename_and_a_pt2(tmp_path) -> None:
    (s,) = discover(_triton_repo(tmp_path, 'default_model_filename: "net.onnx"', versions=(2,), filename="net.onnx"))
    assert s.version == "2" and s.path.endswith("net.onnx")
    d = tmp_path / "pt"
    (d / "7").mkdir(parents=True)
    export_pt2(str(d / "7" / "model.pt2"))
    (d / "config.pbtxt").write_text('backend: "pytorch" max_batch_size: 4')
    assert find(str(tmp_path), "pt").version == "7"


@pytest.mark.parametrize("config,words", [
    ("max_batch_size: 'a'", ["config.pbtxt: line 1:17", "Couldn't parse integer"]),
    ("input [ { data_type: TYPE_NOPE } ]", ["config.pbtxt: line", "has no value named TYPE_NOPE"]),
    ('platform: "tensorrt_plan"', ["platform 'tensorrt_plan' is not one shapeplan runs for model.onnx"]),
    ('platform: "pytorch_libtorch"', ["platform 'pytorch_libtorch'"]),
    ('name: "other"', ["name 'other' is not the model's directory name 'net'"]),
    ("instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] } ]", ["instance groups on GPUs [0, 1]", "list one GPU"]),
    ("instance_group [ { kind: KIND_GPU }, { kind: KIND_CPU } ]", ["instance groups on both CPU and GPU"]),
    ("version_policy: { specific: { versions: [ 2 ] } }", ["version_policy specific [2], but the versions here are [1, 3]"]),
    ("max_batch_size: -1", ["max_batch_size must be >= 0, got -1"]),
    ('default_model_filename: "../1/model.onnx"', ["default_model_filename '../1/model.onnx' must be a file name"]),
    ('default_model_filename: "net.onnx"', ["no version directory (1/, 2/, ...) beside it holds 'net.onnx'"]),
])
def test_config_errors_name_the_file_and_what_is_wrong(tmp_path, config, words) -> None:
    with pytest.raises(ModelError) as e:
        discover(_triton_repo(tmp_path, config))
    for w in words:
        assert w in str(e.value)
    assert "config.pbtxt" in str(e.value)


def test_config_json_and_pbtxt_together_is_an_error(tmp_path) -> None:
    root = _triton_repo(tmp_path)
    (tmp_path / "net" / "config.json").write_text(json.dumps({"max_batch_size": 2}))
    with pytest.raises(ModelError, match="both config.json and config.pbtxt; keep one"):
        discover(root)


def test_served_version_through_the_official_clients(tmp_path, monkeypatch) -> None:
    tc = pytest.importorskip("tritonclient.grpc")
    th = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    from shapeplan.serve.kserve import KServeServer, ModelRepository
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / "plans"))
    root = _triton_repo(tmp_path / "repo")
    with KServeServer(ModelRepository(discover(root)), "127.0.0.1", 0, 0) as s:
        g = tc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        h = th.InferenceServerClient(f"127.0.0.1:{s.http_port}")
        try:
            assert g.get_model_metadata("net", as_json=True)["versions"] == ["3"]
            assert h.is_model_ready("net", "3") and g.is_model_ready("net", "3")
            x = np.random.RandomState(0).rand(3, 8).astype(np.float32)
            i = tc.InferInput("x", [3, 8], "FP32")
            i.set_data_from_numpy(x)
            r = g.infer("net", [i], model_version="3")
            assert r.get_response().model_version == "3"
            np.testing.assert_allclose(r.as_numpy("y"), mlp_ref(x), rtol=1e-5, atol=1e-6)
            with pytest.raises(InferenceServerException, match="model 'net' has no version '1'; it has \\['3'\\]"):
                g.infer("net", [i], model_version="1")
            stats = g.get_inference_statistics("net", as_json=True)["model_stats"][0]
            assert stats["version"] == "3"
            cfg = s.repo.get("net").config
            assert (cfg.max_batch_size, cfg.max_queue_delay_us, cfg.instance_count) == (16, 250, 2)
            assert len(s.repo.get("net").instances) == 2
        finally:
            g.close()
            h.close()


def test_any_config_pbtxt_reads_or_is_a_model_error(tmp_path) -> None:
    """Whatever a config.pbtxt holds (fragments of real configs in any order, any text), the repository
    either reads it or says what is wrong with a ModelError naming the file: never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    frags = ["name:", '"net"', "max_batch_size:", "-1", "8", "99999999999999999999", "input", "[", "]", "{", "}",
             ",", "dims:", "data_type:", "TYPE_FP32", "TYPE_NOPE", "instance_group", "kind:", "KIND_GPU", "gpus:",
             "dynamic_batching", "max_queue_delay_microseconds:", "version_policy:", "specific", "versions:",
             "latest", "num_versions:", "all", "platform:", '"tensorrt_plan"', "backend:", '"onnxruntime"',
             "optimization", "#", "\n", "'", '"', "\\", ":", "<", ">", "model_warmup", "default_model_filename:"]
    root = tmp_path / "repo"
    _triton_repo(root, "")
    path = root / "net" / "config.pbtxt"

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.sampled_from(frags) | st.text(max_size=4), max_size=24))
    def run(parts) -> None:
        path.write_text(" ".join(parts))
        try:
            discover(str(root))
        except ModelError as e:
            assert "config.pbtxt" in str(e)
    run()
