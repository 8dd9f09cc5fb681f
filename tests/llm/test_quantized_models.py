"""Quantized Llama models end to end (CPU): a tiny random Llama written by ``shapeplan quantize`` as
Q4_K_M, Q8_0 and Q4_0 GGUF files gives the same greedy tokens as transformers loading the same file
(``from_pretrained(dir, gguf_file=...)``: it dequantizes with gguf-py); the weights stay packed in the
graph; ``from_pretrained(quantize="int8"|"int4")`` stays within the documented logit tolerance of the
float32 model (docs/llm.md#quantization)."""
from __future__ import annotations

import os

import pytest
import torch

import shapeplan as sp
from shapeplan.cli import main
from tests.llm.conftest import hf_greedy, prefill_logits as _prefill_logits

gguf = pytest.importorskip("gguf")
PROMPT = "Explain KV caching: keys and values"
# hidden 256 / intermediate 512: every matrix row is a multiple of the K-quants' 256-element blocks
DIMS = dict(hidden=256, intermediate_size=512, heads=4, kv_heads=2, num_layers=2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from shapeplan.llm.demo import make_tiny_checkpoint
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("hf-q")), "llama", **DIMS)


@pytest.fixture(scope="module")
def files(ckpt, tmp_path_factory):
    """file type -> GGUF path written by the CLI (once per module)."""
    made: dict[str, str] = {}
    d = tmp_path_factory.mktemp("gguf-q")

    def get(ftype: str) -> str:
        if ftype not in made:
            made[ftype] = str(d / f"tiny-{ftype}.gguf")
            assert main(["quantize", ckpt, made[ftype], "--type", ftype]) == 0
        return made[ftype]

    return get


def _pipe(path: str, mode: str = "slot_by_slot", **kw):
    return sp.llm.GenerationPipeline.from_pretrained(path, mode=mode, dtype="float32", max_prefill_length=32,
                                                     max_kv_cache_length=96, **kw)


QUANT_OPS = ("QuantMatMul", "QuantGather", "QuantRMSNormMatMul", "QuantMatMulAdd")


def _quant_nodes(pipe) -> list:
    return [n for n in pipe.graph.nodes if n.op_type in QUANT_OPS]


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0", "Q4_0", "IQ4_XS", "Q3_K_M"])     # Q3_K_M: Q3_K, Q4_K, Q5_K, Q6_K
def test_gguf_matches_transformers(ftype, files):
    pytest.importorskip("accelerate")                      # transformers' GGUF loader needs it
    from transformers import AutoModelForCausalLM
    path = files(ftype)
    pipe = _pipe(path)
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    ids = pipe.encode(PROMPT)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_prefill_logits(pipe, ids), ref, atol=1e-4, rtol=0)
    res = pipe.generate(PROMPT, max_new_tokens=16, sampling=sp.llm.Sampling.greedy())
    assert res.token_ids == hf_greedy(hf, ids, 16)
    # nothing was widened: every matrix is a uint8 constant of the file's bytes
    floats = [v for v in pipe.graph.values.values() if v.kind.value == "constant" and v.data.dim() == 2
              and v.data.is_floating_point() and not v.name.startswith("rope")]
    assert not floats, [v.name for v in floats]
    r = gguf.GGUFReader(path)
    file_bytes = sum(int(t.n_bytes) for t in r.tensors if len(t.shape) == 2)
    packed = sum(v.data.numel() for v in pipe.graph.values.values() if str(v.name).endswith(".packed"))
    assert packed == file_bytes


