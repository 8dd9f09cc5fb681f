"""ops/quantized.py: QuantMatMul / QuantGather against dequantize-then-matmul / dequantize-then-index,
through the engine (torch reference kernels on CPU) and, under Triton's interpreter, the Triton kernels
of runtime/backends/triton/kernels/gguf.py for every type (within fp32 rounding)."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")          # must precede the first import of triton

import shapeplan as sp  # noqa: E402
from shapeplan.errors import ShapeError  # noqa: E402
from shapeplan.ir.graph import Graph  # noqa: E402
from shapeplan.ops import quantized as qops  # noqa: E402
from shapeplan.quant.dequant import dequantize  # noqa: E402
from shapeplan.quant.formats import QTYPES  # noqa: E402
from shapeplan.quant.quantize import quantize  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
QUANTIZABLE = [n for n in QTYPES if not n.startswith("IQ4")]


def packed_weight(name: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A packed ``name`` weight [n, k]: quantized from random floats, or random bytes for IQ4 (no quantizer)."""
    g = torch.Generator().manual_seed(seed)
    if name in QUANTIZABLE:
        return quantize(torch.randn(n, k, generator=g) * 0.05, name)
    from tests.quant.test_dequant import random_blocks
    return random_blocks(name, n, k, seed)


def _graph(name: str, n: int, k: int, packed: torch.Tensor, x_shape: tuple) -> Graph:
    g = Graph("qmm")
    x = g.placeholder("x", "float32", x_shape)
    ids = g.placeholder("ids", "int64", (2, 3))
    w = g.constant(packed, name="w.packed")
    y = g.op.QuantMatMul(x, w, qtype=name, n=n, k=k, _domain="shapeplan")
    e = g.op.QuantGather(w, ids, qtype=name, n=n, k=k, dtype="float32", _domain="shapeplan")
    g.set_outputs(y, e)
    return g


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q5_1", "INT4_G64"])
@pytest.mark.parametrize("mode", ["slot_by_slot", "emulated_replay"])
def test_ops_equal_dequantize_then_matmul(name, mode):
    n, k = 24, 512
    packed = packed_weight(name, n, k)
    w = dequantize(packed, name)                                                    # [N, K]
    eng = sp.compile(_graph(name, n, k, packed, (2, 3, k)), mode=mode)
    x, ids = torch.randn(2, 3, k), torch.tensor([[0, 5, 23], [7, 7, 1]])
    for _ in range(3):                                                              # through capture + replay
        y, e = eng.run({"x": x, "ids": ids}).values()
    assert torch.equal(y, x @ w.t())                                                # the same computation
    assert torch.equal(e, w[ids])


def test_shape_errors_name_the_input():
    packed = packed_weight("Q4_K", 8, 256)
    with pytest.raises(ShapeError, match=r"input 'x' has 128 features.*'w\.packed' expects k=256"):
        sp.compile(_graph("Q4_K", 8, 256, packed, (1, 128)), mode="slot_by_slot")
    with pytest.raises(ShapeError, match=r"'w\.packed' has shape \[8, 144\], expected \[8, 288\]"):
        sp.compile(_graph("Q4_K", 8, 512, packed, (1, 512)), mode="slot_by_slot")
    with pytest.raises(ShapeError, match=r"'w\.packed' has quantization type Q1_X"):
        sp.compile(_graph("Q1_X", 8, 256, packed, (1, 256)), mode="slot_by_slot")


def test_lower_precision_activations():
    packed = packed_weight("Q4_K", 16, 256)
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    y = qops.quant_matmul(x, packed, qtype="Q4_K", n=16, k=256)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, x @ dequantize(packed, "Q4_K").to(torch.bfloat16).t())


# ------------------------------------------------------------------ Triton kernels (interpreter on CPU)
@pytest.fixture
def triton_kernels():
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton needs TRITON_INTERPRET=1 without CUDA")
    from shapeplan.runtime.backends.triton.kernels import gguf
    old = qops.set_quant_kernels("triton")
    qops._triton_failed.clear()
    yield gguf
    assert not qops._triton_failed, qops._triton_failed                  # the kernels ran, no silent fallback
    qops.set_quant_kernels(old)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal within fp32 rounding of a K-term dot product."""
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("name", list(QTYPES))
def test_triton_kernels_every_type(name, triton_kernels):
    gguf = triton_kernels
    q = QTYPES[name]
    n, k = 20, 512                                                  # a partial row block (BN = 16)
    packed = packed_weight(name, n, k).to(DEV)
    w = dequantize(packed, name)
    torch.testing.assert_close(gguf.dequantize_rows(packed, q, k, torch.float32), w, rtol=0, atol=0)
    idx = torch.tensor([[3, 0], [19, 3]], device=DEV)
    assert torch.equal(gguf.dequantize_rows(packed, q, k, torch.float32, idx), w[idx.reshape(-1)])
    for m, split in ((1, None), (3, 2)):                      # GEMV, one pass and split-K
        x = torch.randn(m, k, device=DEV)
        _close(gguf.gemv(x, packed, q, n, k, split=split), x @ w.t())
    x = torch.randn(11, k, device=DEV)
    _close(gguf.gemm(x, packed, q, n, k), x @ w.t())                # prefill: fused tiles into tl.dot


def test_triton_paths_through_the_op(triton_kernels):
    gguf = triton_kernels
    packed = packed_weight("Q4_0", 16, 320).to(DEV)                 # K not a multiple of 256: a masked tail
    w = dequantize(packed, "Q4_0")
    for m in (2, 12):
        x = torch.randn(1, m, 320, device=DEV)
        _close(qops.quant_matmul(x, packed, qtype="Q4_0", n=16, k=320), x @ w.t())
    old = gguf.configure(gemm={"path": "dequant", "scratch_elements": 5 * 320})   # dequantize + matmul, in slices
    try:
        x = torch.randn(12, 320, device=DEV)
        _close(qops.quant_matmul(x, packed, qtype="Q4_0", n=16, k=320), x @ w.t())
    finally:
        gguf.configure(*old)
    e = qops.quant_gather(packed, torch.tensor([[1, -1]], device=DEV), qtype="Q4_0", n=16, k=320)
    assert torch.equal(e, w[[1, 15]].reshape(1, 2, 320))


# ------------------------------------------------------------------ compiled for the H200 (no GPU needed)
def _compile_sm90(*specs: str) -> dict:
    """Compile kernels (``kernel:type:m``) for sm_90 with Triton's own ptxas in a process without the
    interpreter (under it, nothing compiles): what the interpreter cannot check, e.g. layouts or types
    the GPU compiler rejects. Returns spec -> {"ok", "error", "vector_loads"}."""
    import json
    import subprocess
    import sys
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    script = os.path.join(os.path.dirname(__file__), "_compile_sm90.py")
    out = subprocess.run([sys.executable, script, *specs], capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode == 3:
        pytest.skip(out.stdout.strip())
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_decode_gemv_compiles_for_sm90():
    res = _compile_sm90("gemv:Q4_K:1")["gemv:Q4_K:1"]
    assert res["ok"], res["error"]
    assert res["vector_loads"]                          # a Q4_K chunk's bytes load 16 at a time


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90():
    specs = [f"{k}:{n}:{m}" for n in QTYPES for k, m in (("gemv", 1), ("gemv", 8), ("gemm", 0), ("rows", 0))]
    res = _compile_sm90(*specs)
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items() if not r["ok"]}
