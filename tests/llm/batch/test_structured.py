"""Structured output on the serving core (CPU, float32, a random-weight model with a trained BPE
tokenizer): 50 seeded runs at temperature 1 per constraint, batched. Every run that ends with "stop"
parses / validates / matches; a bounded constraint ends with "stop" every time; a run cut by
max_new_tokens is a prefix its grammar accepts; tool calls name declared tools with arguments that
validate; unconstrained requests batched with constrained ones get exactly their tokens alone."""
from __future__ import annotations

import json
import re

import pytest

from shapeplan.errors import ConstraintError
from shapeplan.llm import Constraint, GenerationPipeline, Sampling, parse_tool_calls
from tests.llm.conftest import AHEAD, launched_ahead

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

RUNS = 50
KW = dict(mode="emulated_replay", max_prefill_length=32, max_kv_cache_length=256, progress=False, sync_every=8,
          max_num_seqs=64)

BOUNDED = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]},
    "size": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "ok", "color"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather now", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def pipe(checkpoints):
    p = GenerationPipeline.from_pretrained(checkpoints("llama"), **KW)
    yield p
    p.close()


def _runs(pipe, constraint, n=RUNS, max_new_tokens=64, **kw):
    samplings = [Sampling(temperature=1.0, seed=1000 + i, constraint=constraint) for i in range(n)]
    prompts = [f"Request {i}:" for i in range(n)]
    return pipe.generate_batch(prompts, max_new_tokens=max_new_tokens, sampling=samplings, **kw)


def _prefix_ok(pipe, constraint, ids):
    """The grammar takes every token of ``ids`` (a run cut by max_new_tokens is a valid prefix)."""
    st = pipe.structured.start(constraint, frozenset(pipe.eos_token_ids))
    return all(st.matcher.accept_token(t) for t in ids)


def test_bounded_json_schema_always_stops_and_validates(pipe):
    res = _runs(pipe, Constraint.json_schema(BOUNDED))
    assert [r.finish_reason for r in res] == ["stop"] * RUNS
    for r in res:
        jsonschema.validate(json.loads(r.text), BOUNDED)
    assert len({r.text for r in res}) > RUNS // 2                  # the draws differ: the mask is not a script


def test_json_object_stops_parse_and_truncated_runs_are_prefixes(pipe):
    c = Constraint.json_object()
    res = _runs(pipe, c, max_new_tokens=40)
    assert {r.finish_reason for r in res} <= {"stop", "length"}
    for r in res:
        if r.finish_reason == "stop":
            assert isinstance(json.loads(r.text), dict)
            assert "  " not in r.text.replace('"  ', "")        # compact: no whitespace runs outside strings
        else:
            assert _prefix_ok(pipe, c, r.token_ids)


def test_regex_runs_match(pipe):
    pattern = r"(yes|no|maybe) [a-z]{1,6}, [0-9]{1,3}\."
    c = Constraint.regex(pattern)
    res = _runs(pipe, c, max_new_tokens=32)
    assert [r.finish_reason for r in res] == ["stop"] * RUNS
    assert all(re.fullmatch(pattern, r.text) for r in res), [r.text for r in res]


def test_ebnf_grammar_runs_parse(pipe):
    """Nested lists of digits: every finished run is JSON whose leaves are one-digit numbers."""
    c = Constraint.grammar('root ::= item\nitem ::= "[" (item ("," item)*)? "]" | [0-9]')
    res = _runs(pipe, c, max_new_tokens=24)

    def leaves_ok(x):
        return all(leaves_ok(y) for y in x) if isinstance(x, list) else isinstance(x, int) and 0 <= x <= 9

    for r in res:
        if r.finish_reason == "stop":
            assert leaves_ok(json.loads(r.text)), r.text
        else:
            assert _prefix_ok(pipe, c, r.token_ids)
    assert any(r.finish_reason == "stop" for r in res)


def test_choice_runs_pick_one_option(pipe):
    options = ["red", "green", "blue sky", "no"]
    res = _runs(pipe, Constraint.choice(options))
    assert [r.finish_reason for r in res] == ["stop"] * RUNS
    assert {r.text for r in res} <= set(options) and len({r.text for r in res}) > 1


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_tool_calls_name_declared_tools_with_valid_arguments(pipe, choice):
    c = Constraint.tool_call(TOOLS, choice, parallel=False)
    res = _runs(pipe, c, max_new_tokens=128)   # the tiny BPE spells a call in ~60 tokens
    assert [r.finish_reason for r in res] == ["stop"] * RUNS
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    names = set()
    for r in res:
        content, calls = parse_tool_calls(r.text)
        assert content == "" and len(calls) == 1, r.text
        assert calls[0].name in schemas
        jsonschema.validate(json.loads(calls[0].arguments), schemas[calls[0].name])
        names.add(calls[0].name)
        assert calls[0].to_openai()["function"]["name"] == calls[0].name
    assert names == ({"get_weather", "ping"} if choice == "required" else {"get_weather"})


