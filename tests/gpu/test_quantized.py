"""Quantized weights on the GPU: every type's Triton kernels (GEMV for M <= 8, both prefill paths, the
row gather) against dequantize-then-matmul; a plan with QuantMatMul / QuantGather captured (cuda_graphs,
triton) against slot_by_slot; a Q4_K_M GGUF model decoding on CUDA; the int4 tinygemm baseline of
``shapeplan bench --vs-torch-compile``. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

import shapeplan as sp  # noqa: E402
from shapeplan.ir.graph import Graph  # noqa: E402
from shapeplan.ops import quantized as qops  # noqa: E402
from shapeplan.quant.dequant import dequantize  # noqa: E402
from shapeplan.quant.formats import QTYPES  # noqa: E402
from shapeplan.runtime.backends.triton.kernels import gguf  # noqa: E402
from tests.ops.test_quant_ops import packed_weight  # noqa: E402

DEV = "cuda"


@pytest.fixture(autouse=True)
def _no_fallback():
    qops._triton_failed.clear()
    yield
    assert not qops._triton_failed, qops._triton_failed


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(QTYPES))
def test_kernels_every_type(name, dtype):
    q = QTYPES[name]
    n, k = 300, 1024                                           # rows not a multiple of any block of rows
    p = packed_weight(name, n, k).to(DEV)
    w = dequantize(p, name)                                    # float32 reference weight [N, K]
    exact = dict(rtol=1e-6, atol=1e-6 * w.abs().max().item())   # d*sc*q - dm may fuse into an FMA on the GPU
    torch.testing.assert_close(gguf.dequantize_rows(p, q, k, torch.float32), w, **exact)
    idx = torch.tensor([[0, 299], [17, 17]], device=DEV)
    torch.testing.assert_close(gguf.dequantize_rows(p, q, k, torch.float32, idx), w[idx.reshape(-1)], **exact)
    for m in (1, 2, 5, 8):
        x = torch.randn(m, k, device=DEV, dtype=dtype)
        ref = x.float() @ w.t()
        _close(gguf.gemv(x, p, q, n, k), ref, dtype)
        _close(gguf.gemv(x, p, q, n, k, split=3), ref, dtype)
    for m in (16, 200):
        x = torch.randn(m, k, device=DEV, dtype=dtype)
        ref = x.float() @ w.t()
        _close(gguf.gemm(x, p, q, n, k), ref, dtype)
        _close(gguf.dequant_mm(x, p, q, n, k), ref, dtype)
        with gguf.configured(gemm={"swap": True}):          # the weight tile as the MMA's first operand
            _close(gguf.gemm(x, p, q, n, k), ref, dtype)


def _graph(name: str, n: int, k: int, p: torch.Tensor, m: int) -> Graph:
    g = Graph("q")
    x = g.placeholder("x", "bfloat16", (1, m, k))
    ids = g.placeholder("ids", "int64", (1, m))
    c = g.constant(p, name="w.packed")
    h = g.op.QuantGather(c, ids, qtype=name, n=n, k=k, dtype="bfloat16", _domain="shapeplan")
    y = g.op.QuantMatMul(g.op.Add(x, h), c, qtype=name, n=n, k=k, _domain="shapeplan")       # [1, m, n]
    g.set_outputs(g.op.QuantMatMul(g.op.Tanh(y), c, qtype=name, n=n, k=k, _domain="shapeplan"))  # n == k
    return g


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
@pytest.mark.parametrize("name,m,xq", [("Q4_K", 1, 1), ("Q4_K", 1, 2), ("Q6_K", 1, 2), ("Q8_0", 1, 1), ("Q8_0", 1, 2),
                                       ("Q4_0", 1, 2), ("IQ4_XS", 1, 1), ("IQ4_XS", 1, 2), ("IQ4_NL", 1, 2),
                                       ("Q6_K", 4, 1), ("INT4_G64", 64, 1)])
def test_captured_plan_matches_slot_by_slot(name, m, xq, mode, monkeypatch):
    """xq: the one-row kernels' x mode for these shapes (2: x as int8 codes, the quantizing kernel inside
    the captured graph too)."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    monkeypatch.setattr(qgemv, "DEFAULT", {q: (*t[:3], xq) for q, t in qgemv.DEFAULT.items()})
    n = k = 512
    p = packed_weight(name, n, k).to(DEV)
    ref_eng = sp.compile(_graph(name, n, k, p, m), device=DEV, mode="slot_by_slot")
    eng = sp.compile(_graph(name, n, k, p, m), device=DEV, mode=mode)
    for _ in range(5):
        feeds = {"x": torch.randn(1, m, k, device=DEV, dtype=torch.bfloat16),
                 "ids": torch.randint(0, n, (1, m), device=DEV)}
        (out,) = eng.run(feeds).values()
        (ref,) = ref_eng.run(feeds).values()
        if mode == "cuda_graphs":                                       # the same kernels, replayed
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
        else:                                    # Add / Tanh fused by the triton backend: bf16 rounding
            torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    info = eng.inspect()
    assert info.phase == "REPLAYING"
    assert all(s["capture"]["captured"] for s in info.segments if "capture" in s)


