"""ops/fused_linear.py: RMSNormMatMul and MatMulAdd against the unfused ops they replace (RMSNormalization,
MatMul, SiluMul, Add), through the engine, and the decode GEMV kernel (runtime/backends/triton/kernels/
gemv.py) under Triton's interpreter on CPU (on CUDA where there is one) against the unfused result."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")          # must precede the first import of triton

import shapeplan as sp  # noqa: E402
from shapeplan.errors import ShapeError  # noqa: E402
from shapeplan.ir.graph import Graph  # noqa: E402
from shapeplan.ops import fused_linear as fl  # noqa: E402
from shapeplan.ops.transformer import rms_normalization, silu_mul  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SP = "shapeplan"


def unfused(x, scale, w_t, residual=None, glu=False, eps=1e-5):
    y = (rms_normalization(x, scale, epsilon=eps) if scale is not None else x) @ w_t
    if glu:
        y = silu_mul(y)
    return residual + y if residual is not None else y


def _block_graph(h: int, n: int, f: int) -> tuple[Graph, dict]:
    """x -> qkv = RMSNormMatMul; x2 = MatMulAdd(q-slice, o, x); act = RMSNormMatMul(x2, gate|up, silu_mul);
    out = MatMulAdd(act, down, x2): a decoder block's linear layers on symbolic [B, S]."""
    g = torch.Generator().manual_seed(0)
    w = {"n1": torch.rand(h, generator=g) + 0.5, "n2": torch.rand(h, generator=g) + 0.5,
         "qkv": torch.randn(n, h, generator=g) / h ** 0.5, "o": torch.randn(h, n, generator=g) / n ** 0.5,
         "gu": torch.randn(2 * f, h, generator=g) / h ** 0.5, "down": torch.randn(h, f, generator=g) / f ** 0.5}
    gr = Graph("block")
    x = gr.placeholder("x", "float32", ("batch", "seq", h))
    c = {k: gr.constant(v if k.startswith("n") else v.t(), name=k) for k, v in w.items()}
    qkv = gr.op.RMSNormMatMul(x, c["n1"], c["qkv"], epsilon=1e-5, _domain=SP)
    x2 = gr.op.MatMulAdd(qkv, c["o"], x, _domain=SP)
    act = gr.op.RMSNormMatMul(x2, c["n2"], c["gu"], epsilon=1e-5, activation="silu_mul", _domain=SP)
    out = gr.op.MatMulAdd(act, c["down"], x2, _domain=SP)
    gr.set_outputs(out)
    return gr, w


def _block_ref(x, w):
    qkv = unfused(x, w["n1"], w["qkv"].t())
    x2 = x + qkv @ w["o"].t()
    act = unfused(x2, w["n2"], w["gu"].t(), glu=True)
    return x2 + act @ w["down"].t()


@pytest.mark.parametrize("mode", ["slot_by_slot", "emulated_replay"])
@pytest.mark.parametrize("rows", [(1, 1), (2, 5)])
def test_block_equals_unfused_ops(mode, rows):
    """CPU float32: the torch kernels give the unfused ops' values bit for bit, in every mode."""
    gr, w = _block_graph(32, 32, 48)
    eng = sp.compile(gr, device="cpu", mode=mode)
    x = torch.randn(*rows, 32, generator=torch.Generator().manual_seed(1))
    for _ in range(3):                                    # warm-up calls, then replay where the mode has it
        (y,) = eng.run({"x": x}).values()
    assert torch.equal(y, _block_ref(x, w))


def test_shape_errors_name_the_input():
    gr = Graph("bad")
    x = gr.placeholder("x", "float32", (1, 1, 16))
    w = gr.constant(torch.zeros(12, 8), name="w_t")
    with pytest.raises(ShapeError, match=r"'x' has 16 features, weight 'w_t' expects 12"):
        gr.op.RMSNormMatMul(x, gr.constant(torch.ones(16), name="s"), w, _domain=SP)
    w2 = gr.constant(torch.zeros(16, 7), name="odd")
    with pytest.raises(ShapeError, match="silu_mul needs an even N"):
        gr.op.RMSNormMatMul(x, gr.constant(torch.ones(16), name="s2"), w2, activation="silu_mul", _domain=SP)
    with pytest.raises(ShapeError, match=r"residual 'r' has 5 features, the product has 7"):
        gr.op.MatMulAdd(x, gr.constant(torch.zeros(16, 7), name="w7"), gr.placeholder("r", "float32", (1, 1, 5)),
                        _domain=SP)


# ------------------------------------------------------------------ the Triton decode GEMV
gemv = pytest.importorskip("shapeplan.runtime.backends.triton.kernels.gemv")

