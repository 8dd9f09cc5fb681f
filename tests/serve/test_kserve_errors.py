"""Every bad request gets the protocol's error status with a message naming the input, what was expected
and what came, and the server keeps serving (a good request right after each one)."""
from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from tests.serve.conftest import mlp_ref

grpc = pytest.importorskip("grpc")


def _post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}", body, headers or {})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _json(inputs: list, **kw) -> bytes:
    return json.dumps({"inputs": inputs, **kw}).encode()


X = {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}


def _still_serving(server) -> None:
    code, doc = _post(server, "/v2/models/mlp/infer", _json([X]))
    assert code == 200, doc
    np.testing.assert_allclose(doc["outputs"][0]["data"], mlp_ref(np.full((1, 8), 0.5, np.float32)).ravel(),
                               rtol=1e-5, atol=1e-6)
    import tritonclient.grpc as tg
    c = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    i = tg.InferInput("x", [1, 8], "FP32")
    i.set_data_from_numpy(np.full((1, 8), 0.5, np.float32))
    np.testing.assert_allclose(c.infer("mlp", [i]).as_numpy("y"), mlp_ref(np.full((1, 8), 0.5, np.float32)),
                               rtol=1e-5, atol=1e-6)
    c.close()


BINARY_X = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                   "parameters": {"binary_data_size": 30}}]}).encode()

