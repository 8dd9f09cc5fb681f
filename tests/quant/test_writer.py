"""``shapeplan quantize``: the file-type mixtures (recipes) and the GGUF files the writer produces, read
back with gguf-py's own reader."""
from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np
import pytest
import torch

from shapeplan.cli import main
from shapeplan.errors import InputError, ModelError
from shapeplan.llm.config import preset_config
from shapeplan.quant.recipes import more_bits, stacked_type, tensor_types

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from shapeplan.llm.demo import make_tiny_checkpoint
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("hf")), "llama", hidden=256, intermediate_size=512,
                                num_layers=8, heads=4, kv_heads=2)


def test_more_bits_is_llama_cpps_rule():
    assert [i for i in range(16) if more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]


def test_q4_k_m_mixture():
    cfg = preset_config("llama-8b")
    t = tensor_types(cfg, "Q4_K_M")
    assert t["lm_head.weight"] == "Q6_K" and t["model.embed_tokens.weight"] == "Q4_K"
    assert t["model.layers.0.self_attn.v_proj.weight"] == t["model.layers.0.mlp.down_proj.weight"] == "Q6_K"
    assert t["model.layers.5.self_attn.v_proj.weight"] == "Q4_K"                 # (5 - 4) % 3 != 2
    assert t["model.layers.6.self_attn.v_proj.weight"] == "Q6_K"                 # (6 - 4) % 3 == 2
    assert {t[f"model.layers.5.self_attn.{p}_proj.weight"] for p in "qko"} == {"Q4_K"}
    assert "model.norm.weight" not in t                                          # 1-D: stays F32


@pytest.mark.parametrize("spec, mix", [
    # the type counts llama.cpp's llama-quantize gives Meta-Llama-3-8B (no importance matrix)
    ("Q2_K", {"Q2_K": 129, "Q3_K": 64, "Q4_K": 32, "Q6_K": 1}),
    ("Q3_K_S", {"Q3_K": 225, "Q6_K": 1}),
    ("Q3_K_M", {"Q3_K": 129, "Q4_K": 92, "Q5_K": 4, "Q6_K": 1}),
    ("Q3_K_L", {"Q3_K": 129, "Q5_K": 96, "Q6_K": 1}),
    ("Q4_K_S", {"Q4_K": 217, "Q5_K": 8, "Q6_K": 1}),
    ("Q4_K_M", {"Q4_K": 193, "Q6_K": 33}),
    ("Q5_K_M", {"Q5_K": 193, "Q6_K": 33}),
    ("Q8_0", {"Q8_0": 226}),
])
def test_file_type_mixtures_are_llama_cpps(spec, mix):
    assert collections.Counter(tensor_types(preset_config("llama-8b"), spec).values()) == mix


