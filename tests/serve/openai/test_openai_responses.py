"""``POST /v1/responses`` (OpenAI's Responses API) through the official ``openai`` client: a greedy response
equals the chat completion of the same messages, streamed or not (the SDK's own event accumulator agrees);
input items (text parts, an earlier answer, function calls and their outputs) render as the chat messages
they stand for; ``text.format`` and function tools go through structured output; bad requests are 400s
naming the parameter, and the server goes on serving."""
from __future__ import annotations

import json

import pytest

from tests.serve.openai.conftest import MODEL

SYSTEM = "Answer briefly."
ASK = "Explain KV caching"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"]}


def _chat(server, messages: list[dict], n: int):
    return server.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=n, temperature=0)


@pytest.mark.parametrize("n", [6, 400])
def test_a_response_is_the_chat_completion_of_its_messages(server, n):
    r = server.client().responses.create(model=MODEL, instructions=SYSTEM, input=ASK, max_output_tokens=n,
                                         temperature=0, metadata={"run": "1"})
    chat = _chat(server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}], n)
    c = chat.choices[0]
    assert r.output_text == c.message.content
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL and r.metadata == {"run": "1"}
    assert len(r.output) == 1 and r.output[0].type == "message" and r.output[0].role == "assistant"
    if c.finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed" and r.incomplete_details is None
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_a_streamed_response_is_openais_event_sequence(server):
    kw = dict(model=MODEL, instructions=SYSTEM, input=ASK, max_output_tokens=24, temperature=0)
    whole = server.client().responses.create(**kw)
    events = list(server.client().responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    with server.client().responses.stream(**kw) as s:                     # the SDK's accumulator
        last = list(s)[-1]
    assert last.type == f"response.{whole.status}" and last.response.output_text == whole.output_text


def test_input_items_render_as_their_chat_messages(server):
    items = [{"role": "developer", "content": [{"type": "input_text", "text": SYSTEM}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": ASK}]},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Keys and values.", "annotations": []}]},
             {"role": "user", "content": "More?"}]
    r = server.client().responses.create(model=MODEL, input=items, max_output_tokens=8, temperature=0)
    chat = _chat(server, [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "Hi\n" + ASK},
                          {"role": "assistant", "content": "Keys and values."}, {"role": "user", "content": "More?"}],
                 8)
    assert r.output_text == chat.choices[0].message.content


