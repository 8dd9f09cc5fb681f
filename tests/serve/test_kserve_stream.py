"""Triton's streaming extension (``ModelStreamInfer``) through the official client's stream API
(``tritonclient.grpc``: ``start_stream`` / ``async_stream_infer``) against the real server: pipelined
requests come back right and matched by id, they batch together, a bad request gets its own error
response and the stream, and the server, go on serving."""
from __future__ import annotations

import queue

import numpy as np
import pytest

import shapeplan as sp
from tests.serve.conftest import mlp_ref

tg = pytest.importorskip("tritonclient.grpc")


def _stream(grpc_client):
    """Start a stream; returns a queue of (request id, result or None, error or None), one per response."""
    got: queue.Queue = queue.Queue()

    def callback(result, error):
        rid = result.get_response().id if result is not None else None
        got.put((rid, result, error))
    grpc_client.start_stream(callback=callback)
    return got


def _input(name: str, a: np.ndarray, datatype: str):
    i = tg.InferInput(name, list(a.shape), datatype)
    i.set_data_from_numpy(a)
    return i


def _collect(got: queue.Queue, n: int) -> list:
    return [got.get(timeout=30) for _ in range(n)]


def _still_streaming(grpc_client) -> None:
    """A new stream gets its answer."""
    got = _stream(grpc_client)
    try:
        grpc_client.async_stream_infer("mlp", [_input("x", np.ones((1, 8), np.float32), "FP32")], request_id="after")
        ((rid, result, error),) = _collect(got, 1)
    finally:
        grpc_client.stop_stream()
    assert error is None and rid == "after" and result.as_numpy("y").shape == (1, 4)


