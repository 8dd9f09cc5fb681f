"""CLI subcommands (generate, chat, bench) and the demo hook."""
from __future__ import annotations

import argparse
import json

from shapeplan.cli import main
from shapeplan.llm import GenerationPipeline

SMALL = ["--mode", "slot_by_slot", "--max-prefill-length", "32", "--max-kv-cache-length", "64"]


def test_generate_streams_the_completion(checkpoints, capsys):
    path = checkpoints("llama")
    assert main(["generate", "--model", path, "--prompt", "Hello world", "--max-new-tokens", "8",
                 "--metrics", *SMALL]) == 0
    out = capsys.readouterr()
    pipe = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", max_prefill_length=32,
                                              max_kv_cache_length=64, progress=False)
    assert out.out == pipe.generate("Hello world", max_new_tokens=8).text + "\n"
    assert "TTFT" in out.err and "late_steady" in out.err


def test_generate_takes_the_presence_and_frequency_penalties(checkpoints, capsys):
    from shapeplan.llm import Sampling
    path = checkpoints("llama")
    assert main(["generate", "--model", path, "--prompt", "Hello world", "--max-new-tokens", "12",
                 "--presence-penalty", "1.5", "--frequency-penalty", "0.5", "--min-p", "0.1", *SMALL]) == 0
    pipe = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", max_prefill_length=32,
                                              max_kv_cache_length=64, progress=False)
    want = pipe.generate("Hello world", max_new_tokens=12, sampling=Sampling(presence_penalty=1.5,
                                                                            frequency_penalty=0.5, min_p=0.1))
    assert capsys.readouterr().out == want.text + "\n"
    assert main(["generate", "--model", path, "--prompt", "Hi", "--presence-penalty", "3", *SMALL]) != 0
    assert "presence_penalty must be in [-2, 2], got 3.0" in capsys.readouterr().err


def test_chat_loop_keeps_the_conversation(checkpoints, capsys):
    from shapeplan.commands import chat
    path = checkpoints("llama")
    lines = iter(["hi", "tell me more", "/reset", "again", "/exit"])
    args = argparse.Namespace(model=path, max_new_tokens=4, temperature=0.0, top_k=0, top_p=1.0,
                              repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_p=0.0, seed=0,
                              device="cpu", mode="slot_by_slot", dtype=None,
                              max_prefill_length=48, max_kv_cache_length=128, metrics=False)
    assert chat._chat(args, input_fn=lambda _: next(lines)) == 0
    assert capsys.readouterr().out.count("\n") == 3


def test_bench_matrix_checks_configs_against_slot_by_slot(tmp_path, capsys):
    f = tmp_path / "bench.json"
    rc = main(["bench", "--preset", "llama-tiny", "--config", "matrix", "--dtype", "float32", "--prompt-len", "12",
               "--new-tokens", "24", "--max-kv-cache-length", "64", "--json", str(f)])
    table = capsys.readouterr().out
    assert rc == 0, table
    rows = {r["config"]: r for r in json.loads(f.read_text())["rows"]}
    assert {"slot_by_slot", "emulated_replay", "auto"} <= set(rows)
    assert rows["emulated_replay"]["agree_with_reference"] == "24/24"
    assert all(r["ok"] and r["late_steady_tok_s"] > 0 for r in rows.values())
    assert "late" in table and "emulated_replay" in table