def test_function_tools_and_their_outputs(server):
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    tools = [{"type": "function", "name": "get_weather", "description": "weather now", "parameters": WEATHER}]
    kw = dict(model=MODEL, input="Weather in Paris?", max_output_tokens=96, temperature=1.0, tools=tools,
              tool_choice="required", parallel_tool_calls=False, extra_body={"seed": 5})   # (unseeded, a draw
    # ran into max_output_tokens once: the chat test's seed, prompt and tools make it the chat test's answer)
    r = server.client().responses.create(**kw)
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    events = list(server.client().responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    jsonschema.validate(json.loads(events[-1].response.output[0].arguments), WEATHER)
    # the call and its output sent back as items: the conversation goes on as text
    follow = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}]
    again = server.client().responses.create(model=MODEL, input=follow, max_output_tokens=8, temperature=0,
                                             tools=tools, tool_choice="none")
    chat = _chat(server, [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"id": call.call_id, "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}}]},
                          {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp": 21}'}], 8)
    assert again.output_text == chat.choices[0].message.content


def test_a_json_schema_text_format_validates(server):
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    r = server.client().responses.create(
        model=MODEL, input="Weather?", max_output_tokens=64, temperature=1.0, extra_body={"seed": 1},
        text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text.format.type == "json_schema"


OK = {"model": MODEL, "input": "Hi", "max_output_tokens": 2}


@pytest.mark.parametrize("body,status,param", [
    ({**OK, "previous_response_id": "resp_1"}, 404, "previous_response_id"),
    ({**OK, "background": True}, 400, "background"),
    ({**OK, "truncation": "auto"}, 400, "truncation"),
    ({**OK, "reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({**OK, "include": ["message.output_text.logprobs"]}, 400, "include"),
    ({**OK, "top_logprobs": 3}, 400, "top_logprobs"),
    ({**OK, "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({**OK, "max_output_tokens": 5000}, 400, "max_output_tokens"),
    ({**OK, "temperature": 3}, 400, "temperature"),
    ({**OK, "frobnicate": 1}, 400, "frobnicate"),
    ({**OK, "model": "gpt-5"}, 404, "model"),
    ({**OK, "input": []}, 400, "input"),
    ({**OK, "input": [5]}, 400, "input.0"),
    ({**OK, "input": [{"type": "image_generation_call", "id": "x"}]}, 400, "input.0.type"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, 400,
     "input.0.content.0.type"),
    ({**OK, "input": [{"role": "wizard", "content": "Hi"}]}, 400, "input.0.role"),
    ({**OK, "input": [{"role": "user", "content": "Hi", "color": "red"}]}, 400, "input.0.color"),
    ({**OK, "input": [{"type": "function_call_output", "output": "1"}]}, 400, "input.0.call_id"),
    ({**OK, "input": [{"role": "user", "content": [{"type": "input_text"}]}]}, 400, "input.0.content.0.text"),
    ({**OK, "tools": [{"type": "web_search"}]}, 400, "tools.0.type"),
    ({**OK, "tools": [{"type": "function"}]}, 400, "tools.0.name"),
    ({**OK, "tool_choice": {"type": "mcp"}}, 400, "tool_choice"),
    ({**OK, "text": {"format": {"type": "yaml"}}}, 400, "text.format"),
    ({**OK, "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
    ({**OK, "input": "Hello " * 2000}, 400, "input"),
])
def test_bad_requests_are_400s_naming_the_parameter(server, body, status, param):
    r = server.post("/v1/responses", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    ok = server.client().responses.create(**OK)                              # and the server goes on serving
    assert ok.status in ("completed", "incomplete")


def test_items_become_chat_messages():
    """What the chat template receives of the input: parts joined, consecutive calls in one assistant
    message's tool_calls, each output a tool message (instructions go first, apart: not stored)."""
    from shapeplan.serve.openai.responses import ResponsesRequest, _input
    req = ResponsesRequest.model_validate({"model": MODEL, "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": '{"x": 1}', "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]}]})
    assert _input(req) == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"}]


def test_stored_responses_continue_a_conversation(server):
    """An answer is kept: retrieved as it was given, continued by previous_response_id (its input and output
    before the new input; its instructions not carried over), deleted; store: false keeps nothing."""
    import openai
    c = server.client()
    first = c.responses.create(model=MODEL, instructions=SYSTEM, input=ASK, max_output_tokens=6, temperature=0)
    assert first.store is True
    assert c.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = c.responses.create(model=MODEL, input="More?", previous_response_id=first.id, max_output_tokens=6,
                                temperature=0)
    assert second.previous_response_id == first.id
    chat = _chat(server, [{"role": "user", "content": ASK}, {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "More?"}], 6)
    assert second.output_text == chat.choices[0].message.content
    # a chain of three, the middle one streamed
    events = list(c.responses.create(model=MODEL, input="And?", previous_response_id=second.id, max_output_tokens=6,
                                     temperature=0, stream=True))
    third = events[-1].response
    assert c.responses.retrieve(third.id).output_text == third.output_text
    chat = _chat(server, [{"role": "user", "content": ASK}, {"role": "assistant", "content": first.output_text},
                          {"role": "user", "content": "More?"}, {"role": "assistant", "content": second.output_text},
                          {"role": "user", "content": "And?"}], 6)
    assert third.output_text == chat.choices[0].message.content
    deleted = c.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=MODEL, input="x", previous_response_id=first.id, max_output_tokens=2)
    assert c.responses.retrieve(second.id).output_text == second.output_text      # the rest stays
    kept_out = c.responses.create(model=MODEL, input=ASK, max_output_tokens=2, store=False)
    assert kept_out.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(kept_out.id)


def test_the_store_keeps_the_newest():
    from shapeplan.serve.openai.errors import NotFound
    from shapeplan.serve.openai.responses import ResponseStore
    store = ResponseStore(size=2)
    for i in range(3):
        store.put({"id": f"resp_{i}", "output": []}, [])
    with pytest.raises(NotFound, match="resp_0"):
        store.get("resp_0")
    assert store.get("resp_2").response["id"] == "resp_2" and store.delete("resp_1")["deleted"] is True


# ------------------------------------------------------------------ any request: answered or refused, never a 500
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.serve.openai.test_openai_errors import _JSON, _SCHEMA  # noqa: E402

_PART = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                               "text": st.text(max_size=6)})
_ITEM = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "wizard"]),
                           "content": st.text(max_size=10) | st.lists(_PART, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.text(max_size=4),
                           "name": st.text(max_size=4), "arguments": st.text(max_size=6)}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.text(max_size=4),
                           "output": st.text(max_size=6)}),
    _JSON)
_RESPONSES = {
    "input": st.text(max_size=16) | st.lists(_ITEM, max_size=3), "instructions": st.text(max_size=8) | st.none(),
    "max_output_tokens": st.integers(-1, 3), "temperature": st.floats(-1, 3), "top_p": st.floats(-0.5, 1.5),
    "stream": st.booleans(), "store": st.booleans(), "metadata": st.dictionaries(st.text(max_size=3),
                                                                                 st.text(max_size=3), max_size=2),
    "previous_response_id": st.text(max_size=6), "truncation": st.sampled_from(["auto", "disabled", "x"]),
    "text": st.builds(lambda s: {"format": {"type": "json_schema", "name": "x", "schema": s}}, _SCHEMA)
    | st.sampled_from([{"format": {"type": "text"}}, {"format": {"type": "json_object"}}, {"format": "x"}]),
    "tools": st.lists(st.builds(lambda p: {"type": "function", "name": "f", "parameters": p}, _SCHEMA)
                      | st.just({"type": "web_search"}), max_size=2),
    "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "name": "g"}, {"type": "x"}]),
    "seed": st.integers(-(2**64), 2**64), "top_k": st.integers(-3, 40), "stop": st.text(max_size=3),
}


@st.composite
def _responses_request(draw) -> dict:
    body = {"model": draw(st.sampled_from([MODEL, MODEL, "nope"])), "input": draw(_RESPONSES["input"]),
            "max_output_tokens": 2}
    for name in draw(st.lists(st.sampled_from(sorted(_RESPONSES)), max_size=5, unique=True)):
        body[name] = draw(_RESPONSES[name] | _JSON) if draw(st.integers(0, 5)) == 0 else draw(_RESPONSES[name])
    return body


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(_responses_request())
def test_any_responses_request_is_answered_or_refused(server, body):
    """Any combination of the Responses API's fields, right or wrong: a response (or its event stream, ending
    in response.completed / incomplete), or a 4xx with OpenAI's error JSON; never a 500."""
    r = server.post("/v1/responses", content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text[:400])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    elif body.get("stream") is True:
        last = [line for line in r.text.splitlines() if line.startswith("event: ")][-1]
        assert last in ("event: response.completed", "event: response.incomplete"), r.text[-400:]
    else:
        assert r.json()["object"] == "response" and r.json()["status"] in ("completed", "incomplete")