def test_pipelined_requests_match_engine_and_batch_together(server, grpc_client, repo_dir) -> None:
    import os
    engine = sp.compile(os.path.join(repo_dir, "mlp.onnx"), disk_cache=False)
    xs = {f"r{i}": np.random.RandomState(i).rand(1 + i % 3, 8).astype(np.float32) for i in range(24)}
    model = server.repo.models["mlp"]
    before = model.stats.snapshot()
    got = _stream(grpc_client)
    try:
        for rid, x in xs.items():           # all sent before any answer is read
            grpc_client.async_stream_infer("mlp", [_input("x", x, "FP32")], request_id=rid,
                                           outputs=[tg.InferRequestedOutput("y")])
        responses = _collect(got, len(xs))
    finally:
        grpc_client.stop_stream()
    assert sorted(rid for rid, _, _ in responses) == sorted(xs)
    for rid, result, error in responses:
        assert error is None
        y = result.as_numpy("y")
        np.testing.assert_allclose(y, engine.run({"x": xs[rid]})["y"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(y, mlp_ref(xs[rid]), rtol=1e-5, atol=1e-6)
    after = model.stats.snapshot()
    rows = sum(len(x) for x in xs.values())
    assert after["inference_count"] - before["inference_count"] == rows
    # served concurrently, so they share engine calls: fewer calls than requests
    assert after["execution_count"] - before["execution_count"] < len(xs)


def test_bad_requests_get_their_own_error_and_the_stream_goes_on(server, grpc_client) -> None:
    x = np.ones((1, 8), np.float32)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    bad = {
        "nomodel": ("nope", [_input("x", x, "FP32")], "unknown model 'nope'"),
        "name": ("mlp", [_input("z", x, "FP32")], "missing input(s) ['x'] and unknown input(s) ['z']"),
        "dtype": ("mlp", [_input("x", x.astype(np.float64), "FP64")], "expected datatype FP32"),
        "shape": ("mlp", [_input("x", np.ones((1, 5), np.float32), "FP32")],
                  "input 'x': dimension 1 must be 8"),
        "kernel": ("gather", [_input("data", data[:1], "FP32"), _input("idx", np.array([[10]]), "INT64")],
                   "index 10 is out of bounds"),
    }
    good = {"ok1": ("mlp", [_input("x", x, "FP32")]),
            "ok2": ("gather", [_input("data", data[1:], "FP32"), _input("idx", np.array([[2]]), "INT64")])}
    got = _stream(grpc_client)
    try:
        for rid, (model, inputs, _) in bad.items():
            grpc_client.async_stream_infer(model, inputs, request_id=rid)
        for rid, (model, inputs) in good.items():
            grpc_client.async_stream_infer(model, inputs, request_id=rid)
        responses = _collect(got, len(bad) + len(good))
    finally:
        grpc_client.stop_stream()
    errors = {}
    results = {}
    for rid, result, error in responses:
        if error is not None:
            errors[len(errors)] = str(error)
        else:
            results[rid] = result
    assert len(errors) == len(bad) and sorted(results) == ["ok1", "ok2"]
    for _, _, want in bad.values():
        assert any(want in e for e in errors.values()), (want, errors)
    np.testing.assert_allclose(results["ok1"].as_numpy("y"), mlp_ref(x), rtol=1e-5, atol=1e-6)
    assert results["ok2"].as_numpy("out").tolist() == [[6.0]]
    assert grpc_client.is_server_live()


def test_error_responses_carry_the_request_id_and_garbage_does_not_end_the_stream(server) -> None:
    """On the wire (tritonclient's callback drops the id of a failed request): the error response names
    the request it answers; a message that is not protobuf gets an error response, not a closed stream."""
    import grpc
    from shapeplan.serve.kserve import proto as pb
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        ok = pb.ModelInferRequest(model_name="mlp", id="good")
        t = ok.inputs.add(name="x", datatype="FP32", shape=[1, 8])
        assert t.name == "x"
        ok.raw_input_contents.append(np.ones((1, 8), np.float32).tobytes())
        wrong = pb.ModelInferRequest(model_name="nope", id="which")
        out = [pb.ModelStreamInferResponse.FromString(r)
               for r in call(iter([b"\xff\xff\xff", wrong.SerializeToString(), ok.SerializeToString()]))]
    finally:
        ch.close()
    assert len(out) == 3
    by_id = {r.infer_response.id: r for r in out}
    assert "not a valid ModelInferRequest" in by_id[""].error_message
    assert "nope" in by_id["which"].error_message and by_id["which"].infer_response.model_name == "nope"
    good = by_id["good"]
    assert good.error_message == "" and good.infer_response.outputs[0].name == "y"
    y = np.frombuffer(good.infer_response.raw_output_contents[0], np.float32).reshape(1, 4)
    np.testing.assert_allclose(y, mlp_ref(np.ones((1, 8), np.float32)), rtol=1e-5, atol=1e-6)


def test_stream_response_bytes_are_upbs() -> None:
    from shapeplan.serve.kserve import proto as pb
    from shapeplan.serve.kserve import wire
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    mine = wire.infer_response("m", "1", "id7", [("y", "FP32", a.shape, a)], stream=True)
    want = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(
        model_name="m", model_version="1", id="id7",
        outputs=[pb.ModelInferResponse.InferOutputTensor(name="y", datatype="FP32", shape=[2, 3])],
        raw_output_contents=[a.tobytes()]))
    assert mine == want.SerializeToString()
    from shapeplan.serve.kserve.grpc_server import _stream_error
    err = _stream_error("bad x", "m", "", "id7")
    assert err == pb.ModelStreamInferResponse(error_message="bad x", infer_response=pb.ModelInferResponse(
        model_name="m", id="id7")).SerializeToString()
    assert _stream_error("garbage", "", "", "") == pb.ModelStreamInferResponse(
        error_message="garbage").SerializeToString()


def test_a_client_that_leaves_mid_stream_costs_nobody_else(server, grpc_client) -> None:
    """The client cancels while its request waits in gather's 300 ms batching window: the request is
    served into a call that has ended, and the server goes on (a new stream gets its answer)."""
    import grpc
    import time
    from shapeplan.serve.kserve import proto as pb
    req = pb.ModelInferRequest(model_name="gather", id="gone")
    req.inputs.add(name="data", datatype="FP32", shape=[1, 4])
    req.inputs.add(name="idx", datatype="INT64", shape=[1, 1])
    req.raw_input_contents.extend([np.ones((1, 4), np.float32).tobytes(), np.zeros((1, 1), np.int64).tobytes()])
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        sent = queue.Queue()
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")(iter(sent.get, None))
        sent.put(req.SerializeToString())
        time.sleep(0.05)
        call.cancel()
        with pytest.raises(grpc.RpcError) as e:
            next(call)
        assert e.value.code() == grpc.StatusCode.CANCELLED
    finally:
        ch.close()
    time.sleep(0.4)                         # the request's batch runs and finds its call gone
    _still_streaming(grpc_client)


def test_an_oversized_message_ends_its_stream_only(server, grpc_client) -> None:
    """grpcio's own size check (--max-request-bytes) ends the stream with RESOURCE_EXHAUSTED (documented);
    the server goes on serving new streams."""
    import grpc
    from shapeplan.serve.kserve import proto as pb
    req = pb.ModelInferRequest(model_name="mlp", id="big")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    req.raw_input_contents.append(bytes(12 << 20))
    ch = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")(iter([req.SerializeToString()]))
        with pytest.raises(grpc.RpcError) as e:
            list(call)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        ch.close()
    _still_streaming(grpc_client)
