"""Every bad request gets its status and OpenAI's error JSON (never a 500), and the server keeps
serving; a full queue is a 503 with Retry-After; ``--api-key`` guards every endpoint but /health."""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serve.openai.conftest import MODEL

OK = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

# (path, body, status, param) -- body: a dict (sent as JSON) or raw bytes
BAD = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"\xff\xfe", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b"[" * 100000 + b"]" * 100000, 400, None),
    ("/v1/completions", b'{"model": "tiny-llama", "prompt": "Hi", "n": 1' + b"0" * 5000 + b"}", 400, None),
    ("/v1/completions", b'{"model": "tiny-llama", "prompt": "Hi", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", b'{"model": "tiny-llama", "prompt": "Hi", "repetition_penalty": Infinity}', 400,
     "repetition_penalty"),
    ("/v1/completions", {**OK, "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model"),
    ("/v1/completions", {**OK, "prompt": "Hello " * 2000}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": [5] * 1024}, 400, "prompt"),
    ("/v1/completions", {**OK, "max_tokens": 1100}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 5000}, 400, "max_completion_tokens"),
    ("/v1/completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**OK, "max_tokens": -5}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {**OK, "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {**OK, "n": "2"}, 400, "n"),
    ("/v1/completions", {**OK, "n": 0}, 400, "n"),
    ("/v1/completions", {**OK, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {**OK, "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {**OK, "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {**OK, "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {**OK, "prompt": 3.5}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": [1.5, 2]}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {**OK, "prompt": [100000]}, 400, "prompt"),
    ("/v1/completions", {**OK, "stop": 5}, 400, "stop"),
    ("/v1/completions", {**OK, "stop": [""]}, 400, "stop"),
    ("/v1/completions", {**OK, "seed": 2 ** 70}, 400, "seed"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"prompt": "Hi"}, 400, "model"),
    ("/v1/completions", {**OK, "frobnicate": True}, 400, "frobnicate"),
    ("/v1/completions", {**OK, "stream": True, "stream_options": {"include_usage": True, "x": 1}}, 400,
     "stream_options.x"),
    ("/v1/completions", {**OK, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {**OK, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {**OK, "min_p": 1.5}, 400, "min_p"),
    ("/v1/completions", {**OK, "stop_token_ids": [100000]}, 400, "stop_token_ids"),
    ("/v1/completions", {**OK, "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("/v1/completions", {**OK, "stop_token_ids": ["5"]}, 400, "stop_token_ids.0"),
    ("/v1/completions", {**OK, "frequency_penalty": -2.1}, 400, "frequency_penalty"),
    ("/v1/completions", {**OK, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {**OK, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("/v1/completions", {**OK, "logit_bias": {"-1": 1}}, 400, "logit_bias"),
    ("/v1/completions", {**OK, "logit_bias": {"100000": 1}}, 400, "logit_bias"),
    ("/v1/completions", {**OK, "logit_bias": {"5": "x"}}, 400, "logit_bias.5"),
    ("/v1/completions", {**OK, "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {**OK, "echo": True, "logprobs": 1, "prompt": "Hello " * 80}, 400, "prompt"),
    ("/v1/completions", {**OK, "best_of": 3}, 400, "best_of"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": "Hi"}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "Hi"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "Hi", "mood": "x"}]}, 400,
     "messages.0.mood"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
]


def _send(server, path, body):
    if isinstance(body, bytes):
        return server.post(path, content=body, headers={"content-type": "application/json"})
    return server.post(path, json=body)


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_request_gets_its_status_and_openai_error_json(server, path, body, status, param):
    r = _send(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param, err
    assert _send(server, "/v1/completions", OK).status_code == 200          # still serving


def test_the_openai_client_raises_its_typed_errors(server):
    import openai
    c = server.client()
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], logit_bias={"x": 1})
    with pytest.raises(openai.BadRequestError, match="context"):
        c.completions.create(model=MODEL, prompt="Hello " * 2000, max_tokens=2)


def test_a_10_mb_body_is_413_and_the_server_keeps_serving(server):
    r = server.post("/v1/completions", content=b'{"model": "' + b"x" * (10 << 20) + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert server.post("/v1/completions", json=OK).status_code == 200


def test_unknown_paths_and_methods_answer_in_openai_shape(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_a_full_queue_is_503_with_retry_after(small_server):
    s, auth = small_server, {"Authorization": "Bearer sk-test-key"}
    release, blocked = threading.Event(), threading.Event()

    def hold() -> None:                   # keep the engine thread busy: nothing leaves the queue meanwhile
        blocked.set()
        release.wait(60)

    holder = threading.Thread(target=lambda: s.pipe.batch.call(hold))
    holder.start()
    blocked.wait(10)
    try:
        with httpx.Client(base_url=s.url, headers=auth, timeout=60) as c, ThreadPoolExecutor(2) as pool:
            queued = [pool.submit(c.post, "/v1/completions", json=OK) for _ in range(2)]
            s.wait_for(lambda: s.pipe.batch._inbox.qsize() >= 2)           # both wait behind the hold
            r = c.post("/v1/completions", json=OK)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "server_error"
            release.set()
            assert [f.result().status_code for f in queued] == [200, 200]
            assert c.post("/v1/completions", json=OK).status_code == 200
    finally:
        release.set()
        holder.join()


def test_the_api_key_guards_everything_but_health(small_server):
    import openai
    s = small_server
    for path in ("/v1/models", "/metrics", f"/v1/models/{MODEL}"):
        assert httpx.get(s.url + path).status_code == 401
        assert httpx.get(s.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(s.url + path, headers={"Authorization": "Bearer sk-test-key"}).status_code == 200
    r = httpx.post(s.url + "/v1/completions", json=OK)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(s.url + "/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
    assert s.client().completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens >= 1


# ------------------------------------------------------------------ any request: answered, or a 4xx in OpenAI's shape
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3),
                     max_leaves=8)
_TYPES = ("string", "integer", "number", "boolean", "null", "nope")
_SCHEMA = st.recursive(st.sampled_from([{"type": t} for t in _TYPES])
                       | st.builds(lambda e: {"enum": e}, st.lists(st.text(max_size=3) | st.integers(), max_size=3)),
                       lambda inner: st.builds(lambda p, r: {"type": "object", "properties": p, "required": r},
                                               st.dictionaries(st.text(max_size=3), inner, max_size=2),
                                               st.lists(st.text(max_size=3), max_size=2))
                       | st.builds(lambda i: {"type": "array", "items": i, "maxItems": 2}, inner),
                       max_leaves=4)
_FIELDS = {         # each drawn field: mostly a value the server takes, sometimes anything
    "n": st.integers(-1, 3), "temperature": st.floats(-1, 3), "top_p": st.floats(-0.5, 1.5),
    "top_k": st.integers(-3, 40), "min_p": st.floats(-0.5, 1.5), "presence_penalty": st.floats(-3, 3),
    "stop_token_ids": st.lists(st.integers(-2, 400), max_size=3),
    "frequency_penalty": st.floats(-3, 3),
    "seed": st.integers(-(2**64), 2**64), "stop": st.text(max_size=3)
    | st.lists(st.text(max_size=3), max_size=3), "repetition_penalty": st.floats(-1, 3),
    "logit_bias": st.dictionaries(st.sampled_from(["5", "-1", "abc", "99999999", "0"]), st.floats(-200, 200),
                                  max_size=2),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "user": st.text(max_size=4), "ignore_eos": st.booleans(), "return_token_ids": st.booleans(),
    "guided_choice": st.lists(st.text(max_size=4), max_size=3), "guided_regex": st.text(max_size=6),
    "guided_grammar": st.sampled_from(['root ::= "a"+', "root ::= ", "nope"]) | st.text(max_size=8),
    "structured_outputs": st.dictionaries(st.sampled_from(["json", "regex", "choice", "grammar", "json_object", "x"]),
                                          st.text(max_size=4) | st.booleans() | _SCHEMA, max_size=2),
}
_COMPLETION = {"prompt": st.text(max_size=20) | st.lists(st.text(max_size=8), max_size=3)
               | st.lists(st.integers(-3, 300) | st.sampled_from([2**31, 2**63]), max_size=6)
               | st.lists(st.lists(st.integers(0, 300), max_size=4), max_size=2),
               "max_tokens": st.integers(-1, 3) | st.none(), "logprobs": st.integers(-1, 21), "echo": st.booleans(),
               "suffix": st.text(max_size=3), "best_of": st.integers(0, 2)}
_CHAT = {"messages": st.lists(st.fixed_dictionaries(
             {"role": st.sampled_from(["system", "user", "assistant", "tool", "wizard"]),
              "content": st.text(max_size=12) | st.lists(st.fixed_dictionaries(
                  {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=6)}), max_size=2)}),
             max_size=3),
         "max_completion_tokens": st.integers(-1, 3), "logprobs": st.booleans(), "top_logprobs": st.integers(-1, 21),
         "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "yaml"}])
         | st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}, _SCHEMA),
         "tools": st.lists(st.builds(lambda p: {"type": "function", "function": {"name": "f", "parameters": p}},
                                     _SCHEMA), max_size=2),
         "tool_choice": st.sampled_from(["auto", "none", "required", {"type": "function", "function": {"name": "g"}}])}


@st.composite
def _request(draw) -> tuple[str, dict]:
    chat = draw(st.booleans())
    fields = {**_FIELDS, **(_CHAT if chat else _COMPLETION)}
    body = {"model": draw(st.sampled_from([MODEL, MODEL, "nope"]))}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True)):
        body[name] = draw(fields[name] | _JSON) if draw(st.integers(0, 5)) == 0 else draw(fields[name])
    body.setdefault("messages" if chat else "prompt", draw(_CHAT["messages"] if chat else _COMPLETION["prompt"]))
    if body.get("max_tokens") is None and not chat:
        body["max_tokens"] = 2                          # (a null max_tokens: the rest of the context, too long here)
    body.setdefault("max_completion_tokens" if chat else "max_tokens", 2)
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(_request())
def test_any_request_is_answered_or_refused_in_openai_shape(server, request_):
    """Any combination of fields and values (right, wrong, or of the wrong type; JSON schemas and tools of any
    shape): the server answers it, or refuses it with a 4xx and OpenAI's error JSON; never a 500, and it keeps
    serving."""
    path, body = request_
    r = _send(server, path, json.dumps(body).encode())            # (NaN and Infinity as Python writes them)
    assert r.status_code < 500, (r.status_code, r.text[:400])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    elif body.get("stream"):
        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, r.text[-400:]
    else:
        assert r.json()["choices"], r.text[:400]
