"""The `shapeplan generate` command's start-up (issue 22): what its path imports, `--timings`, the
fast exit, the streamed weight loader (shapeplan/llm/stream_load.py) against the memory-mapped one,
and bench/startup.py --generate-cmd on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from shapeplan.errors import ModelError
from shapeplan.llm import GenerationPipeline, LlamaConfig
from shapeplan.llm import stream_load
from shapeplan.llm.weights import load_weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: modules the generate path must not import (each costs 0.05-0.8 s of a start; none is needed)
NOT_ON_GENERATE_PATH = ("transformers", "onnx", "onnxruntime", "ml_dtypes", "jinja2", "fastapi", "grpc", "rich",
                        "uvicorn", "starlette", "xgrammar", "gguf", "tritonclient")
PROMPT = "Hello world"


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, SHAPEPLAN_CACHE_DIR=kw.pop("cache_dir"))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
                          **kw)


def test_generate_path_imports_only_what_it_needs(checkpoints, tmp_path):
    """`import shapeplan.llm` and a whole generate command, in a fresh process: none of the modules above."""
    script = ("import json, sys\n"
              "import shapeplan.llm\n"
              "after_import = sorted(sys.modules)\n"
              "from shapeplan.cli import main\n"
              f"rc = main(['generate', '--model', {checkpoints('llama')!r}, '--prompt', 'Hi', '--max-new-tokens', '3'])\n"
              "print(json.dumps({'rc': rc, 'import': after_import, 'generate': sorted(sys.modules)}))\n")
    p = _run(["-c", script], cache_dir=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0
    for when in ("import", "generate"):
        bad = sorted({m for m in got[when] if m.split(".")[0] in NOT_ON_GENERATE_PATH})
        assert not bad, f"after {when}: {bad[:10]}"


def test_generate_command_timings_and_fast_exit(checkpoints, tmp_path):
    """The real command (os._exit after its atexit handlers): stdout is all there and the text is the
    pipeline's; --timings prints the breakdown, whose parts add up to no more than its total."""
    path = checkpoints("llama")
    p = _run(["-m", "shapeplan", "generate", "--model", path, "--prompt", PROMPT, "--max-new-tokens", "12",
              "--timings"], cache_dir=str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    want = GenerationPipeline.from_pretrained(path, max_prefill_length=512, max_kv_cache_length=2048,
                                              progress=False).generate(PROMPT, max_new_tokens=12).text
    assert p.stdout == want + "\n"
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("timings {"))
    t = json.loads(line[len("timings "):])
    for k in ("interpreter + imports", "config + tokenizer", "weights", "graph", "compile", "prefill", "decode",
              "in process"):
        assert t[k] >= 0, k
    parts = sum(v for k, v in t.items() if k != "in process")
    assert 0 < t["in process"] and parts <= t["in process"] + 0.05