def test_tool_call_auto_allows_text_and_valid_calls(pipe):
    c = Constraint.tool_call(TOOLS, "auto")
    res = _runs(pipe, c, n=20, max_new_tokens=40)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for r in res:
        _, calls = parse_tool_calls(r.text)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        if r.finish_reason == "length":
            assert _prefix_ok(pipe, c, r.token_ids)


@AHEAD
def test_unconstrained_rows_in_a_constrained_batch_get_their_tokens_alone(pipe, ahead):
    plain = [Sampling.greedy(), Sampling(temperature=1.0, seed=7), Sampling(temperature=0.8, top_k=20, seed=9),
             Sampling(repetition_penalty=1.3), Sampling(presence_penalty=1.0, logit_bias={5: 3.0})]
    prompts = [f"plain {i}" for i in range(len(plain))]
    # the plain rows run 40 tokens (EOS ignored), the constrained ones at most 20: the batch's last rounds hold
    # plain rows only, so with ``ahead`` on some of them launch ahead whatever the timing
    alone = [pipe._result(pipe.submit(p, 40, s, ignore_eos=True), s).token_ids for p, s in zip(prompts, plain)]
    c = Constraint.json_schema(BOUNDED)
    json_rows = [Sampling(temperature=1.0, seed=i, constraint=c) for i in range(6)]
    with launched_ahead(pipe, ahead):          # on: rounds go ahead once no constrained row is left
        handles = [(pipe.submit(p, 40, s, ignore_eos=True), s) for p, s in zip(prompts, plain)]
        handles += [(pipe.submit(f"json {i}", 20, s), s) for i, s in enumerate(json_rows)]
        res = [pipe._result(h, s) for h, s in handles]
    assert [r.token_ids for r in res[:len(plain)]] == alone
    for r in res[len(plain):]:
        assert r.finish_reason == "length" or json.loads(r.text)


def test_overlap_off_gives_the_same_tokens(pipe):
    c = Constraint.json_schema(BOUNDED)
    on = [r.token_ids for r in _runs(pipe, c, n=8)]
    pipe.structured.overlap = False
    try:
        off = [r.token_ids for r in _runs(pipe, c, n=8)]
    finally:
        pipe.structured.overlap = True
    assert on == off


def test_constrained_requests_get_the_same_tokens_alone_and_batched(pipe):
    """Alone, a request takes its forced runs at once (prefills); in a batch of more than JUMP_ROWS
    constrained rows it decodes them in lockstep: the tokens are the same, with the presence / frequency
    penalties too (a forced run's tokens count as generated either way)."""
    from shapeplan.llm.batch.constrained import JUMP_ROWS
    c = Constraint.json_schema(BOUNDED)
    ss = [Sampling(temperature=1.0, seed=50 + i, constraint=c, frequency_penalty=0.6 * (i % 2),
                   presence_penalty=1.2 if i % 3 == 1 else 0.0) for i in range(JUMP_ROWS + 2)]
    before = pipe.structured.stats.jumps
    alone = [pipe.generate(f"r{i}", 64, s).token_ids for i, s in enumerate(ss)]
    mid = pipe.structured.stats.jumps - before - len(ss)            # beyond the free one before each prefill
    batched = pipe.generate_batch([f"r{i}" for i in range(len(ss))], 64, ss)
    assert [r.token_ids for r in batched] == alone
    assert mid > 0


def test_preempted_constrained_requests_lose_nothing(pipe, checkpoints):
    """A KV pool too small for everyone: constrained requests are preempted and recomputed, and still
    give the tokens they give alone."""
    c = Constraint.json_schema(BOUNDED)
    ss = [Sampling(temperature=1.0, seed=70 + i, constraint=c, frequency_penalty=0.5 * (i % 2)) for i in range(8)]
    prompts = [[5 + i] * 20 for i in range(8)]
    alone = [pipe.generate(p, 60, s).token_ids for p, s in zip(prompts, ss)]
    per_block = pipe.kv_cache_bytes // pipe.paged.num_blocks
    small = GenerationPipeline.from_pretrained(checkpoints("llama"), **{**KW, "kv_cache_bytes": 18 * per_block})
    try:
        got = [r.token_ids for r in small.generate_batch(prompts, 60, ss)]
        assert small.kv_stats()["preemptions"] > 0
    finally:
        small.close()
    assert got == alone


