"""Pooling (ops/pool.py) against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import shapeplan as sp
from shapeplan.ir.shape_inference import infer_node

RNG = np.random.default_rng(1)


def model_of(op: str, x: np.ndarray, n_out: int = 1, extra: dict | None = None, opset: int = 22,
             **attrs) -> onnx.ModelProto:
    extra = extra or {}
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, ["x", *extra], outs, **attrs)
    ins = [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)]
    ins += [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in extra.items()]
    types = [helper.np_dtype_to_tensor_dtype(x.dtype), onnx.TensorProto.INT64][:n_out]
    g = helper.make_graph([node], "t", ins, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ours = list(sp.compile(model, mode="slot_by_slot").run(feeds).values())
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return ours


POOL_CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1]),
    dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 3], dilations=[2, 1], strides=[1, 2]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[3, 3], auto_pad="SAME_LOWER", strides=[2, 1]),
]
POOL_IDS = ["asym-pads", "ceil", "ceil-last-window-in-pad", "dilations", "same-upper", "same-lower"]


@pytest.mark.parametrize("attrs", POOL_CASES, ids=POOL_IDS)
def test_max_pool_with_indices(attrs: dict) -> None:
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    compare(model_of("MaxPool", x, n_out=2, **attrs), {"x": x})


@pytest.mark.parametrize("cip", [0, 1])
@pytest.mark.parametrize("attrs", POOL_CASES, ids=POOL_IDS)
def test_average_pool(attrs: dict, cip: int) -> None:
    if "dilations" in attrs and cip:
        pytest.skip("same geometry as cip=0 without pads")
    x = RNG.standard_normal((1, 2, 9, 8)).astype(np.float32)
    compare(model_of("AveragePool", x, count_include_pad=cip, **attrs), {"x": x})


def test_max_pool_int_and_3d() -> None:
    x = RNG.integers(0, 255, (1, 2, 5, 6, 4), dtype=np.uint8)
    compare(model_of("MaxPool", x, kernel_shape=[2, 2, 2], strides=[2, 2, 1], pads=[0, 1, 0, 1, 0, 0]), {"x": x})


def test_max_pool_storage_order_column_major() -> None:
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    (_, idx) = sp.compile(model_of("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2], storage_order=1),
                          mode="slot_by_slot").run({"x": x}).values()
    for i in range(2):
        for j in range(2):
            win = x[0, 0, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
            r, c = np.unravel_index(win.argmax(), win.shape)
            assert idx[0, 0, i, j] == (2 * j + c) * 4 + (2 * i + r)


def test_lp_pool_and_globals() -> None:
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    compare(model_of("LpPool", x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 0, 0], p=3, opset=18), {"x": x})
    for op in ("GlobalAveragePool", "GlobalMaxPool"):
        compare(model_of(op, x), {"x": x})
    (y,) = sp.compile(model_of("GlobalLpPool", x, p=2), mode="slot_by_slot").run({"x": x}).values()
    np.testing.assert_allclose(y, np.sqrt((x ** 2).sum((2, 3), keepdims=True)), rtol=1e-5)


def test_max_unpool_inverts_max_pool() -> None:
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    pooled, idx = sp.compile(model_of("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2]),
                             mode="slot_by_slot").run({"x": x}).values()
    shape = np.array([1, 2, 7, 7], np.int64)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], "t",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, pooled.shape),
         helper.make_tensor_value_info("i", onnx.TensorProto.INT64, idx.shape),
         helper.make_tensor_value_info("s", onnx.TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 22)])
    feeds = {"x": pooled, "i": idx, "s": shape}
    (y,) = sp.compile(model, mode="slot_by_slot").run(feeds).values()
    # a larger output_shape keeps the unpooled block at the origin, as the ONNX conformance case and
    # onnx's reference evaluator do (ORT re-flattens the indices into the larger shape instead)
    np.testing.assert_array_equal(y, ReferenceEvaluator(model).run(None, feeds)[0])
    assert y.shape == (1, 2, 7, 7)
    np.testing.assert_array_equal(np.sort(y[y != 0]), np.sort(pooled.reshape(-1)))


def test_pool_shape_function_keeps_symbolic_batch() -> None:
    g = sp.Graph()
    x = g.placeholder("x", "float32", ("n", 8, 15, 15))
    node = g.add_node("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, num_outputs=2)
    infer_node(node, 21)
    assert node.outputs[0].shape == ("n", 8, 7, 7)
    assert node.outputs[1].dtype.name == "int64"


def _windows_max(x, **attrs):
    """MaxPool through the general windowing (what the fast path replaces): the reference."""
    from shapeplan.ops.pool import _lowest, _setup, _windows
    n = x.dim() - 2
    k, s, d, out, p = _setup(x, attrs["kernel_shape"], attrs.get("strides"), attrs.get("dilations"),
                             attrs.get("auto_pad", "NOTSET"), attrs.get("pads"), attrs.get("ceil_mode", 0))
    win = _windows(x, out, p, k, s, d, _lowest(x.dtype))
    return win.reshape(*win.shape[:2 + n], -1).amax(-1)


def test_max_pool_fast_path_equals_the_windowing_bit_for_bit() -> None:
    """torch's pooling kernel (channels-last on the CPU for 2-D) against the general windows, 600 random
    geometries (fixed seed): 1-3 spatial dims, pads, ceil mode, dilations, auto_pad, four float dtypes,
    NaNs, transposed (non-contiguous) inputs. A max is exact, so the two must agree bit for bit."""
    import random

    import torch

    from shapeplan.ops.pool import max_pool
    rnd = random.Random(7)
    checked = 0
    for _ in range(600):
        n = rnd.choice([1, 2, 2, 3])
        k = [rnd.randint(1, 4) for _ in range(n)]
        a = dict(kernel_shape=k, strides=[rnd.randint(1, 3) for _ in range(n)],
                 dilations=[rnd.randint(1, 2) for _ in range(n)], ceil_mode=rnd.randint(0, 1),
                 auto_pad=rnd.choice(["NOTSET"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if a["auto_pad"] == "NOTSET":
            a["pads"] = [rnd.randint(0, max(0, k[i % n] - 1)) for i in range(2 * n)]
        size = [rnd.randint((k[i] - 1) * a["dilations"][i] + 1, 9) for i in range(n)]
        dt = rnd.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16])
        x = torch.from_numpy(np.random.default_rng(rnd.randrange(1 << 30)).standard_normal((2, 3, *size))).to(dt)
        if rnd.random() < 0.2:
            x.view(-1)[rnd.randrange(x.numel())] = float("nan")
        if n > 1 and rnd.random() < 0.2:
            x = x.transpose(-1, -2)
        try:
            want = _windows_max(x, **a)
        except RuntimeError:                 # a geometry with no output (windows larger than the input)
            continue
        got = max_pool(x, **a)
        assert got.shape == want.shape and got.dtype == want.dtype, (a, size)
        assert torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(want, nan=7.0)), (a, size, dt)
        assert got.is_contiguous()
        checked += 1
    assert checked > 550


def test_average_pool_fast_path_matches_the_windowing() -> None:
    """AveragePool through torch's kernel where its padding gives ONNX's windows and divisors (else the
    windowing's sum and count) against the windowing, 600 random geometries (fixed seed): 1-3 spatial
    dims, pads (symmetric half the time), ceil mode, auto_pad, count_include_pad, inputs smaller than the
    kernel, four float dtypes, transposed inputs. The sums' order differs: equal within rounding."""
    import random

    import torch

    from shapeplan.ops.pool import _avg_pool_core, _setup, average_pool
    rnd = random.Random(11)
    checked = 0
    for _ in range(600):
        n = rnd.choice([1, 2, 2, 3])
        k = [rnd.randint(1, 4) for _ in range(n)]
        a = dict(kernel_shape=k, strides=[rnd.randint(1, 3) for _ in range(n)], ceil_mode=rnd.randint(0, 1),
                 count_include_pad=rnd.randint(0, 1),
                 auto_pad=rnd.choice(["NOTSET"] * 4 + ["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if a["auto_pad"] == "NOTSET":
            a["pads"] = [rnd.randint(0, max(0, k[i % n] - 1)) for i in range(2 * n)]
            if rnd.random() < 0.5:
                a["pads"] = a["pads"][:n] * 2
        dt = rnd.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16])
        size = [rnd.randint(1, 10) for _ in range(n)]
        x = torch.from_numpy(np.random.default_rng(rnd.randrange(1 << 30)).standard_normal((2, 3, *size))).to(dt)
        if n > 1 and rnd.random() < 0.2:
            x = x.transpose(-1, -2)
        k2, s2, d2, out, p = _setup(x, k, a["strides"], None, a["auto_pad"], a.get("pads"), a["ceil_mode"])
        try:
            want = _avg_pool_core(x, k2, s2, d2, out, p, a["count_include_pad"])
        except RuntimeError:                 # a geometry with no output
            continue
        got = average_pool(x, **a)
        tol = dict(rtol=1e-5, atol=1e-6) if dt in (torch.float32, torch.float64) else dict(rtol=2e-2, atol=2e-2)
        assert got.shape == want.shape and got.dtype == want.dtype, (a, size)
        torch.testing.assert_close(got, want, equal_nan=True, **tol, msg=lambda m: f"{a} {size} {dt}: {m}")
        assert got.is_contiguous()
        checked += 1
    assert checked > 400