@pytest.mark.parametrize("model_type,dtype", [("llama", None), ("llama", torch.bfloat16), ("mistral", torch.float32)])
def test_streamed_load_equals_memory_map(checkpoints, monkeypatch, model_type, dtype):
    """The streamed loader (pieces of 4 KiB here, so tensors span pieces; three threads; a sharded
    checkpoint for mistral) gives the memory map's tensors, in order, converted where asked, and the
    stacked q/k/v and gate/up slots."""
    path = checkpoints(model_type)
    cfg = LlamaConfig.from_file(path)
    monkeypatch.setattr(stream_load, "CHUNK", 4096)
    monkeypatch.setenv("SHAPEPLAN_LOAD_THREADS", "3")
    want = load_weights(path, cfg, dtype=dtype, progress=False)
    got = load_weights(path, cfg, dtype=dtype, progress=False, stream=True)
    assert list(got) == list(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    if dtype is not None:
        q, k = (got[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qk")
        assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()


def test_streamed_load_truncated_file_names_tensor(checkpoints, tmp_path):
    import shutil
    src = checkpoints("llama")
    d = tmp_path / "ckpt"
    shutil.copytree(src, d)
    f = d / "model.safetensors"
    data = f.read_bytes()
    cfg = LlamaConfig.from_file(str(d))
    from shapeplan.llm.weights import CheckpointWeights
    _, offset, nbytes = CheckpointWeights(str(d)).file("model.norm.weight").layout("model.norm.weight")
    plan = stream_load.pieces("model.norm.weight", str(f), offset, torch.empty(nbytes, dtype=torch.uint8))
    f.write_bytes(data[:offset + 2])                  # the tensor's bytes cut short after the header check
    with pytest.raises(ModelError, match="model.norm.weight"):
        stream_load.load(plan, torch.device("cpu"))
    with pytest.raises(ModelError):
        load_weights(str(d), cfg, stream=True, progress=False)


def test_progress_bar_waits():
    """The bar (and rich's import) only once a load has taken `after` seconds."""
    from shapeplan.llm.weights import _Progress
    bar = _Progress(True, "loading", 10, after=3600)
    for _ in range(10):
        bar.advance()
    assert bar._bar is None and bar.done == 10
    bar.close()


def test_bench_startup_generate_cmd_on_cpu(tmp_path, capsys):
    from bench import startup
    rc = startup.main(["--generate-cmd", "--preset", "llama-tiny", "--dtype", "float32", "--device", "cpu",
                       "--runs", "1", "--new-tokens", "8", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["run"] for r in rows] == ["first"]
    r = rows[0]
    assert r["wall"] >= r["in process"] > 0 and r["decode"] > 0
    assert "exit + unaccounted" in out and "weights" in out


def test_generate_timings_print_the_warm_up_parts(monkeypatch):
    """`--timings` names each CUDA warm-up part with its start and end since the process started (a table
    line, then one `warm-up parts {json}` line that bench/startup.py reads), the CUDA context's thread and
    the tokenizer helper's parse first; nothing without a warm-up."""
    import io

    from shapeplan import _tokproc
    from shapeplan.commands import generate
    from shapeplan.commands.generate import print_warmup_parts
    from shapeplan.llm import warmup
    monkeypatch.setattr(warmup, "timings", [("gemms", 10.5, 11.25), ("attention", 10.5, 12.0)])
    monkeypatch.setattr(generate, "_parts", [("context", 10.25, 10.75)])
    monkeypatch.setattr(_tokproc, "timeline", [("tokenizer", 10.0, 10.5)])
    out = io.StringIO()
    print_warmup_parts(10.0, file=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == ("warm-up parts (s since the process started): context 0.250-0.750, tokenizer 0.000-0.500, "
                        "gemms 0.500-1.250, attention 0.500-2.000")
    assert json.loads(lines[1][len("warm-up parts "):]) == {"context": [0.25, 0.75], "tokenizer": [0.0, 0.5],
                                                           "gemms": [0.5, 1.25], "attention": [0.5, 2.0]}
    monkeypatch.setattr(warmup, "timings", [])
    out = io.StringIO()
    print_warmup_parts(10.0, file=out)
    assert out.getvalue() == ""


@pytest.mark.parametrize("switch", ["on", "off"])
def test_tokenizer_parsed_on_a_thread(checkpoints, monkeypatch, switch):
    """SHAPEPLAN_TOKENIZER_THREAD: from_pretrained parses tokenizer.json on a thread while the weights load and
    the graph is built, and waits for it before it returns; the tokenizer and the completion are the same
    either way. auto: off on every device (tokenizers holds the GIL while it parses)."""
    from shapeplan.llm.pipeline import _tokenizer_thread
    from shapeplan.llm.tokenizer import Tokenizer
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_THREAD", switch)
    path = checkpoints("llama")
    ref = Tokenizer(path)
    pipe = GenerationPipeline.from_pretrained(path, max_prefill_length=32, max_kv_cache_length=96, progress=False)
    try:
        tok = pipe.tokenizer
        assert tok._thread is None and "tokenizer wait" in pipe.timings        # the parse had ended
        assert tok.encode(PROMPT) == ref.encode(PROMPT)
        assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos) == (ref.bos_token_id, ref.eos_token_id, ref.add_bos)
        text = pipe.generate(PROMPT, max_new_tokens=6).text
    finally:
        pipe.close()
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_THREAD", "off" if switch == "on" else "on")
    other = GenerationPipeline.from_pretrained(path, max_prefill_length=32, max_kv_cache_length=96, progress=False)
    try:
        assert other.generate(PROMPT, max_new_tokens=6).text == text
    finally:
        other.close()
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_THREAD", "auto")
    assert not _tokenizer_thread(torch.device("cpu")) and not _tokenizer_thread(torch.device("cuda"))


@pytest.mark.parametrize("switch", ["on", "off"])
def test_broken_tokenizer_fails_the_load(checkpoints, tmp_path, monkeypatch, switch):
    """A tokenizer.json that does not parse: from_pretrained raises ModelError naming the file, parsed on a
    thread or not (the thread's error is raised where the load waits for it)."""
    import shutil
    d = tmp_path / "ckpt"
    shutil.copytree(checkpoints("llama"), d)
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_THREAD", switch)
    with pytest.raises(ModelError, match="tokenizer.json: cannot load tokenizer"):
        GenerationPipeline.from_pretrained(str(d), max_prefill_length=32, max_kv_cache_length=96, progress=False)
