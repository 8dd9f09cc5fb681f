"""Pipeline behaviour: bad input, finish reasons, sampling, streaming, metrics, sessions, sp.load."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import shapeplan as sp
from shapeplan.llm import GenerationPipeline, Sampling

PROMPT = "Explain KV caching: keys and values"


@pytest.fixture(scope="module")
def llama(checkpoints):
    return checkpoints("llama")


@pytest.fixture(scope="module")
def pipe(llama):
    return GenerationPipeline.from_pretrained(llama, mode="slot_by_slot", max_prefill_length=32,
                                              max_kv_cache_length=96, progress=False, sync_every=4)


def _copy(src: str, dst) -> str:
    dst = str(dst)
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------ bad input
def test_prompt_longer_than_the_context_is_an_error_unless_truncation_asked(pipe):
    long = " ".join(["hello world"] * 60)
    with pytest.raises(sp.InputError, match="max_kv_cache_length=96"):
        pipe.generate(long, max_new_tokens=2)
    with pytest.warns(UserWarning, match="left-truncated"):
        res = pipe.generate(long, max_new_tokens=2, truncate="left")
    assert len(res.prompt_token_ids) == 95


def test_a_prompt_longer_than_max_prefill_is_prefilled_in_chunks(llama, pipe):
    """Chunked prefill: 32-token chunks give the tokens one 64-token prefill gives."""
    prompt = list(range(3, 53))                                   # 50 tokens
    big = GenerationPipeline.from_pretrained(llama, mode="slot_by_slot", max_prefill_length=64,
                                             max_kv_cache_length=96, progress=False)
    assert pipe.generate(prompt, max_new_tokens=8).token_ids == big.generate(prompt, max_new_tokens=8).token_ids


def test_prefill_not_smaller_than_kv_cache_is_rejected(llama):
    with pytest.raises(sp.InputError, match="must be smaller than max_kv_cache_length"):
        GenerationPipeline.from_pretrained(llama, max_prefill_length=64, max_kv_cache_length=64, progress=False)


def test_unsupported_model_type_lists_supported(llama, tmp_path):
    d = _copy(llama, tmp_path / "m")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["model_type"] = "gpt2"
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(sp.ModelError, match="'gpt2' is not supported.*llama, mistral, qwen2, qwen3"):
        GenerationPipeline.from_pretrained(d, progress=False)


def test_missing_tensor_names_tensor_and_files(llama, tmp_path):
    d = _copy(llama, tmp_path / "m")
    f = os.path.join(d, "model.safetensors")
    w = load_file(f)
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, f)
    with pytest.raises(sp.ModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing.*model\.safetensors"):
        GenerationPipeline.from_pretrained(d, progress=False)


def test_misshaped_tensor_names_tensor_file_and_shapes(llama, tmp_path):
    d = _copy(llama, tmp_path / "m")
    f = os.path.join(d, "model.safetensors")
    w = load_file(f)
    w["model.layers.0.self_attn.k_proj.weight"] = w["model.layers.0.self_attn.k_proj.weight"][:-1].clone()
    save_file(w, f)
    with pytest.raises(sp.ModelError, match=r"k_proj\.weight.*model\.safetensors has shape \[31, 64\], "
                                            r"expected \[32, 64\]"):
        GenerationPipeline.from_pretrained(d, progress=False)


def test_phi3_fused_tensors_are_checked(tmp_path):
    """Phi-3's fused q/k/v of the wrong row count names the fused tensor, its file and the rows expected; a
    missing one names a part; partial rotary embeddings (Phi-4-mini) are refused by name."""
    import json

    from shapeplan.llm.demo import make_tiny_checkpoint
    d = make_tiny_checkpoint(str(tmp_path / "phi"), "phi3")
    f = os.path.join(d, "model.safetensors")
    w = load_file(f)
    name = "model.layers.0.self_attn.qkv_proj.weight"
    w[name] = w[name][:-2].clone()
    save_file(w, f)
    with pytest.raises(sp.ModelError, match=r"qkv_proj\.weight.*model\.safetensors has shape \[126, 64\], "
                                            r"expected \[128, 64\].*64 \+ 32 \+ 32 rows"):
        GenerationPipeline.from_pretrained(d, progress=False)
    del w[name]
    save_file(w, f)
    with pytest.raises(sp.ModelError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight.*missing"):
        GenerationPipeline.from_pretrained(d, progress=False)
    cfg = os.path.join(d, "config.json")
    with open(cfg) as fh:
        c = json.load(fh)
    c["partial_rotary_factor"] = 0.75
    c.pop("rope_parameters", None)
    with open(cfg, "w") as fh:
        json.dump(c, fh)
    with pytest.raises(sp.ModelError, match="partial_rotary_factor=0.75"):
        GenerationPipeline.from_pretrained(d, progress=False)


def test_no_safetensors_is_a_clean_error(llama, tmp_path):
    d = _copy(llama, tmp_path / "m")
    os.remove(os.path.join(d, "model.safetensors"))
    with pytest.raises(sp.ModelError, match="no \\*.safetensors"):
        GenerationPipeline.from_pretrained(d, progress=False)


def test_corrupt_or_truncated_safetensors_is_a_clean_error(llama, tmp_path):
    d = _copy(llama, tmp_path / "m")
    f = os.path.join(d, "model.safetensors")
    data = open(f, "rb").read()
    open(f, "wb").write(data[: len(data) // 2])                      # truncated: tensors past the end
    with pytest.raises(sp.ModelError, match="model.safetensors.*(beyond the end|truncated)"):
        GenerationPipeline.from_pretrained(d, progress=False)
    open(f, "wb").write(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")          # header is not JSON
    with pytest.raises(sp.ModelError, match="model.safetensors"):
        GenerationPipeline.from_pretrained(d, progress=False)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("damage,words", [
    (lambda b: b[: len(b) // 2], "not valid JSON"),                     # cut short
    (lambda b: b"\xff\xfe" + b, "not valid JSON.*UnicodeDecodeError"),  # not UTF-8
    (lambda b: b"[1, 2]", "expected a JSON object, got list"),
], ids=["truncated", "not utf-8", "not an object"])
def test_a_damaged_checkpoint_json_file_is_a_model_error_naming_it(llama, tmp_path, name, damage, words):
    d = _copy(llama, tmp_path / "m")
    f = os.path.join(d, name)
    with open(f, "rb") as fh:
        data = fh.read()
    with open(f, "wb") as fh:
        fh.write(damage(data))
    with pytest.raises(sp.ModelError, match=f"{name}: {words}"):
        GenerationPipeline.from_pretrained(d, progress=False)


@pytest.mark.parametrize("field,value,words", [
    ("hidden_size", "wide", "hidden_size|invalid literal"), ("num_attention_heads", 0, "ZeroDivisionError"),
    ("rope_scaling", [1, 2], "TypeError|ValueError"), ("eos_token_id", "</s>", "eos_token_id must be a token id"),
    ("num_hidden_layers", None, "TypeError"),
])
def test_a_config_field_of_the_wrong_type_is_a_model_error(field, value, words):
    from shapeplan.llm.config import LlamaConfig
    d = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 2, field: value}
    with pytest.raises(sp.ModelError, match=f"cfg.json: .*({words})"):
        LlamaConfig.from_dict(d, source="cfg.json")


_ENTRY_VALUE = (st.none() | st.booleans() | st.integers(-3, 70) | st.text(max_size=4)
                | st.lists(st.integers(-2, 9), max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=4), st.fixed_dictionaries(
    {}, optional={"dtype": st.sampled_from(["F32", "BF16", "I8", "F8_E4M3", "NOPE"]) | _ENTRY_VALUE,
                  "shape": st.lists(st.integers(-1, 4), max_size=3) | _ENTRY_VALUE,
                  "data_offsets": st.lists(st.integers(-4, 70), min_size=2, max_size=2) | _ENTRY_VALUE})
    | _ENTRY_VALUE, max_size=3) | _ENTRY_VALUE, st.binary(max_size=64))
def test_any_safetensors_header_reads_or_is_a_model_error(header, data):
    """The hand-written safetensors reader (llm/weights.py) under any header that is valid JSON (entries of any
    shape: missing fields, wrong types, negative or reversed offsets, sizes that disagree with the shape, data
    past the end): every tensor reads with its declared shape, or a ModelError names the file."""
    import tempfile
    from shapeplan.llm.weights import SafetensorsFile
    head = json.dumps(header).encode()
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        f.write(len(head).to_bytes(8, "little") + head + data)
        f.flush()
        try:
            st_file = SafetensorsFile(f.name)
            for name in st_file.names():
                t = st_file.get(name)
                assert tuple(t.shape) == st_file.shape(name)
        except sp.ModelError as e:
            assert f.name in str(e)


def test_generation_past_kv_cache_stops_with_length(llama):
    p = GenerationPipeline.from_pretrained(llama, mode="slot_by_slot", max_prefill_length=24,
                                           max_kv_cache_length=48, progress=False, eos_token_ids=[])
    res = p.generate(PROMPT, max_new_tokens=200)
    assert res.finish_reason == "length"
    assert len(res.prompt_token_ids) + len(res.token_ids) == 48
    with p.start_session() as s:           # a continuation that no longer fits is refused
        s.generate(PROMPT, max_new_tokens=200)
        with pytest.raises(sp.InputError, match="does not fit the KV cache"):
            s.generate(PROMPT, max_new_tokens=5)


def test_max_new_tokens_and_eos(pipe):
    res = pipe.generate(PROMPT, max_new_tokens=5)
    assert res.finish_reason == "length" and len(res.token_ids) == 5
    # make the 3rd greedy token the EOS: generation stops there, later device steps are discarded
    third = pipe.generate(PROMPT, max_new_tokens=3).token_ids[2]
    old = pipe.eos_token_ids
    pipe.eos_token_ids = {third}
    try:
        res = pipe.generate(PROMPT, max_new_tokens=20)
    finally:
        pipe.eos_token_ids = old
    assert res.finish_reason == "stop" and res.token_ids[-1] == third and len(res.token_ids) <= 3


def test_sessions_hold_their_own_blocks(pipe):
    """Two conversations side by side: each turn continues from its own session's KV blocks (so it
    equals the same conversation held alone), and closing gives every block back."""
    base = pipe.kv_stats()["blocks_used"]
    with pipe.start_session() as alone:
        a1 = alone.generate(PROMPT, max_new_tokens=6).token_ids
        a2 = alone.generate(" and more", max_new_tokens=6).token_ids
    s, t = pipe.start_session(), pipe.start_session()
    assert s.generate(PROMPT, max_new_tokens=6).token_ids == a1
    t.generate("Hello world", max_new_tokens=6)
    assert pipe.kv_stats()["blocks_used"] > base                  # both sessions hold blocks
    assert s.generate(" and more", max_new_tokens=6).token_ids == a2
    assert s.cached == len(s.tokens) - 1
    s.close()
    t.close()
    with pytest.raises(sp.LifecycleError, match="closed"):
        s.generate(PROMPT)
    assert pipe.kv_stats()["blocks_used"] == base


def test_a_stream_left_early_gives_its_blocks_back(pipe):
    """Breaking out of ``pipe.stream`` (or of a session's stream) ends its request at once, and every block it
    held goes back to the pool: before, a stream's request ran on and kept its blocks for good (a keep-alive
    server lost a request's worth of the pool to every client that went away). The session goes on: its next
    turn prefills the whole conversation and gives the tokens a fresh session gives."""
    base = pipe.kv_stats()["blocks_used"]
    for _ in range(3):
        for n, _delta in enumerate(pipe.stream(PROMPT, max_new_tokens=60)):
            if n == 2:
                break
        assert pipe.kv_stats()["blocks_used"] == base
    with pipe.start_session() as s:
        s.generate(PROMPT, max_new_tokens=6)
        for n, _delta in enumerate(s.stream(" and more", max_new_tokens=60)):
            if n == 2:
                break
        assert s.cached == 0 and pipe.kv_stats()["blocks_used"] == base
        again = s.generate(" again", max_new_tokens=6).token_ids
    with pipe.start_session() as alone:                         # the conversation without the turn left early
        alone.generate(PROMPT, max_new_tokens=6)
        assert alone.generate(" again", max_new_tokens=6).token_ids == again
    assert pipe.kv_stats()["blocks_used"] == base


# ------------------------------------------------------------------ sampling
def test_seeded_sampling_is_reproducible_and_mode_independent(llama, pipe):
    smp = Sampling.random(temperature=0.8, top_k=50, top_p=0.95, seed=1234)
    a = pipe.generate(PROMPT, max_new_tokens=16, sampling=smp).token_ids
    b = pipe.generate(PROMPT, max_new_tokens=16, sampling=smp).token_ids
    assert a == b
    c = pipe.generate(PROMPT, max_new_tokens=16, sampling=Sampling.random(temperature=0.8, seed=99)).token_ids
    assert c != a
    replay = GenerationPipeline.from_pretrained(llama, mode="emulated_replay", max_prefill_length=32,
                                                max_kv_cache_length=96, progress=False, sync_every=4)
    assert replay.generate(PROMPT, max_new_tokens=16, sampling=smp).token_ids == a


def test_degenerate_sampling_equals_greedy(pipe):
    greedy = pipe.generate(PROMPT, max_new_tokens=12).token_ids
    assert pipe.generate(PROMPT, max_new_tokens=12, sampling=Sampling.random(top_k=1, seed=3)).token_ids == greedy
    assert pipe.generate(PROMPT, max_new_tokens=12,
                         sampling=Sampling.random(top_p=1e-6, seed=4)).token_ids == greedy


def test_bad_sampling_settings():
    with pytest.raises(sp.InputError):
        Sampling(temperature=-1)
    with pytest.raises(sp.InputError):
        Sampling(top_p=0)
    for kw, match in (({"min_p": 1.5}, "min_p must be in"), ({"presence_penalty": 2.5}, "presence_penalty must be in"),
                      ({"frequency_penalty": -3}, "frequency_penalty must be in"),
                      ({"logit_bias": {5: 101}}, "token id 5 with bias 101"),
                      ({"logit_bias": {-1: 1}}, "token id -1"),
                      ({"logit_bias": {"x": 1}}, "logit_bias must map token ids to numbers"),
                      ({"logit_bias": [(3, 1.0), (3, 2.0)]}, "names a token id twice")):
        with pytest.raises(sp.InputError, match=match):
            Sampling(**kw)
    s = Sampling(logit_bias={9: 1, "4": -2.5})                 # (OpenAI's JSON keys are strings)
    assert s.logit_bias == ((4, -2.5), (9, 1.0)) and s.adjusts and not s.is_plain_greedy
    assert hash(s) == hash(Sampling(logit_bias=[(4, -2.5), (9, 1.0)]))


def test_stop_token_ids_end_the_request_after_the_token(pipe):
    """``Sampling(stop_token_ids=...)`` (vLLM's): the request ends with "stop" right after the first of them it
    generates, the token kept (as EOS is), also with ``ignore_eos``; batched rows stop each at their own."""
    plain = pipe.generate_batch([PROMPT], 16, Sampling.greedy(), ignore_eos=True)[0].token_ids
    t = plain[5]
    cut = plain[:plain.index(t) + 1]
    for ignore_eos in (False, True):
        res = pipe.generate_batch([PROMPT], 16, Sampling(stop_token_ids=[t]), ignore_eos=ignore_eos)[0]
        assert res.token_ids == cut and res.finish_reason == "stop"
    batch = pipe.generate_batch([PROMPT] * 2, max_new_tokens=16, ignore_eos=True,
                                sampling=[Sampling(stop_token_ids=[t]), Sampling.greedy()])
    assert [r.token_ids for r in batch] == [cut, plain]
    with pytest.raises(sp.InputError, match="stop_token_ids token id"):
        pipe.generate(PROMPT, max_new_tokens=4, sampling=Sampling(stop_token_ids=[pipe.cfg.vocab_size]))
    with pytest.raises(sp.InputError, match="stop_token_ids must be >= 0"):
        Sampling(stop_token_ids=[-1])


def test_a_logit_bias_outside_the_vocabulary_fails_alone(pipe):
    with pytest.raises(sp.InputError, match=f"logit_bias token id {pipe.cfg.vocab_size} is outside the vocabulary"):
        pipe.generate(PROMPT, max_new_tokens=4, sampling=Sampling(logit_bias={pipe.cfg.vocab_size: 1.0}))
    assert pipe.generate(PROMPT, max_new_tokens=4).finish_reason in ("stop", "length")


# ------------------------------------------------------------------ streaming, metrics, syncs
def test_streaming_yields_the_text(pipe):
    stream = pipe.stream(PROMPT, max_new_tokens=20)
    deltas = list(stream)
    assert "".join(deltas) == stream.result.text
    assert stream.result.token_ids == pipe.generate(PROMPT, max_new_tokens=20).token_ids
    seen: list[str] = []
    res = pipe.generate(PROMPT, max_new_tokens=20, on_text=seen.append)
    assert "".join(seen) == res.text


def test_stop_string_ends_generation(pipe):
    full = pipe.generate(PROMPT, max_new_tokens=24, sampling=Sampling.greedy())
    assert len(full.text) > 6
    stop = full.text[3:6]
    res = pipe.generate(PROMPT, max_new_tokens=24, sampling=Sampling.greedy(stop=(stop,)))
    assert res.finish_reason == "stop" and stop not in res.text and full.text.startswith(res.text)
    stream = pipe.stream(PROMPT, max_new_tokens=24, sampling=Sampling.greedy(stop=(stop,)))
    assert "".join(stream) == res.text == stream.result.text


def test_stream_never_shows_part_of_a_stop_string():
    from shapeplan.llm.pipeline import _until_stop
    assert _until_stop("hello wor", ("world",), hold=True) == "hello "
    assert _until_stop("hello wor", ("world",), hold=False) == "hello wor"
    assert _until_stop("hello world!", ("world",), hold=True) == "hello "
    assert _until_stop("abc", (), hold=True) == "abc"


def test_metrics_and_host_sync_budget(pipe):
    res = pipe.generate(PROMPT, max_new_tokens=40)
    m = res.metrics
    assert m.new_tokens == 40 and m.prompt_tokens + m.cached_tokens == len(res.prompt_token_ids)
    assert m.ttft_s > 0 and m.overall_tok_s > 0 and m.decode_tok_s > 0 and m.steady_tok_s > 0
    assert m.late_steady_tok_s > 0 and m.effective_tok_s == m.late_steady_tok_s
    # syncs: every sync_every=4 steps, plus tokens 0, 2 and 19 and the last
    assert m.host_syncs <= 40 // 4 + 4
    short = pipe.generate(PROMPT, max_new_tokens=10).metrics
    assert short.late_steady_tok_s == 0 and short.effective_tok_s == short.steady_tok_s
    assert set(m.to_dict()) >= {"ttft_s", "overall_tok_s", "decode_tok_s", "steady_tok_s",
                                "late_steady_tok_s", "effective_tok_s"}


def test_prefill_buckets_bound_the_number_of_plans(llama):
    p = GenerationPipeline.from_pretrained(llama, mode="emulated_replay", max_prefill_length=32,
                                           max_kv_cache_length=96, progress=False)
    assert p.buckets == [16, 32]
    for words in (1, 3, 6, 9, 2, 5):
        p.generate(" ".join(["fox"] * words), max_new_tokens=6)
    shapes = {r.key.signature[0] for r in p.engine.runners()}           # input_ids shapes with a plan
    rows = p.decode_buckets[0]                                    # the CPU's smallest decode bucket: 16
    assert shapes == {(1, 16), (1, 32), (rows, 1)}                # two prefill buckets + one decode plan
    # a closed session hands the same KV buffers and plans to the next request: nothing is
    # reallocated, recompiled or recaptured
    k0 = p.engine.variables["k_cache_0"].data_ptr()
    runners = {r.key: (r.phase, sum(s.captures for s in r.segments)) for r in p.engine.runners()}
    with p.start_session() as s:
        s.generate("fox fox", max_new_tokens=6)
        s.generate(" fox", max_new_tokens=6)
    p.generate("fox", max_new_tokens=6)
    assert p.engine.variables["k_cache_0"].data_ptr() == k0
    assert {r.key: (r.phase, sum(s.captures for s in r.segments)) for r in p.engine.runners()} == runners


def test_chat_template_matches_transformers(llama, pipe):
    from transformers import PreTrainedTokenizerFast
    ref = PreTrainedTokenizerFast.from_pretrained(llama)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "tell me more"}]
    assert pipe.tokenizer.apply_chat_template(msgs) == ref.apply_chat_template(msgs, tokenize=False,
                                                                               add_generation_prompt=True)
    big = GenerationPipeline.from_pretrained(llama, mode="slot_by_slot", max_prefill_length=64,
                                             max_kv_cache_length=128, progress=False)
    with big.start_session() as s:
        a = s.generate("hi", max_new_tokens=6, chat=True)
        b = s.generate("tell me more", max_new_tokens=6, chat=True)
    assert a.finish_reason and b.finish_reason and len(s.messages) == 4


def test_sp_load_on_hf_dir_returns_the_decoder_graph(llama):
    g = sp.load(llama)
    assert [v.name for v in g.inputs] == ["input_ids", "position", "length"]
    assert "next_token" in [v.name for v in g.outputs]
    hist = g.op_histogram()
    assert hist["shapeplan::CacheWriteKV"] == 2 and hist["shapeplan::CachedAttention"] == 2 and hist["shapeplan::CausalMask"] == 1


def test_prefix_cache_reuses_the_kv_of_the_last_request(llama, pipe):
    cached = GenerationPipeline.from_pretrained(llama, mode="slot_by_slot", max_prefill_length=32,
                                                max_kv_cache_length=96, progress=False, prefix_cache=True)
    longer = PROMPT + " of past tokens"
    first = cached.generate(PROMPT, max_new_tokens=8)
    assert first.metrics.cached_tokens == 0
    again = cached.generate(PROMPT, max_new_tokens=8)             # whole blocks of the prompt are cached
    n = len(first.prompt_token_ids)
    assert again.metrics.cached_tokens == (n - 1) // 16 * 16 > 0
    assert again.metrics.prompt_tokens == n - again.metrics.cached_tokens and again.token_ids == first.token_ids
    stats = cached.prefix_cache_stats()
    assert stats["total_hits"] >= 1 and stats["total_hit_tokens"] >= 16 and stats["resident_blocks"] >= 1
    ext = cached.generate(longer, max_new_tokens=8)
    assert ext.metrics.cached_tokens > 0
    assert ext.token_ids == pipe.generate(longer, max_new_tokens=8).token_ids
    other = cached.generate("Hello world", max_new_tokens=8)           # unrelated: little or nothing reused
    assert other.token_ids == pipe.generate("Hello world", max_new_tokens=8).token_ids


def test_weights_loaded_stacked_are_not_copied_at_construction(llama):
    """q/k/v and gate/up load into one buffer per group (``weights.stacked_slots``); the builder's fused
    projections then view that buffer instead of concatenating, and compute what separately held
    weights compute."""
    import torch

    from shapeplan.llm.config import LlamaConfig
    from shapeplan.llm.model import build_graph
    from shapeplan.llm.weights import load_weights, random_weights
    cfg = LlamaConfig.from_file(llama)
    w = random_weights(cfg, seed=3)
    q = w["model.layers.0.self_attn.q_proj.weight"]
    gate = w["model.layers.1.mlp.gate_proj.weight"]
    g = build_graph(cfg, w, max_kv_cache_length=64)
    by_name = {c.name: c.data for c in g.constants}
    qkv, gate_up = by_name["model.layers.0.self_attn.qkv_proj.weight.T"], by_name["model.layers.1.mlp.gate_up_proj.weight.T"]
    assert qkv.data_ptr() == q.data_ptr() and gate_up.data_ptr() == gate.data_ptr()      # views, no copies
    rows = sum(w[f"model.layers.0.self_attn.{n}_proj.weight"].shape[0] for n in "qkv")
    assert tuple(qkv.shape) == (cfg.hidden_size, rows)

    separate = {k: v.clone() for k, v in w.items()}                                       # the old layout
    g2 = build_graph(cfg, separate, max_kv_cache_length=64)
    assert torch.equal(by_name["model.layers.0.self_attn.qkv_proj.weight.T"],
                       {c.name: c.data for c in g2.constants}["model.layers.0.self_attn.qkv_proj.weight.T"])
    ids = [1, 5, 9, 4]
    a = GenerationPipeline(cfg, w, device="cpu", mode="slot_by_slot", max_prefill_length=16,
                           max_kv_cache_length=64, eos_token_ids=[]).generate(ids, 6).token_ids
    b = GenerationPipeline(cfg, separate, device="cpu", mode="slot_by_slot", max_prefill_length=16,
                           max_kv_cache_length=64, eos_token_ids=[]).generate(ids, 6).token_ids
    assert a == b

    loaded = load_weights(llama, cfg, device="meta", dtype=torch.float32)                # a non-CPU device:
    k, v = (loaded[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "kv")          # stacked slots
    assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert v.storage_offset() == k.storage_offset() + k.numel()


def test_sampling_settings_of_the_wrong_type_are_input_errors_naming_them():
    """Any value of any field: a Sampling, or an InputError naming the field (never a bare TypeError from a
    comparison later); one stop string is one stop (not its letters)."""
    from hypothesis import given, settings, strategies as st
    values = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=3) \
        | st.lists(st.text(max_size=2), max_size=2)
    fields = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop", "presence_penalty",
              "frequency_penalty", "min_p", "logit_bias", "stop_token_ids")

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(st.sampled_from(fields), values, max_size=3))
    def check(kw):
        try:
            s = Sampling(**kw)
        except sp.InputError as e:
            assert any(f in str(e) for f in kw), (kw, e)
            return
        assert all(isinstance(x, float) and x == x for x in s.as_row())
        assert isinstance(s.stop, tuple) and all(isinstance(x, str) for x in s.stop)

    check()
    assert Sampling(stop="###").stop == ("###",)