def test_q4_k_m_mixed_types_split_the_fused_projections(files):
    pipe = _pipe(files("Q4_K_M"))
    mm = {(n.attrs["qtype"], int(n.attrs["n"])) for n in _quant_nodes(pipe) if n.op_type != "QuantGather"}
    # layer 0 (Q4_K everywhere): q/k/v fused (256 + 2 * 128 rows); layer 1 (a "more bits" layer): V in
    # Q6_K, so q and k stay fused (256 + 128 rows, one op) and v is its own; the LM head (320 rows) in
    # Q6_K; gate/up fused in both layers; o (256 rows) in Q4_K, down in Q4_K (layer 0) and Q6_K (layer 1)
    assert mm == {("Q4_K", 512), ("Q4_K", 384), ("Q6_K", 128), ("Q4_K", 256), ("Q6_K", 320), ("Q4_K", 1024),
                  ("Q6_K", 256)}, mm
    norm_ops = [n for n in pipe.graph.nodes if n.op_type == "QuantRMSNormMatMul"]
    assert len(norm_ops) == 2 + 2 + 1 + 2    # layer 0: q/k/v, gate/up; layer 1: q+k, v, gate/up; the head: last token, all
    res = _pipe(files("Q4_K_M"), mode="emulated_replay").generate(PROMPT, max_new_tokens=12)
    assert res.token_ids == pipe.generate(PROMPT, max_new_tokens=12).token_ids      # replay == reference


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_fused_quantized_ops_equal_the_unfused_graph(ftype, files):
    """The decoder graph with QuantRMSNormMatMul / QuantMatMulAdd (torch kernels on CPU) gives the unfused
    graph's (RMSNormalization, QuantMatMul, SiluMul, SkipRMSNormalization) logits bit for bit."""
    import numpy as np
    from shapeplan.llm.bench import load_model
    from shapeplan.llm.model import build_graph
    cfg, w = load_model(None, files(ftype), "cpu", "float32")
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    out = {}
    for fuse in (True, False):
        g = build_graph(cfg, dict(w), max_kv_cache_length=16, fuse_norms=fuse)
        ops = {n.op_type for n in g.nodes}
        assert ("QuantRMSNormMatMul" in ops and "QuantMatMulAdd" in ops and "SkipRMSNormalization" not in ops) == fuse
        if fuse:                    # o_proj (after the attention) asks for its weight's L2 prefetch, down_proj not
            adds = [n.attrs.get("prefetch", 0) for n in g.nodes if n.op_type == "QuantMatMulAdd"]
            assert adds == [1, 0] * cfg.num_layers
        eng = sp.compile(g, mode="slot_by_slot", outputs=["logits", "all_logits"])
        feeds = {"input_ids": ids, "position": torch.tensor([0]), "length": torch.tensor([ids.shape[1]])}
        out[fuse] = eng.run(feeds, outputs=["logits", "all_logits"])
    for name in ("logits", "all_logits"):
        assert torch.equal(out[True][name], out[False][name]), name
    assert np.isfinite(out[True]["logits"].numpy()).all()


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q4_0"])
def test_cpu_unpack_dequantizes_once(ftype, files, monkeypatch):
    """``SHAPEPLAN_QUANT_CPU=unpack``: a CPU pipeline dequantizes every matrix once (no quantized op in its
    graph) and gives the packed pipeline's tokens and logits (the same dequantized values)."""
    packed = _pipe(files(ftype))
    monkeypatch.setenv("SHAPEPLAN_QUANT_CPU", "unpack")
    dense = _pipe(files(ftype))
    assert _quant_nodes(packed) and not _quant_nodes(dense)
    assert dense.generate(PROMPT, max_new_tokens=8).token_ids == packed.generate(PROMPT, max_new_tokens=8).token_ids
    ids = packed.encode(PROMPT)
    torch.testing.assert_close(dense.score(ids), packed.score(ids), rtol=1e-5, atol=1e-5)


