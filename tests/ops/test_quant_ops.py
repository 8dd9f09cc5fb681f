"""ops/quantized.py: QuantMatMul / QuantGather against dequantize-then-matmul / dequantize-then-index,
through the engine (torch reference kernels on CPU) and, under Triton's interpreter, the Triton kernels
of runtime/backends/triton/kernels/gguf.py for every type (within fp32 rounding)."""
from __future__ import annotations

import os
from unittest import mock

import numpy as np
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


def packed_weight(name: str, n: int, k: int, seed: int = 0, random_bytes: bool = False) -> torch.Tensor:
    """A packed ``name`` weight [n, k], quantized from random floats; ``random_bytes``: random blocks instead
    (every code and scale bit pattern, tests/quant/test_dequant.py's ``random_blocks``)."""
    if random_bytes:
        from tests.quant.test_dequant import random_blocks
        return random_blocks(name, n, k, seed)
    g = torch.Generator().manual_seed(seed)
    return quantize(torch.randn(n, k, generator=g) * 0.05, name)


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
    # prefill: fused tiles into tl.dot, whole K and split along K (uneven: a short last split), and a tiling
    # bench/quant_gemv.py --gemm-sweep tries (16-row M tiles, K tiles of 128 elements and of a whole 256 chunk,
    # the weight tile as the MMA's first operand)
    for tiling in ({"split": None}, {"split": 3}, {"bm": 16, "bn": 32, "bk": 128, "warps": 8, "stages": 3},
                   {"bm": 16, "bn": 64, "bk": 256, "split": 2}, {"bm": 16, "swap": True},
                   {"bm": 32, "bn": 64, "swap": True, "split": 2}):
        with gguf.configured(gemm=tiling):
            _close(gguf.gemm(x, packed, q, n, k), x @ w.t())


def test_triton_paths_through_the_op(triton_kernels):
    gguf = triton_kernels
    packed = packed_weight("Q4_0", 16, 320).to(DEV)                 # K not a multiple of 256: a masked tail
    w = dequantize(packed, "Q4_0")
    for m in (2, 12):                           # the GEMV; 12 rows of a narrow matrix: auto's dequantize + matmul
        x = torch.randn(1, m, 320, device=DEV)
        _close(qops.quant_matmul(x, packed, qtype="Q4_0", n=16, k=320), x @ w.t())
    for gemm in ({"path": "fused"}, {"path": "fused", "split": 3},                    # the fused GEMM, whole K or
                 {"path": "dequant", "scratch_elements": 5 * 320}):                    # split; dequantize, in slices
        with gguf.configured(gemm=gemm):
            x = torch.randn(12, 320, device=DEV)
            _close(qops.quant_matmul(x, packed, qtype="Q4_0", n=16, k=320), x @ w.t())
    e = qops.quant_gather(packed, torch.tensor([[1, -1]], device=DEV), qtype="Q4_0", n=16, k=320)
    assert torch.equal(e, w[[1, 15]].reshape(1, 2, 320))


def test_auto_takes_the_fused_gemm_only_where_it_measured_faster(triton_kernels, monkeypatch):
    """``gguf.matmul``'s choice of path by rows M and weight size N * K (the kernels themselves are tested
    above): the GEMV up to 8 rows; the fused GEMM up to ``fused_max_m`` rows of a matrix of ``fused_min_weights``
    elements or more (llama-8b's matrices but k / v; llama-1b's gate/up, down and LM head); dequantize + cuBLAS
    for smaller matrices and from 65 rows (the H100 table in gguf.GEMM's comment)."""
    gguf = triton_kernels
    calls = []
    monkeypatch.setattr(gguf, "gemv", lambda x, p, q, n, k, **kw: calls.append("gemv"))
    monkeypatch.setattr(gguf, "gemm", lambda x, p, q, n, k: calls.append("fused"))
    monkeypatch.setattr(gguf, "dequant_mm", lambda x, p, q, n, k: calls.append("dequant"))
    unread = torch.zeros(1, 18, dtype=torch.uint8)                  # the stand-ins read no weight
    cases = {(8, 128256, 4096): "gemv", (9, 16384, 2048): "fused", (64, 4096, 4096): "fused",
             (16, 2048, 8192): "fused", (16, 1024, 4096): "dequant", (64, 3072, 2048): "dequant",
             (65, 28672, 4096): "dequant", (128, 2048, 2048): "dequant", (2048, 128256, 4096): "dequant"}
    for m, n, k in cases:
        gguf.matmul(torch.zeros(m, 1), unread, QTYPES["Q4_0"], n, k)
    assert calls == list(cases.values())


def test_pdl_auto_takes_the_measured_shapes():
    """``SHAPEPLAN_QUANT_GEMV_PDL``: auto launches the one-row GEMVs with PDL on llama-8b-sized matrices only
    (measured faster there, slower on llama-1b's), on / off everywhere; a boolean's spellings still work."""
    from shapeplan import env
    from shapeplan.runtime.backends.triton.kernels.qgemv import pdl_wanted
    shapes = {(6144, 4096): True, (128256, 4096): True, (4096, 14336): True, (3072, 2048): False,
              (2048, 8192): False, (128256, 2048): False}
    assert {s: pdl_wanted(*s, "auto") for s in shapes} == shapes
    assert all(pdl_wanted(*s, "on") and not pdl_wanted(*s, "off") for s in shapes)
    assert env.get("SHAPEPLAN_QUANT_GEMV_PDL", {}) == "auto"
    assert [env.get("SHAPEPLAN_QUANT_GEMV_PDL", {"SHAPEPLAN_QUANT_GEMV_PDL": v}) for v in ("1", "0", "on", "AUTO")] \
        == ["on", "off", "on", "auto"]


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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])   # this checkout's shapeplan
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