PROMPT = "Explain KV caching"
KW = dict(dtype="float32", max_prefill_length=32, max_kv_cache_length=96)


def _tiny_gguf(tmp_path, ftype: str, model_type: str = "llama") -> tuple[str, list[int]]:
    """A tiny random ``model_type`` model written by ``shapeplan quantize`` as ``ftype``, and its 16 greedy
    tokens on the CPU (the torch reference, the file's layout)."""
    from shapeplan.cli import main
    from shapeplan.llm.demo import make_tiny_checkpoint
    extra = {"head_dim": 128} if model_type == "qwen3" else {}
    ck = make_tiny_checkpoint(str(tmp_path / "hf"), model_type, hidden=256, intermediate_size=512, heads=4,
                              kv_heads=2, num_layers=2, **extra)
    path = str(tmp_path / "m.gguf")
    assert main(["quantize", ck, path, "--type", ftype]) == 0
    want = sp.llm.GenerationPipeline.from_pretrained(path, mode="slot_by_slot", **KW).generate(
        PROMPT, max_new_tokens=16).token_ids
    return path, want


def _same_tokens_in_every_mode(path: str, want: list[int]) -> None:
    for mode in ("slot_by_slot", "cuda_graphs", "triton"):
        pipe = sp.llm.GenerationPipeline.from_pretrained(path, device=DEV, mode=mode, **KW)
        assert pipe.generate(PROMPT, max_new_tokens=16).token_ids == want, mode


def test_gguf_model_on_cuda(tmp_path, monkeypatch):
    """The file's layouts on the device (``SHAPEPLAN_QUANT_REPACK=0``; ours are the default: the next test)."""
    from shapeplan.importers.gguf import read_gguf
    from shapeplan.quant.formats import QuantWeight
    monkeypatch.setenv("SHAPEPLAN_QUANT_REPACK", "0")
    path, want = _tiny_gguf(tmp_path, "Q4_K_M")
    _same_tokens_in_every_mode(path, want)
    _, weights, _ = read_gguf(path, device=DEV)
    assert all(w.packed.is_cuda for w in weights.values() if isinstance(w, QuantWeight))
    assert {w.qtype for w in weights.values() if isinstance(w, QuantWeight)} == {"Q4_K", "Q6_K"}
    bf = sp.llm.GenerationPipeline.from_pretrained(path, device=DEV, mode="triton", dtype="bfloat16",
                                                   max_prefill_length=32, max_kv_cache_length=96)
    assert len(bf.generate(PROMPT, max_new_tokens=16).token_ids) == 16


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_repacked_model_on_cuda(ftype, tmp_path, monkeypatch):
    """By default (SHAPEPLAN_QUANT_REPACK unset) the Q4_K / Q6_K / Q8_0 matrices land in the device arena as
    our layouts, and the tokens are the CPU reference's (file layout) in every mode."""
    from shapeplan.importers.gguf import read_gguf
    from shapeplan.quant.formats import QuantWeight
    path, want = _tiny_gguf(tmp_path, ftype)
    monkeypatch.delenv("SHAPEPLAN_QUANT_REPACK", raising=False)
    _, weights, _ = read_gguf(path, device=DEV)
    assert {w.qtype for w in weights.values() if isinstance(w, QuantWeight)} == \
        ({"Q4_K_R", "Q6_K_R"} if ftype == "Q4_K_M" else {"Q8_0_R"})
    _same_tokens_in_every_mode(path, want)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "phi3"])
