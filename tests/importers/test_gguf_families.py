"""GGUF files beyond the llama architecture and byte-level vocabularies: Qwen2 / Qwen3 files (``qwen2`` /
``qwen3`` architectures: q/k/v biases, q/k norms, rows not permuted) and SentencePiece vocabularies
(``tokenizer.ggml.model == "llama"``: Llama 2, Mistral, TinyLlama), each written by ``shapeplan quantize`` from
a tiny random checkpoint and read back both by shapeplan and by transformers' own GGUF loader, the reference:
the same logits, greedy tokens and token ids. A SentencePiece file without merges (as llama.cpp's converter
writes one from a ``tokenizer.model``) is made by copying a file without its ``tokenizer.ggml.merges``."""
from __future__ import annotations

import json
import os

import pytest
import torch

import shapeplan as sp
from shapeplan.cli import main
from shapeplan.errors import ModelError
from tests.llm.conftest import hf_greedy, prefill_logits

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")                          # transformers' GGUF loader needs it
PROMPT = "Explain KV caching: keys and values 2024"
# hidden 256 / intermediate 512: every matrix row is a multiple of the K-quants' 256-element blocks; qwen3 with
# head_dim 128 (q is 512 wide), as every Qwen3 model has (transformers' GGUF reader assumes it)
DIMS = dict(hidden=256, intermediate_size=512, heads=4, kv_heads=2, num_layers=2)
TEXTS = ["Explain KV caching: keys and values", " leading space and  two spaces", "tabs\tand\nnew lines\n\n",
         "digits 1234567 and 2024-12-06", "naïve café, Zürich: 東京 😀", "<s> inside </s> text", ""]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One intra-op thread (the shared ``one_thread`` fixture)."""


def _checkpoint(path: str, model_type: str, **kw) -> str:
    from shapeplan.llm.demo import make_tiny_checkpoint
    extra = {"head_dim": 128} if model_type == "qwen3" else {}
    out = make_tiny_checkpoint(path, model_type, **DIMS, **extra, **kw)
    if model_type == "phi3":                   # a pad token in the vocabulary (transformers' Phi-3 wants one)
        _pad(out)
    return out


def _pad(ckpt: str) -> None:
    p = os.path.join(ckpt, "tokenizer_config.json")
    with open(p) as fh:
        conf = json.load(fh)
    conf["pad_token"] = "<unk>"
    with open(p, "w") as fh:
        json.dump(conf, fh)


def _quantize(ckpt: str, out: str, ftype: str) -> str:
    assert main(["quantize", ckpt, out, "--type", ftype]) == 0
    return out


def _pipe(path: str, **kw):
    return sp.llm.GenerationPipeline.from_pretrained(path, mode="slot_by_slot", dtype="float32",
                                                     max_prefill_length=32, max_kv_cache_length=96, **kw)


def _hf(path: str):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=torch.float32).eval()


def _hf_tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def _fields(path: str) -> dict:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items()}


def _same_model(path: str) -> None:
    """Logits, greedy tokens and the prompt's ids of ``path`` equal transformers' reading of it."""
    pipe, hf = _pipe(path), _hf(path)
    ids = pipe.encode(PROMPT)
    assert ids == _hf_tokenizer(path)(PROMPT).input_ids
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(prefill_logits(pipe, ids), ref, atol=1e-4, rtol=0)
    res = pipe.generate(PROMPT, max_new_tokens=16, sampling=sp.llm.Sampling.greedy())
    assert res.token_ids == hf_greedy(hf, ids, 16)


@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "phi3"])
def test_qwen_and_phi3_files_match_transformers(model_type, ftype, tmp_path):
    ckpt = _checkpoint(str(tmp_path / "hf"), model_type)
    path = _quantize(ckpt, str(tmp_path / f"{model_type}.gguf"), ftype)
    f = _fields(path)
    assert f["general.architecture"] == model_type
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    if model_type == "qwen2":
        assert {"blk.0.attn_q.bias", "blk.1.attn_v.bias"} <= names
    elif model_type == "phi3":                                      # q/k/v and gate/up stacked, as llama.cpp's
        assert {"blk.0.attn_qkv.weight", "blk.1.ffn_up.weight"} <= names
        assert not names & {"blk.0.attn_q.weight", "blk.0.ffn_gate.weight"}
    else:
        assert {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names
        assert f["qwen3.attention.key_length"] == 128
    _same_model(path)


def test_qwen_rows_are_not_permuted(tmp_path):
    """llama.cpp permutes q/k rows for the llama architecture only: a qwen2 file holds Hugging Face's rows."""
    from safetensors.torch import load_file
    ckpt = _checkpoint(str(tmp_path / "hf"), "qwen2")
    path = _quantize(ckpt, str(tmp_path / "q.gguf"), "F32")
    t = {x.name: x for x in gguf.GGUFReader(path).tensors}
    ref = load_file(os.path.join(ckpt, "model.safetensors"))
    for g, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
        got = torch.from_numpy(t[f"blk.0.{g}.weight"].data.copy())
        assert torch.equal(got, ref[f"model.layers.0.self_attn.{hf}.weight"])