def test_cpu_unpack_auto_is_bounded_by_memory(monkeypatch):
    """auto: unpack when the float weights take at most a quarter of the machine's memory."""
    from shapeplan.llm.pipeline import _cpu_unpack
    from shapeplan.quant.formats import QuantWeight
    from shapeplan.quant.quantize import quantize_weight
    w = {"a.weight": quantize_weight(torch.randn(64, 256), "Q8_0"), "norm": torch.ones(256)}
    assert isinstance(w["a.weight"], QuantWeight)
    dense = 64 * 256 * 2                                                  # bf16 bytes
    monkeypatch.setenv("SHAPEPLAN_QUANT_CPU", "auto")
    assert _cpu_unpack(w, torch.bfloat16, memory=4 * dense) and not _cpu_unpack(w, torch.bfloat16, memory=4 * dense - 1)
    assert not _cpu_unpack({"norm": torch.ones(2)}, torch.bfloat16, memory=1 << 40)   # nothing quantized
    monkeypatch.setenv("SHAPEPLAN_QUANT_CPU", "unpack")
    assert _cpu_unpack(w, torch.bfloat16, memory=1)
    monkeypatch.setenv("SHAPEPLAN_QUANT_CPU", "packed")
    assert not _cpu_unpack(w, torch.bfloat16, memory=1 << 40)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_attention_hands_o_its_x_as_codes(ftype, files, monkeypatch):
    """``SHAPEPLAN_QUANT_ATTN_X=on``: each paged layer's PagedWriteAttention has a second output, the o
    projection's x as int8 codes, which QuantMatMulAdd takes as its fourth input; the torch kernels read x
    itself, so the tokens are those of the graph without it (auto: off on the CPU)."""
    def graph_and_tokens(mode):
        monkeypatch.setenv("SHAPEPLAN_QUANT_ATTN_X", mode)
        pipe = _pipe(files(ftype))
        return pipe.graph, pipe.generate(PROMPT, max_new_tokens=6).token_ids

    g_on, on = graph_and_tokens("on")
    attn = [n for n in g_on.nodes if n.op_type == "PagedWriteAttention"]
    o = [n for n in g_on.nodes if n.op_type == "QuantMatMulAdd" and len(n.inputs) == 4]
    assert len(attn) == len(o) == DIMS["num_layers"] and all(len(n.outputs) == 2 for n in attn)
    assert {n.inputs[3].name for n in o} == {n.outputs[1].name for n in attn}
    for mode in ("auto", "off"):
        g, tokens = graph_and_tokens(mode)
        assert tokens == on
        assert all(len(n.outputs) == 1 for n in g.nodes if n.op_type == "PagedWriteAttention")


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_packed_arena_lays_out_stacked_groups(ftype, files, monkeypatch):
    """Off the CPU the packed matrices are copied into one buffer (``importers.gguf._arena``, run here on
    CPU tensors; the file's layouts, ``SHAPEPLAN_QUANT_REPACK=0``): the same bytes; q/k/v and gate/up of one
    type consecutive, so the builder stacks them without a copy; every other start 256-byte aligned; the
    decoder's logits unchanged."""
    import numpy as np
    from shapeplan.importers.gguf import ARENA_ALIGN, _arena
    from shapeplan.llm.bench import load_model
    from shapeplan.llm.model import _already_stacked, build_graph
    from shapeplan.llm.weights import fused_groups
    from shapeplan.quant.formats import QuantWeight
    monkeypatch.setenv("SHAPEPLAN_QUANT_REPACK", "0")
    cfg, w = load_model(None, files(ftype), "cpu", "float32")
    quant = {n: v for n, v in w.items() if isinstance(v, QuantWeight)}
    arena = _arena(quant, fused_groups(cfg), "cpu")
    base = next(iter(arena.values())).packed
    assert all(torch.equal(arena[n].packed, quant[n].packed) for n in quant)
    assert len({a.packed.untyped_storage().data_ptr() for a in arena.values()}) == 1
    stacked = 0
    for group in fused_groups(cfg):
        ws = [arena.get(n) for n in group]
        if all(ws) and len({(a.qtype, a.packed.shape[1]) for a in ws}) == 1:
            assert _already_stacked([a.packed for a in ws], torch.uint8) is not None, group
            assert ws[0].packed.storage_offset() % ARENA_ALIGN == 0
            stacked += 1
    assert stacked >= cfg.num_layers                      # gate/up everywhere (and q/k/v where one type)
    for group in fused_groups(cfg):                       # a mixed group (Q4_K_M's Q6_K v): q and k stacked
        types = [arena[n].qtype for n in group if n in arena]
        if len(set(types)) > 1:
            same = [arena[n].packed for n in group if arena[n].qtype == types[0]]
            assert len(same) < 2 or _already_stacked(same, torch.uint8) is not None, group
    starts = {a.packed.storage_offset() for a in arena.values()}
    assert base.untyped_storage().nbytes() - sum(a.nbytes for a in arena.values()) < ARENA_ALIGN * len(starts)
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    feeds = {"input_ids": ids, "position": torch.tensor([0]), "length": torch.tensor([ids.shape[1]])}
    out = [sp.compile(build_graph(cfg, dict(ws), max_kv_cache_length=16), mode="slot_by_slot").run(feeds)["logits"]
           for ws in (w, {**w, **arena})]
    assert torch.equal(out[0], out[1]) and np.isfinite(out[0].numpy()).all()


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_repacked_layouts_in_the_arena(ftype, files, monkeypatch):
    """``SHAPEPLAN_QUANT_REPACK`` on (the default): the arena stores each Q4_K / Q6_K / Q8_0 matrix as
    Q4_K_R / Q6_K_R / Q8_0_R (our layouts: a row's codes, then its headers), the same values; the stacked
    groups stay stacked (q/k/v, gate/up); the decoder's logits bit for bit those of the file's layout, in
    slot_by_slot and emulated replay."""
    from shapeplan.importers.gguf import _arena
    from shapeplan.llm.bench import load_model
    from shapeplan.llm.model import _already_stacked, build_graph
    from shapeplan.llm.weights import fused_groups
    from shapeplan.quant.formats import REPACKED, QuantWeight, unrepack
    monkeypatch.delenv("SHAPEPLAN_QUANT_REPACK", raising=False)
    cfg, w = load_model(None, files(ftype), "cpu", "float32")
    quant = {n: v for n, v in w.items() if isinstance(v, QuantWeight)}
    arena = _arena(quant, fused_groups(cfg), "cpu")
    kinds = {(quant[n].qtype, arena[n].qtype) for n in quant}
    assert kinds == ({("Q4_K", "Q4_K_R"), ("Q6_K", "Q6_K_R")} if ftype == "Q4_K_M" else {("Q8_0", "Q8_0_R")}), kinds
    for n in quant:
        want = quant[n].packed
        got = arena[n].packed
        assert torch.equal(unrepack(got, arena[n].qtype) if arena[n].qtype in REPACKED else got, want), n
    gate_up = [arena[n].packed for n in fused_groups(cfg)[-1] if n in arena]
    assert {arena[n].qtype for n in fused_groups(cfg)[-1] if n in arena} == {ftype[:4] + "_R"}
    assert _already_stacked(gate_up, torch.uint8) is not None
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    feeds = {"input_ids": ids, "position": torch.tensor([0]), "length": torch.tensor([ids.shape[1]])}
    want = sp.compile(build_graph(cfg, dict(w), max_kv_cache_length=16), mode="slot_by_slot").run(feeds)["logits"]
    for mode in ("slot_by_slot", "emulated_replay"):
        g = build_graph(cfg, {**w, **arena}, max_kv_cache_length=16)
        assert ftype[:4] + "_R" in {n.attrs.get("qtype") for n in g.nodes}
        assert torch.equal(sp.compile(g, mode=mode).run(feeds)["logits"], want), mode