HTTP_CASES = [
    # (id, path, body, headers, status, words the message must hold)
    ("unknown model", "/v2/models/nope/infer", _json([X]), {}, 404, ["unknown model 'nope'", "mlp"]),
    ("unknown version", "/v2/models/mlp/versions/7/infer", _json([X]), {}, 404, ["no version '7'"]),
    ("wrong input name", "/v2/models/mlp/infer", _json([{**X, "name": "z"}]), {}, 400,
     ["unknown input(s) ['z']", "missing input(s) ['x']", "model 'mlp' expects (x: FP32[-1, 8])"]),
    ("missing input", "/v2/models/gather/infer",
     _json([{"name": "data", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]), {}, 400,
     ["missing input(s) ['idx']"]),
    ("wrong datatype", "/v2/models/mlp/infer", _json([{**X, "datatype": "FP64"}]), {}, 400,
     ["input 'x'", "expected datatype FP32", "got FP64"]),
    ("wrong rank", "/v2/models/mlp/infer", _json([{**X, "shape": [8]}]), {}, 400,
     ["input 'x'", "expected rank 2", "got shape [8]"]),
    ("wrong static dim", "/v2/models/mlp/infer",
     _json([{**X, "shape": [1, 7], "data": [0.5] * 7}]), {}, 400,
     ["input 'x'", "dimension 1 must be 8", "got shape [1, 7]"]),
    ("data count vs shape", "/v2/models/mlp/infer", _json([{**X, "data": [0.5] * 5}]), {}, 400,
     ["input 'x'", "FP32[1, 8] needs 8 elements, got 5"]),
    ("data of the wrong type", "/v2/models/mlp/infer", _json([{**X, "data": ["a"] * 8}]), {}, 400,
     ["input 'x'", "FP32 data must be float values", "'a'"]),
    ("unknown datatype", "/v2/models/mlp/infer", _json([{**X, "datatype": "FP8"}]), {}, 400,
     ["input 'x'", "unknown datatype 'FP8'"]),
    ("binary byte length", "/v2/models/mlp/infer", BINARY_X + bytes(30),
     {"Inference-Header-Content-Length": str(len(BINARY_X))}, 400, ["input 'x'", "needs 32 bytes, got 30"]),
    ("binary size past the end", "/v2/models/mlp/infer", BINARY_X + bytes(10),
     {"Inference-Header-Content-Length": str(len(BINARY_X))}, 400, ["input 'x'", "binary_data_size 30"]),
    ("header length past the body", "/v2/models/mlp/infer", _json([X]),
     {"Inference-Header-Content-Length": "100000"}, 400, ["Inference-Header-Content-Length is 100000"]),
    ("malformed JSON", "/v2/models/mlp/infer", b'{"inputs": [', {}, 400, ["not valid JSON"]),
    ("JSON nested past the recursion limit", "/v2/models/mlp/infer", b'{"inputs": ' + b"[" * 100_000, {}, 400,
     ["not valid JSON", "recursion"]),
    ("shape past what an array holds", "/v2/models/mlp/infer",
     _json([{**X, "shape": [0, 2**62, 2**62], "data": []}]), {}, 400, ["input 'x'", "is not an array shape"]),
    ("no inputs", "/v2/models/mlp/infer", b'{"inputs": []}', {}, 400, ["'inputs' must be a non-empty list"]),
    ("inputs not a list", "/v2/models/mlp/infer", b'{"inputs": {"x": 1}}', {}, 400, ["'inputs' must be"]),
    ("unknown output", "/v2/models/mlp/infer", _json([X], outputs=[{"name": "q"}]), {}, 400,
     ["unknown output(s) ['q']", "['y']"]),
    ("batch over max", "/v2/models/gather/infer",
     _json([{"name": "data", "datatype": "FP32", "shape": [9, 4], "data": [0.0] * 36},
            {"name": "idx", "datatype": "INT64", "shape": [9, 1], "data": [0] * 9}]), {}, 400,
     ["a batch of 9 rows", "1 to 8 rows", "max_batch_size"]),
    ("inputs disagree on the batch", "/v2/models/gather/infer",
     _json([{"name": "data", "datatype": "FP32", "shape": [2, 4], "data": [0.0] * 8},
            {"name": "idx", "datatype": "INT64", "shape": [1, 1], "data": [0]}]), {}, 400,
     ["disagree on the batch", "'data': 2", "'idx': 1"]),
    ("bad gzip", "/v2/models/mlp/infer", b"not gzip", {"Content-Encoding": "gzip"}, 400, ["not valid gzip"]),
]


@pytest.mark.parametrize("case", HTTP_CASES, ids=[c[0] for c in HTTP_CASES])
def test_http_bad_request(server, case) -> None:
    _, path, body, headers, status, words = case
    code, doc = _post(server, path, body, headers)
    assert code == status, doc
    for w in words:
        assert w in doc["error"], (w, doc["error"])
    _still_serving(server)


def test_http_oversized_request(server) -> None:
    """12 MB of JSON: 413 (the default limit is 8 MiB), and a gzip body that inflates past it too."""
    import gzip
    big = _json([{**X, "shape": [1, 8], "data": [0.5] * (3 << 20)}])
    assert len(big) > 10_000_000
    code, doc = _post(server, "/v2/models/mlp/infer", big)
    assert code == 413 and "at most 8388608" in doc["error"] and "--max-request-bytes" in doc["error"]
    bomb = gzip.compress(b" " * (9 << 20))
    code, doc = _post(server, "/v2/models/mlp/infer", bomb, {"Content-Encoding": "gzip"})
    assert code == 413 and "decompressed" in doc["error"]
    _still_serving(server)


def test_http_gzip_request_is_accepted(server) -> None:
    import gzip
    code, doc = _post(server, "/v2/models/mlp/infer", gzip.compress(_json([X])), {"Content-Encoding": "gzip"})
    assert code == 200 and doc["outputs"][0]["shape"] == [1, 8 // 2]


def test_http_unknown_model_metadata_and_ready(server) -> None:
    for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v2/models/nope/stats"):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}{path}")
            raise AssertionError(path)
        except urllib.error.HTTPError as e:
            assert e.code == 404 and "unknown model 'nope'" in json.loads(e.read())["error"]


def test_tritonclient_http_sees_the_message(server, http_client) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException
    i = th.InferInput("x", [1, 8], "FP64")
    i.set_data_from_numpy(np.zeros((1, 8), np.float64))
    with pytest.raises(InferenceServerException, match=r"input 'x': expected datatype FP32 .*got FP64") as e:
        http_client.infer("mlp", [i])
    assert e.value.status() == "400"


# ------------------------------------------------------------------------------------------ gRPC
def _grpc_call(server, method: str = "ModelInfer"):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}",
                               options=[("grpc.max_send_message_length", -1)])
    return ch, ch.unary_unary(f"/inference.GRPCInferenceService/{method}")   # bytes in, bytes out