def _split_rules(ckpt: str, regex: str) -> None:
    """Give the checkpoint's byte-level tokenizer these split rules (a Split, then bytes -> unicode)."""
    p = os.path.join(ckpt, "tokenizer.json")
    with open(p, encoding="utf-8") as fh:
        tj = json.load(fh)
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    with open(p, "w", encoding="utf-8") as fh:
        json.dump(tj, fh)


@pytest.mark.parametrize("pre,model_type", [("qwen2", "qwen2"), ("tekken", "llama"), ("llama-bpe", "llama")])
def test_split_rules_travel_with_the_file(pre, model_type, tmp_path):
    """The file names its split rules (``tokenizer.ggml.pre``) and the tokenizer read back splits by them, as
    the checkpoint's own and transformers' reading of the file do."""
    from shapeplan.importers.gguf import _SPLITS
    from shapeplan.llm.tokenizer import Tokenizer
    ckpt = _checkpoint(str(tmp_path / "hf"), model_type)
    _split_rules(ckpt, _SPLITS[pre])
    path = _quantize(ckpt, str(tmp_path / "q.gguf"), "Q8_0")
    assert _fields(path)["tokenizer.ggml.pre"] == pre
    ours, hf_dir, ref = _pipe(path).tokenizer, Tokenizer(ckpt), _hf_tokenizer(path)
    for text in TEXTS + ["HelloWorld CamelCaseWords and ALLCAPS", "x=1234567/2"]:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf_dir.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False).input_ids
    pieces = ours.backend().pre_tokenizer.pre_tokenize_str("1234567")
    assert len(pieces) == (3 if pre == "llama-bpe" else 7)          # Llama 3: up to 3 digits a piece


# ------------------------------------------------------------------ SentencePiece vocabularies
def _sentencepiece_tokenizer(ckpt: str) -> int:
    """Replace the checkpoint's tokenizer with a Llama 2-style one: a BPE trained on ``▁``-marked text, byte
    fallback over the 256 ``<0xNN>`` tokens, ``<s>`` / ``</s>`` / ``<unk>`` first. Returns its vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from shapeplan.llm.demo import _CORPUS
    specials = ["<s>", "</s>", "<unk>"]
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer_tok.train_from_iterator(_CORPUS * 4, trainers.BpeTrainer(vocab_size=420, special_tokens=specials,
                                                                     show_progress=False))
    learned = json.loads(trainer_tok.to_str())["model"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for t, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(os.path.join(ckpt, "tokenizer.json"))
    return tok.get_vocab_size()


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory):
    """(checkpoint dir, GGUF path) of a tiny Llama with a SentencePiece-style tokenizer, as Q8_0."""
    from shapeplan.llm.demo import make_tiny_checkpoint
    d = tmp_path_factory.mktemp("spm")
    probe = str(d / "probe")
    os.makedirs(probe)
    vocab = _sentencepiece_tokenizer(probe)
    ckpt = make_tiny_checkpoint(str(d / "hf"), "llama", vocab_size=vocab, **DIMS)
    _sentencepiece_tokenizer(ckpt)
    return ckpt, _quantize(ckpt, str(d / "spm.gguf"), "Q8_0")


def _copy(src: str, out: str, drop: tuple[str, ...]) -> str:
    """``src`` copied field by field and tensor by tensor, without the fields ``drop``."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop:
            continue
        vtype = field.types[0]
        w.add_key_value(name, field.contents(), vtype,
                        sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_sentencepiece_vocabulary_is_written_and_read(spm_file):
    from shapeplan.llm.tokenizer import Tokenizer
    ckpt, path = spm_file
    f = _fields(path)
    assert f["tokenizer.ggml.model"] == "llama" and f["tokenizer.ggml.add_space_prefix"] is True
    types = f["tokenizer.ggml.token_type"]
    assert types[:3] == [3, 3, 2] and set(types[3:259]) == {6}           # control, unknown, 256 bytes
    scores, tokens, merges = f["tokenizer.ggml.scores"], f["tokenizer.ggml.tokens"], f["tokenizer.ggml.merges"]
    made = [tokens.index(m.replace(" ", "", 1)) for m in (merges[0], merges[-1])]
    assert [scores[i] for i in made] == [0.0, -(len(merges) - 1.0)]       # a merge's piece scores -rank
    assert scores[tokens.index("a")] < -len(merges)                      # a single letter: below every merge
    ours, hf_dir, ref = _pipe(path).tokenizer, Tokenizer(ckpt), _hf_tokenizer(path)
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf_dir.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False).input_ids
        assert ours.decode(ids) == hf_dir.decode(ids) == ref.decode(ids, skip_special_tokens=True)
    assert ours.encode(TEXTS[0]) == ref(TEXTS[0]).input_ids                # <s> first
    fallback = ours.encode("😀", add_special_tokens=False)                # not in the vocabulary: its 4 bytes
    assert [ours.backend().id_to_token(i) for i in fallback[-4:]] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    _same_model(path)


