"""``--reasoning-parser think``: a chat answer's ``<think> ... </think>`` comes back as ``reasoning_content`` beside
``content``, whole or streamed (the deltas joined are the whole answer's parts, however the text is cut), also
when the prompt opened ``<think>`` (DeepSeek-R1's template); off, the tags stay in the content. The tiny random
model is made to think by a regex constraint (vLLM's ``guided_regex``)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapeplan.serve.openai.reasoning import CLOSE, OPEN, ReasoningStream, split
from tests.serve.openai.conftest import MODEL, _start

THINK = "<think>[a-z]{2,6}</think>[a-z]{2,6}"
ASK = [{"role": "user", "content": "Think first."}]


def test_split():
    assert split("<think>abc</think>def") == ("abc", "def")
    assert split("<think>abc") == ("abc", "")                    # cut by max_tokens while thinking
    assert split("abc</think>def") == (None, "abc</think>def")
    assert split("abc</think>def", inside=True) == ("abc", "def")
    assert split("plain") == (None, "plain") and split("") == (None, "")


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from([OPEN, CLOSE, "<th", "ink>", "</", "<", ">", "a", "b c", "\n"]), max_size=8),
       cuts=st.lists(st.integers(0, 60), max_size=6), inside=st.booleans())
def test_streamed_parts_join_to_the_whole(pieces, cuts, inside):
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    s = ReasoningStream(inside)
    got = [s.push(ch, final=i == len(chunks) - 1) for i, ch in enumerate(chunks)]
    r, c = split(text, inside)
    assert "".join(g[0] for g in got) == (r or "") and "".join(g[1] for g in got) == c


@pytest.fixture(scope="module")
def think_server(tiny_checkpoint):
    pytest.importorskip("xgrammar")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    r = _start(tiny_checkpoint, reasoning_parser="think")
    yield r
    r.server.stop()
    r.pipe.close()
    torch.set_num_threads(threads)


def _ask(srv, **kw):
    return dict(model=MODEL, messages=ASK, max_tokens=48, temperature=1.0, seed=3, **kw)


def test_reasoning_comes_apart_whole_and_streamed(think_server, server):
    import re
    c = think_server.client()
    m = c.chat.completions.create(**_ask(think_server, extra_body={"guided_regex": THINK})).choices[0].message
    whole = re.fullmatch("<think>([a-z]+)</think>([a-z]+)", f"<think>{m.reasoning_content}</think>{m.content}")
    assert whole and m.reasoning_content and m.content
    chunks = list(c.chat.completions.create(stream=True, **_ask(think_server, extra_body={"guided_regex": THINK})))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == m.reasoning_content
    assert "".join(d.content or "" for d in deltas) == m.content
    # the parser off (the other server): the same answer with its tags in the content
    plain = server.client().chat.completions.create(**_ask(server, extra_body={"guided_regex": THINK}))
    assert plain.choices[0].message.content == f"<think>{m.reasoning_content}</think>{m.content}"
    assert getattr(plain.choices[0].message, "reasoning_content", None) is None


def test_a_prompt_that_opens_think(think_server):
    tok = think_server.pipe.tokenizer
    old = tok.chat_template
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>\n"
    try:
        m = think_server.client().chat.completions.create(
            **_ask(think_server, extra_body={"guided_regex": "[a-z]{2,6}</think>[a-z]{2,6}"})).choices[0].message
    finally:
        tok.chat_template = old
    assert m.reasoning_content and m.content and "</think>" not in m.content + m.reasoning_content


def test_responses_reasoning_item_whole_and_streamed(think_server):
    """/v1/responses: the reasoning is an item of its own before the message, whole or streamed (its
    reasoning_text deltas join to it); sent back as input, it is accepted and left out of the prompt."""
    c = think_server.client()
    kw = dict(model=MODEL, input="Think first.", max_output_tokens=48, temperature=1.0,
              extra_body={"seed": 3, "guided_regex": THINK})
    r = c.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    thought, answer = r.output[0].content[0].text, r.output_text
    assert thought and answer and "<think>" not in thought + answer
    events = list(c.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == answer
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output[0].content[0].text == thought and final.output_text == answer
    again = c.responses.create(model=MODEL, input=[{"role": "user", "content": "Think first."},
                                                   *[o.model_dump(exclude_none=True) for o in r.output],
                                                   {"role": "user", "content": "More?"}],
                               max_output_tokens=4, temperature=0)
    assert again.status in ("completed", "incomplete")
