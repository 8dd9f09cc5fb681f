"""``shapeplan serve --model DIR`` end to end: a real server process that loads, captures, prints its
URL, answers, and exits cleanly on SIGTERM; argument errors are clean."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx

from shapeplan.cli import main

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"


def test_serve_without_a_model_is_a_clean_error(capsys):
    assert main(["serve"]) == 2
    assert "nothing to serve" in capsys.readouterr().err


def test_serve_a_checkpoint_in_a_process(tiny_checkpoint):
    cmd = [sys.executable, "-m", "shapeplan", "serve", "--model", tiny_checkpoint, "--port", "0",
           "--served-model-name", "tiny", "--max-num-seqs", "16", "--max-kv-cache-length", "256",
           "--max-prefill-length", "64", "--api-key", "k", "--log-level", "warning",
           "--chat-template", TEMPLATE]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        m = re.search(r"on (http://\S+)/v1", line)
        assert m, (line, p.stderr.read() if p.poll() is not None else "")
        url, auth = m.group(1), {"Authorization": "Bearer k"}
        assert httpx.get(url + "/v1/models", headers=auth).json()["data"][0]["id"] == "tiny"
        r = httpx.post(url + "/v1/completions", headers=auth, timeout=60,
                       json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # --chat-template: the messages render with it
        from shapeplan.llm.tokenizer import Tokenizer
        ids = httpx.post(url + "/tokenize", headers=auth, timeout=60,
                         json={"messages": [{"role": "user", "content": "Hi"}]}).json()["tokens"]
        assert ids == Tokenizer(tiny_checkpoint).encode("<user>Hi</user>", add_special_tokens=False)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