def _infer_msg(name="x", datatype="FP32", shape=(1, 8), raw: bytes | None = None, model="mlp", **kw):
    from shapeplan.serve.kserve import proto as pb
    req = pb.ModelInferRequest(model_name=model, **kw)
    req.inputs.add(name=name, datatype=datatype, shape=list(shape))
    req.raw_input_contents.append(np.full(shape, 0.5, np.float32).tobytes() if raw is None else raw)
    return req.SerializeToString()


GRPC_CASES = [
    ("unknown model", _infer_msg(model="nope"), "NOT_FOUND", ["unknown model 'nope'"]),
    ("unknown version", _infer_msg(model_version="3"), "NOT_FOUND", ["no version '3'"]),
    ("wrong input name", _infer_msg(name="z"), "INVALID_ARGUMENT", ["unknown input(s) ['z']"]),
    ("wrong datatype", _infer_msg(datatype="INT32"), "INVALID_ARGUMENT",
     ["input 'x'", "expected datatype FP32", "got INT32"]),
    ("wrong shape", _infer_msg(shape=(1, 4)), "INVALID_ARGUMENT", ["input 'x'", "dimension 1 must be 8"]),
    ("raw byte length", _infer_msg(raw=bytes(31)), "INVALID_ARGUMENT", ["input 'x'", "needs 32 bytes, got 31"]),
    ("negative dimension", _infer_msg(shape=(-1, 8), raw=b""), "INVALID_ARGUMENT",
     ["input 'x'", "non-negative integers"]),
    ("malformed protobuf", b"\xff\xff\xff\xff garbage", "INVALID_ARGUMENT", ["not a valid ModelInferRequest"]),
    ("shape past what an array holds", _infer_msg(shape=(0, 2**62, 2**62), raw=b""), "INVALID_ARGUMENT",
     ["input 'x'", "is not an array shape"]),
    ("more dimensions than an array has", _infer_msg(shape=(1,) * 40, raw=bytes(4)), "INVALID_ARGUMENT",
     ["input 'x'", "at most 32 dimensions"]),
]


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
def test_grpc_bad_request(server, case) -> None:
    _, raw, code, words = case
    ch, call = _grpc_call(server)
    with ch, pytest.raises(grpc.RpcError) as e:
        call(raw)
    assert e.value.code().name == code, e.value.details()
    for w in words:
        assert w in e.value.details(), (w, e.value.details())
    _still_serving(server)


def test_grpc_raw_contents_count(server) -> None:
    from shapeplan.serve.kserve import proto as pb
    req = pb.ModelInferRequest(model_name="mlp")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    req.raw_input_contents.extend([bytes(32), bytes(32)])
    ch, call = _grpc_call(server)
    with ch, pytest.raises(grpc.RpcError) as e:
        call(req.SerializeToString())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "2 entries for 1 inputs" in e.value.details()


def test_grpc_oversized_request(server) -> None:
    raw = _infer_msg(shape=(1, 8), raw=bytes(12 << 20))
    ch, call = _grpc_call(server)
    with ch, pytest.raises(grpc.RpcError) as e:
        call(raw)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serving(server)


def test_grpc_unknown_model_metadata(server, grpc_client) -> None:
    from tritonclient.utils import InferenceServerException
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as e:
        grpc_client.get_model_metadata("nope")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match="unknown model"):
        grpc_client.get_inference_statistics("nope")
