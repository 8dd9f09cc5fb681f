"""The official KServe v2 clients (tritonclient.http / tritonclient.grpc) against a real server on
loopback: metadata, inference on an ONNX and a torch.export model (the same arrays as engine.run and as
ONNX Runtime), statistics and /metrics."""
from __future__ import annotations

import json
import os
import urllib.request

import numpy as np
import pytest

import shapeplan as sp
from tests.serve.conftest import W, B, mlp_ref

ort = pytest.importorskip("onnxruntime")


def _get(server, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}") as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_health_and_metadata(server, http_client, grpc_client) -> None:
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    assert http_client.is_model_ready("mlp") and grpc_client.is_model_ready("export")
    assert sorted(server.repo.models) == ["export", "fixed", "gather", "mlp"]      # llm/ and notes.txt skipped
    meta = http_client.get_model_metadata("mlp")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["platform"] == "onnx" and meta["versions"] == ["1"]
    gm = grpc_client.get_model_metadata("fixed", as_json=True)
    assert gm["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["2", "3"]}]   # int64 as JSON strings
    sm = grpc_client.get_server_metadata(as_json=True)
    assert sm["name"] == "shapeplan" and "binary_tensor_data" in sm["extensions"]
    assert http_client.get_server_metadata()["extensions"] == sm["extensions"]


def _ort(model_path: str, feeds: dict) -> list:
    return ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("rows", [1, 3])
def test_onnx_model_http_and_grpc_match_engine_and_ort(server, http_client, grpc_client, repo_dir, rows) -> None:
    import tritonclient.grpc as tg
    import tritonclient.http as th
    x = np.random.RandomState(rows).rand(rows, 8).astype(np.float32)
    path = os.path.join(repo_dir, "mlp.onnx")
    want_engine = sp.compile(path, disk_cache=False).run({"x": x})["y"]
    want_ort = _ort(path, {"x": x})[0]
    for client, mod, binary in ((http_client, th, True), (http_client, th, False), (grpc_client, tg, None)):
        i = mod.InferInput("x", list(x.shape), "FP32")
        if binary is None:
            i.set_data_from_numpy(x)
            outs = [mod.InferRequestedOutput("y")]
        else:
            i.set_data_from_numpy(x, binary_data=binary)
            outs = [mod.InferRequestedOutput("y", binary_data=binary)]
        got = client.infer("mlp", [i], outputs=outs).as_numpy("y")
        assert got.dtype == np.float32 and got.shape == (rows, 4)
        np.testing.assert_allclose(got, want_engine, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got, want_ort, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, mlp_ref(x), rtol=1e-5, atol=1e-6)


def test_torch_export_model_matches_engine_torch_and_ort(server, http_client, grpc_client, repo_dir, tmp_path) -> None:
    import onnx
    import torch
    import tritonclient.grpc as tg
    import tritonclient.http as th
    from onnx import TensorProto, helper, numpy_helper
    from tests.serve.conftest import TorchMLP
    meta = grpc_client.get_model_metadata("export", as_json=True)
    (inp,), (out,) = meta["inputs"], meta["outputs"]
    assert inp["datatype"] == "FP32" and inp["shape"] == ["-1", "8"] and out["shape"] == ["-1", "4"]
    x = np.random.RandomState(7).rand(5, 8).astype(np.float32)
    ep = torch.export.load(os.path.join(repo_dir, "export", "model.pt2"))
    want_engine = sp.compile(ep, disk_cache=False).run({inp["name"]: x})[out["name"]]
    m = TorchMLP()
    with torch.no_grad():
        want_torch = m(torch.from_numpy(x)).numpy()
    # ONNX Runtime on the same weights (the Linear as MatMul + Add)
    w, b = m.fc.weight.detach().numpy().T.copy(), m.fc.bias.detach().numpy()
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
                           helper.make_node("Relu", ["a"], ["y"])], "ref",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    ref = str(tmp_path / "ref.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), ref)
    want_ort = _ort(ref, {"x": x})[0]
    for client, mod in ((http_client, th), (grpc_client, tg)):
        i = mod.InferInput(inp["name"], [5, 8], "FP32")
        i.set_data_from_numpy(x)
        got = client.infer("export", [i]).as_numpy(out["name"])
        np.testing.assert_allclose(got, want_engine, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got, want_torch, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, want_ort, rtol=1e-5, atol=1e-6)


def test_fixed_shape_model_and_json_contents(server, http_client, grpc_client) -> None:
    import tritonclient.grpc as tg
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    i = tg.InferInput("x", [2, 3], "FP32")
    i.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc_client.infer("fixed", [i]).as_numpy("y"), x * x)
    # plain JSON (no binary extension), nested data, through urllib
    body = json.dumps({"id": "r1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                                                "data": x.tolist()}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/fixed/infer", body)
    with urllib.request.urlopen(req) as r:
        doc = json.loads(r.read())
    assert doc["id"] == "r1" and doc["model_name"] == "fixed"
    assert doc["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 3], "data": (x * x).ravel().tolist()}]


def test_grpc_typed_contents(server) -> None:
    """InferTensorContents (not raw) in, raw contents out."""
    import grpc
    from shapeplan.serve.kserve import proto as pb
    x = np.random.RandomState(3).rand(2, 8).astype(np.float32)
    req = pb.ModelInferRequest(model_name="mlp", id="c1")
    t = req.inputs.add(name="x", datatype="FP32", shape=[2, 8])
    t.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=pb.ModelInferResponse.FromString)
        res = call(req)
    assert res.id == "c1" and res.outputs[0].name == "y" and list(res.outputs[0].shape) == [2, 4]
    got = np.frombuffer(res.raw_output_contents[0], np.float32).reshape(2, 4)
    np.testing.assert_allclose(got, mlp_ref(x), rtol=1e-5, atol=1e-6)


def test_statistics_and_metrics(server, http_client, grpc_client) -> None:
    import tritonclient.grpc as tg
    x = np.ones((1, 8), np.float32)
    i = tg.InferInput("x", [1, 8], "FP32")
    i.set_data_from_numpy(x)
    for _ in range(3):
        grpc_client.infer("mlp", [i])
    st = http_client.get_inference_statistics("mlp")["model_stats"][0]
    assert st["name"] == "mlp" and st["inference_count"] >= 3 and st["execution_count"] >= 3
    assert st["inference_stats"]["success"]["count"] >= 3 and st["inference_stats"]["queue"]["count"] >= 3
    plans = st["plan_stats"]
    assert {p["signature"][0] for p in plans} >= {"1x8", "2x8", "4x8", "8x8", "16x8", "32x8"}
    assert all(p["pinned"] for p in plans) and all(p["phase"] == "REPLAYING" for p in plans), plans
    assert next(p for p in plans if p["signature"] == ["1x8"])["replays"] >= 3
    assert any(b["batch_size"] == 1 for b in st["batch_stats"])
    gs = grpc_client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert int(gs["inference_count"]) == st["inference_count"] or int(gs["inference_count"]) >= 3
    everything = http_client.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in everything} == {"mlp", "export", "fixed", "gather"}
    status, text = _get(server, "/metrics")
    text = text.decode()
    assert status == 200
    assert 'shapeplan_inference_requests_total{model="mlp",outcome="success",version="1"}' in text
    assert 'shapeplan_plans{model="mlp",phase="REPLAYING",version="1"} 6.0' in text
    assert "shapeplan_plan_replays_total" in text and "shapeplan_inference_duration_seconds_total" in text