def test_tied_embeddings_share_the_packed_table(tmp_path):
    from shapeplan.llm.demo import make_tiny_checkpoint
    ck = make_tiny_checkpoint(str(tmp_path / "tied"), "llama", tie_word_embeddings=True, **DIMS)
    out = str(tmp_path / "tied.gguf")
    assert main(["quantize", ck, out, "--type", "Q4_0"]) == 0
    pipe = _pipe(out)
    gather = next(n for n in _quant_nodes(pipe) if n.op_type == "QuantGather")
    readers = [n for n in pipe.graph.nodes if gather.inputs[0] in n.inputs]
    assert {n.op_type for n in readers} == {"QuantGather", "QuantRMSNormMatMul"}   # one table, two readers
    assert gather.attrs["qtype"] == "Q6_K"                                     # the head's type (llama.cpp)


#: load-time quantization against the float32 model on a tiny random Llama (init std 0.02): the max and
#: mean |logit difference| as fractions of the float32 logits' range (measured: int8 1.1 % / 0.22 %,
#: int4 12.6 % / 2.9 %; Q8_0 0.8 % / 0.16 %, Q4_K_M 8.2 % / 1.8 % for comparison)
TOLERANCE = {"int8": (0.03, 0.005), "int4": (0.25, 0.05)}


@pytest.fixture(scope="module")
def ckpt_std(tmp_path_factory):
    from shapeplan.llm.demo import make_tiny_checkpoint
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("hf-std")), "llama", init_std=0.02, **DIMS)


@pytest.mark.parametrize("spec", list(TOLERANCE))
def test_load_time_quantization_tolerance(spec, ckpt_std):
    ids = list(range(3, 40, 3))
    ref = _prefill_logits(_pipe(ckpt_std), ids)
    pipe = _pipe(ckpt_std, quantize=spec)
    types = {n.attrs["qtype"] for n in _quant_nodes(pipe)}
    assert types == {"int8": {"INT8_G128"}, "int4": {"INT4_G64"}}[spec]
    diff, span = (_prefill_logits(pipe, ids) - ref).abs(), (ref.max() - ref.min()).item()
    max_tol, mean_tol = TOLERANCE[spec]
    assert diff.max().item() < max_tol * span and diff.mean().item() < mean_tol * span, (diff.max(), diff.mean())
    replay = _pipe(ckpt_std, mode="emulated_replay", quantize=spec).generate(PROMPT, max_new_tokens=8)
    assert replay.token_ids == pipe.generate(PROMPT, max_new_tokens=8).token_ids


