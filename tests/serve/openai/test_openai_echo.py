"""``echo`` on ``/v1/completions``, as evaluation harnesses use it (lm-evaluation-harness' loglikelihood sends
``echo: true, logprobs: 1`` and reads ``token_logprobs`` by prompt position): each choice starts with its
prompt; with ``logprobs`` the prompt's tokens come first (the first without a log-probability, as OpenAI's),
their values the log-softmax of transformers' logits on the same checkpoint; ``max_tokens: 0`` scores a
prompt without generating; streamed, the prompt is the first chunk."""
from __future__ import annotations

import pytest
import torch

from tests.serve.openai.conftest import MODEL

PROMPT = "Once upon a time there was a cache"


def _post(server, **body):
    r = server.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_puts_the_prompt_before_the_answer(server):
    plain = _post(server, prompt=PROMPT, max_tokens=5)["choices"][0]
    echo = _post(server, prompt=PROMPT, max_tokens=5, echo=True)["choices"][0]
    assert echo["text"] == PROMPT + plain["text"] and echo["finish_reason"] == plain["finish_reason"]


@pytest.mark.parametrize("rows", [None, 3])
def test_prompt_logprobs_are_transformers_log_softmax(server, tiny_checkpoint, monkeypatch, rows):
    """(rows: the log-softmax taken 3 prompt rows at a time, as a long prompt takes 256.)"""
    from transformers import AutoModelForCausalLM

    from shapeplan.serve.openai import generation
    if rows:
        monkeypatch.setattr(generation, "_ECHO_ROWS", rows)
    ids = server.pipe.tokenizer.encode(PROMPT)
    out = _post(server, prompt=ids, max_tokens=0, echo=True, logprobs=2)
    c = out["choices"][0]
    lp = c["logprobs"]
    assert c["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 0
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    hf = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    want = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert lp["token_logprobs"][1:] == pytest.approx(want, abs=1e-4)
    for i in range(1, len(ids)):
        top = lp["top_logprobs"][i]
        assert len(top) <= 2 and max(top.values()) == pytest.approx(float(ref[i - 1].max()), abs=1e-4)
    text = c["text"]
    assert text == server.pipe.tokenizer.decode(ids)
    offs = lp["text_offset"]
    assert offs == sorted(offs) and offs[0] == 0 and all(o <= len(text) for o in offs)


def test_harness_style_request_lines_up_by_position(server):
    """Token-id prompt, one generated token: token_logprobs[:n] are the prompt's, [n] the new token's, which
    equals the same request's logprob without echo."""
    ids = server.pipe.tokenizer.encode(PROMPT)
    c = _post(server, prompt=ids, max_tokens=1, echo=True, logprobs=1)["choices"][0]
    plain = _post(server, prompt=ids, max_tokens=1, logprobs=1)["choices"][0]
    lp = c["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][-1] == pytest.approx(plain["logprobs"]["token_logprobs"][0], abs=1e-5)
    assert lp["tokens"][-1] == plain["logprobs"]["tokens"][0]
    assert lp["text_offset"][-1] == len(server.pipe.tokenizer.decode(ids))


@pytest.mark.parametrize("max_tokens", [0, 4])
def test_a_streamed_echo_starts_with_the_prompt(server, max_tokens):
    body = dict(prompt=PROMPT, max_tokens=max_tokens, echo=True, logprobs=1, n=2, seed=3, temperature=0.8)
    whole = _post(server, **body)
    chunks = list(server.client().completions.create(model=MODEL, stream=True, **body))
    for j in range(2):
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == j]
        assert mine[0].text == PROMPT
        assert "".join(m.text for m in mine) == whole["choices"][j]["text"]
        got = [v for m in mine for v in (m.logprobs.token_logprobs if m.logprobs else [])]
        assert got == pytest.approx(whole["choices"][j]["logprobs"]["token_logprobs"], abs=1e-5)


@pytest.mark.parametrize("body,param", [
    ({"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "Hello " * 80, "max_tokens": 0, "echo": True, "logprobs": 1}, "prompt"),
])
def test_bad_echo_requests(server, body, param):
    r = server.post("/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
