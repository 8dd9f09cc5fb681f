"""Tensor (de)serialization: JSON (flat and nested), the binary extension, BYTES, BF16, gRPC contents."""
from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("google.protobuf")
from shapeplan.serve.errors import BadRequestError  # noqa: E402
from shapeplan.serve.kserve import protocol  # noqa: E402
from shapeplan.serve.kserve import proto as pb  # noqa: E402


@pytest.mark.parametrize("dt,arr", [
    ("FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
    ("INT64", np.array([[-5, 7]], np.int64)),
    ("UINT8", np.array([1, 255], np.uint8)),
    ("BOOL", np.array([True, False])),
    ("FP16", np.array([0.5, -2], np.float16)),
    ("BF16", np.array([1.5, -3], ml_dtypes.bfloat16)),
])
def test_bytes_round_trip(dt, arr) -> None:
    assert protocol.datatype_of_array(arr) == dt
    back = protocol.array_from_bytes("t", dt, list(arr.shape), protocol.array_to_bytes(arr))
    assert back.dtype == arr.dtype and back.shape == arr.shape and (back == arr).all()


def test_bytes_tensor_layout() -> None:
    a = np.array([b"ab", b"", "ü".encode()], dtype=object)
    raw = protocol.array_to_bytes(a)
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 2) + "ü".encode()
    assert protocol.array_from_bytes("s", "BYTES", [3], raw).tolist() == [b"ab", b"", "ü".encode()]
    with pytest.raises(BadRequestError, match="input 's': BYTES\\[2\\] needs 2 elements, got 3"):
        protocol.array_from_bytes("s", "BYTES", [2], raw)
    with pytest.raises(BadRequestError, match="runs past the end"):
        protocol.array_from_bytes("s", "BYTES", [1], struct.pack("<I", 9) + b"ab")


def test_json_nested_and_flat() -> None:
    nested = protocol.array_from_json("x", "INT32", [2, 2], [[1, 2], [3, 4]])
    flat = protocol.array_from_json("x", "INT32", [2, 2], [1, 2, 3, 4])
    assert nested.dtype == np.int32 and (nested == flat).all()
    assert protocol.array_from_json("b", "BOOL", [2], [True, False]).tolist() == [True, False]
    assert protocol.array_from_json("s", "BYTES", [1], ["hi"]).tolist() == [b"hi"]
    with pytest.raises(BadRequestError, match="INT32 data must be int values, got 1.5"):
        protocol.array_from_json("x", "INT32", [1], [1.5])
    with pytest.raises(BadRequestError, match="does not fit UINT8"):
        protocol.array_from_json("x", "UINT8", [1], [300])
    with pytest.raises(BadRequestError, match="shape must be a list of non-negative integers"):
        protocol.array_from_json("x", "FP32", [1, "a"], [1.0])


def test_http_binary_request_and_response() -> None:
    x = np.arange(4, dtype=np.float32)
    head = json.dumps({"id": "7", "inputs": [{"name": "x", "datatype": "FP32", "shape": [4],
                                              "parameters": {"binary_data_size": 16}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}]}).encode()
    req = protocol.decode_http(head + x.tobytes(), len(head))
    assert (req.feeds["x"] == x).all() and req.outputs == ["y", "z"] and req.binary_outputs == {"y"}
    body, n = protocol.encode_http("m", "1", req, {"y": x * 2, "z": np.array([1], np.int64)})
    doc = json.loads(body[:n])
    assert doc["id"] == "7" and doc["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert doc["outputs"][1]["data"] == [1]
    assert np.frombuffer(body[n:], np.float32).tolist() == [0, 2, 4, 6]
    # no outputs listed + binary_data_output: every output binary
    req = protocol.decode_http(json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
                                           "parameters": {"binary_data_output": True}}).encode(), None)
    _, n = protocol.encode_http("m", "1", req, {"y": np.ones(1, np.float32)})
    assert n is not None


def test_grpc_contents_and_raw() -> None:
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="i", datatype="INT32", shape=[3])
    t.contents.int_contents.extend([1, -2, 3])
    t = req.inputs.add(name="s", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append(b"q")
    d = protocol.decode_grpc(req)
    assert d.feeds["i"].dtype == np.int32 and d.feeds["i"].tolist() == [1, -2, 3] and d.feeds["s"].tolist() == [b"q"]
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(BadRequestError, match="FP16 must come in raw_input_contents"):
        protocol.decode_grpc(req)
    res = pb.ModelInferResponse.FromString(protocol.encode_grpc("m", "1", d, {"y": np.array([[1, 2]], np.int64)}))
    assert res.outputs[0].datatype == "INT64" and list(res.outputs[0].shape) == [1, 2]
    assert np.frombuffer(res.raw_output_contents[0], np.int64).tolist() == [1, 2]


# ------------------------------------------------------------------ any request: decoded, or a BadRequestError
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4),
                     max_leaves=12)
_DIMS = st.integers(-2, 4) | st.sampled_from([2**31, 2**62, 2**63, 2**70]) | st.booleans()


@st.composite
def _tensor(draw) -> dict:
    """An input as a client might send it: mostly plausible fields, any of them sometimes wrong."""
    t = {"name": draw(st.text(max_size=3) | _JSON), "datatype": draw(st.sampled_from(list(protocol.DATATYPES)) | _JSON),
         "shape": draw(st.lists(_DIMS, max_size=4) | _JSON)}
    if draw(st.booleans()):
        t["data"] = draw(st.lists(st.integers(-300, 300) | st.floats() | st.booleans() | st.text(max_size=2)
                                  | st.lists(st.integers(-3, 3), max_size=3), max_size=6) | _JSON)
    elif draw(st.booleans()):
        t["parameters"] = {"binary_data_size": draw(st.integers(-2, 40) | _JSON)}
    else:
        t["parameters"] = _shm_params(draw)
    return t