def test_quantize_refuses_a_gguf_file(files):
    from shapeplan.errors import InputError
    with pytest.raises(InputError, match="quantize= applies to Hugging Face checkpoints"):
        _pipe(files("Q8_0"), quantize="int4")


@pytest.mark.slow
@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q4_0", "IQ4_XS"])
@pytest.mark.parametrize("one_row", [False, True], ids=["bucket16", "one_row"])
def test_triton_kernels_in_the_pipeline(ftype, one_row, files, monkeypatch):
    """The Triton kernels (interpreter on CPU) through prefill (GEMM) and decode: the torch reference's tokens.
    On the CPU the smallest decode bucket has 16 rows (the batched GEMV); ``one_row`` forces it to 1, as on a
    GPU, so decode runs the one-row kernels (qgemv.py; Q4_K_M: Q4_K's and Q6_K's, Q4_0 and IQ4_XS: Q8_0's kernel
    with nibble codes; the Q6_K head's K, 256, is not a multiple of the Q6_K kernel's 512: the generic GEMV)."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton needs TRITON_INTERPRET=1 without CUDA")
    from shapeplan.llm import pipeline
    from shapeplan.ops import quantized as qops
    from shapeplan.runtime.backends.triton.kernels import qgemv
    calls = []
    if one_row:
        monkeypatch.setattr(pipeline, "CPU_MIN_DECODE_BUCKET", 1)
        monkeypatch.setattr(qgemv, "MIN_PROGRAMS", 1)           # 32 rows a program: the interpreter runs
        monkeypatch.setattr(qgemv, "DEFAULT", {q: (32, *t[1:]) for q, t in qgemv.DEFAULT.items()})   # them one by one
        real = qgemv.gemv1
        monkeypatch.setattr(qgemv, "gemv1", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    want = _pipe(files(ftype)).generate(PROMPT, max_new_tokens=6).token_ids
    old = qops.set_quant_kernels("triton")
    try:
        got = _pipe(files(ftype), mode="emulated_replay").generate(PROMPT, max_new_tokens=6).token_ids
    finally:
        qops.set_quant_kernels(old)
    assert not qops._triton_failed and got == want
    assert set(calls) == (set() if not one_row else {"Q4_K", "Q6_K"} if ftype == "Q4_K_M" else {ftype})


@pytest.mark.slow
@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_one_row_o_reads_the_attention_codes(ftype, files, monkeypatch):
    """The one-row kernels (interpreter) with int8-x tiles everywhere: o reads the codes PagedWriteAttention
    handed it (``SHAPEPLAN_QUANT_ATTN_X=on``; on the CPU the torch form of the codes, on a GPU the attention
    kernel's) and gives the tokens of the graph whose o quantizes x itself."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton needs TRITON_INTERPRET=1 without CUDA")
    from shapeplan.llm import pipeline
    from shapeplan.ops import quantized as qops
    from shapeplan.runtime.backends.triton.kernels import qgemv
    monkeypatch.setattr(pipeline, "CPU_MIN_DECODE_BUCKET", 1)
    monkeypatch.setattr(qgemv, "MIN_PROGRAMS", 1)
    monkeypatch.setattr(qgemv, "DEFAULT", {q: (32, t[1], t[2], 2) for q, t in qgemv.DEFAULT.items()})
    codes = []
    real = qgemv.gemv1
    monkeypatch.setattr(qgemv, "gemv1", lambda *a, **kw: codes.append(kw.get("x_codes") is not None) or real(*a, **kw))
    old = qops.set_quant_kernels("triton")
    try:
        got = {}
        for mode in ("off", "on"):
            monkeypatch.setenv("SHAPEPLAN_QUANT_ATTN_X", mode)
            got[mode] = _pipe(files(ftype), mode="emulated_replay").generate(PROMPT, max_new_tokens=6).token_ids
    finally:
        qops.set_quant_kernels(old)
    assert not qops._triton_failed and got["on"] == got["off"] and any(codes)