def test_bench_serving_on_quantized_weights(capsys):
    """``bench --quantize TYPE --batch N``: the batched engine's benchmark on weights quantized at load (it had
    failed counting a quantized weight's bytes, twenty-fourth session on the GPU)."""
    rc = main(["bench", "--preset", "llama-tiny", "--quantize", "Q8_0", "--batch", "2", "--config", "slot_by_slot",
               "--dtype", "float32", "--prompt-len", "8", "--new-tokens", "4", "--max-kv-cache-length", "64"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    row = next(line.split() for line in out.out.splitlines() if line.startswith("shapeplan "))
    assert row[1:3] == ["2", "2"] and float(row[4]) > 0                 # 2 at once, 2 requests, tokens out
    assert "llama-tiny Q8_0" in out.out and "weights" in out.err


def test_bench_vs_torch_compile_runs_the_pytorch_decoder_on_the_same_weights(tmp_path, capsys):
    """``--vs-torch-compile``: the gpt-fast-style PyTorch decoder with the same weights in the same process
    (on the CPU its eager row only; on CUDA also eager + CUDA graph and torch.compile): same tokens as our
    slot_by_slot in float32, timed the same way."""
    f = tmp_path / "bench.json"
    rc = main(["bench", "--preset", "llama-tiny", "--config", "slot_by_slot", "--dtype", "float32",
               "--prompt-len", "10", "--new-tokens", "24", "--max-kv-cache-length", "64", "--vs-torch-compile",
               "--json", str(f)])
    table = capsys.readouterr().out
    assert rc == 0, table
    rows = {r["config"]: r for r in json.loads(f.read_text())["rows"]}
    assert set(rows) == {"slot_by_slot", "torch eager"}
    assert rows["torch eager"]["ok"] and rows["torch eager"]["agree_with_reference"] == "24/24"
    assert rows["torch eager"]["late_steady_tok_s"] > 0 and "torch eager" in table


def test_demo_generates_with_a_tiny_model():
    from shapeplan.llm.demo import run_demo
    lines: list[str] = []
    res = run_demo(max_new_tokens=6, mode="slot_by_slot", print_fn=lines.append)
    assert len(res.token_ids) == 6 and any("tok/s" in s for s in lines)


TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"


def test_a_chat_template_from_the_command_line(checkpoints, capsys, tmp_path):
    """--chat-template (the text, or a file) replaces the checkpoint's template: the command's answer is the
    pipeline's on the prompt rendered with it; a template that does not parse, or a value that is neither a file
    nor a template, is an error naming the flag before anything loads."""
    from shapeplan.llm import Sampling
    path = checkpoints("llama")
    pipe = GenerationPipeline.from_pretrained(path, mode="slot_by_slot", max_prefill_length=32,
                                              max_kv_cache_length=64, progress=False)
    rendered = "[user] Hello world\n[assistant]"
    want = pipe.generate(pipe.tokenizer.encode(rendered, add_special_tokens=False), max_new_tokens=6,
                         sampling=Sampling.greedy()).text
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    for value in (TEMPLATE, str(f)):
        assert main(["generate", "--model", path, "--prompt", "Hello world", "--chat", "--chat-template", value,
                     "--max-new-tokens", "6", *SMALL]) == 0
        assert capsys.readouterr().out == want + "\n"
    assert main(["generate", "--model", path, "--prompt", "Hi", "--chat-template", "{% for %}", *SMALL]) != 0
    assert "--chat-template: the template does not parse: line 1" in capsys.readouterr().err
    assert main(["generate", "--model", path, "--prompt", "Hi", "--chat-template", "no-such-file", *SMALL]) != 0
    assert "--chat-template: 'no-such-file' is neither a file nor a jinja2 template" in capsys.readouterr().err


def test_a_list_of_named_templates_takes_the_default():
    from shapeplan.llm.tokenizer import _default_template
    assert _default_template([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]) == "D"
    assert _default_template("S") == "S" and _default_template(None) is None and _default_template([{"x": 1}]) is None


def test_the_commands_pipeline_holds_one_request(checkpoints):
    """generate / chat / the keep-alive server run one request at a time: their pipeline's KV pool holds one
    request of the full --max-kv-cache-length (and the null block), not the library's 64; a full-length
    request and a chat session near the limit give the tokens of a pipeline with the default pool."""
    from shapeplan.commands.generate import load_pipeline
    path = checkpoints("llama")
    engine = dict(device="cpu", mode="auto", dtype=None, max_prefill_length=48, max_kv_cache_length=128)
    pipe = load_pipeline(argparse.Namespace(model=path, chat_template=None, **engine))
    ref = GenerationPipeline.from_pretrained(path, progress=False, **engine)
    try:
        assert pipe.max_num_seqs == 1 and pipe.blocks.num_blocks == 128 // pipe.block_size + 1
        assert ref.blocks.num_blocks > 8 * pipe.blocks.num_blocks
        for n in (40, 48):
            got, want = (p.submit(list(range(5, 5 + n)), max_new_tokens=128 - n, ignore_eos=True) for p in (pipe, ref))
            got.wait()
            want.wait()
            assert got.finish_reason == "length" and got.token_ids == want.token_ids and len(got.token_ids) == 128 - n
        turns = []
        for p in (pipe, ref):
            with p.start_session() as s:
                turns.append([(s.generate(line, max_new_tokens=8, chat=True).token_ids, s.cached)
                              for line in ("hi", "tell me more", "and more please")])
        assert turns[0] == turns[1] and turns[0][-1][1] > 100          # the last turn ends near the 128 limit
    finally:
        pipe.close()
        ref.close()