def test_model_config_endpoint(server, http_client, grpc_client) -> None:
    """Triton's model configuration extension: the config as Triton's ModelConfig (what tritonclient's
    get_model_config reads, over HTTP and gRPC), ours beside it over HTTP."""
    status, body = _get(server, "/v2/models/gather/config")
    doc = json.loads(body)
    assert status == 200 and doc["max_batch_size"] == 8
    assert doc["dynamic_batching"] == {"max_queue_delay_microseconds": 300_000}
    assert doc["input"] == [{"name": "data", "data_type": "TYPE_FP32", "dims": [4]},
                            {"name": "idx", "data_type": "TYPE_INT64", "dims": [1]}]
    assert doc["instance_group"] == [{"count": 1, "kind": "KIND_CPU"}] and doc["backend"] == "onnxruntime"
    assert doc["shapeplan"]["buckets"] == [1, 2, 4, 8] and doc["shapeplan"]["max_queue_delay_us"] == 300_000
    assert http_client.get_model_config("gather") == doc
    g = grpc_client.get_model_config("gather").config
    assert (g.name, g.platform, g.max_batch_size) == ("gather", "onnxruntime_onnx", 8)
    assert [(t.name, list(t.dims)) for t in g.output] == [("out", [1])]
    assert g.dynamic_batching.max_queue_delay_microseconds == 300_000 and g.instance_group[0].count == 1
    fixed = grpc_client.get_model_config("fixed").config
    assert fixed.max_batch_size == 0 and list(fixed.input[0].dims) == [2, 3] and not fixed.HasField("dynamic_batching")


