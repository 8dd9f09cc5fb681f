"""The hand-written ModelInferRequest reader and ModelInferResponse writer against upb: the same fields
read, the same bytes written, None (upb's turn) for whatever the reader does not take."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("google.protobuf")
from shapeplan.serve.kserve import proto as pb  # noqa: E402
from shapeplan.serve.kserve import protocol, wire  # noqa: E402


def _same(view: wire.InferRequestView, msg) -> None:
    assert (view.model_name, view.model_version, view.id) == (msg.model_name, msg.model_version, msg.id)
    assert [(t.name, t.datatype, list(t.shape)) for t in view.inputs] == \
           [(t.name, t.datatype, list(t.shape)) for t in msg.inputs]
    assert [o.name for o in view.outputs] == [o.name for o in msg.outputs]
    assert [bytes(r) for r in view.raw_input_contents] == list(msg.raw_input_contents)


def _request(**kw) -> "pb.ModelInferRequest":
    req = pb.ModelInferRequest(**kw)
    rng = np.random.RandomState(0)
    for name, dt, shape in (("x", "FP32", [2, 3]), ("idx", "INT64", [2, 1]), ("é", "FP16", [0, 5])):
        req.inputs.add(name=name, datatype=dt, shape=shape)
        req.raw_input_contents.append(rng.bytes(4 * 6) if name == "x" else rng.bytes(16) if name == "idx" else b"")
    return req


@pytest.mark.parametrize("kw", [{}, {"model_name": "m"}, {"model_name": "resnet", "model_version": "3", "id": "r-1"}])
def test_reads_what_upb_reads(kw) -> None:
    req = _request(**kw)
    req.outputs.add(name="y")
    req.outputs.add(name="z")
    raw = req.SerializeToString()
    view = wire.read_infer_request(raw)
    assert view is not None
    _same(view, pb.ModelInferRequest.FromString(raw))
    assert all(isinstance(r, memoryview) and r.obj is raw for r in view.raw_input_contents)   # no copy


def test_negative_and_large_dimensions_and_unpacked_shape() -> None:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[-1, 2**40, 0, -(2**63)])
    req.raw_input_contents.append(b"")
    raw = req.SerializeToString()
    assert wire.read_infer_request(raw).inputs[0].shape == [-1, 2**40, 0, -(2**63)]
    # shape written unpacked (field 3 as varints, legal for parsers): [1, 768]
    t = bytes([0x0A, 1]) + b"x" + bytes([0x18, 1, 0x18]) + bytes([0x80, 0x06])
    raw = bytes([0x2A, len(t)]) + t + bytes([0x3A, 0])
    view = wire.read_infer_request(raw)
    assert view.inputs[0].shape == [1, 768] == list(pb.ModelInferRequest.FromString(raw).inputs[0].shape)


def _with_parameters() -> bytes:
    req = _request()
    req.parameters["priority"].int64_param = 1
    return req.SerializeToString()


def _with_input_parameters() -> bytes:
    req = _request()
    req.inputs[0].parameters["p"].bool_param = True
    return req.SerializeToString()


def _with_output_parameters() -> bytes:
    req = _request()
    req.outputs.add(name="y").parameters["classification"].int64_param = 3
    return req.SerializeToString()


def _typed_contents() -> bytes:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    return req.SerializeToString()


@pytest.mark.parametrize("raw", [
    _with_parameters(), _with_input_parameters(), _with_output_parameters(), _typed_contents(),
    _request().SerializeToString() + bytes([0x40, 1]),              # unknown field 8 (varint)
    _request().SerializeToString() + bytes([0x0D, 1, 2, 3, 4]),     # fixed32 wire type
    b"\xff\xff\xff\xff garbage",                                     # malformed
    _request().SerializeToString()[:-3],                             # truncated
    bytes([0x0A, 2, 0xC3, 0x28]),                                    # model_name not UTF-8
], ids=["parameters", "input parameters", "output parameters", "typed contents", "unknown field", "fixed32",
        "garbage", "truncated", "bad utf-8"])
def test_anything_else_is_left_to_upb(raw) -> None:
    assert wire.read_infer_request(raw) is None


def test_decode_grpc_takes_the_view() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    req = pb.ModelInferRequest(model_name="m", id="7")
    req.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    req.raw_input_contents.append(x.tobytes())
    req.outputs.add(name="y")
    d = protocol.decode_grpc(wire.read_infer_request(req.SerializeToString()))
    np.testing.assert_array_equal(d.feeds["x"], x)
    assert d.outputs == ["y"] and d.id == "7"


@pytest.mark.parametrize("outputs", [
    {"y": np.arange(6, dtype=np.float32).reshape(2, 3)},
    {"a": np.array(3.5, np.float64), "b": np.zeros((0, 4), np.int32), "s": np.array([b"hi", b""], dtype=object)},
    {"big": np.random.RandomState(0).rand(4, 1000).astype(np.float32)[1:3]},      # a view of a batch
])
@pytest.mark.parametrize("ids", [("m", "1", ""), ("resnet-ü", "", "req-9")])
def test_response_bytes_are_upbs(outputs, ids) -> None:
    model, version, rid = ids
    req = protocol.InferRequest({}, id=rid)
    ours = protocol.encode_grpc(model, version, req, outputs)
    ref = pb.ModelInferResponse(model_name=model, model_version=version, id=rid)
    for name, a in outputs.items():
        t = ref.outputs.add()
        t.name, t.datatype = name, protocol.datatype_of_array(a)
        t.shape.extend(a.shape)
        ref.raw_output_contents.append(protocol.array_to_bytes(a))
    assert ours == ref.SerializeToString()


# ------------------------------------------------------------ any bytes: the reader agrees with upb or steps aside
hypothesis = pytest.importorskip("hypothesis")
from google.protobuf.message import DecodeError  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_DATATYPES = ["FP32", "FP16", "INT64", "INT8", "BOOL", "BYTES", "BF16", ""]


@st.composite
def _messages(draw, upb_only: bool | None = None) -> bytes:
    """A valid ModelInferRequest in the subset the reader takes (names with any Unicode, shapes with any
    int64, empty or absent fields), sometimes (``upb_only`` None) with an input parameter, which the reader
    leaves to upb."""
    text = st.text(max_size=12)
    req = pb.ModelInferRequest(model_name=draw(text), model_version=draw(text), id=draw(text))
    for _ in range(draw(st.integers(0, 3))):
        req.inputs.add(name=draw(text), datatype=draw(st.sampled_from(_DATATYPES)),
                       shape=draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4)))
        req.raw_input_contents.append(draw(st.binary(max_size=24)))
    for _ in range(draw(st.integers(0, 2))):
        req.outputs.add(name=draw(text))
    if req.inputs and (upb_only if upb_only is not None else draw(st.booleans())):
        req.inputs[0].parameters["p"].int64_param = draw(st.integers(-5, 5))
    return req.SerializeToString()


@st.composite
def _damaged(draw) -> bytes:
    """A valid message cut short, with bytes changed, inserted or appended (what a broken client or a
    hostile one sends)."""
    raw = bytearray(draw(_messages()))
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["cut", "flip", "insert", "append"]))
        at = draw(st.integers(0, len(raw)))
        if what == "cut":
            del raw[at:]
        elif what == "flip" and at < len(raw):
            raw[at] ^= draw(st.integers(1, 255))
        elif what == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            raw += draw(st.binary(min_size=1, max_size=6))
    return bytes(raw)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_messages(), _damaged(), st.binary(max_size=64)))
def test_any_bytes_read_as_upb_reads_them_or_left_to_upb(raw) -> None:
    """Whatever arrives, the reader never raises, and when it returns a view, upb parses the same bytes and
    reads the same fields: a malformed message is never read as a request, and none is read otherwise."""
    view = wire.read_infer_request(raw)
    try:
        ref = pb.ModelInferRequest.FromString(raw)
    except DecodeError:
        assert view is None, "the reader took bytes that upb rejects"
        return
    if view is not None:
        _same(view, ref)


@settings(max_examples=200, deadline=None)
@given(_messages(upb_only=False))
def test_every_request_of_the_subset_takes_the_zero_copy_path(raw) -> None:
    """Every valid request of the reader's subset (any Unicode names, any int64 dimensions, fields empty
    or absent) is read here, not left to upb: the zero-copy path is not lost to a parsing slip."""
    view = wire.read_infer_request(raw)
    assert view is not None
    _same(view, pb.ModelInferRequest.FromString(raw))