def test_prefill_gemm_compiles_for_sm90():
    """The fused GEMM, whole K and split along K (float32 partial sums), in its tilings for 64 and for 16 rows,
    and with the weight tile as the MMA's first operand, as the GPU compiler takes them."""
    res = _compile_sm90("gemm:Q4_K:0", "gemm:Q4_K:1", "gemm:Q8_0_R:2", "gemm:Q6_K_R:3", "gemm:Q4_K_R:6",
                        "gemm:Q8_0_R:7", "mmq:Q8_0_R:0", "mmq:Q4_K_R:1", "mmq:Q4_K_R:2", "mmq:Q6_K_R:0",
                        "mmq:Q4_K_R:4", "mmq:Q6_K_R:5")
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items() if not r["ok"]}
    # the integer GEMM's products are int8 MMAs; with the weight tile first (SWAP) Hopper's warpgroup MMA
    assert all(r["int8_mma"] for s, r in res.items() if s.startswith("mmq"))
    assert res["mmq:Q8_0_R:0"]["wgmma"] and res["mmq:Q4_K_R:1"]["wgmma"] and not res["mmq:Q4_K_R:2"]["wgmma"]


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90():
    specs = [f"{k}:{n}:{m}" for n in QTYPES
             for k, m in (("gemv", 1), ("gemv", 8), ("gemm", 0), ("gemm", 1), ("gemm", 2), ("gemm", 3), ("gemm", 6),
                          ("rows", 0))]
    res = _compile_sm90(*specs)
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items() if not r["ok"]}


