"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: the ids a completion or chat request would send to the
engine (the chat request's ``usage.prompt_tokens`` is their count), the text of ids, and 400s / 404s naming
the parameter."""
from __future__ import annotations

import pytest

from tests.serve.openai.conftest import MODEL

PROMPT = "Explain KV caching: keys and values"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]


def test_a_prompt_tokenizes_as_the_pipeline_does(server):
    r = server.post("/tokenize", json={"model": MODEL, "prompt": PROMPT, "return_token_strs": True}).json()
    tok = server.pipe.tokenizer
    assert r["tokens"] == tok.encode(PROMPT) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == server.pipe.max_kv_cache_length
    assert r["token_strs"][0] == "<s>"                                     # the BOS the tokenizer adds
    assert r["token_strs"] == [tok.decode([t], skip_special_tokens=False) for t in r["tokens"]]
    bare = server.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()   # model optional
    assert bare["tokens"] == tok.encode(PROMPT, add_special_tokens=False) == r["tokens"][1:]
    assert bare["token_strs"] is None
    back = server.post("/detokenize", json={"model": MODEL, "tokens": bare["tokens"]}).json()
    assert back == {"prompt": PROMPT}


def test_messages_count_as_the_chat_request_does(server):
    r = server.post("/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()
    chat = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert r["count"] == chat.usage.prompt_tokens
    tok = server.pipe.tokenizer
    assert r["tokens"] == tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    no_prefix = server.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert no_prefix["count"] < r["count"]


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {"model": MODEL}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "messages"),
    ("/tokenize", {"model": "gpt-5", "prompt": "a"}, 404, "model"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "frobnicate": 1}, 400, "frobnicate"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "a"}]}, 400, "messages.0.role"),
    ("/detokenize", {"tokens": [100000]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens.0"),
    ("/detokenize", {"model": "gpt-5", "tokens": [1]}, 404, "model"),
    ("/detokenize", {}, 400, "tokens"),
])
def test_bad_requests(server, path, body, status, param):
    r = server.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert server.post("/tokenize", json={"prompt": "still serving"}).status_code == 200