def test_qwen_gguf_models_on_cuda(model_type, tmp_path):
    """qwen2 (q/k/v biases after the stacked quantized projection), qwen3 (q/k norms, q wider than the
    hidden size) and phi3 (q/k/v and gate/up stacked in the file, split by rows) files: every mode's tokens on
    the device are the CPU reference's, and a batch of three prompts gives each prompt's single-stream tokens."""
    path, want = _tiny_gguf(tmp_path, "Q4_K_M", model_type)
    _same_tokens_in_every_mode(path, want)
    pipe = sp.llm.GenerationPipeline.from_pretrained(path, device=DEV, mode="triton", max_num_seqs=4, **KW)
    prompts = [PROMPT, "A second prompt", PROMPT + " again"]
    alone = [pipe.generate(p, max_new_tokens=12).token_ids for p in prompts]
    assert [r.token_ids for r in pipe.generate_batch(prompts, max_new_tokens=12)] == alone


def test_bench_quantize_lays_out_as_a_load(tmp_path, monkeypatch):
    """``shapeplan bench --quantize``'s in-memory quantization on the GPU ends in the layouts and bytes a load of
    the file that ``shapeplan quantize`` writes gives (our repacked layouts), so the bench times what users run."""
    from shapeplan.importers.gguf import read_gguf
    from shapeplan.llm.bench import load_model, quantized
    from shapeplan.llm.demo import make_tiny_checkpoint
    from shapeplan.quant.formats import QuantWeight
    monkeypatch.delenv("SHAPEPLAN_QUANT_REPACK", raising=False)
    ck = make_tiny_checkpoint(str(tmp_path / "hf"), "llama", hidden=256, intermediate_size=512, heads=4,
                              kv_heads=2, num_layers=2)
    cfg, weights = load_model(None, ck, DEV, "float32")
    q = {n: w for n, w in quantized(cfg, weights, "Q4_K_M").items() if isinstance(w, QuantWeight)}
    assert {w.qtype for w in q.values()} == {"Q4_K_R", "Q6_K_R"}
    assert all(w.packed.is_cuda for w in q.values())
    path = str(tmp_path / "m.gguf")
    from shapeplan.cli import main
    assert main(["quantize", ck, path, "--type", "Q4_K_M"]) == 0
    _, loaded, _ = read_gguf(path, device=DEV)
    assert {n: w.qtype for n, w in loaded.items() if isinstance(w, QuantWeight)} == {n: w.qtype for n, w in q.items()}