def test_the_served_config_written_as_config_pbtxt_reads_back_the_same(server, tmp_path) -> None:
    from google.protobuf import json_format, text_format

    from shapeplan.serve.kserve import proto as pb
    from shapeplan.serve.kserve.triton_config import config_from_pbtxt, read_pbtxt
    for name in ("mlp", "gather", "fixed", "export"):
        m = server.repo.get(name)
        msg = json_format.ParseDict(m.triton_config(), pb.ModelConfig(), ignore_unknown_fields=True)
        (tmp_path / "config.pbtxt").write_text(text_format.MessageToString(msg))
        back = config_from_pbtxt(read_pbtxt(str(tmp_path / "config.pbtxt")), "config.pbtxt", name, m.path)
        want = m.config
        assert back.max_batch_size == m.spec.max_batch_size and back.dynamic_batching == m.spec.batching
        assert (back.device, back.instance_count) == (want.device, want.instance_count)
        if m.spec.batching:
            assert back.max_queue_delay_us == want.max_queue_delay_us


def test_classification_extension(server, http_client, grpc_client) -> None:
    """Triton's classification extension (tritonclient's ``class_count``): an output comes back as its top k,
    "value:index" per batch row, largest first; over HTTP (JSON and binary) and gRPC."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    x = np.random.RandomState(3).rand(6, 8).astype(np.float32) * 4
    ref = mlp_ref(x)
    for mod, c, kw in ((th, http_client, {"binary_data": False}), (th, http_client, {}), (tg, grpc_client, {})):
        i = mod.InferInput("x", [6, 8], "FP32")
        i.set_data_from_numpy(x)
        got = c.infer("mlp", [i], outputs=[mod.InferRequestedOutput("y", class_count=2, **kw)]).as_numpy("y")
        assert got.shape == (6, 2)
        for row, want in zip(got, ref):
            pairs = [cell.decode().split(":") if isinstance(cell, bytes) else cell.split(":") for cell in row]
            values, idx = [float(v) for v, _ in pairs], [int(k) for _, k in pairs]
            np.testing.assert_allclose(values, np.sort(want)[::-1][:2], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(want[idx], values, rtol=1e-5, atol=1e-6)
    i = tg.InferInput("x", [6, 8], "FP32")
    i.set_data_from_numpy(x)
    o = tg.InferRequestedOutput("y", class_count=9)          # more than the 4 values a row has: all 4
    assert grpc_client.infer("mlp", [i], outputs=[o]).as_numpy("y").shape == (6, 4)
    import httpx
    r = httpx.post(f"http://127.0.0.1:{server.http_port}/v2/models/mlp/infer",
                   json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}],
                         "outputs": [{"name": "y", "parameters": {"classification": 0}}]})
    assert r.status_code == 400 and "classification must be a positive integer" in r.json()["error"]
