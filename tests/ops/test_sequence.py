"""Sequence and optional ops (ops/sequence.py) against onnxruntime / onnx's reference evaluator."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import shapeplan as sp


def run_both(model: onnx.ModelProto, feeds: dict, ref: str = "ort") -> tuple[list, list]:
    got = list(sp.compile(model, mode="slot_by_slot").run(feeds).values())
    if ref == "ort":
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
    return got, want


def assert_same(got, want) -> None:  # noqa: ANN001
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.asarray(got).shape == np.asarray(want).shape


SEQ_MODEL = onnx.parser.parse_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] a, float[2, 3] b, float[4, 3] c, int64 pos, int64 neg) => (seq(float) s, float[M, 3] cat,
   float[K, 2, 3] stacked, int64 n, float[2, 3] at, seq(float) pieces, seq(float) sized) {
    s0 = SequenceConstruct (a, b)
    s1 = SequenceInsert (s0, c, pos)
    s = SequenceErase (s1, neg)
    cat = ConcatFromSequence <axis = 0> (s1)
    stacked = ConcatFromSequence <axis = 0, new_axis = 1> (s0)
    n = SequenceLength (s1)
    at = SequenceAt (s1, neg)
    pieces = SplitToSequence <axis = 0, keepdims = 0> (c)
    sz = Constant <value = int64[2] {1, 3}> ()
    sized = SplitToSequence <axis = 0> (c, sz)
}
""")


@pytest.mark.parametrize("pos,neg", [(1, -1), (0, -3), (2, 0)])
def test_sequence_ops_match_ort(pos: int, neg: int) -> None:
    rng = np.random.default_rng(5)
    feeds = {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": rng.standard_normal((2, 3)).astype(np.float32),
             "c": rng.standard_normal((4, 3)).astype(np.float32), "pos": np.array(pos, np.int64),
             "neg": np.array(neg, np.int64)}
    try:
        got, want = run_both(SEQ_MODEL, feeds)
    except sp.UnsupportedOpError as e:
        pytest.skip(f"an op this test needs is not in the table yet: {e}")
    for g, w in zip(got, want):
        assert_same(g, w)


def test_sequence_insert_out_of_range_names_the_position() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] a, int64 pos) => (seq(float) s) {
        s0 = SequenceConstruct (a)
        s = SequenceInsert (s0, a, pos)
    }
    """)
    engine = sp.compile(model, mode="slot_by_slot")
    with pytest.raises(sp.ShapeplanError, match="position 5 is out of range"):
        engine.run({"a": np.zeros(2, np.float32), "pos": np.array(5, np.int64)})
    (s,) = engine.run({"a": np.ones(2, np.float32), "pos": np.array(-1, np.int64)}).values()
    assert len(s) == 2


def test_sequence_map_with_sequence_and_tensor_inputs() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] a, float[3] b, float[1] k) => (seq(float) out, seq(int64) shapes) {
        s = SequenceConstruct (a, b)
        out, shapes = SequenceMap (s, k) <
            body = m (float[N] x, float[1] kk) => (float[N] y, int64[1] sh) {
                y = Mul (x, kk)
                sh = Shape (x)
            }
        >
    }
    """)
    feeds = {"a": np.array([1, 2], np.float32), "b": np.array([3, 4, 5], np.float32), "k": np.array([2], np.float32)}
    try:
        got, want = run_both(model, feeds, ref="reference")
    except sp.UnsupportedOpError as e:
        pytest.skip(f"an op this test needs is not in the table yet: {e}")
    for g, w in zip(got, want):
        assert_same(g, w)


def test_optional_ops() -> None:
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2] a) => (bool has, bool empty_has, float[2] got) {
        o = Optional (a)
        has = OptionalHasElement (o)
        e = Optional <type = float> ()
        empty_has = OptionalHasElement (e)
        got = OptionalGetElement (o)
    }
    """)
    feeds = {"a": np.array([1, 2], np.float32)}
    got, want = run_both(model, feeds)
    for g, w in zip(got, want):
        assert_same(g, w)
    assert bool(got[0]) and not bool(got[1])