def test_the_per_kind_rules():
    t = tensor_types(preset_config("llama-8b"), "Q3_K_M")
    assert [t[f"model.layers.{i}.self_attn.v_proj.weight"] for i in range(3)] == ["Q5_K", "Q5_K", "Q4_K"]
    assert [t[f"model.layers.{i}.mlp.down_proj.weight"] for i in (0, 1, 2, 31)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert t["model.layers.7.self_attn.o_proj.weight"] == "Q4_K" and t["model.layers.7.mlp.up_proj.weight"] == "Q3_K"
    t = tensor_types(preset_config("llama-8b"), "IQ4_XS")              # 4 query heads a KV head: v in Q5_K
    assert t["model.layers.9.self_attn.v_proj.weight"] == "Q5_K"
    assert [t[f"model.layers.{i}.mlp.down_proj.weight"] for i in (3, 4)] == ["Q5_K", "IQ4_XS"]
    mha = dataclasses.replace(preset_config("llama-8b"), num_kv_heads=32)        # no GQA: Q2_K's v in Q3_K
    assert tensor_types(mha, "Q2_K")["model.layers.0.self_attn.v_proj.weight"] == "Q3_K"


def test_stacked_qkv_takes_llama_cpps_type():
    cfg = preset_config("llama-8b")
    assert stacked_type(cfg, "Q4_K_M", "blk.3.attn_qkv.weight", ["Q4_K", "Q4_K", "Q6_K"]) == "Q5_K"
    assert stacked_type(cfg, "Q3_K_L", "blk.3.attn_qkv.weight", ["Q3_K", "Q3_K", "Q5_K"]) == "Q4_K"
    assert stacked_type(cfg, "Q4_0", "blk.3.attn_qkv.weight", ["Q4_0", "Q4_0", "Q4_0"]) == "Q4_0"
    assert stacked_type(cfg, "Q4_K_M", "blk.3.ffn_up.weight", ["Q4_K", "Q6_K"]) == "Q6_K"


def test_tied_head_and_fallbacks():
    cfg = preset_config("llama-1b")                                              # tied embeddings
    assert tensor_types(cfg, "Q4_0")["model.embed_tokens.weight"] == "Q6_K"     # the table is the head
    assert tensor_types(cfg, "Q8_0")["model.embed_tokens.weight"] == "Q8_0"
    tiny = preset_config("llama-tiny")                                           # rows of 64: no K-quant
    t = tensor_types(tiny, "Q4_K_M")
    assert t["model.layers.0.self_attn.q_proj.weight"] == "Q5_0" and t["lm_head.weight"] == "Q8_0"
    assert set(tensor_types(tiny, "int4").values()) == {"INT4_G64"}
    with pytest.raises(InputError, match="unknown quantization 'Q7'"):
        tensor_types(tiny, "Q7")


def _read(path: str):
    r = gguf.GGUFReader(path)
    return r, {t.name: t for t in r.tensors}


def test_written_file_reads_back(ckpt, tmp_path, capsys):
    out = str(tmp_path / "m.gguf")
    assert main(["quantize", ckpt, out, "--type", "Q4_K_M"]) == 0
    assert "Q6_K x" in capsys.readouterr().err
    r, t = _read(out)
    assert r.get_field("general.architecture").contents() == "llama"
    assert r.get_field("general.file_type").contents() == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    assert r.get_field("llama.block_count").contents() == 8
    assert t["output.weight"].tensor_type.name == "Q6_K"
    assert t["blk.0.attn_v.weight"].tensor_type.name == "Q6_K" and t["blk.2.attn_v.weight"].tensor_type.name == "Q4_K"
    assert t["blk.0.attn_norm.weight"].tensor_type.name == "F32"
    # the vocabulary is the checkpoint's
    import json
    with open(os.path.join(ckpt, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    tokens = r.get_field("tokenizer.ggml.tokens").contents()
    assert all(tokens[i] == tok for tok, i in vocab.items())
    # Q rows are interleaved as llama.cpp's converter does: dequantized and un-permuted, they are HF's
    from safetensors.numpy import load_file
    from shapeplan.importers.gguf import _unpermute
    hf = load_file(os.path.join(ckpt, "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"]
    q = gguf.quants.dequantize(t["blk.0.attn_q.weight"].data, gguf.GGMLQuantizationType.Q4_K).reshape(hf.shape)
    back = _unpermute(torch.from_numpy(np.ascontiguousarray(q)), 4).numpy()
    assert np.abs(back - hf).max() < 0.1 * np.abs(hf).max()


def test_preset_file_and_errors(tmp_path):
    out = str(tmp_path / "p.gguf")
    assert main(["quantize", "--preset", "llama-tiny", out, "--type", "Q8_0"]) == 0
    _, t = _read(out)
    assert t["blk.1.ffn_up.weight"].tensor_type.name == "Q8_0" and "rope_freqs.weight" not in t
    assert main(["quantize", "--preset", "llama-tiny", "a", "b"]) == 1                  # one path with --preset


def test_refuses_what_gguf_cannot_hold(tmp_path):
    from shapeplan.llm.demo import make_tiny_checkpoint
    from shapeplan.quant.writer import write_gguf
    m = make_tiny_checkpoint(str(tmp_path / "m"), "mistral", sliding_window=24)
    with pytest.raises(ModelError, match="sliding window does not exist in GGUF's llama architecture"):
        write_gguf(m, str(tmp_path / "x.gguf"))