def test_sentencepiece_merges_from_scores(spm_file, tmp_path):
    """A file with scores and no merges: the merges come from the scores, as transformers makes them."""
    _, path = spm_file
    bare = _copy(path, str(tmp_path / "bare.gguf"), ("tokenizer.ggml.merges",))
    assert "tokenizer.ggml.merges" not in _fields(bare)
    ours, ref = _pipe(bare).tokenizer, _hf_tokenizer(bare)
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False).input_ids, text
    _same_model(bare)


def test_sentencepiece_without_merges_or_scores_is_a_model_error(spm_file, tmp_path):
    _, path = spm_file
    bad = _copy(path, str(tmp_path / "noscores.gguf"), ("tokenizer.ggml.merges", "tokenizer.ggml.scores"))
    with pytest.raises(ModelError, match=r"noscores\.gguf.*without tokenizer\.ggml\.merges needs "
                                         r"tokenizer\.ggml\.scores"):
        _pipe(bad)


def test_merges_from_scores_order_as_transformers():
    """The order of the merges made from scores (ties included: equal scores, one piece split two ways) is
    transformers' ``generate_merges``, over random vocabularies."""
    import itertools
    import random

    from transformers.tokenization_utils_base import generate_merges

    from shapeplan.importers.gguf import _merges_from_scores
    rng = random.Random(0)
    pieces = ["".join(p) for n in (1, 2, 3, 4) for p in itertools.product("abc", repeat=n)]
    for _ in range(30):
        tokens = list("abc") + rng.sample(pieces[3:], 40)
        scores = [float(rng.randint(-6, 0)) for _ in tokens]            # few values: many ties
        want = generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores)))
        assert _merges_from_scores(tokens, scores, set()) == want


def test_phi3_sliding_window_and_sentencepiece(tmp_path):
    """A Phi-3 file keeps its sliding window (``phi3.attention.sliding_window``, as llama.cpp writes it) and its
    SentencePiece vocabulary puts the space before every piece of text, as transformers reads Phi-3 files;
    without the window (transformers' GGUF reader drops it) logits and tokens equal transformers'."""
    from shapeplan.llm.demo import make_tiny_checkpoint
    d = tmp_path / "phi"
    os.makedirs(d / "probe")
    vocab = _sentencepiece_tokenizer(str(d / "probe"))
    windowed = make_tiny_checkpoint(str(d / "w"), "phi3", vocab_size=vocab, sliding_window=24, **DIMS)
    _pad(windowed)
    path = _quantize(windowed, str(d / "w.gguf"), "Q8_0")
    assert _fields(path)["phi3.attention.sliding_window"] == 24
    assert _pipe(path).cfg.sliding_window == 24
    plain = make_tiny_checkpoint(str(d / "p"), "phi3", vocab_size=vocab, **DIMS)
    _sentencepiece_tokenizer(plain)
    _pad(plain)
    path = _quantize(plain, str(d / "p.gguf"), "Q8_0")
    ours, ref = _pipe(path).tokenizer, _hf_tokenizer(path)
    for text in TEXTS + ["  two leading spaces", "<s> after a special token"]:
        assert ours.encode(text, add_special_tokens=False) == ref(text, add_special_tokens=False).input_ids, text
    _same_model(path)
