"""Structured output through the OpenAI server (``response_format``, ``tools``; shapeplan/llm/constraint.py
maps them): a bounded JSON schema always gives valid JSON, forced tool calls come back as
``message.tool_calls`` with ``finish_reason: "tool_calls"`` (streamed or not), bad input is a 400."""
from __future__ import annotations

import json

import pytest

from tests.serve.openai.conftest import MODEL

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                                           "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "ok", "color"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather now", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def test_a_json_schema_response_validates(server):
    for seed in range(3):
        r = server.client().chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=64, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_calls_come_back_as_tool_calls(server, stream):
    kw = dict(model=MODEL, messages=ASK, max_tokens=96, temperature=1.0, seed=5, tools=TOOLS,
              tool_choice="required", parallel_tool_calls=False)
    if stream:
        chunks = list(server.client().chat.completions.create(stream=True, **kw))
        last = chunks[-1].choices[0]
        assert all(not c.choices[0].delta.content for c in chunks[:-1])      # held until the answer is parsed
        finish, calls = last.finish_reason, last.delta.tool_calls
    else:
        r = server.client().chat.completions.create(**kw)
        finish, calls = r.choices[0].finish_reason, r.choices[0].message.tool_calls
    assert finish == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"tool_choice": "required"}, "tools"),
    ({"response_format": {"type": "json_object"}, "logprobs": True}, "logprobs"),
])
def test_bad_structured_requests_are_400(server, body, param):
    r = server.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# ------------------------------------------------------------------ vLLM's structured-output extensions
CHOICES = ["yes", "no", "maybe later"]


@pytest.mark.parametrize("body", [{"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}}])
def test_a_guided_choice_answers_one_of_them(server, body):
    for seed in range(3):
        r = server.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 16,
                                                      "temperature": 1.0, "seed": seed, **body})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] in CHOICES


def test_guided_regex_json_and_grammar_on_completions(server):
    import re
    r = server.client().completions.create(model=MODEL, prompt="Code:", max_tokens=16, temperature=1.0, seed=2,
                                           extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.choices[0].text), r.choices[0].text
    r = server.client().completions.create(model=MODEL, prompt="JSON:", max_tokens=64, temperature=1.0, seed=3,
                                           extra_body={"structured_outputs": {"json": WEATHER}})
    jsonschema.validate(json.loads(r.choices[0].text), WEATHER)
    r = server.client().completions.create(model=MODEL, prompt="Say:", max_tokens=16, temperature=1.0, seed=4,
                                           extra_body={"guided_grammar": 'root ::= "a" ("b" | "c")+ "."'})
    assert re.fullmatch("a[bc]+\\.", r.choices[0].text), r.choices[0].text


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ("/v1/chat/completions", {"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
    ("/v1/chat/completions", {"guided_choice": []}, "guided_choice"),
    ("/v1/chat/completions", {"structured_outputs": {"yaml": "x"}}, "structured_outputs.yaml"),
    ("/v1/completions", {"guided_regex": ""}, "guided_regex"),
    ("/v1/completions", {"guided_choice": ["a"], "logprobs": 1}, "logprobs"),
    ("/v1/completions", {"guided_json": "{not json"}, "guided_json"),
])
def test_bad_guided_requests_are_400(server, path, body, param):
    base = {"model": MODEL, "max_tokens": 4, **({"messages": ASK} if "chat" in path else {"prompt": "Hi"})}
    r = server.post(path, json={**base, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
