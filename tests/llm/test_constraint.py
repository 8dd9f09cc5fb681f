"""Structured output pieces without a model: the Constraint API and its OpenAI mapping, tool-call
parsing, the ApplyTokenBitmask op (torch and the Triton kernel, against xgrammar's own), and the
grammar helpers that work around xgrammar (bounded JSON strings, the UTF-8 guard, batched filling)."""
from __future__ import annotations

import json

import pytest
import torch

from shapeplan.errors import ConstraintError, InputError
from shapeplan.llm import Constraint, Sampling, parse_tool_calls
from shapeplan.llm.xgrammar_gaps import Utf8Guard, _valid_inside, json_strings_fix
from shapeplan.ops.llm import apply_token_bitmask

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def test_constraints_are_hashable_data_with_canonical_specs():
    a = Constraint.json_schema({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}})
    b = Constraint.json_schema('{"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}')
    assert a == b and hash(a) == hash(b)
    assert list(a.schema["properties"]) == ["b", "a"]             # declared order kept: the generation order
    assert Constraint.json_object() != Constraint.json_object(whitespace="flexible")
    assert Constraint.choice(["x", "y"]).choices == ["x", "y"]
    assert Sampling(constraint=a).constraint is a and Sampling.random(seed=1, constraint=a).constraint is a


def test_pydantic_models_give_their_schema():
    pydantic = pytest.importorskip("pydantic")

    class Movie(pydantic.BaseModel):
        title: str
        year: int

    c = Constraint.json_schema(Movie)
    assert c.schema["required"] == ["title", "year"]


@pytest.mark.parametrize("make, message", [
    (lambda: Constraint.json_schema("{nope"), "not valid JSON"),
    (lambda: Constraint.json_schema(42), "expected a dict"),
    (lambda: Constraint.regex(""), "non-empty pattern"),
    (lambda: Constraint.grammar("  "), "root rule"),
    (lambda: Constraint.choice([]), "non-empty list"),
    (lambda: Constraint.json_object(whitespace="loose"), "whitespace must be"),
    (lambda: Constraint.tool_call([]), "non-empty list of tools"),
    (lambda: Constraint.tool_call([{"type": "function", "function": {"name": "bad name"}}]), "function name"),
    (lambda: Constraint.tool_call(TOOLS * 2), "used twice"),
    (lambda: Constraint.tool_call(TOOLS, "other"), "not among the tools"),
    (lambda: Constraint.tool_call([{"type": "code_interpreter"}]), "only function tools"),
])
def test_bad_constraints_are_constraint_errors(make, message):
    with pytest.raises(ConstraintError, match=message) as e:
        make()
    assert isinstance(e.value, InputError)


def test_from_openai_maps_response_format_and_tools():
    assert Constraint.from_openai() is None
    assert Constraint.from_openai(response_format={"type": "text"}) is None
    assert Constraint.from_openai(response_format={"type": "json_object"}) == Constraint.json_object()
    rf = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": True}}
    assert Constraint.from_openai(response_format=rf) == Constraint.json_schema(WEATHER)
    auto = Constraint.from_openai(tools=TOOLS)
    assert auto.kind == "tool_call" and auto.tool_choice == "auto" and auto.tools[0]["name"] == "get_weather"
    assert Constraint.from_openai(tools=TOOLS, tool_choice="required").tool_choice == "required"
    named = Constraint.from_openai(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert named.tool_choice == "get_weather"
    assert Constraint.from_openai(tools=TOOLS, tool_choice="none", response_format=rf) == Constraint.json_schema(WEATHER)
    assert not Constraint.from_openai(tools=TOOLS, parallel_tool_calls=False).parallel
    for bad, message in [({"type": "xml"}, "text, json_object or json_schema"),
                         ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs"),
                         ("json", "must be an object")]:
        with pytest.raises(ConstraintError, match=message):
            Constraint.from_openai(response_format=bad)
    with pytest.raises(ConstraintError, match="no tools"):
        Constraint.from_openai(tool_choice="required")


def test_parse_tool_calls_keeps_text_and_skips_broken_blocks():
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call> '
            '<tool_call>\n{"name": "x", "arguments": 3}\n</tool_call> <tool_call>\n{"name": "cut')
    content, calls = parse_tool_calls(text)
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]
    assert content.startswith("Let me check.") and '"arguments": 3' in content and content.endswith('"cut')
    o = calls[0].to_openai()
    assert o["type"] == "function" and o["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert o["id"].startswith("call_") and o["id"] != calls[1].to_openai()["id"]
    assert parse_tool_calls("no calls") == ("no calls", [])


def _mask(keep: torch.Tensor) -> torch.Tensor:
    """bool [B, V] -> int32 [B, ceil(V/32)] in xgrammar's layout."""
    b, v = keep.shape
    w = -(-v // 32)
    bits = torch.zeros(b, w * 32, dtype=torch.int64)
    bits[:, :v] = keep.long()
    words = (bits.reshape(b, w, 32) << torch.arange(32)).sum(-1)                # in [0, 2**32)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_token_bitmask_matches_xgrammar(dtype):
    torch.manual_seed(0)
    v = 1000                                       # not a multiple of 32: the last word is partial
    logits = torch.randn(3, v).to(dtype)
    keep = torch.rand(3, v) < 0.3
    keep[2] = True                                 # a row without a constraint: all ones
    mask = _mask(keep)
    assert (mask[2, :-1] == -1).all()
    out = apply_token_bitmask(logits, mask)
    assert torch.equal(out[keep], logits[keep]) and torch.isinf(out[~keep]).all() and (out[~keep] < 0).all()
    xgr = pytest.importorskip("xgrammar")
    ref = logits.clone()
    xgr.apply_token_bitmask_inplace(ref, mask)
    assert torch.equal(out, ref)


def test_the_triton_bitmask_kernel_matches_torch():
    pytest.importorskip("triton")
    from shapeplan.runtime.backends.triton.kernels.bitmask import apply_token_bitmask as triton_apply
    torch.manual_seed(1)
    logits = torch.randn(2, 5000)
    mask = _mask(torch.rand(2, 5000) < 0.5)
    dev = "cuda" if torch.cuda.is_available() else "cpu"     # CPU: TRITON_INTERPRET=1 (tests/conftest.py)
    got = triton_apply(logits.to(dev), mask.to(dev)).cpu()
    assert torch.equal(got, apply_token_bitmask(logits, mask))


def test_bounded_json_strings_get_a_pattern_without_control_characters():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 4}, "b": {"type": "string", "minLength": 2, "pattern": "x+"},
        "c": {"enum": [{"type": "string", "maxLength": 1}]}, "d": {"type": "array", "items": {"type": "string", "minLength": 1}}}}
    fixed = json_strings_fix(schema)
    assert fixed["properties"]["a"] == {"type": "string", "pattern": r'^[^"\\\x00-\x1f]{0,4}$'}
    assert fixed["properties"]["b"] == schema["properties"]["b"]                 # its own pattern wins
    assert fixed["properties"]["c"] == schema["properties"]["c"]                 # data, not a schema
    assert fixed["properties"]["d"]["items"]["pattern"] == r'^[^"\\\x00-\x1f]{1,}$'


