"""The OpenAI server against the pipeline it serves, through the real ``openai`` client: greedy text
and tokens equal ``pipe.generate`` (completions and chat, streamed and not), 32 concurrent clients
each get their own single-stream tokens, stop strings, n=2 with seeds, logprobs, usage counts."""
from __future__ import annotations

import asyncio

import pytest
import torch

from shapeplan.llm import Sampling
from tests.serve.openai.conftest import MODEL

PROMPTS = ["Hello world", "The quick brown fox", "Explain KV caching:", "Once upon a time", "0 1 2 3 4",
           "A compile-once, replay-many engine", "Python, torch and ONNX", "keys and values"]


def _ref(pipe, prompt: str, n: int, chat: bool = False, sampling: Sampling | None = None):
    return pipe.generate(prompt, n, sampling or Sampling.greedy(), chat=chat)


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_completion_greedy_equals_pipe_generate(server, prompt):
    ref = _ref(server.pipe, prompt, 24)
    r = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                           extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert c.text == ref.text
    assert c.model_extra["token_ids"] == ref.token_ids
    assert c.finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(server.pipe.encode(prompt))
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")


def test_completion_stream_gives_the_same_text_then_usage_then_done(server):
    ref = _ref(server.pipe, PROMPTS[3], 30)
    chunks = list(server.client().completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=30, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 30
    assert last.usage.prompt_tokens == len(server.pipe.encode(PROMPTS[3]))


def test_raw_stream_ends_with_done(server):
    import httpx
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_greedy_equals_pipe_generate_with_the_chat_template(server, stream):
    ref = _ref(server.pipe, "Tell me about KV caches", 20, chat=True)
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me about KV caches"}], max_tokens=20,
              temperature=0)
    if stream:
        chunks = list(server.client().chat.completions.create(stream=True, **kw))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = server.client().chat.completions.create(**kw)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
        assert r.usage.completion_tokens == len(ref.token_ids)
    assert text == ref.text and finish == ref.finish_reason


def test_chat_takes_content_parts_and_max_completion_tokens(server):
    ref = _ref(server.pipe, "Hello world", 7, chat=True)
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "Hello world"}]}],
        max_completion_tokens=7, temperature=0)
    assert r.choices[0].message.content == ref.text and r.usage.completion_tokens == len(ref.token_ids)


def test_32_concurrent_clients_each_get_their_own_greedy_tokens(server):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {i}" for i in range(32)]
    lengths = [8 + (i * 5) % 23 for i in range(32)]
    refs = [_ref(server.pipe, p, n) for p, n in zip(prompts, lengths)]

    async def one(client, i: int):
        kw = dict(model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0,
                  extra_body={"return_token_ids": True})
        if i % 2:
            ids, text = [], ""
            async for c in await client.completions.create(stream=True, **kw):
                ids += c.choices[0].model_extra["token_ids"]
                text += c.choices[0].text
            return ids, text
        r = await client.completions.create(**kw)
        return r.choices[0].model_extra["token_ids"], r.choices[0].text

    async def all_of_them():
        async with server.async_client() as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    got = asyncio.run(all_of_them())
    for (ids, text), ref in zip(got, refs):
        assert ids == ref.token_ids
        assert text == ref.text


def test_stop_strings_cut_the_text_streamed_or_not(server):
    ref = _ref(server.pipe, "The quick brown fox", 40)
    text = ref.text
    at = next(i for i in range(4, len(text) - 3) if "\ufffd" not in text[i:i + 3] and text[i:i + 3].strip())
    stop = text[at:at + 3]
    want = text[:text.find(stop)]
    kw = dict(model=MODEL, prompt="The quick brown fox", max_tokens=40, temperature=0,
              stop=["never-in-there", stop], extra_body={"return_token_ids": True})
    r = server.client().completions.create(**kw)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    ids = r.choices[0].model_extra["token_ids"]
    assert stop in server.pipe.decode(ids) and stop not in server.pipe.decode(ids[:-1])   # tokens end at the stop
    assert r.usage.completion_tokens == len(ids)
    chunks = list(server.client().completions.create(stream=True, **{**kw, "stop": stop}))
    streamed = [c.choices[0].text for c in chunks]
    assert "".join(streamed) == want and chunks[-1].choices[0].finish_reason == "stop"


def test_n2_with_a_seed_is_reproducible_and_each_choice_is_its_seeds_sample(server):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=16, temperature=1.0, top_p=0.95, n=2, seed=42,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    a = server.client().completions.create(**kw)
    b = server.client().completions.create(**kw)
    ids = [c.model_extra["token_ids"] for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1]
    assert ids == [c.model_extra["token_ids"] for c in b.choices]
    assert ids[0] != ids[1]
    for j, got in enumerate(ids):
        h = server.pipe.submit("Once upon a time", 16, Sampling(temperature=1.0, top_p=0.95, seed=42 + j),
                               ignore_eos=True)
        h.wait()
        assert got == h.token_ids
    assert a.usage.completion_tokens == 32 and a.usage.prompt_tokens == len(server.pipe.encode("Once upon a time"))
    chunks = list(server.client().completions.create(stream=True, **kw))
    streamed = {0: [], 1: []}
    for c in chunks:
        streamed[c.choices[0].index] += c.choices[0].model_extra["token_ids"]
    assert [streamed[0], streamed[1]] == ids


