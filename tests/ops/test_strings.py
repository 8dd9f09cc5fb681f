"""String and ai.onnx.ml ops (ops/strings.py) against onnxruntime / onnx's reference evaluator."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp

STR, F, I64 = TensorProto.STRING, TensorProto.FLOAT, TensorProto.INT64


def model_of(op: str, ins: list[tuple[str, int, list]], outs: list[tuple[str, int]], opset: int = 20,
             domain: str = "", ml: int = 0, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [n for n, _, _ in ins], [n for n, _ in outs], domain=domain, **attrs)
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info(n, t, s) for n, t, s in ins],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outs])
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", ml)] if ml else [])
    return helper.make_model(g, opset_imports=ops, ir_version=10)


def compare(model: onnx.ModelProto, feeds: dict, ref: str = "ort") -> list:
    got = list(sp.compile(model, mode="slot_by_slot").run(feeds).values())
    if ref == "ort":
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind in "OUS":
            assert g.astype(str).tolist() == w.astype(str).tolist()
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.parametrize("attrs", [
    dict(case_change_action="LOWER", stopwords=["the", "A"]),
    dict(case_change_action="UPPER", is_case_sensitive=1, stopwords=["the", "A"]),
    dict(case_change_action="NONE", stopwords=["x", "y", "The", "a", "cat"], is_case_sensitive=1),
])
@pytest.mark.parametrize("two_d", [False, True])
def test_string_normalizer_matches_reference(attrs: dict, two_d: bool) -> None:
    x = np.array(["The", "cat", "a", "A", "Dog"], dtype=object)
    x = x.reshape(1, -1) if two_d else x
    # (ORT's StringNormalizer needs an installed en_US locale, so the reference evaluator is the oracle)
    compare(model_of("StringNormalizer", [("x", STR, list(x.shape))], [("y", STR)], opset=10, **attrs), {"x": x},
            ref="reference")


def test_string_split_concat_regex() -> None:
    x = np.array([["a,b,,c", ""], ["one", "x,y"]], dtype=object)
    y, z = compare(model_of("StringSplit", [("x", STR, [2, 2])], [("y", STR), ("z", I64)], delimiter=",",
                            maxsplit=2), {"x": x}, ref="reference")
    assert y.shape == (2, 2, 3) and z.tolist() == [[3, 1], [1, 2]]
    ws = np.array(["  hello   world ", "x"], dtype=object)
    y, z = compare(model_of("StringSplit", [("x", STR, [2])], [("y", STR), ("z", I64)]), {"x": ws}, ref="reference")
    assert y.tolist() == [["hello", "world"], ["x", ""]] and z.tolist() == [2, 1]
    a, b = np.array([["a", "é"], ["c", ""]], dtype=object), np.array(["1", "2"], dtype=object)
    compare(model_of("StringConcat", [("a", STR, [2, 2]), ("b", STR, [2])], [("y", STR)]), {"a": a, "b": b})
    r = np.array(["abc@x.org", "nope", "q@y.com"], dtype=object)
    (m,) = compare(model_of("RegexFullMatch", [("x", STR, [3])], [("y", TensorProto.BOOL)],
                            pattern=r"[a-z]+@[a-z]+\.(org|com)"), {"x": r})
    assert m.tolist() == [True, False, True]


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip", [0, 2])
def test_tfidf_vectorizer_matches_ort(mode: str, skip: int) -> None:
    x = np.array([[1, 1, 3, 3, 3, 7, 8, 6, 7, 5], [8, 6, 7, 5, 6, 8, 6, 7, 5, 6]], np.int64)
    attrs = dict(mode=mode, min_gram_length=1, max_gram_length=2, max_skip_count=skip, ngram_counts=[0, 4],
                 ngram_indexes=[0, 1, 2, 3, 4, 5, 6], pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
                 weights=[0.5, 1, 1.5, 2, 2.5, 3, 3.5])
    compare(model_of("TfIdfVectorizer", [("x", I64, [2, 10])], [("y", F)], opset=9, **attrs), {"x": x})


def test_tfidf_vectorizer_strings_1d_matches_ort() -> None:
    x = np.array(["a", "b", "a", "c", "b", "a"], dtype=object)
    attrs = dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=1, ngram_counts=[0, 2],
                 ngram_indexes=[0, 1, 2, 3], pool_strings=["a", "c", "a", "b", "b", "a"])
    compare(model_of("TfIdfVectorizer", [("x", STR, [6])], [("y", F)], opset=9, **attrs), {"x": x})


def test_label_encoder_forms() -> None:
    s = np.array([["a", "b"], ["zz", "c"]], dtype=object)
    compare(model_of("LabelEncoder", [("x", STR, [2, 2])], [("y", I64)], opset=17, ml=2, domain="ai.onnx.ml",
                     keys_strings=["a", "b", "c"], values_int64s=[1, 2, 3], default_int64=-7), {"x": s})
    i = np.array([3, 1, 9], np.int64)
    compare(model_of("LabelEncoder", [("x", I64, [3])], [("y", STR)], opset=17, ml=2, domain="ai.onnx.ml",
                     keys_int64s=[1, 3], values_strings=["one", "three"], default_string="?"), {"x": i})
    keys = helper.make_tensor("k", I64, [2], [1, 3])
    vals = helper.make_tensor("v", F, [2], [0.5, 1.5])
    dflt = helper.make_tensor("d", F, [1], [-2.0])
    (y,) = compare(model_of("LabelEncoder", [("x", I64, [3])], [("y", F)], opset=17, ml=4, domain="ai.onnx.ml",
                            keys_tensor=keys, values_tensor=vals, default_tensor=dflt), {"x": i}, ref="reference")
    assert y.tolist() == [1.5, 0.5, -2.0]


def test_binarizer_and_array_feature_extractor() -> None:
    x = np.array([[0.5, -1, 2], [3, 0, -0.1]], np.float32)
    compare(model_of("Binarizer", [("x", F, [2, 3])], [("y", F)], opset=17, ml=1, domain="ai.onnx.ml",
                     threshold=0.4), {"x": x})
    idx = np.array([2, 0], np.int64)
    compare(model_of("ArrayFeatureExtractor", [("x", F, [2, 3]), ("i", I64, [2])], [("y", F)], opset=17, ml=1,
                     domain="ai.onnx.ml"), {"x": x, "i": idx})


def _tree_model(aggregate: int, post: int) -> onnx.ModelProto:
    # tree 0: x0 <= 0.5 ? leaf0 : (x1 in {1, 3} ? leaf1 : leaf2); tree 1: x1 > 2 ? leaf3 : leaf4
    attrs = dict(
        n_targets=2, aggregate_function=aggregate, post_transform=post,
        tree_roots=[0, 2],
        nodes_featureids=[0, 1, 1], nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [3], [0, 6, 3]),
        nodes_splits=helper.make_tensor("s", F, [3], [0.5, 0.0, 2.0]),
        nodes_truenodeids=[0, 1, 3], nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 4], nodes_falseleafs=[0, 1, 1],
        nodes_missing_value_tracks_true=[1, 0, 0],
        membership_values=helper.make_tensor("mv", F, [3], [1.0, 3.0, float("nan")]),
        leaf_targetids=[0, 1, 0, 1, 0],
        leaf_weights=helper.make_tensor("w", F, [5], [1.0, 10.0, 100.0, 0.5, -3.0]),
    )
    return model_of("TreeEnsemble", [("x", F, [5, 2])], [("y", F)], opset=21, ml=5, domain="ai.onnx.ml", **attrs)


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_matches_reference(aggregate: int) -> None:
    x = np.array([[0.1, 9], [0.9, 1], [0.9, 2], [np.nan, 5], [2, 3]], np.float32)
    compare(_tree_model(aggregate, 0), {"x": x}, ref="reference")


def test_tree_ensemble_logistic_post_transform() -> None:
    x = np.array([[0.1, 9], [0.9, 1], [0.9, 2], [np.nan, 5], [2, 3]], np.float32)
    (raw,) = sp.compile(_tree_model(1, 0), mode="slot_by_slot").run({"x": x}).values()
    (sig,) = sp.compile(_tree_model(1, 2), mode="slot_by_slot").run({"x": x}).values()
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-raw)), rtol=1e-6)