def test_utf8_guard_forbids_overlong_forms_and_surrogates():
    assert _valid_inside("é".encode()) and _valid_inside(b"\xe4\xb8") and _valid_inside(b"\x80\x80abc")
    assert not _valid_inside(b"\xc0\x80") and not _valid_inside(b"\xe0\x80") and not _valid_inside(b"\xed\xa0")
    assert not _valid_inside(b"\xf0\x8f") and not _valid_inside(b"\xff")
    vocab = [b"a", b"\xf0", b"\x8f\xb4\x97", b"\x90\x80\x80", b"\xc0", b"", b"\xed", b"\xa0\x80", b"\x9f\xbf"]
    g = Utf8Guard(vocab, 40)                        # 40 > len(vocab): padded ids stay as they are
    row = torch.full((2,), -1, dtype=torch.int32)
    g.restrict(row, ord("a"))
    allowed = {t for t in range(40) if (int(row[t // 32]) >> (t % 32)) & 1}
    assert allowed == set(range(40)) - {4}                                     # a lone C0 is never valid
    for last, bad in ((0xF0, {2, 4}), (0xED, {4, 7}), (0xE0, {2, 3, 4, 8})):
        row = torch.full((2,), -1, dtype=torch.int32)
        g.restrict(row, last)
        allowed = {t for t in range(40) if (int(row[t // 32]) >> (t % 32)) & 1}
        assert allowed == set(range(40)) - bad, last
    row = torch.tensor([1 << 4, 0], dtype=torch.int32)                          # only the invalid token left
    g.restrict(row, ord("a"))
    assert row.tolist() == [1 << 4, 0]                                         # left as it was: never empty


def test_batched_mask_filling_gives_the_serial_masks(checkpoints):
    xgr = pytest.importorskip("xgrammar")
    from shapeplan.llm.grammar import fill_rows, grammars_for
    from shapeplan.llm.tokenizer import Tokenizer
    tok = Tokenizer(checkpoints("llama"))
    g = grammars_for(tok, tok.vocab_size, (1,))
    cs = [Constraint.json_object(), Constraint.regex("[a-z]+ [0-9]"), Constraint.json_schema(WEATHER)]
    states = [g.start(c) for c in cs]
    for st, prefix in zip(states, ['{"a', "ab", '{"city": "x']):
        assert st.take(tok.encode(prefix, add_special_tokens=False))
    serial = torch.zeros(3, -(-tok.vocab_size // 32), dtype=torch.int32)
    for i, st in enumerate(states):
        st.fill(serial, i)
    batched = torch.zeros_like(serial)
    fill_rows(list(enumerate(states)), batched, pool=xgr.BatchGrammarMatcher(2))
    assert torch.equal(serial, batched) and (serial != 0).any(1).all()


@pytest.mark.parametrize("xgrammar_tokens", [True, False])
def test_forced_runs_are_committed_and_followed(checkpoints, xgrammar_tokens):
    """Decoding by hand (the first allowed token each step): where the grammar forces a run the mask
    allows only the run's next token, with xgrammar's run tokens or (older xgrammar) our tokenizer's."""
    pytest.importorskip("xgrammar")
    from shapeplan.llm.grammar import Grammars
    from shapeplan.llm.tokenizer import Tokenizer
    tok = Tokenizer(checkpoints("llama"))
    g = Grammars(tok, tok.vocab_size, (1,))
    g.compiler
    g.jump_tokens = g.jump_tokens and xgrammar_tokens
    st = g.start(Constraint.json_schema({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 5}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}))
    mask = torch.zeros(1, -(-tok.vocab_size // 32), dtype=torch.int32)
    ids, one_hot_steps = [], 0
    while st.end < 0 and len(ids) < 80:
        st.fill(mask, 0)
        bits = [t for t in range(tok.vocab_size) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
        one_hot_steps += len(bits) == 1 and bool(st.run)
        t = bits[-1] if bits[-1] != 1 or len(bits) == 1 else bits[-2]      # the last allowed, EOS if alone
        st.accept(t)
        ids.append(t)
    assert st.end == len(ids) and ids[-1] == 1
    assert json.loads(tok.decode(ids[:-1]))["city"] is not None
    assert one_hot_steps >= 5