CASES = [dict(), dict(norm=True), dict(res=True), dict(norm=True, glu=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "+".join(c) or "plain")
@pytest.mark.parametrize("nk,tiles", [((48, 256), (16, 64, 4)), ((40, 300), (1, 128, 4)), ((40, 300), None)])
def test_gemv_kernel_equals_unfused(dtype, case, nk, tiles):
    n, k = nk
    g = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=g).to(DEV, dtype)
    w = (torch.randn(n, k, generator=g) / 16).to(DEV, dtype)
    s = (torch.rand(k, generator=g) + 0.5).to(DEV, dtype)
    r = torch.randn(1, n // 2 if case.get("glu") else n, generator=g).to(DEV, dtype)
    y = gemv.gemv(x, w, norm_w=s if case.get("norm") else None, eps=1e-5, residual=r if case.get("res") else None,
                  glu=bool(case.get("glu")), tiles=tiles)
    ref = unfused(x, s if case.get("norm") else None, w.t(), r if case.get("res") else None, bool(case.get("glu")))
    assert y.shape == ref.shape and y.dtype == dtype
    if dtype == torch.float32:                      # only the order of the K-sum differs
        assert (y - ref).abs().max().item() <= 1e-5
        return
    # bfloat16: no less accurate than the unfused ops, both against the float32 result of the same inputs
    f = lambda t: t.float() if t is not None else None  # noqa: E731
    truth = unfused(f(x), f(s) if case.get("norm") else None, f(w).t(), f(r) if case.get("res") else None,
                    bool(case.get("glu")))
    err_fused = (y.float() - truth).abs().max().item()
    err_unfused = (ref.float() - truth).abs().max().item()
    # (Triton's interpreter converts to bfloat16 by truncation: up to an ulp per rounding, three roundings)
    margin = 2 ** -8 if x.is_cuda else 2 ** -5
    assert err_fused <= err_unfused + margin * truth.abs().max().item()


def test_ops_take_the_gemv_for_one_row_and_the_unfused_path_for_more(monkeypatch):
    """set_gemv("triton") routes one-row calls through the kernel (counted), more rows through the
    unfused kernels; both agree with the unfused ops."""
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    old = fl.set_gemv("triton")
    try:
        g = torch.Generator().manual_seed(3)
        x1, x3 = torch.randn(1, 1, 64, generator=g).to(DEV), torch.randn(1, 3, 64, generator=g).to(DEV)
        s = (torch.rand(64, generator=g) + 0.5).to(DEV)
        w_t = (torch.randn(32, 64, generator=g) / 8).to(DEV).t()   # a row-major [N, K] weight, as the LLM graph has
        for x in (x1, x3):
            torch.testing.assert_close(fl.rms_norm_matmul(x, s, w_t, epsilon=1e-5, activation="silu_mul"),
                                       unfused(x, s, w_t, glu=True), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fl.matmul_add(x, w_t, x[..., :32]), x[..., :32] + x @ w_t,
                                       rtol=1e-5, atol=1e-5)
        assert calls == [(1, 64), (1, 64)]
    finally:
        fl.set_gemv(old)


def test_switch_turns_the_gemv_off(monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_LLM_FUSED_GEMV", "0")
    old = fl.set_gemv("triton")
    try:
        assert fl._gemv(torch.zeros(1, 8), torch.zeros(4, 8)) is None
    finally:
        fl.set_gemv(old)
    monkeypatch.setenv("SHAPEPLAN_LLM_FUSED_GEMV", "1")
    old = fl.set_gemv("torch")
    try:
        assert fl._gemv(torch.zeros(1, 8), torch.zeros(4, 8)) is None
    finally:
        fl.set_gemv(old)


def test_llm_graph_uses_the_fused_ops_and_keeps_the_unfused_when_asked():
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.model import build_graph
    from shapeplan.llm.weights import random_weights
    cfg = preset_config("llama-tiny", "float32")
    w = random_weights(cfg, device="cpu", seed=0)
    ops = {n.op_type for n in build_graph(cfg, dict(w), max_kv_cache_length=32).nodes}
    assert {"RMSNormMatMul", "MatMulAdd"} <= ops and not ops & {"SkipRMSNormalization", "SiluMul"}
    ops = {n.op_type for n in build_graph(cfg, dict(w), max_kv_cache_length=32, fuse_norms=False).nodes}
    assert not ops & {"RMSNormMatMul", "MatMulAdd"} and "SkipRMSNormalization" in ops
    assert np.isfinite(cfg.rms_norm_eps)


def test_gemv_kernel_compiles_for_sm90():
    """The kernel as the H200 compiles it (Triton's ptxas, no GPU needed): every variant, wide loads."""
    from tests.ops.test_quant_ops import _compile_sm90
    res = _compile_sm90("dense:Q4_K:0", "dense:Q4_K:1", "dense:Q4_K:2", "dense:Q4_K:3", "dense:Q4_K:4")
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items() if not r["ok"]}
    assert all(r["vector_loads"] for r in res.values())              # W tiles load 16 bytes at a time
    from shapeplan.runtime.backends.triton.kernels import gemv_jit
    if gemv_jit.HAS_GDC:                          # the PDL variant waits for the kernel before it
        assert res["dense:Q4_K:3"]["griddepcontrol"] and not res["dense:Q4_K:1"]["griddepcontrol"]
        # the output projection's: residual, PDL and its weight asked of L2 (1,024 lines a program, 4 a thread)
        assert res["dense:Q4_K:4"]["griddepcontrol"] and res["dense:Q4_K:4"]["prefetch_l2"] >= 1
    assert not any(res[f"dense:Q4_K:{m}"]["prefetch_l2"] for m in range(4))


def test_prefetch_lines_cover_the_weight_from_the_first_programs(monkeypatch):
    """gemv(prefetch=True): about PREFETCH_PROGRAMS programs ask L2 for the whole weight, a power of two of
    128-byte lines each (at least 128: one a thread); off for a weight that is not one block, or by the switch."""
    monkeypatch.setenv("SHAPEPLAN_LLM_GEMV_PREFETCH", "1")
    for (n, k), dtype, per in [((2048, 2048), torch.bfloat16, 1024), ((4096, 4096), torch.bfloat16, 4096),
                               ((3000, 1000), torch.float32, 2048), ((16, 16), torch.bfloat16, 128)]:
        w = torch.empty(n, k, dtype=dtype)
        lines = -(-w.numel() * w.element_size() // 128)
        assert gemv.prefetch_lines(w) == per
        assert -(-lines // per) <= gemv.PREFETCH_PROGRAMS
    assert gemv.prefetch_lines(torch.empty(64, 64).t()[:, :32]) == 0
    monkeypatch.setenv("SHAPEPLAN_LLM_GEMV_PREFETCH", "0")
    assert gemv.prefetch_lines(torch.empty(64, 64)) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the prefetch runs with PDL, on CUDA (Hopper+) only")
@pytest.mark.parametrize("nk", [(2048, 2048), (40, 300)])
def test_gemv_with_the_weight_prefetch_equals_without(nk, monkeypatch):
    """The L2 prefetch changes no value: bit for bit the GEMV without it (with PDL where the GPU has it)."""
    monkeypatch.setenv("SHAPEPLAN_LLM_GEMV_PREFETCH", "1")
    n, k = nk
    g = torch.Generator().manual_seed(n)
    x, r = torch.randn(1, k, generator=g).to(DEV, torch.bfloat16), torch.randn(1, n, generator=g).to(DEV, torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / 16).to(DEV, torch.bfloat16)
    assert torch.equal(gemv.gemv(x, w, residual=r, prefetch=True), gemv.gemv(x, w, residual=r))


def test_llm_graph_prefetches_only_the_output_projection():
    """The decoder graph marks the MatMulAdd after the attention (o_proj) with prefetch=1, not the down projection;
    the attribute leaves the values alone (the CPU kernels ignore it)."""
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.model import build_graph
    from shapeplan.llm.weights import random_weights
    cfg = preset_config("llama-tiny", "float32")
    nodes = [n for n in build_graph(cfg, dict(random_weights(cfg, device="cpu", seed=0)), max_kv_cache_length=32).nodes
             if n.op_type == "MatMulAdd"]
    assert len(nodes) == 2 * cfg.num_layers
    assert [n.attrs.get("prefetch", 0) for n in nodes] == [1, 0] * cfg.num_layers
    g = torch.Generator().manual_seed(3)
    a, w_t, r = torch.randn(1, 1, 24, generator=g), torch.randn(24, 16, generator=g), torch.randn(1, 1, 16, generator=g)
    assert torch.equal(fl.matmul_add(a, w_t, r, prefetch=1), fl.matmul_add(a, w_t, r))


def test_pdl_only_on_cuda_when_asked(monkeypatch):
    """Programmatic dependent launch is opt-in (SHAPEPLAN_LLM_GEMV_PDL) and never applies off CUDA."""
    monkeypatch.setenv("SHAPEPLAN_LLM_GEMV_PDL", "1")
    assert not gemv.pdl(torch.zeros(1, 8))
    monkeypatch.setenv("SHAPEPLAN_LLM_GEMV_PDL", "0")
    assert not gemv.pdl(torch.zeros(1, 8, device=DEV))