# ------------------------------------------------------------------ the integer tensor-core GEMM (mmq.py)
@pytest.mark.parametrize("name", ["Q8_0_R", "Q4_K_R", "Q6_K_R"])
def test_integer_mma_gemm(name, triton_kernels):
    """mmq.py: x as int8 codes per block of 32 times the weight's int8 codes in
    an int8 ``tl.dot``. Where int8 codes hold x exactly, dequantize-then-matmul to fp32 rounding; on random x
    the same arithmetic in torch (``_int8_x_linear``) to 1e-3. Both operand orders, 16- and 32-row tiles, split
    along K, 1-40 rows (17: 32-row tiles by default, 40: three 16-row tiles), N not a multiple of the tile's rows;
    random bytes (every code and scale pattern). Each type's own tiling (``mmq.tiling``: Q4_K_R 128 rows of W) too."""
    from shapeplan.runtime.backends.triton.kernels import mmq
    n, k = 20, 1024                                   # (x's quantizer: whole programs of 16 blocks)
    g = torch.Generator().manual_seed(21)
    packed = packed_weight(name, n, k, seed=6, random_bytes=True).to(DEV)
    w = dequantize(packed, name)
    for m, tiling in ((1, {}), (3, {"swap": False, "by_type": {}}), (17, {"bn": 16, "by_type": {}}),
                      (40, {"bm": 16, "split": 2, "by_type": {}})):                 # {}: each type's committed tiling
        codes = torch.randint(-127, 128, (m * k // 32, 32), generator=g).float()
        codes[:, 0] = 127 * torch.sign(torch.randn(m * k // 32, generator=g))
        scale = 2.0 ** -torch.randint(4, 9, (m * k // 32, 1), generator=g).float()
        exact = (codes * scale).reshape(m, k).to(DEV)                   # x that int8 codes hold exactly
        assert torch.equal(_x8(exact), exact)
        x = torch.randn(m, k, generator=g).to(DEV)
        with mock.patch.dict(mmq.MMQ, tiling):
            _close(mmq.mmq(exact, packed, name, n, k), exact @ w.t())
            y = mmq.mmq(x, packed, name, n, k)
        want = _int8_x_linear(name, packed, w, x)
        torch.testing.assert_close(y, want, rtol=1e-3, atol=1e-3 * want.abs().max().item())
    with pytest.raises(ValueError, match="K a multiple of 256 .* got Q8_0_R, K=160"):
        mmq.mmq(torch.zeros(2, 160, device=DEV), packed_weight("Q8_0_R", 4, 160).to(DEV), "Q8_0_R", 4, 160)


def test_integer_mma_gemm_dispatch(triton_kernels, monkeypatch):
    """The quantized ops take mmq.py only where ``mmq.wanted`` asks, for a decode step's rows (x [B, 1, K]; never a
    prefill's [1, S, K]): by default 5-16 rows (Q8_0_R 3-16; the one-row kernels keep fewer, the GEMMs 17 and up),
    only for its types, only for a matrix whose one-row kernel reads x as int8 codes (``qgemv.config``'s XQ 2 / 3),
    and ``SHAPEPLAN_QUANT_MMQ_MAX_ROWS`` moves the top (0: never)."""
    gguf = triton_kernels
    from shapeplan.runtime.backends.triton.kernels import mmq, qgemv
    calls = []
    monkeypatch.setattr(mmq, "mmq", lambda x, p, q, n, k: calls.append((q, x.shape[0])) or torch.zeros(x.shape[0], n))
    xq = {"mode": 2}
    monkeypatch.setattr(qgemv, "config", lambda q, n, k: (1, 1, 1, xq["mode"]))
    monkeypatch.setattr(gguf, "matmul", lambda x, p, q, n, k: torch.zeros(x.shape[0], n))
    weights = {name: packed_weight(name, 8, k).to(DEV) for name, k in (("Q4_K_R", 256), ("Q8_0_R", 256), ("Q6_K", 512))}

    def run(name, b, s=1):
        k = 512 if name == "Q6_K" else 256
        qops.quant_matmul(torch.randn(b, s, k, device=DEV), weights[name], qtype=name, n=8, k=k)

    for b in (4, 5, 8, 16, 17):
        run("Q4_K_R", b)
    for b in (2, 3):
        run("Q8_0_R", b)
    run("Q6_K", 8)                                                       # (the file's layout: not read)
    run("Q4_K_R", 1, 8)                                                  # a prefill's 8 rows
    assert calls == [("Q4_K_R", 5), ("Q4_K_R", 8), ("Q4_K_R", 16), ("Q8_0_R", 3)]
    calls.clear()
    xq["mode"] = 1                                                       # the single stream reads float x here
    run("Q4_K_R", 8)
    xq["mode"] = 3
    monkeypatch.setenv("SHAPEPLAN_QUANT_MMQ_MAX_ROWS", "0")
    run("Q4_K_R", 8)
    monkeypatch.setenv("SHAPEPLAN_QUANT_MMQ_MAX_ROWS", "64")
    for b in (2, 64, 65):
        run("Q4_K_R", b)
    assert calls == [("Q4_K_R", 64)]
    assert [mmq.block_m(m) for m in (2, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]    # one program column to 64 rows


# ------------------------------------------------------------------ the one-row kernels (qgemv.py)
ONE_ROW = ["Q4_K", "Q4_K_R", "Q5_K", "Q6_K", "Q6_K_R", "Q8_0", "Q8_0_R", "Q4_0", "IQ4_NL", "IQ4_XS"]
#: the types whose one-row kernel reads PF (Q4_K's kernel: Q4_K, Q4_K_R, Q5_K); the others ignore it
PF_TYPES = ("Q4_K", "Q4_K_R", "Q5_K")


def one_row_case(name: str, tiles: tuple | None, *rest) -> object:
    """A one-row kernel case (``name``, ``tiles``, ...) for ``parametrize``, run on CUDA only where Triton's
    interpreter would run another case's program again: the interpreter ignores ``tl.range``'s ``num_stages``
    (STAGES > 1), and a type outside ``PF_TYPES`` ignores PF, so such tiles differ from the same tiles without
    them only in compiled code (on CUDA; every variant's sm_90 PTX is checked on the CPU by
    ``test_one_row_kernels_compile_for_sm90``). This keeps the CPU suite to the cases that differ there."""
    tiles = tiles or ()                                                  # (BN, CH, warps, XQ[, STAGES[, PF]])
    stages, pf = tiles[4] if len(tiles) > 4 else 1, tiles[5] if len(tiles) > 5 else 0
    if stages > 1 or (pf and name not in PF_TYPES):
        return pytest.param(name, tiles or None, *rest, marks=pytest.mark.skipif(
            DEV != "cuda", reason="STAGES / PF: under Triton's interpreter the same run as these tiles without it"))
    return pytest.param(name, tiles or None, *rest)


def _unfused(x, w, s=None, r=None, glu=False, eps=1e-5):
    """float32 reference: rms_norm(x) * s @ W.T, then the SiLU gate of the halves or + r."""
    if s is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * s
    y = x @ w.t()
    if glu:
        g, u = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(g) * u
    return y + r if r is not None else y


@pytest.mark.parametrize("name,tiles,nk,random_bytes", [
    one_row_case(name, tiles, nk, random_bytes) for name in ONE_ROW
    for nk, tiles, random_bytes in [((13, 1024), (4, 1, 4, 1), False), ((13, 1024), (4, 1, 4, 0), False),
                                    ((7, 1536), (2, 2, 1, 1), True), ((7, 1536), (2, 2, 1, 0), True),
                                    ((7, 1536), (2, 2, 1, 1, 3), True), ((7, 1536), (2, 2, 1, 1, 1, 1), True),
                                    ((5, 512), None, False)]])
def test_one_row_kernel_equals_dequantize_then_matmul(name, tiles, nk, random_bytes, triton_kernels):
    """N not a multiple of BN, K over several super-blocks / block pairs (a partial last iteration with
    CH = 2), quantized weights and random bytes (every code and scale bit pattern); x read as quads in
    the weights' layout (XQ = 1) and as a tile broadcast over the rows (XQ = 0); the K loop in 3 stages, and
    Q4_K's next words prefetched into registers (PF; the other types ignore it)."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    n, k = nk
    packed = packed_weight(name, n, k, seed=n, random_bytes=random_bytes).to(DEV)
    w = dequantize(packed, name)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to(DEV)
    assert qgemv.supports(x, packed, name, k)
    _close(qgemv.gemv1(x, packed, name, n, k, tiles=tiles), x @ w.t())


def _x8(v: torch.Tensor) -> torch.Tensor:
    """x as XQ = 2 reads it (qgemv.quantize_x): int8 codes round(x * 127 / max|x|) per block of 32, times
    the block's scale, in float32 as the kernel computes them."""
    b = v.reshape(-1, 32)
    amax = b.abs().amax(1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.floor(b * inv + 0.5) * (amax / 127.0)).reshape(v.shape)


def _int8_x_linear(name, packed, w, x):
    """What the XQ = 2 kernel computes for x (float32, after the norm): ``_x8(x) @ W.T``; Q4_K takes its
    minimum term from the exact Σx per sub-block, so it adds (x - _x8(x)) @ W0.T, W0 = the weight with
    every code 0 (each sub-block's -dmin * m)."""
    x8 = _x8(x)
    y = x8 @ w.t()
    if name in ("Q4_K", "Q4_K_R", "Q5_K"):
        from shapeplan.quant.formats import unrepack
        src = "Q4_K" if name == "Q4_K_R" else name
        file_layout = unrepack(packed, name) if name == "Q4_K_R" else packed
        zero = file_layout.clone().view(packed.shape[0], -1, QTYPES[src].type_size)
        zero[:, :, 16:] = 0                                   # the codes (and Q5_K's qh), after [d, dmin] and the scales
        y = y + (x - x8) @ dequantize(zero.view(packed.shape), src).t()
    return y


#: the int8-x tiles: XQ = 2 for every type (K loop in 3 stages, Q4_K's register prefetch), XQ = 3 for Q4_K
INT8_X = ([(name, t) for name in ONE_ROW for t in [(4, 1, 4, 2), (2, 2, 1, 2), (2, 2, 1, 2, 3), (2, 2, 1, 2, 1, 1)]]
          + [(name, t) for name in ("Q4_K", "Q4_K_R") for t in [(4, 1, 4, 3), (2, 2, 1, 3), (2, 2, 1, 3, 3)]])


@pytest.mark.parametrize("name,tiles,n,random_bytes", [
    one_row_case(name, tiles, n, random_bytes) for name, tiles in INT8_X for n, random_bytes in [(13, False), (16, True)]])
def test_one_row_kernel_int8_x_exact(name, tiles, n, random_bytes, triton_kernels):
    """XQ = 2 / 3 (x as int8 codes, one dp4a per weight word) on an x that int8 codes hold exactly (each
    block a power-of-two scale times codes, one of them ±127): the dequantize-then-matmul result, to fp32
    rounding. N = 13: not a multiple of BN, a partial last iteration with CH = 2 (masked loads); N = 16
    with random bytes: every code and 6-bit scale / minimum pattern, and for XQ = 3 the unmasked launch
    (EVEN) where BN and CH divide N and K / 256."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    k = 1536
    g = torch.Generator().manual_seed(3)
    packed = packed_weight(name, n, k, seed=n, random_bytes=random_bytes).to(DEV)
    w = dequantize(packed, name)
    codes = torch.randint(-127, 128, (k // 32, 32), generator=g).float()
    codes[:, 0] = 127 * torch.sign(torch.randn(k // 32, generator=g))
    scale = 2.0 ** -torch.randint(4, 9, (k // 32, 1), generator=g).float()
    x = (codes * scale).reshape(1, k).to(DEV)
    assert torch.equal(_x8(x), x)
    _close(qgemv.gemv1(x, packed, name, n, k, tiles=tiles), x @ w.t())


@pytest.mark.parametrize("k", [160, 1024, 5120])
def test_x_quantizer_with_the_norm(k, triton_kernels):
    """XQ = 2's x quantizer with the norm (qgemv.quantize_x): per block of 32 of rms_norm(x) * s, the scale
    max|x| / 127, the exact sum, and the codes round(x * 127 / max|x|), byte b of word j = element 4j + b;
    K below one chunk (masked), at one, and past QX_CHUNK (a second, partial chunk of the sum of squares)."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    g = torch.Generator().manual_seed(k)
    x = torch.randn(1, k, generator=g).to(DEV)
    s = (torch.rand(k, generator=g) + 0.5).to(DEV)
    xw, xd, xs = qgemv.quantize_x(x, s, 1e-5, k)
    xn = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * s).reshape(-1, 32)
    amax = xn.abs().amax(1)
    torch.testing.assert_close(xd, amax / 127.0, rtol=1e-5, atol=0)
    torch.testing.assert_close(xs, xn.sum(1), rtol=1e-4, atol=1e-5)
    codes = xw.view(torch.int8).reshape(-1, 32).float()
    want = torch.floor(xn * (127.0 / amax[:, None]) + 0.5)
    assert (codes - want).abs().max().item() <= 1                   # a tie may round the other way
    assert (codes == want).float().mean().item() > 0.99


@pytest.mark.parametrize("name,xq", [(name, xq) for name in ONE_ROW for xq in (1, 0, 2)] + [("Q4_K", 3), ("Q4_K_R", 3)])
@pytest.mark.parametrize("case", ["norm", "norm+glu", "res"])
def test_one_row_kernel_prologue_and_epilogues(name, case, xq, triton_kernels):
    from shapeplan.runtime.backends.triton.kernels import qgemv
    n, k = 18, 1024                                           # GLU: 9 outputs, BN = 4: a partial block
    g = torch.Generator().manual_seed(7)
    packed = packed_weight(name, n, k, seed=3).to(DEV)
    w = dequantize(packed, name)
    x = torch.randn(1, k, generator=g).to(DEV)
    s = (torch.rand(k, generator=g) + 0.5).to(DEV)
    r = torch.randn(1, n, generator=g).to(DEV)
    kw = dict(norm_w=s if "norm" in case else None, eps=1e-5, residual=r if case == "res" else None,
              glu="glu" in case)
    y = qgemv.gemv1(x, packed, name, n, k, tiles=(4, 2, 4, xq), **kw)
    if xq < 2:
        _close(y, _unfused(x, w, kw["norm_w"], kw["residual"], kw["glu"]))
        return
    # XQ = 2 / 3: the norm applied before the int8 codes; a code may round the other way at a tie (1e-3)
    xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * s if kw["norm_w"] is not None else x
    want = _unfused(xn, w, None, kw["residual"], kw["glu"])
    lin = _int8_x_linear(name, packed, w, xn)
    if kw["glu"]:
        g_, u_ = lin.chunk(2, dim=-1)
        lin = torch.nn.functional.silu(g_) * u_
    lin = lin + kw["residual"] if kw["residual"] is not None else lin
    torch.testing.assert_close(y, lin, rtol=1e-3, atol=1e-3 * lin.abs().max().item())
    torch.testing.assert_close(y, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())   # int8 x: ~1 % off


def assert_same_x_codes(got: torch.Tensor, want: torch.Tensor, k: int, ties: bool = False) -> None:
    """Two buffers of x as int8 codes (``x_codes``' layout) agree: codes and scales equal, sums to float32
    rounding; ``ties``: a code may be one off (a tie rounded the other way: the GPU's division need not
    round as IEEE's, which the interpreter and torch use)."""
    got, want = got.cpu(), want.cpu()
    nw, nb = k // 4, k // 32
    if ties:
        assert (got[:nw].view(torch.int8).int() - want[:nw].view(torch.int8).int()).abs().max() <= 1
        torch.testing.assert_close(got[nw:nw + nb].view(torch.float32), want[nw:nw + nb].view(torch.float32),
                                   rtol=1e-6, atol=0)
    else:
        assert torch.equal(got[:nw + nb], want[:nw + nb])
    torch.testing.assert_close(got[nw + nb:].view(torch.float32), want[nw + nb:].view(torch.float32),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K_R", "Q8_0_R", "Q4_0"])
def test_one_row_kernel_reads_given_x_codes(name, triton_kernels):
    """``x_codes`` (x as int8 codes made before, as the paged decode attention writes them for o): the
    result equals the kernel's own quantization of the same x, in every x mode that reads codes; the torch
    form of the codes (``shapeplan.quant.quantize.x_codes``) gives the same words and scales; x modes 0 / 1
    read x and ignore the codes; codes of the wrong size, or beside a norm prologue, are a clear error."""
    from shapeplan.quant.quantize import x_codes
    from shapeplan.runtime.backends.triton.kernels import qgemv
    n, k = 12, 1024
    g = torch.Generator().manual_seed(13)
    packed = packed_weight(name, n, k, seed=9).to(DEV)
    x = torch.randn(1, k, generator=g).to(torch.bfloat16).to(DEV)
    r = torch.randn(1, n, generator=g).to(torch.bfloat16).to(DEV)
    buf = torch.empty(qgemv.x_code_words(k), dtype=torch.int32, device=DEV)
    qgemv.quantize_x(x, None, 0.0, k, out=buf)
    assert_same_x_codes(buf, x_codes(x.cpu()), k, ties=DEV == "cuda")
    for xq in (0, 1, 2) + ((3,) if name in qgemv.INT_DOTS else ()):
        want = qgemv.gemv1(x, packed, name, n, k, residual=r, tiles=(4, 2, 4, xq))
        got = qgemv.gemv1(torch.zeros_like(x) if xq >= 2 else x, packed, name, n, k, residual=r,
                          tiles=(4, 2, 4, xq), x_codes=buf)        # xq >= 2: x itself is not read
        assert torch.equal(got, want), xq
    with pytest.raises(ValueError, match="x_codes must be int32 \\[320\\]"):
        qgemv.gemv1(x, packed, name, n, k, tiles=(4, 2, 4, 2), x_codes=buf[:-1])
    with pytest.raises(ValueError, match="without a norm prologue"):
        qgemv.gemv1(x, packed, name, n, k, norm_w=torch.ones(k, device=DEV), tiles=(4, 2, 4, 2), x_codes=buf)
    with pytest.raises(ValueError, match="with one row of x .* and 2 rows"):
        qgemv.gemv1(x.expand(2, k), packed, name, n, k, tiles=(4, 2, 4, 2), x_codes=buf)


@pytest.mark.parametrize("name,xq,case", [(name, xq, case) for name in ONE_ROW
                                          for xq, case in ((1, "norm+glu"), (2, "norm+glu"), (2, "res"))]
                         + [("Q4_K", 0, "norm+glu"), ("Q4_K", 3, "res"), ("Q4_K_R", 3, "norm+glu")])
def test_one_row_kernel_rows_equal_one_row_calls(name, xq, case, triton_kernels):
    """x of 3 rows (the batched engine's decode, up to 8): a program per row and block of outputs, and each row
    is bit for bit the one-row call on that row (the same tiles and arithmetic; with XQ = 2 / 3 the rows' x
    quantized in one launch, each row's codes those of a one-row quantization); x rows 2 bytes off 8-byte
    alignment are copied first."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    n, k, m = 18, 512, 3
    g = torch.Generator().manual_seed(17)
    packed = packed_weight(name, n, k, seed=4).to(DEV)
    x = torch.randn(m, k + 1, generator=g).to(torch.bfloat16).to(DEV)[:, 1:]     # rows 2 bytes past alignment
    s = (torch.rand(k, generator=g) + 0.5).to(torch.bfloat16).to(DEV)
    r = torch.randn(m, n, generator=g).to(torch.bfloat16).to(DEV)
    kw = dict(norm_w=s, eps=1e-5, glu=True) if case == "norm+glu" else {}
    y = qgemv.gemv1(x, packed, name, n, k, tiles=(4, 2, 4, xq), residual=r if case == "res" else None, **kw)
    for i in range(m):
        yi = qgemv.gemv1(x[i:i + 1], packed, name, n, k, tiles=(4, 2, 4, xq),
                         residual=r[i:i + 1] if case == "res" else None, **kw)
        assert torch.equal(y[i:i + 1], yi), (i, (y[i] - yi[0]).abs().max().item())
    if xq >= 2:
        codes = qgemv.x_code_buffer(k, DEV, m)
        qgemv.quantize_x(x.contiguous(), kw.get("norm_w"), 1e-5, k, out=codes)
        words = qgemv.x_code_words(k)
        for i in range(m):             # (each row copied to an aligned address, as gemv1 does: x's alignment
            one = qgemv.x_code_buffer(k, DEV)      # picks the loads' width, and so the order Σx is summed in)
            xi = x[i:i + 1].clone(memory_format=torch.contiguous_format)
            qgemv.quantize_x(xi, kw.get("norm_w"), 1e-5, k, out=one)
            assert torch.equal(codes[i * words:(i + 1) * words], one)


@pytest.mark.parametrize("name", ONE_ROW)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_one_row_kernel_16_bit_x(name, dtype, triton_kernels):
    """bf16 / float16 x and norm weight (the decode step's): the quads' halves widened by shift and mask
    (bf16) or as float16, x at an address 2 bytes off 8-byte alignment (copied first), against float32
    math on the same rounded inputs; the output rounded to x's dtype."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    n, k = 12, 1024
    g = torch.Generator().manual_seed(11)
    packed = packed_weight(name, n, k, seed=5).to(DEV)
    w = dequantize(packed, name)
    x = torch.randn(1, k + 1, generator=g).to(dtype).to(DEV)[:, 1:]       # 2 bytes past an aligned address
    s = (torch.rand(k, generator=g) + 0.5).to(dtype).to(DEV)
    for xq in (1, 0, 2) + ((3,) if name in qgemv.INT_DOTS else ()):
        y = qgemv.gemv1(x, packed, name, n, k, norm_w=s, eps=1e-5, tiles=(4, 2, 4, xq))
        assert y.dtype == dtype
        want = _unfused(x.float(), w, s.float(), None, False)
        torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_one_row_kernel_dispatch(triton_kernels, monkeypatch):
    """gguf.matmul sends up to 8 rows of Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 to the one-row kernel; a packed view 2
    bytes off word alignment, other types (Q4_1) and 9 rows or more take the other kernels."""
    gguf = triton_kernels
    from shapeplan.runtime.backends.triton.kernels import qgemv
    calls = []
    real = qgemv.gemv1
    monkeypatch.setattr(qgemv, "gemv1", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    packed = packed_weight("Q8_0", 4, 512).to(DEV)
    w = dequantize(packed, "Q8_0")
    x = torch.randn(1, 512, device=DEV)
    _close(gguf.matmul(x, packed, QTYPES["Q8_0"], 4, 512), x @ w.t())
    assert calls == ["Q8_0"]
    raw = torch.zeros(4 * 544 + 2, dtype=torch.uint8, device=DEV)
    off = raw[2:].view(4, 544)
    off.copy_(packed)
    assert not qgemv.supports(x, off, "Q8_0", 512)
    _close(gguf.matmul(x, off, QTYPES["Q8_0"], 4, 512), x @ w.t())
    _close(gguf.matmul(x.expand(2, 512), packed, QTYPES["Q8_0"], 4, 512), x.expand(2, 512) @ w.t())
    assert calls == ["Q8_0", "Q8_0"]                               # two rows (one x row, stride 0): the same kernel
    x9 = torch.randn(9, 512, device=DEV)
    _close(gguf.matmul(x9, packed, QTYPES["Q8_0"], 4, 512), x9 @ w.t())
    assert calls == ["Q8_0", "Q8_0"]
    with pytest.raises(ValueError, match="1 to 8 rows, got 9"):
        real(x9, packed, "Q8_0", 4, 512)
    calls.clear()
    with pytest.raises(ValueError, match="x mode 3 .* not Q8_0"):           # integer dots: Q4_K only
        real(x, packed, "Q8_0", 4, 512, tiles=(2, 2, 1, 3))
    q5 = packed_weight("Q5_K", 4, 512).to(DEV)                             # (Q5_K's products overflow them)
    with pytest.raises(ValueError, match="x mode 3 .* not Q5_K"):
        real(x, q5, "Q5_K", 4, 512, tiles=(2, 2, 1, 3))
    _close(gguf.matmul(x, q5, QTYPES["Q5_K"], 4, 512), x @ dequantize(q5, "Q5_K").t())
    assert calls == ["Q5_K"]                                                 # Q5_K, one row: the one-row kernel
    q40, q41 = packed_weight("Q4_0", 4, 512).to(DEV), packed_weight("Q4_1", 4, 512).to(DEV)
    _close(gguf.matmul(x, q40, QTYPES["Q4_0"], 4, 512), x @ dequantize(q40, "Q4_0").t())
    _close(gguf.matmul(x, q41, QTYPES["Q4_1"], 4, 512), x @ dequantize(q41, "Q4_1").t())
    assert calls == ["Q5_K", "Q4_0"]                                         # Q4_0: Q8_0's kernel; Q4_1: the generic


@pytest.mark.parametrize("name", ["Q4_K", "Q4_K_R", "Q5_K", "Q4_0", "Q4_1"])    # the one-row kernel; Q4_1: unfused
def test_fused_quant_ops_through_the_kernels(name, triton_kernels):
    """QuantRMSNormMatMul / QuantMatMulAdd with the Triton kernels (one and three rows: fused, but Q4_1: the norm,
    the GEMV and the gate / add) against the torch reference (the unfused ops)."""
    n, k = 16, 512
    g = torch.Generator().manual_seed(5)
    packed = packed_weight(name, n, k).to(DEV)
    s = (torch.rand(k, generator=g) + 0.5).to(DEV)
    for m in (1, 3):
        x = torch.randn(1, m, k, generator=g).to(DEV)
        r = torch.randn(1, m, n, generator=g).to(DEV)
        got = (qops.quant_rms_norm_matmul(x, s, packed, qtype=name, n=n, k=k, activation="silu_mul"),
               qops.quant_matmul_add(x, packed, r, qtype=name, n=n, k=k))
        old = qops.set_quant_kernels("torch")
        try:
            want = (qops.quant_rms_norm_matmul(x, s, packed, qtype=name, n=n, k=k, activation="silu_mul"),
                    qops.quant_matmul_add(x, packed, r, qtype=name, n=n, k=k))
        finally:
            qops.set_quant_kernels(old)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            _close(a, b)


@pytest.mark.parametrize("name", ["Q8_0_R", "Q4_K_R", "Q6_K_R"])
def test_fused_quant_ops_rows_through_integer_gemm(name, triton_kernels, monkeypatch):
    """A decode step's 8 rows of QuantRMSNormMatMul (norm + GLU) / QuantMatMulAdd where the one-row kernel reads x as int8 codes
    (tiles with XQ = 2) run mmq.py (the norm where x is quantized, then the gate / the add), and each row agrees
    with that row's one-row call to float32 rounding: the same codes of x, only the order of the sums differs
    (what batched decode on these buckets promises against single-stream decode). The first, a middle and
    the last row are checked (each row is its own program of the one-row kernel, and the same tile of mmq's);
    a prefill's 8 rows go to the one-row kernels, never to mmq."""
    from shapeplan.runtime.backends.triton.kernels import mmq, qgemv
    tiles = qgemv.DEFAULT_LARGE[qgemv.tiles_type(name)]
    assert tiles[3] == 2
    monkeypatch.setattr(qgemv, "config", lambda q, n, k: tiles)
    rows = []
    real = mmq.mmq
    monkeypatch.setattr(mmq, "mmq", lambda x, *a, **kw: rows.append(x.shape[0]) or real(x, *a, **kw))
    n, k = 16, 512
    g = torch.Generator().manual_seed(9)
    packed = packed_weight(name, n, k).to(DEV)
    s = (torch.rand(k, generator=g) + 0.5).to(DEV)
    x = torch.randn(8, 1, k, generator=g).to(DEV)                       # a decode step's 8 rows
    r = torch.randn(8, 1, n, generator=g).to(DEV)
    norm = qops.quant_rms_norm_matmul(x, s, packed, qtype=name, n=n, k=k, activation="silu_mul")
    add = qops.quant_matmul_add(x, packed, r, qtype=name, n=n, k=k)
    assert rows == [8, 8]
    for i in (0, 5, 7):
        _close(norm[i:i + 1], qops.quant_rms_norm_matmul(x[i:i + 1], s, packed, qtype=name, n=n, k=k,
                                                          activation="silu_mul"))
        _close(add[i:i + 1], qops.quant_matmul_add(x[i:i + 1], packed, r[i:i + 1], qtype=name, n=n, k=k))
    assert rows == [8, 8]                                                # the single rows: the one-row kernel
    monkeypatch.setenv("SHAPEPLAN_QUANT_MMQ_MAX_ROWS", "0")              # off: the one-row kernels, bit for bit
    assert torch.equal(qops.quant_matmul_add(x[:5], packed, r[:5], qtype=name, n=n, k=k)[2:3],  # (5 rows: mmq's
                       qops.quant_matmul_add(x[2:3], packed, r[2:3], qtype=name, n=n, k=k))    # when on)
    assert rows == [8, 8]
    monkeypatch.delenv("SHAPEPLAN_QUANT_MMQ_MAX_ROWS")
    one_row = []                                                         # (the routing only: the one-row kernel's
    monkeypatch.setattr(qgemv, "gemv1", lambda x, packed, q, n, *a, **kw:  # 8 rows are test_one_row_kernel_rows_*'s)
                        one_row.append(x.shape[0]) or torch.zeros(x.shape[0], n, dtype=x.dtype, device=x.device))
    qops.quant_matmul_add(x.reshape(1, 8, k), packed, r.reshape(1, 8, n), qtype=name, n=n, k=k)
    assert rows == [8, 8] and one_row == [8]                             # a prefill's 8 rows: the one-row kernel


#: the file layouts' kernels, compiled in every variant; the others (our layouts, Q5_K, Q4_0) share their code
#: and are compiled in the variants that differ (plain, norm + GLU, residual, int8 x)
FILE_ONE_ROW = ["Q4_K", "Q6_K", "Q8_0"]


def test_one_row_kernels_compile_for_sm90():
    """Every variant, and with programmatic dependent launch (SHAPEPLAN_QUANT_GEMV_PDL: griddepcontrol
    in the PTX; 3/4: norm + GLU / residual), every way of reading x, the K loop pipelined (STAGES), and the
    output projection's L2 prefetch of its weight (L2PF)."""
    more = [n for n in ONE_ROW if n not in FILE_ONE_ROW]
    specs = ([f"gemv1:{n}:{m}" for n in FILE_ONE_ROW for m in (0, 1, 2, 3, 4)]
             + [f"gemv1:{n}:{m}" for n in more for m in (0, 1, 2)]
             + [f"gemv1t:{n}:{m}" for n in FILE_ONE_ROW for m in (1, 2)]    # XQ = 0: the x tile broadcast
             + [f"gemv1i:{n}:{m}" for n in FILE_ONE_ROW for m in (1, 2, 3)]  # XQ = 2: x as int8 codes
             + [f"gemv1i:{n}:1" for n in more]
             + [f"gemv1s:{n}:{m}" for n in FILE_ONE_ROW for m in (1, 2)]    # XQ = 2, K loop in 3 stages
             + [f"gemv1p:{n}:{m}" for n in ("Q4_K", "Q5_K") for m in (1, 2)]   # XQ = 2, register prefetch
             + [f"gemv1q:{n}:{m}" for n in ("Q4_K",) for m in (1, 2, 4)] + ["gemv1q:Q4_K_R:1"]   # XQ = 3
             + ["quantx:x:0", "quantx:x:1", "quantx:x:2"]
             + [f"{v}:{n}:20" for v, n in (("gemv1i", "Q4_K_R"), ("gemv1q", "Q4_K_R"), ("gemv1i", "Q6_K_R"),
                                           ("gemv1i", "Q8_0_R"), ("gemv1", "Q8_0"))])   # + the weight's L2 prefetch
    res = _compile_sm90(*specs)
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items() if not r["ok"]}
    assert res["gemv1:Q4_K:0"]["vector_loads"]              # Q4_K super-blocks are 16-byte aligned
    assert res["gemv1:Q4_K_R:0"]["vector_loads"] and res["gemv1q:Q4_K_R:1"]["vector_loads"]   # and Q4_K_R's codes
    assert res["gemv1:Q5_K:0"]["vector_loads"]              # and Q5_K's 176-byte ones
    # Q8_0_R's and Q6_K_R's aligned codes load 2-4 words at once (as many as the tile gives a thread),
    # Q8_0's and Q6_K's one word each (the odd block realigned by funnel shifts): fewer loads
    assert all(res[f"{v}:{t}_R:{m}"]["global_loads"] < res[f"{v}:{t}:{m}"]["global_loads"]
               for v, m in (("gemv1", 0), ("gemv1i", 1)) for t in ("Q8_0", "Q6_K"))
    assert all(res[f"gemv1i:{n}:1"]["dp4a"] for n in ONE_ROW)    # XQ = 2: the products are dp4a
    assert all(res[f"gemv1:{n}:{m}"]["griddepcontrol"] == (m >= 3) for n in FILE_ONE_ROW for m in (0, 3, 4))
    assert res["gemv1i:Q4_K:3"]["griddepcontrol"] and res["quantx:x:2"]["griddepcontrol"]
    # STAGES > 1: the pipeliner turned the K loop's loads into cp.async copies; STAGES 1 left them plain
    assert all(res[f"gemv1s:{n}:{m}"]["cp_async"] and not res[f"gemv1i:{n}:{m}"]["cp_async"]
               for n in FILE_ONE_ROW for m in (1, 2))
    assert res["gemv1q:Q4_K:1"]["dp4a"] and res["gemv1q:Q4_K:4"]["griddepcontrol"]
    # the attention's output projection (residual, PDL) asks L2 for its weight first; no other variant does
    pf = [s for s in specs if s.endswith(":20")]
    assert all(res[s]["prefetch_l2"] and res[s]["griddepcontrol"] for s in pf)
    assert not any(res[s]["prefetch_l2"] for s in specs if s not in pf)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the prefetch runs with PDL, on CUDA (Hopper+) only")
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
def test_one_row_kernel_with_the_weight_prefetch_equals_without(name, monkeypatch):
    """QuantMatMulAdd's prefetch=1 (the attention's output projection) changes no value: bit for bit the one-row
    kernel without it, PDL on where the GPU has it."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    monkeypatch.setenv("SHAPEPLAN_QUANT_GEMV_PDL", "on")
    monkeypatch.setenv("SHAPEPLAN_LLM_GEMV_PREFETCH", "1")
    n, k = 512, 1024
    packed = packed_weight(name, n, k).to(DEV)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(1, 1, k, generator=g).to(DEV, torch.bfloat16)
    r = torch.randn(1, 1, n, generator=g).to(DEV, torch.bfloat16)
    got = qops.quant_matmul_add(a, packed, r, qtype=name, n=n, k=k, prefetch=1)
    assert torch.equal(got, qops.quant_matmul_add(a, packed, r, qtype=name, n=n, k=k))
    assert qgemv.supports(a.reshape(1, k), packed, name, k)


def test_one_row_switch_falls_back_to_the_generic_gemv(monkeypatch):
    """SHAPEPLAN_QUANT_ONE_ROW=0: the one-row kernel declines, so gguf.matmul (and the fused quantized ops)
    take the generic GEMV."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    x, packed = torch.zeros(1, 256), packed_weight("Q4_K", 8, 256)
    monkeypatch.setenv("SHAPEPLAN_QUANT_ONE_ROW", "1")
    on = qgemv.supports(x, packed, "Q4_K", 256)
    monkeypatch.setenv("SHAPEPLAN_QUANT_ONE_ROW", "0")
    assert on == qgemv.AVAILABLE and not qgemv.supports(x, packed, "Q4_K", 256)


def test_int8_x_switch_and_large_default(monkeypatch):
    """Shapes without a ``TUNE`` entry take x as int8 codes (XQ = 2) from ``LARGE`` weight elements on;
    ``SHAPEPLAN_QUANT_INT8_X=0`` keeps x in the activation dtype (XQ = 1, the same tile) for those and for
    the ``TUNE`` entries that chose int8 codes."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    if not qgemv.AVAILABLE:
        pytest.skip("no Triton")
    tuned = next(key for key, tiles in qgemv.TUNE.items() if tiles[3] == 2)
    monkeypatch.setenv("SHAPEPLAN_QUANT_INT8_X", "1")
    assert qgemv.config("Q4_K", 16384, 4096)[3] == 2 and qgemv.config("Q4_K", 64, 256)[3] == 1
    assert qgemv.config(*tuned) == qgemv.TUNE[tuned]
    monkeypatch.setenv("SHAPEPLAN_QUANT_INT8_X", "0")
    assert qgemv.config("Q4_K", 16384, 4096) == (*qgemv.DEFAULT_LARGE["Q4_K"][:3], 1)
    for key in [tuned] + [k for k, t in qgemv.TUNE.items() if len(t) > 4 and t[3] == 2][:1]:
        t = qgemv.TUNE[key]
        assert qgemv.config(*key) == (*t[:3], 1, *t[4:])      # STAGES / PF kept


def test_one_row_tune_table_is_well_formed():
    """Every ``TUNE`` entry: (BN, CH, warps, XQ[, STAGES[, PF]]) with powers of two where the kernel's
    aranges need them, a known x mode, STAGES >= 1 and PF only where a kernel reads it (Q4_K): a typo
    there would be ignored or fail only at the first launch on a GPU."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    for (qtype, n, k), t in qgemv.TUNE.items():
        assert qtype in qgemv.K_MULTIPLE and k % qgemv.K_MULTIPLE[qtype] == 0 and 4 <= len(t) <= 6, (qtype, n, k, t)
        bn, ch, warps, xq, stages, pf = qgemv.full_tiles(t)
        assert all(v > 0 and v & (v - 1) == 0 for v in (bn, ch, warps)), t
        assert xq in (0, 1, 2, 3) and stages >= 1 and pf in (0, 1) and (pf == 0 or qtype == "Q4_K"), (qtype, n, k, t)
        assert xq < 3 or (qtype in qgemv.INT_DOTS and pf == 0), (qtype, n, k, t)   # XQ 3: Q4_K's, no PF


def test_iq4_prmt_table_lookup_bit_logic():
    """The GPU branch of qgemv._iq4_bytes in integers, with PTX's ``prmt.b32`` (default mode: result byte i is
    byte ``c >> 4i & 7`` of the pair {a: bytes 0-3, b: bytes 4-7}) emulated: for every word of four codes
    0..15 it gives IQ4's table values as signed bytes (the interpreter runs the other branch, a table walk)."""
    from shapeplan.quant.formats import IQ4_VALUES
    from shapeplan.runtime.backends.triton.kernels import qgemv
    t0, t1, t2, t3 = (np.int64(w) & 0xFFFFFFFF for w in qgemv._iq4_table_words())
    codes = np.stack(np.meshgrid(*[np.arange(16)] * 4, indexing="ij"), -1).reshape(-1, 4).astype(np.int64)
    q = codes[:, 0] | codes[:, 1] << 8 | codes[:, 2] << 16 | codes[:, 3] << 24

    def prmt(a, b, c):
        pair = a | (b << 32)
        return sum(((pair >> (8 * ((c >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))

    t = q | (q >> 4)
    sel = ((t & 0xFF) | ((t >> 8) & 0xFF00)) & 0x7777
    lo, hi = prmt(t0, t1, sel), prmt(t2, t3, sel)
    m = ((q >> 3) & 0x01010101) * 0xFF
    out = (hi & m) | (lo & ~m & 0xFFFFFFFF)
    got = np.stack([(out >> (8 * b)) & 0xFF for b in range(4)], -1).astype(np.uint8).view(np.int8)
    np.testing.assert_array_equal(got, np.asarray(IQ4_VALUES, dtype=np.int8)[codes])
