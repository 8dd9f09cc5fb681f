"""String ops (StringNormalizer, StringSplit, StringConcat, RegexFullMatch, TfIdfVectorizer) and the
ai.onnx.ml ops with conformance cases (LabelEncoder, TreeEnsemble, Binarizer, ArrayFeatureExtractor).

ONNX strings run as numpy object arrays of ``str``; these kernels work on the host. Numeric
results are torch tensors (on the numeric input's device when there is one).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from shapeplan.errors import ModelError
from shapeplan.ops.registry import Trait, register

HOST = Trait.HOST_SYNC
ML = "ai.onnx.ml"


def _strs(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=object)


def _device(x: Any) -> torch.device:
    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


# ---------------------------------------------------------------------------------------- string ops


@register("StringNormalizer", since=10, traits=HOST)
def string_normalizer(x, *, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=None):
    """Drop stop words (whole elements), then change case. Input [C] or [1, C]."""
    arr = _strs(x)
    flat = [str(s) for s in arr.reshape(-1)]
    if stopwords:
        if is_case_sensitive:
            stops = set(stopwords)
            flat = [s for s in flat if s not in stops]
        else:
            stops = {w.lower() for w in stopwords}
            flat = [s for s in flat if s.lower() not in stops]
    if case_change_action == "LOWER":
        flat = [s.lower() for s in flat]
    elif case_change_action == "UPPER":
        flat = [s.upper() for s in flat]
    if not flat:
        flat = [""]
    out = np.array(flat, dtype=object)
    return out.reshape(1, -1) if arr.ndim == 2 else out


@register("StringConcat", since=20, traits=HOST)
def string_concat(x, y):
    return np.asarray(np.add(_strs(x), _strs(y)), dtype=object)    # 0-d inputs give a bare str


@register("StringSplit", since=20, traits=HOST)
def string_split(x, *, delimiter=None, maxsplit=None):
    """Split each element; Y is padded with "" to the longest split, Z counts the pieces."""
    arr = _strs(x)
    sep = delimiter or None                     # unset or "": split on runs of whitespace
    n = -1 if maxsplit is None else int(maxsplit)
    parts = [str(s).split(sep, n) for s in arr.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    y = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, :len(p)] = p
    z = torch.tensor([len(p) for p in parts], dtype=torch.int64).reshape(arr.shape)
    return y.reshape(*arr.shape, width), z


@register("RegexFullMatch", since=20, traits=HOST)
def regex_full_match(x, *, pattern=""):
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ModelError(f"RegexFullMatch: pattern {pattern!r} does not compile: {e}") from e
    arr = _strs(x)
    hits = [rx.fullmatch(str(s)) is not None for s in arr.reshape(-1)]
    return torch.tensor(hits, dtype=torch.bool).reshape(arr.shape)


@register("TfIdfVectorizer", since=9, traits=HOST)
def tfidf_vectorizer(x, *, max_gram_length=1, max_skip_count=0, min_gram_length=1, mode="TF",
                     ngram_counts=(), ngram_indexes=(), pool_int64s=None, pool_strings=None, weights=None):
    """Count pool n-grams (with up to ``max_skip_count`` skips between items) per row."""
    pool = list(pool_strings) if pool_strings is not None else list(pool_int64s or [])
    out_dim = max(ngram_indexes) + 1 if len(ngram_indexes) else 0
    grams: dict[tuple, int] = {}                                   # n-gram tuple -> output column
    k = 0
    starts = list(ngram_counts) + [len(pool)]
    for n in range(1, len(ngram_counts) + 1):
        for j in range(starts[n - 1], starts[n], n):
            grams[tuple(pool[j:j + n])] = int(ngram_indexes[k])
            k += 1
    rows = x.tolist() if isinstance(x, torch.Tensor) else _strs(x).tolist()
    batched = isinstance(rows, list) and rows and isinstance(rows[0], list)
    if not batched:
        rows = [rows]
    counts = np.zeros((len(rows), out_dim), dtype=np.float32)
    for r, row in enumerate(rows):
        L = len(row)
        for dist in range(1, max_skip_count + 2):
            for n in range(max(min_gram_length, 1 if dist == 1 else 2), max_gram_length + 1):
                span = (n - 1) * dist
                for s in range(0, L - span):
                    col = grams.get(tuple(row[s + i * dist] for i in range(n)))
                    if col is not None:
                        counts[r, col] += 1
    w = np.asarray(weights, dtype=np.float32) if weights else None
    if mode == "IDF":
        counts = np.where(counts > 0, w if w is not None else 1.0, 0.0).astype(np.float32)
    elif mode == "TFIDF" and w is not None:
        counts = counts * w
    out = torch.from_numpy(counts.astype(np.float32))
    out = out if batched else out[0]
    return out.to(_device(x))


# ---------------------------------------------------------------------------------------- ai.onnx.ml


@register("Binarizer", domain=ML, since=1)
def binarizer(x, *, threshold=0.0):
    return (x > threshold).to(x.dtype)


@register("ArrayFeatureExtractor", domain=ML, since=1)
def array_feature_extractor(x, y):
    """Select columns ``y`` of the last axis of ``x`` (a vector input gives a [1, k] matrix)."""
    idx = y.reshape(-1).to(torch.int64) if isinstance(y, torch.Tensor) else torch.as_tensor(y).reshape(-1)
    if isinstance(x, torch.Tensor):
        out = x.index_select(-1, idx.to(x.device))
    else:
        out = _strs(x)[..., idx.tolist()]
    return out.reshape(1, -1) if x.ndim == 1 else out


def _tensor_list(t: Any) -> list:
    if isinstance(t, torch.Tensor):
        return t.reshape(-1).tolist()
    return [str(s) for s in np.asarray(t, dtype=object).reshape(-1)]


@register("LabelEncoder", domain=ML, since=1)
def label_encoder(x, *, default_float=-0.0, default_int64=-1, default_string="_Unused", default_tensor=None,
                  keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
                  values_floats=None, values_int64s=None, values_strings=None, values_tensor=None,
                  class_ids=None, classes_strings=None):
    """Map each element through a key -> value table; unknown keys get the default."""
    if classes_strings is not None:          # LabelEncoder-1: string <-> its index in classes_strings
        positions = list(range(len(classes_strings)))
        if isinstance(x, torch.Tensor):
            keys_int64s, values_strings = positions, list(classes_strings)
        else:
            keys_strings, values_int64s = list(classes_strings), positions
    keys = next((k for k in (keys_floats, keys_int64s, keys_strings) if k is not None), None)
    if keys is None and keys_tensor is not None:
        keys = _tensor_list(keys_tensor)
    if values_tensor is not None:
        values, kind = _tensor_list(values_tensor), values_tensor
        default = _tensor_list(default_tensor)[0] if default_tensor is not None else \
            ("_Unused" if not isinstance(values_tensor, torch.Tensor) else
             -1 if not values_tensor.dtype.is_floating_point else -0.0)
    elif values_floats is not None:
        values, kind, default = list(values_floats), torch.float32, default_float
    elif values_int64s is not None:
        values, kind, default = list(values_int64s), torch.int64, default_int64
    elif values_strings is not None:
        values, kind, default = list(values_strings), "str", default_string
    else:
        raise ModelError("LabelEncoder: no values_* attribute is set")
    if keys is None or len(keys) != len(values):
        raise ModelError(f"LabelEncoder: {0 if keys is None else len(keys)} keys but {len(values)} values")
    table = dict(zip(keys, values))
    src = x.reshape(-1).tolist() if isinstance(x, torch.Tensor) else [str(s) for s in _strs(x).reshape(-1)]
    mapped = [table.get(v, default) for v in src]
    shape = tuple(x.shape)
    if isinstance(kind, torch.Tensor):
        return torch.tensor(mapped, dtype=kind.dtype, device=_device(x)).reshape(shape)
    if isinstance(kind, np.ndarray) or kind == "str":
        return np.array(mapped, dtype=object).reshape(shape)
    return torch.tensor(mapped, dtype=kind, device=_device(x)).reshape(shape)


# TreeEnsemble node modes
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


def _as_list(v: Any) -> list:
    if v is None:
        return []
    if isinstance(v, torch.Tensor):
        return v.reshape(-1).tolist()
    return list(v)


@register("TreeEnsemble", domain=ML, since=5, traits=HOST)
def tree_ensemble(x, *, aggregate_function=1, leaf_targetids=(), leaf_weights=None, membership_values=None,
                  n_targets=1, nodes_falseleafs=(), nodes_falsenodeids=(), nodes_featureids=(),
                  nodes_hitrates=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                  nodes_splits=None, nodes_trueleafs=(), nodes_truenodeids=(), post_transform=0,
                  tree_roots=()):
    """Evaluate every tree for every sample at once: walk all (sample, tree) cursors level by level."""
    dev, dt = x.device, x.dtype
    X = x.to(torch.float64)                                        # [S, F]
    S, T = X.shape[0], len(tree_roots)
    modes = torch.tensor(_as_list(nodes_modes), dtype=torch.int64, device=dev)
    feat = torch.tensor(list(nodes_featureids), dtype=torch.int64, device=dev)
    split = torch.tensor(_as_list(nodes_splits), dtype=torch.float64, device=dev)
    t_id = torch.tensor(list(nodes_truenodeids), dtype=torch.int64, device=dev)
    f_id = torch.tensor(list(nodes_falsenodeids), dtype=torch.int64, device=dev)
    t_leaf = torch.tensor(list(nodes_trueleafs), dtype=torch.bool, device=dev)
    f_leaf = torch.tensor(list(nodes_falseleafs), dtype=torch.bool, device=dev)
    miss = _as_list(nodes_missing_value_tracks_true) or [0] * len(feat)
    miss_t = torch.tensor(miss, dtype=torch.bool, device=dev)
    # set-membership nodes: NaN-separated member lists, in node order -> padded [n_nodes, M]
    members: list[list[float]] = [[] for _ in range(len(feat))]
    mv = iter(_as_list(membership_values))
    for i, m in enumerate(modes.tolist()):
        if m == _MEMBER:
            for v in mv:
                if v != v:
                    break
                members[i].append(v)
    width = max((len(m) for m in members), default=0) or 1
    mem = torch.full((len(feat), width), float("nan"), dtype=torch.float64, device=dev)
    for i, m in enumerate(members):
        if m:
            mem[i, :len(m)] = torch.tensor(m, dtype=torch.float64)
    roots = torch.tensor(list(tree_roots), dtype=torch.int64, device=dev)
    cur = roots.unsqueeze(0).expand(S, T).clone()                   # [S, T] node or leaf index
    at_leaf = (t_leaf[roots] & f_leaf[roots] & (t_id[roots] == f_id[roots])).unsqueeze(0).expand(S, T).clone()
    cur = torch.where(at_leaf, t_id[roots].unsqueeze(0).expand(S, T), cur)
    rows = torch.arange(S, device=dev).unsqueeze(1).expand(S, T)
    for _ in range(len(feat) + 1):
        if bool(at_leaf.all()):
            break
        node = torch.where(at_leaf, torch.zeros_like(cur), cur)
        v = X[rows, feat[node]]
        s, m = split[node], modes[node]
        cond = torch.where(m == _LEQ, v <= s, torch.where(m == _LT, v < s, torch.where(
            m == _GTE, v >= s, torch.where(m == _GT, v > s, torch.where(
                m == _EQ, v == s, torch.where(m == _NEQ, v != s, (mem[node] == v.unsqueeze(-1)).any(-1)))))))
        cond = cond | (miss_t[node] & torch.isnan(v))
        nxt = torch.where(cond, t_id[node], f_id[node])
        nxt_leaf = torch.where(cond, t_leaf[node], f_leaf[node])
        cur = torch.where(at_leaf, cur, nxt)
        at_leaf = at_leaf | nxt_leaf
    weights = torch.tensor(_as_list(leaf_weights), dtype=torch.float64, device=dev)[cur]     # [S, T]
    targets = torch.tensor(list(leaf_targetids), dtype=torch.int64, device=dev)[cur]
    if aggregate_function in (0, 1):
        out = torch.zeros((S, n_targets), dtype=torch.float64, device=dev).scatter_add_(1, targets, weights)
        if aggregate_function == 0:
            out = out / T
    else:
        reduce = "amin" if aggregate_function == 2 else "amax"
        init = float("inf") if reduce == "amin" else float("-inf")
        out = torch.full((S, n_targets), init, dtype=torch.float64, device=dev)
        out = out.scatter_reduce(1, targets, weights, reduce=reduce, include_self=True)
        limit = torch.finfo(dt).max
        out = out.clamp(-limit, limit)
    return _post_transform(out, post_transform).to(dt)


def _post_transform(y: torch.Tensor, kind: int) -> torch.Tensor:
    if kind == 1:
        return torch.softmax(y, -1)
    if kind == 2:
        return torch.sigmoid(y)
    if kind == 3:                                                  # softmax that keeps exact zeros at 0
        e = torch.where(y == 0, torch.zeros_like(y), torch.exp(y - y.amax(-1, keepdim=True)))
        return e / e.sum(-1, keepdim=True).clamp_min(1e-300)
    if kind == 4:
        return torch.special.ndtri(y.clamp(1e-12, 1 - 1e-12)) if y.numel() else y
    return y