def test_generate_stream_and_sessions_follow_the_constraint(pipe):
    c = Constraint.json_schema(BOUNDED)
    s = Sampling(temperature=1.0, seed=3, constraint=c)
    one = pipe.generate("Hi", max_new_tokens=64, sampling=s)
    jsonschema.validate(json.loads(one.text), BOUNDED)
    assert "".join(pipe.stream("Hi", max_new_tokens=64, sampling=s)) == one.text
    with pipe.start_session() as sess:
        first = sess.generate("Hi", max_new_tokens=64, sampling=s)
        second = sess.generate(" again", max_new_tokens=64, sampling=Sampling(temperature=1.0, seed=4, constraint=c))
    assert first.text == one.text
    jsonschema.validate(json.loads(second.text), BOUNDED)


def test_greedy_and_ignore_eos_end_where_the_grammar_ends(pipe):
    c = Constraint.choice(["alpha", "beta"])
    r = pipe.generate("x", max_new_tokens=30, sampling=Sampling.greedy(constraint=c))
    assert r.finish_reason == "stop" and r.text in ("alpha", "beta")
    h = pipe.submit("x", 30, Sampling.greedy(constraint=c), ignore_eos=True)
    h.wait()
    assert h.finish_reason == "stop" and pipe.decode(h.token_ids) == r.text


def test_forced_runs_are_prefilled_not_decoded(pipe):
    before = pipe.structured.stats.as_dict()
    r = pipe.generate("x", max_new_tokens=64, sampling=Sampling(temperature=1.0, seed=5,
                                                               constraint=Constraint.json_schema(BOUNDED)))
    after = pipe.structured.stats.as_dict()
    assert r.text.startswith('{"name": "')
    assert after["jumps"] > before["jumps"] and after["jump_tokens"] - before["jump_tokens"] >= 5
    assert after["steps"] - before["steps"] < len(r.token_ids)        # fewer decode steps than tokens


def test_grammars_are_compiled_once_per_constraint(pipe):
    c = Constraint.json_schema({"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"]})
    pipe.generate("a", 16, Sampling(constraint=c))
    g = pipe.structured.start(c, frozenset(pipe.eos_token_ids)).grammars
    misses = g.misses
    pipe.generate("b", 16, Sampling(constraint=Constraint.json_schema({"type": "object", "properties": {
        "q": {"type": "integer"}}, "required": ["q"]})))
    assert g.misses == misses


def test_bad_constraints_fail_at_submit(pipe):
    with pytest.raises(ConstraintError, match="EBNF parser error"):
        pipe.compile_constraint(Constraint.grammar("root ::= nothing"))
    pipe.compile_constraint(Constraint.choice(["a", "b"]))
    with pytest.raises(ConstraintError, match="Regex parsing error"):
        pipe.submit("x", 8, Sampling(constraint=Constraint.regex("a(")))
    with pytest.raises(ConstraintError, match="json_schema: xgrammar cannot compile it"):
        pipe.submit("x", 8, Sampling(constraint=Constraint.json_schema({"$ref": "#/nowhere"})))
    with pytest.raises(ConstraintError, match="takes a shapeplan.llm.Constraint"):
        pipe.submit("x", 8, Sampling(constraint={"type": "json_object"}))
    assert pipe.generate("x", 4).finish_reason in ("stop", "length")       # still serving


def test_a_pipeline_without_tokenizer_refuses_constraints():
    kw = {k: v for k, v in KW.items() if k != "progress"}
    p = GenerationPipeline.from_preset("llama-tiny", dtype="float32", **{**kw, "max_num_seqs": 16})
    try:
        with pytest.raises(ConstraintError, match="tokenizer"):
            p.submit([1, 2, 3], 4, Sampling(constraint=Constraint.json_object()))
        p.generate_batch([[1, 2, 3], [4, 5]], 8, [Sampling.greedy(), Sampling(temperature=1.0, seed=1)])
        # unconstrained requests pay nothing: no masked sampler, no logits plan, the plans of before
        assert p.structured._engine is None
        assert not any(out == "logits" for out, _, _ in p.runner.settled)
    finally:
        p.close()


def test_missing_xgrammar_names_the_extra(monkeypatch):
    import sys

    from shapeplan.llm.grammar import xgrammar
    monkeypatch.setitem(sys.modules, "xgrammar", None)            # import xgrammar -> ImportError
    with pytest.raises(ConstraintError, match=r"shapeplan\[structured\]"):
        xgrammar()