def test_several_prompts_in_one_completion_request(server):
    refs = [_ref(server.pipe, p, 6) for p in PROMPTS[:3]]
    r = server.client().completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=6, temperature=0)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == [x.text for x in refs]
    assert r.usage.prompt_tokens == sum(len(server.pipe.encode(p)) for p in PROMPTS[:3])


def test_token_id_prompts_work(server):
    ids = server.pipe.encode("Hello world")
    ref = _ref(server.pipe, ids, 10)
    r = server.client().completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0)
    assert r.choices[0].text == ref.text


def test_completion_logprobs_are_the_models_log_softmax(server):
    prompt = "Hello world"
    r = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                           extra_body={"return_token_ids": True})
    c = r.choices[0]
    ids = c.model_extra["token_ids"]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) == 6
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)      # keyed by text: tokens of one text merge
    p = server.pipe.encode(prompt)
    ref = torch.log_softmax(server.pipe.score(p + ids[:-1]).float(), dim=-1)
    for j, (t, v) in enumerate(zip(ids, lp.token_logprobs)):
        assert v == pytest.approx(ref[len(p) - 1 + j, t].item(), abs=1e-4)
        assert max(lp.top_logprobs[j].values()) == pytest.approx(v, abs=1e-6)     # greedy: the top token
    assert lp.text_offset[0] == 0


def test_chat_logprobs(server):
    r = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=5, temperature=0, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 4 and t.top_logprobs[0].logprob == t.logprob for t in content)
    chunks = list(server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                          max_tokens=5, temperature=0, logprobs=True, stream=True))
    streamed = [t.logprob for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == [t.logprob for t in content]


def test_presence_frequency_penalties_and_logit_bias_equal_pipe_generate(server):
    """OpenAI's presence / frequency penalties and logit_bias (token ids as JSON string keys) through the official
    client: the pipeline's tokens under the same Sampling, and not those without them."""
    plain = _ref(server.pipe, PROMPTS[0], 16)
    bias = {str(plain.token_ids[0]): -100, "7": 3}
    ref = _ref(server.pipe, PROMPTS[0], 16, sampling=Sampling(presence_penalty=1.2, frequency_penalty=0.5,
                                                             logit_bias={int(k): v for k, v in bias.items()}))
    r = server.client().completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                           presence_penalty=1.2, frequency_penalty=0.5, logit_bias=bias,
                                           extra_body={"return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids != plain.token_ids
    chat = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=8, temperature=0, frequency_penalty=1.0,
                                                   logit_bias=bias)
    drawn = Sampling(temperature=1.0, seed=5, min_p=0.2)
    r = server.client().completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=12, temperature=1.0, seed=5,
                                           extra_body={"min_p": 0.2, "return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == _ref(server.pipe, PROMPTS[1], 12, sampling=drawn).token_ids
    assert chat.choices[0].message.content == _ref(server.pipe, "Hi", 8, chat=True, sampling=Sampling(
        frequency_penalty=1.0, logit_bias={int(k): v for k, v in bias.items()})).text


def test_stop_token_ids_end_the_choice_with_stop(server):
    plain = _ref(server.pipe, PROMPTS[2], 16).token_ids
    t = plain[4]
    r = server.client().completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=16, temperature=0,
                                           extra_body={"stop_token_ids": [t], "return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == plain[:plain.index(t) + 1]
    assert r.choices[0].finish_reason == "stop"


def test_defaults_come_from_generation_config(server, tmp_path):
    from shapeplan.serve.openai.generation import GenerationDefaults
    # the tiny checkpoint says do_sample: false, so a request without a temperature is greedy
    ref = _ref(server.pipe, "Hello world", 9)
    r = server.client().completions.create(model=MODEL, prompt="Hello world", max_tokens=9)
    assert r.choices[0].text == ref.text
    (tmp_path / "generation_config.json").write_text('{"do_sample": true, "temperature": 0.6, "top_p": 0.9, '
                                                     '"top_k": 20, "repetition_penalty": 1.05, "max_new_tokens": 77, '
                                                     '"min_p": 0.05}')
    d = GenerationDefaults.from_checkpoint(str(tmp_path))
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty, d.max_new_tokens, d.min_p) == \
        (0.6, 0.9, 20, 1.05, 77, 0.05)
    assert GenerationDefaults.from_checkpoint(None) == GenerationDefaults()


def test_ignore_eos_runs_to_max_tokens_and_chat_default_length_is_the_context(server):
    r = server.client().completions.create(model=MODEL, prompt="Hi", max_tokens=50, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 50 and r.choices[0].finish_reason == "length"


def test_models_and_health(server):
    import httpx
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra["max_model_len"] == server.pipe.max_kv_cache_length
    assert server.client().models.retrieve(MODEL).id == MODEL
    assert httpx.get(server.url + "/health").status_code == 200
