"""shapeplan/_tokproc.py: the generate / chat commands' tokenizer.json parsed in a helper process (the parse
holds the GIL, so no thread can hide it). Its answers are the in-process tokenizer's; a file that does not
parse fails the load with the same ModelError; a helper that is gone is replaced by a parse here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from shapeplan import _tokproc
from shapeplan.errors import ModelError
from shapeplan.llm import GenerationPipeline
from shapeplan.llm.tokenizer import Tokenizer

TEXTS = ["Explain KV caching: keys and values", "", "héllo wörld \u2014 \U0001f600 <s> </s>", "a\nb\tc"]


def test_the_helper_answers_as_the_tokenizer(checkpoints):
    path = checkpoints("llama")
    ref = Tokenizer(path)
    helper = _tokproc.start(path)
    assert helper is not None
    tok = Tokenizer(path)
    assert tok._helper is not None and tok._tok is tok._helper and not _tokproc._started
    helper.wait()                                      # its parse's moment, on this process's clock (--timings)
    assert helper.started <= helper.parsed <= time.perf_counter()
    assert _tokproc.timeline[-1] == ("tokenizer", helper.started, helper.parsed)
    for text in TEXTS:
        for special in (True, False):
            ids = tok.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special)
            for skip in (True, False):
                assert tok.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_id, tok.add_bos) == \
        (ref.vocab_size, ref.bos_token_id, ref.eos_token_id, ref.add_bos)
    from tokenizers import Tokenizer as Backend
    assert isinstance(tok.backend(), Backend) and tok.backend() is tok.backend()
    assert tok.encode(TEXTS[0]) == ref.encode(TEXTS[0])                  # still through the helper


def test_a_broken_file_fails_as_it_would_here(checkpoints, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(checkpoints("llama"), d)
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    with pytest.raises(ModelError) as here:
        Tokenizer(str(d))
    _tokproc.start(str(d))
    with pytest.raises(ModelError, match="tokenizer.json: cannot load tokenizer") as there:
        Tokenizer(str(d)).encode("x")
    assert str(there.value) == str(here.value)


def test_a_helper_that_is_gone_is_replaced_by_a_parse_here(checkpoints):
    path = checkpoints("llama")
    ref = Tokenizer(path)
    helper = _tokproc.start(path)
    tok = Tokenizer(path)
    assert tok.encode(TEXTS[0]) == ref.encode(TEXTS[0])
    helper._p.kill()
    helper._p.wait()
    assert tok.encode(TEXTS[2]) == ref.encode(TEXTS[2]) and tok._helper is None
    helper = _tokproc.start(path)                                        # gone before it answered at all
    helper._p.kill()
    helper._p.wait()
    assert Tokenizer(path).decode(ref.encode(TEXTS[0])) == ref.decode(ref.encode(TEXTS[0]))


def test_a_helper_that_says_something_else_is_replaced_too(checkpoints, monkeypatch):
    """A helper whose stdout carries something other than its answers (a library printing on import, say)
    is not trusted: the file is parsed here."""
    path = checkpoints("llama")
    ref = Tokenizer(path)
    monkeypatch.setattr(_tokproc, "_HELPER", "print('hello from a library')\n" + _tokproc._HELPER)
    _tokproc.start(path)
    tok = Tokenizer(path)
    assert tok.encode(TEXTS[0]) == ref.encode(TEXTS[0]) and tok._helper is None


def test_the_command_starts_it_and_the_pipeline_uses_it(checkpoints, monkeypatch):
    """``_tokproc.start_for_command`` (the generate / chat commands, first thing): the pipeline's tokenizer is
    the helper's, the completion the same as without it; ``SHAPEPLAN_TOKENIZER_PROCESS=off`` starts none,
    and neither does a path that is not a checkpoint directory; auto: with 2 or more CPUs."""
    path = checkpoints("llama")
    texts = []
    for on in ("on", "off"):
        monkeypatch.setenv("SHAPEPLAN_TOKENIZER_PROCESS", on)
        _tokproc.start_for_command(path)
        assert bool(_tokproc._started) == (on == "on")
        pipe = GenerationPipeline.from_pretrained(path, max_prefill_length=32, max_kv_cache_length=96, progress=False)
        try:
            assert (pipe.tokenizer._helper is not None) == (on == "on") and not _tokproc._started
            texts.append(pipe.generate("Explain KV caching", max_new_tokens=6).text)
        finally:
            pipe.close()
    assert texts[0] == texts[1]
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_PROCESS", "on")
    _tokproc.start_for_command(os.path.join(path, "model.gguf"))
    assert not _tokproc._started
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_PROCESS", "auto")
    for cpus, started in ((1, False), (2, True), (16, True)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)), raising=False)
        _tokproc.start_for_command(path)
        assert bool(_tokproc._started) == started
        _tokproc._close_unclaimed()


def test_a_command_starts_it_before_torch_imports(checkpoints, monkeypatch):
    """``import shapeplan`` in a generate / chat command's process starts the helper before it imports torch
    (shapeplan/_light.py: the parse then runs beside torch's import); not for a keep-alive client, ``--tp`` or
    another command, and a bad switch value is left to the command's own start to report."""
    path = checkpoints("llama")
    probe = ("import subprocess, sys\n"
             "seen = []\n"
             "class Popen(subprocess.Popen):\n"
             "    def __init__(self, *a, **k):\n"
             "        seen.append('torch' in sys.modules)\n"
             "        super().__init__(*a, **k)\n"
             "subprocess.Popen = Popen\n"
             "sys.argv = ['shapeplan', *sys.argv[1:]]\n"
             "import shapeplan\n"
             "from shapeplan import _tokproc\n"
             "print(seen, len(_tokproc._started), 'torch' in sys.modules)\n")
    env = {**os.environ, "SHAPEPLAN_TOKENIZER_PROCESS": "on"}
    env.pop("SHAPEPLAN_KEEP_ALIVE", None)
    out = subprocess.run([sys.executable, "-c", probe, "generate", "--model", path, "--prompt", "hi"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == ["[False]", "1", "True"]          # the helper first, torch after
    out = subprocess.run([sys.executable, "-c", probe, "chat", f"--model={path}"], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == ["[False]", "1", "True"]

    from shapeplan._light import start_tokenizer_early
    monkeypatch.setenv("SHAPEPLAN_TOKENIZER_PROCESS", "on")
    monkeypatch.delenv("SHAPEPLAN_KEEP_ALIVE", raising=False)
    try:
        for argv in (["generate", "--model", path, "--keep-alive", "5m"], ["generate", "--model", path, "--tp", "2"],
                     ["serve", "--model", path], ["generate", "--prompt", "hi"], []):
            start_tokenizer_early(argv)
            assert not _tokproc._started, argv
        monkeypatch.setenv("SHAPEPLAN_TOKENIZER_PROCESS", "sometimes")
        start_tokenizer_early(["generate", "--model", path])          # no error here: the command's own reports it
        assert not _tokproc._started
        monkeypatch.setenv("SHAPEPLAN_TOKENIZER_PROCESS", "on")
        start_tokenizer_early(["generate", "--model", path])
        assert len(_tokproc._started) == 1
    finally:
        _tokproc._close_unclaimed()