def _shm_params(draw) -> dict:
    """A shared memory placement in region "r" (64 bytes, registered in ``REGIONS``), sometimes wrong."""
    p = {"shared_memory_region": draw(st.sampled_from(["r", "nope", ""]) | _JSON),
         "shared_memory_byte_size": draw(st.integers(-2, 80) | _JSON)}
    if draw(st.booleans()):
        p["shared_memory_offset"] = draw(st.integers(-2, 80) | _JSON)
    return p


def _regions():
    """One 64-byte region "r" over a shared memory object of this process (unlinked at once: the mapping
    stays), or None where there is no /dev/shm."""
    import os
    from multiprocessing import shared_memory

    from shapeplan.serve.kserve.shm import SharedMemoryRegions
    if not os.path.isdir("/dev/shm"):
        return None
    m = shared_memory.SharedMemory(create=True, size=128)
    m.buf[:128] = bytes(range(128))
    regions = SharedMemoryRegions()
    regions.register("r", "/" + m.name, 32, 64)
    m.close()
    m.unlink()
    return regions


REGIONS = _regions()


@st.composite
def _http_body(draw) -> tuple[bytes, int | None]:
    doc = {"inputs": draw(st.lists(_tensor(), max_size=3) | _JSON)}
    for key in ("id", "outputs", "parameters"):
        if draw(st.booleans()):
            doc[key] = draw(st.lists(st.fixed_dictionaries({"name": st.text(max_size=3) | _JSON}), max_size=2) | _JSON)
    if isinstance(doc.get("outputs"), list):
        for o in doc["outputs"]:
            if isinstance(o, dict) and draw(st.booleans()):
                o["parameters"] = _shm_params(draw)
    head = json.dumps(doc).encode()
    tail = draw(st.binary(max_size=48))
    length = draw(st.sampled_from([len(head), None]) | st.integers(-3, len(head) + len(tail) + 3))
    return head + tail, length


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_http_body() | st.tuples(st.binary(max_size=64) | st.just(b"[" * 5000), st.none() | st.integers(-2, 80)))
def test_any_http_body_decodes_or_is_a_bad_request(body) -> None:
    """Whatever a client sends, the HTTP infer body decodes or is refused with a BadRequestError (a 400 that names
    what is wrong), never another exception (a 500): wrong types anywhere, shapes past what an array can hold,
    lengths that disagree, JSON nested deeper than Python's recursion limit, bytes that are not JSON."""
    raw, length = body
    try:
        req = protocol.decode_http(raw, length, REGIONS)
    except BadRequestError as e:
        assert str(e)
        return
    assert req.feeds and all(isinstance(a, np.ndarray) for a in req.feeds.values())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=3), st.sampled_from(list(protocol.DATATYPES)) | st.text(max_size=5),
                          st.lists(st.integers(-2, 4) | st.sampled_from([2**62, 2**63 - 1, -(2**63)]), max_size=40),
                          st.binary(max_size=24)), max_size=3))
def test_any_grpc_request_decodes_or_is_a_bad_request(inputs) -> None:
    """The same for a gRPC request's raw contents: any names, datatypes, int64 dimensions (up to 40 of them)
    and byte lengths."""
    req = pb.ModelInferRequest(model_name="m")
    for name, dt, shape, raw in inputs:
        req.inputs.add(name=name, datatype=dt, shape=shape)
        req.raw_input_contents.append(raw)
    try:
        d = protocol.decode_grpc(req)
    except BadRequestError as e:
        assert str(e)
        return
    assert all(isinstance(a, np.ndarray) for a in d.feeds.values())


_PARAM = st.one_of(st.tuples(st.just("string_param"), st.sampled_from(["r", "nope", ""])),
                   st.tuples(st.just("int64_param"), st.integers(-3, 100) | st.sampled_from([2**62, -(2**63)])),
                   st.tuples(st.just("bool_param"), st.booleans()), st.tuples(st.just("double_param"), st.floats()))
_PARAMS = st.dictionaries(st.sampled_from(["shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
                                           "classification", "binary_data_size"]), _PARAM, max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["FP32", "INT8", "BYTES"]),
                          st.lists(st.integers(0, 4), max_size=3), _PARAMS, st.booleans()), min_size=1, max_size=3),
       st.lists(st.tuples(st.sampled_from(["y", "z"]), _PARAMS), max_size=2))
def test_any_grpc_parameters_decode_or_are_a_bad_request(inputs, outputs) -> None:
    """gRPC inputs and requested outputs with any parameters (shared memory placements in the registered
    64-byte region "r" or not, of any parameter type; classification): decoded, or a BadRequestError."""
    req = pb.ModelInferRequest(model_name="m")
    for name, dt, shape, params, raw in inputs:
        t = req.inputs.add(name=name, datatype=dt, shape=shape)
        for key, (kind, value) in params.items():
            setattr(t.parameters[key], kind, value)
        if raw:
            req.raw_input_contents.append(b"\x01" * (4 * int(np.prod(shape))))
    for name, params in outputs:
        o = req.outputs.add(name=name)
        for key, (kind, value) in params.items():
            setattr(o.parameters[key], kind, value)
    try:
        d = protocol.decode_grpc(pb.ModelInferRequest.FromString(req.SerializeToString()), REGIONS)
    except BadRequestError as e:
        assert str(e)
        return
    assert all(isinstance(a, np.ndarray) for a in d.feeds.values())
