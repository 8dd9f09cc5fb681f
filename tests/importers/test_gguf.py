"""GGUF import: a tiny random Hugging Face Llama (llama3 rope scaling, GQA) written to GGUF with
gguf.GGUFWriter the way llama.cpp's convert_hf_to_gguf does (Q/K rows permuted, Llama 3 scaling as
a rope_freqs tensor, byte-level BPE vocab + merges), loaded back and compared with transformers.

F32 / F16 / BF16 / Q8_0 files are compared with the HF model whose weights went through the same rounding
(F16 / BF16 cast, Q8_0 quantize + dequantize): prefill logits within 1e-4 and identical greedy tokens. Q8_0
against the *original* float weights: logits within 5 % of their range at most, 1 % on average
(documented in docs/llm.md)."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

import shapeplan as sp
from shapeplan.errors import ModelError
from tests.llm.conftest import hf_greedy, prefill_logits as _prefill_logits

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

PROMPT = "Explain KV caching: keys and values"
ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs with one intra-op thread (the shared ``one_thread`` fixture)."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from shapeplan.llm.demo import make_tiny_checkpoint
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("hf-llama")), "llama", rope_parameters=ROPE)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.generate_extra_tensors (llama3)."""
    base, factor = rope["rope_theta"], rope["factor"]
    lo, hi, old = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def hf_tensors(ckpt: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(os.path.join(ckpt, "model.safetensors"))


def write_gguf(ckpt: str, out: str, qtype: Q = Q.F32, *, arch: str = "llama", drop: tuple[str, ...] = (),
               raw: dict[str, Q] | None = None) -> str:
    with open(os.path.join(ckpt, "config.json")) as f:
        c = json.load(f)
    heads, kv_heads, hidden = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    head_dim = hidden // heads
    w = gguf.GGUFWriter(out, arch)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(ROPE["rope_theta"])
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    # tokenizer: byte-level BPE, as convert_hf_to_gguf writes a "gpt2" vocab
    with open(os.path.join(ckpt, "tokenizer.json")) as f:
        tj = json.load(f)
    vocab = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tj["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    def add(name: str, t: np.ndarray) -> None:
        if name in drop:
            return
        t = np.ascontiguousarray(t, dtype=np.float32)
        if raw and name in raw:                    # bytes of a type the reader cannot dequantize
            qt = raw[name]
            block, size = gguf.GGML_QUANT_SIZES[qt]
            nbytes = t.shape[-1] // block * size
            w.add_tensor(name, np.zeros((t.shape[0], nbytes), np.uint8), raw_dtype=qt)
        elif t.ndim == 1 or qtype == Q.F32:        # norms stay F32, as in llama.cpp
            w.add_tensor(name, t)
        elif qtype == Q.F16:
            w.add_tensor(name, t.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)

    sd = hf_tensors(ckpt)
    add("rope_freqs.weight", _rope_factors(ROPE, head_dim))
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c["num_hidden_layers"]):
        for hf, g in _LAYER.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if g == "attn_q":
                t = _permute(t, heads)
            elif g == "attn_k":
                t = _permute(t, kv_heads)
            add(f"blk.{i}.{g}.weight", t)
    add("output_norm.weight", sd["model.norm.weight"])
    add("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _rounded_hf(ckpt: str, qtype: Q):
    """The HF model with every 2-D weight rounded as ``qtype`` stores it."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    if qtype != Q.F32:
        with torch.no_grad():
            for p in m.parameters():
                if p.ndim == 2:
                    a = p.numpy()
                    if qtype == Q.BF16:
                        a = p.to(torch.bfloat16).float().numpy()
                    elif qtype == Q.F16:
                        a = a.astype(np.float16).astype(np.float32)
                    else:
                        a = gguf.quants.dequantize(gguf.quants.quantize(a, qtype), qtype)
                    p.copy_(torch.from_numpy(np.ascontiguousarray(a)))
    return m


def _pipe(path: str, **kw):
    return sp.llm.GenerationPipeline.from_pretrained(path, mode="slot_by_slot", dtype="float32",
                                                     max_prefill_length=64, max_kv_cache_length=128, **kw)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0], ids=lambda q: q.name)
def test_gguf_matches_transformers(qtype, ckpt, tmp_path):
    path = write_gguf(ckpt, str(tmp_path / f"tiny-{qtype.name}.gguf"), qtype)
    pipe = _pipe(path)
    hf = _rounded_hf(ckpt, qtype)
    from shapeplan.llm.tokenizer import Tokenizer
    ids = pipe.encode(PROMPT)
    assert ids == Tokenizer(ckpt).encode(PROMPT)          # the BPE rebuilt from the file's vocab/merges
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(_prefill_logits(pipe, ids), ref, atol=1e-4, rtol=0)
    res = pipe.generate(PROMPT, max_new_tokens=16, sampling=sp.llm.Sampling.greedy())
    assert res.token_ids == hf_greedy(hf, ids, 16)
    assert pipe.eos_token_ids == {1}
    if qtype == Q.Q8_0:                                   # against the unquantized weights: close, not equal
        with torch.no_grad():
            orig = _rounded_hf(ckpt, Q.F32)(torch.tensor([ids])).logits[0]
        diff, span = (_prefill_logits(pipe, ids) - orig).abs(), (orig.max() - orig.min()).item()
        assert diff.max().item() < 0.05 * span and diff.mean().item() < 0.01 * span, (diff.max(), diff.mean())


def test_sp_load_gguf_graph_and_tokenizer_dir(ckpt, tmp_path):
    path = write_gguf(ckpt, str(tmp_path / "tiny.gguf"), Q.BF16)
    g = sp.load(path, max_kv_cache_length=64)
    assert isinstance(g, sp.Graph) and "k_cache_1" in g.values and "logits" in g.values
    pipe = _pipe(path, tokenizer=ckpt)                  # tokenizer= a Hugging Face directory
    res = pipe.generate(PROMPT, max_new_tokens=4)
    assert len(res.token_ids) == 4


def test_truncated_file_names_the_tensor(ckpt, tmp_path):
    path = write_gguf(ckpt, str(tmp_path / "t.gguf"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(ModelError, match=r"t\.gguf.*'output\.weight'.*truncated"):
        sp.load(path)


def test_corrupt_header_is_a_model_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + os.urandom(40))
    with pytest.raises(ModelError, match="bad.gguf"):
        sp.load(str(bad))
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelError, match="bad.gguf"):
        sp.load(str(bad))


def test_missing_tensor(ckpt, tmp_path):
    path = write_gguf(ckpt, str(tmp_path / "m.gguf"), drop=("blk.1.ffn_down.weight",))
    with pytest.raises(ModelError, match=r"m\.gguf.*'blk\.1\.ffn_down\.weight'.*missing"):
        sp.load(path)


def test_unsupported_architecture(ckpt, tmp_path):
    path = write_gguf(ckpt, str(tmp_path / "a.gguf"), arch="gpt2")
    with pytest.raises(ModelError, match=r"a\.gguf.*'gpt2'.*supported GGUF architectures: llama"):
        sp.load(path)


def test_unsupported_quant_type(ckpt, tmp_path):
    path = write_gguf(ckpt, str(tmp_path / "q.gguf"), raw={"blk.0.ffn_up.weight": Q.Q8_1})
    with pytest.raises(ModelError, match=r"q\.gguf.*'blk\.0\.ffn_up\.weight'.*Q8_1.*supported: F32, F16"):
        sp.load(path)


# ------------------------------------------------------------------ any damage: a ModelError naming the file
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_file_reads_or_is_a_model_error(ckpt, tmp_path, data):
    """A GGUF file cut short anywhere, or with bytes changed, inserted or dropped anywhere in its header,
    metadata and tensor table: read, or a ModelError that names the file; never another exception."""
    path = str(tmp_path / "good.gguf")
    if not os.path.exists(path):
        write_gguf(ckpt, path, Q.Q8_0)
    raw = bytearray(open(path, "rb").read())
    head = min(len(raw), 8192)                           # the header, metadata and tensor infos are in front
    for _ in range(data.draw(st.integers(1, 3), label="damages")):
        at = data.draw(st.integers(0, head), label="at")
        what = data.draw(st.sampled_from(["cut", "flip", "insert", "drop"]), label="what")
        if what == "cut":
            del raw[data.draw(st.integers(0, max(0, len(raw) - 1)), label="cut at"):]
        elif what == "flip" and at < len(raw):
            raw[at] ^= data.draw(st.integers(1, 255), label="xor")
        elif what == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        else:
            del raw[at:at + data.draw(st.integers(1, 8), label="n")]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    from shapeplan.importers.gguf import read_gguf
    try:
        read_gguf(str(bad))
    except ModelError as e:
        assert "bad.gguf" in str(e), str(e)
