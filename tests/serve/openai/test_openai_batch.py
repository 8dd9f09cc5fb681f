"""``shapeplan batch``: OpenAI Batch API lines answered offline, each answer what the server gives for the
same request (greedy), checked with the ``openai`` package's own types; lines that are not requests
and requests the server refuses get their error and the batch goes on."""
from __future__ import annotations

import json

import pytest

from tests.serve.openai.conftest import MODEL

ARGS = ["--device", "cpu", "--mode", "emulated_replay", "--max-prefill-length", "64", "--max-kv-cache-length", "1024",
        "--max-num-seqs", "8", "--dtype", "float32"]


def _chat(text: str, **kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0, **kw}


def _line(cid, url: str, body) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def _run(tmp_path, lines: list[str], *extra: str) -> list[dict]:
    from shapeplan.cli import main
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n\n")
    assert main(["batch", "-i", str(src), "-o", str(dst), *ARGS, *extra]) == 0
    return [json.loads(line) for line in dst.read_text().splitlines()]


def test_batch_answers_equal_the_servers(server, tiny_checkpoint, tmp_path) -> None:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response
    prompts = [f"Tell me about number {k}" for k in range(12)]
    lines = [_line(f"chat-{k}", "/v1/chat/completions", _chat(p)) for k, p in enumerate(prompts)]
    completion = {"model": MODEL, "prompt": "The cat sat", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    response = {"model": MODEL, "input": "Say hi", "max_output_tokens": 6, "temperature": 0}
    lines += [_line("completion", "/v1/completions", completion), _line("response", "/v1/responses", response)]
    bad = [
        "{not json",
        json.dumps({"method": "POST", "url": "/v1/completions", "body": completion}),
        _line("chat-0", "/v1/chat/completions", _chat("again")),
        _line("emb", "/v1/embeddings", {"model": MODEL, "input": "x"}),
        _line("streamed", "/v1/chat/completions", _chat("hi", stream=True)),
        json.dumps({"custom_id": "extra", "url": "/v1/completions", "body": completion, "priority": 1}),
    ]
    refused = [_line("hot", "/v1/chat/completions", _chat("hi", temperature="hot")),
               _line("other-model", "/v1/chat/completions", {**_chat("hi"), "model": "other"})]
    out = _run(tmp_path, lines[:6] + bad + lines[6:] + refused, "--model", tiny_checkpoint,
               "--served-model-name", MODEL)
    assert len(out) == len(lines) + len(bad) + len(refused)
    by_id = {o["custom_id"]: o for o in out if o["error"] is None}
    # in the input's order
    assert [o["custom_id"] for o in out[:6]] == [f"chat-{k}" for k in range(6)]
    assert [o["custom_id"] for o in out[6:12]] == [None, None, "chat-0", "emb", "streamed", "extra"]
    c = server.client()
    for k, p in enumerate(prompts):
        o = by_id[f"chat-{k}"]
        assert o["response"]["status_code"] == 200 and o["id"].startswith("batch_req_")
        got = ChatCompletion.model_validate(o["response"]["body"])
        want = c.chat.completions.create(**_chat(p))
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.usage == want.usage
    got = Completion.model_validate(by_id["completion"]["response"]["body"])
    want = c.completions.create(**completion)
    assert got.choices[0].text == want.choices[0].text
    assert got.choices[0].logprobs.tokens == want.choices[0].logprobs.tokens
    got = Response.model_validate(by_id["response"]["response"]["body"])
    assert got.output_text == c.responses.create(**response).output_text
    errors = {i: o["error"]["message"] for i, o in enumerate(out) if o["error"] is not None}
    assert all(o["response"] is None for o in out if o["error"] is not None)
    assert "line 7: the line is not JSON" in errors[6]
    assert "line 8: the line has no custom_id" in errors[7]
    assert "custom_id 'chat-0' is used by an earlier line" in errors[8]
    assert "url '/v1/embeddings': a batch line posts to one of" in errors[9]
    assert "stream: true is not available in a batch" in errors[10]
    assert "unknown field(s) ['priority']" in errors[11]
    hot, other = out[-2]["response"], out[-1]["response"]
    assert hot["status_code"] == 400 and "temperature" in hot["body"]["error"]["message"]
    assert other["status_code"] == 404 and "the model 'other' does not exist" in other["body"]["error"]["message"]


def test_the_files_model_name_is_served_and_stdout(tiny_checkpoint, tmp_path, capfd) -> None:
    from shapeplan.cli import main
    src = tmp_path / "in.jsonl"
    src.write_text(_line("a", "/v1/chat/completions", {**_chat("hi"), "model": "my-model"}) + "\n")
    assert main(["batch", "-i", str(src), "-o", "-", *ARGS, "--model", tiny_checkpoint]) == 0
    cap = capfd.readouterr()
    (line,) = [json.loads(x) for x in cap.out.splitlines() if x.startswith("{")]
    assert line["response"]["status_code"] == 200 and line["response"]["body"]["model"] == "my-model"
    assert "1 lines: 1 answered, 0 refused by the server, 0 not requests" in cap.err


@pytest.mark.parametrize("argv,words", [
    (["-i", "x.jsonl", "-o", "y.jsonl"], "give --model DIR|FILE.gguf or --preset NAME"),
    (["-i", "x.jsonl", "-o", "y.jsonl", "--preset", "nope"], "no such preset"),
    (["-i", "/nonexistent/x.jsonl", "-o", "y.jsonl", "--preset", "llama-125m"], "--input /nonexistent/x.jsonl"),
])
def test_argument_errors(argv, words, capsys) -> None:
    from shapeplan.cli import main
    assert main(["batch", *argv]) == 2
    assert words in capsys.readouterr().err