@pytest.mark.parametrize("ftype", ["Q5_K_M", "Q4_0", "IQ4_XS"])
def test_q5_k_m_q4_0_and_iq4_xs_models_on_cuda(ftype, tmp_path):
    """A Q5_K_M file (Q5_K matrices, some Q6_K), a Q4_0 and an IQ4_XS file (their matrices, the head in Q6_K):
    one row of Q5_K runs the one-row kernel (Q4_K's with 5-bit codes), one row of Q4_0 and IQ4_XS Q8_0's
    (nibble codes; IQ4's through its table); the tokens are the CPU reference's in every mode."""
    _same_tokens_in_every_mode(*_tiny_gguf(tmp_path, ftype))


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_batched_decode_equals_single_stream_on_cuda(ftype, tmp_path, monkeypatch):
    """Three prompts decoded together (decode buckets of 2-4 rows: the one-row kernels with a program per row,
    the norm, gate and residual fused as at one row) give each prompt's single-stream tokens, in both captured
    modes."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    monkeypatch.setenv("SHAPEPLAN_QUANT_MMQ_MAX_ROWS", "0")          # bit for bit: the integer GEMM off (next test)
    path, _ = _tiny_gguf(tmp_path, ftype)
    rows = []
    real = qgemv.gemv1
    monkeypatch.setattr(qgemv, "gemv1", lambda x, *a, **kw: rows.append(x.shape[0]) or real(x, *a, **kw))
    prompts = [PROMPT, "Hello", "0 1 2 3"]
    for mode in ("cuda_graphs", "triton"):
        pipe = sp.llm.GenerationPipeline.from_pretrained(path, device=DEV, mode=mode, **KW)
        single = [pipe.generate(p, max_new_tokens=8).token_ids for p in prompts]
        assert [r.token_ids for r in pipe.generate_batch(prompts, 8)] == single, mode
    assert max(rows) > 1                                     # the batched steps ran the kernel on several rows


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_batched_decode_through_integer_gemm_on_cuda(ftype, tmp_path, monkeypatch):
    """Six prompts decoded together (decode bucket 8) with int8-x tiles everywhere: the decode steps' matrices run
    the integer tensor-core GEMM of mmq.py (the same codes of x as each prompt's single stream, another order of
    float sums) and each prompt gets its single-stream tokens, in both captured modes. Prefill never takes it."""
    from shapeplan.runtime.backends.triton.kernels import mmq, qgemv
    monkeypatch.setattr(qgemv, "DEFAULT", {q: (*t[:3], 2) for q, t in qgemv.DEFAULT.items()})
    path, _ = _tiny_gguf(tmp_path, ftype)
    rows = []
    real = mmq.mmq
    monkeypatch.setattr(mmq, "mmq", lambda x, *a, **kw: rows.append(x.shape[0]) or real(x, *a, **kw))
    prompts = [PROMPT, "Hello", "0 1 2 3", "a b", "KV caching explained", "Why"]
    for mode in ("cuda_graphs", "triton"):
        pipe = sp.llm.GenerationPipeline.from_pretrained(path, device=DEV, mode=mode, **KW)
        single = [pipe.generate(p, max_new_tokens=8).token_ids for p in prompts]
        assert [r.token_ids for r in pipe.generate_batch(prompts, 8)] == single, mode
        assert set(rows) == {8}, rows                         # bucket 8's decode steps (no prefill, no bucket 1)
        rows.clear()


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_one_row_gemvs_with_pdl_on_cuda(ftype, tmp_path, monkeypatch):
    """``SHAPEPLAN_QUANT_GEMV_PDL=on``: every one-row GEMV (and x quantizer) launched with programmatic dependent
    launch, each waiting for the kernel before it before it reads x (``auto``, the default, does so on
    matrices of 4,096+ outputs and inputs only, which these tiny models lack); the tokens are the CPU
    reference's in every mode."""
    monkeypatch.setenv("SHAPEPLAN_QUANT_GEMV_PDL", "on")
    _same_tokens_in_every_mode(*_tiny_gguf(tmp_path, ftype))


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
def test_attention_codes_for_o_on_cuda(ftype, tmp_path, monkeypatch):
    """With int8-x tiles everywhere and ``SHAPEPLAN_QUANT_ATTN_X=on``, each decode step's attention kernel
    writes o's x as codes and o's one-row kernel reads them (no x quantizer before o): in every mode the
    tokens equal those of the same tiles with the fold off (o quantizing x itself)."""
    from shapeplan.runtime.backends.triton.kernels import qgemv
    path, _ = _tiny_gguf(tmp_path, ftype)
    monkeypatch.setattr(qgemv, "DEFAULT", {q: (*t[:3], 2) for q, t in qgemv.DEFAULT.items()})
    tokens, batches = {}, {}
    for fold in ("off", "on"):
        monkeypatch.setenv("SHAPEPLAN_QUANT_ATTN_X", fold)
        for mode in ("slot_by_slot", "cuda_graphs", "triton"):
            pipe = sp.llm.GenerationPipeline.from_pretrained(path, device=DEV, mode=mode, **KW)
            if fold == "on":
                assert sum(len(n.inputs) == 4 for n in pipe.graph.nodes if n.op_type == "QuantMatMulAdd") == 2
            tokens[fold, mode] = pipe.generate(PROMPT, max_new_tokens=16).token_ids
            if mode == "triton":        # rows > 1: the kernel writes row 0's codes, o's batched GEMV reads x
                batches[fold] = [r.token_ids for r in pipe.generate_batch([PROMPT, "Hello", "0 1 2 3"], 8)]
    assert len(set(map(tuple, tokens.values()))) == 1, tokens
    assert batches["on"] == batches["off"]


def test_int4_tinygemm_baseline_cuda_packing_matches_cpu():
    """The CUDA packing of the --vs-torch-compile int4 row gives the CPU packing's logits (same
    quantization, two tinygemm layouts); against bf16 the decoder differs by the 4-bit error itself
    (~9 % per projection on random weights, compounding over layers), so that is no packing check."""
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.reference import TorchDecoder
    from shapeplan.llm.reference_int4 import int4_weights
    from shapeplan.llm.weights import random_weights
    cfg = preset_config("llama-125m", "bfloat16")
    w = random_weights(cfg, device="cpu", seed=0)
    ids, pos = torch.tensor([[1, 50, 900, 7]]), torch.arange(4)
    cpu = TorchDecoder(cfg, int4_weights(cfg, w), max_kv_cache_length=64, device="cpu")(ids, pos).float()
    wd = {n: t.to(DEV) for n, t in w.items()}
    out = TorchDecoder(cfg, int4_weights(cfg, wd), max_kv_cache_length=64, device=DEV)(
        ids.to(DEV), pos.to(DEV)).float().cpu()
    rel = (out - cpu).norm() / cpu.norm()
    assert rel < 0.05, rel
