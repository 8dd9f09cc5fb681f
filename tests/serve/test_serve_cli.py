"""``shapeplan serve``: which server the arguments select, and a real server process end to end."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from shapeplan.cli import main
from tests.serve.conftest import mlp_onnx, mlp_ref


def test_argument_errors(capsys, tmp_path) -> None:
    assert main(["serve", "--model", str(tmp_path / "llama-dir")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    assert main(["serve", "--preset", "llama-nope"]) == 2
    assert "no such preset" in capsys.readouterr().err
    assert main(["serve"]) == 2
    assert "nothing to serve" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--model", "x"]) == 2     # both servers: checked
    assert "--model x: no such checkpoint directory" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "m.onnx"]) == 2
    assert main(["serve", "--model-repository", str(tmp_path / "nope"), "--port", "0", "--grpc-port", "0"]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--grpc-procs", "-1"]) == 2
    assert "--grpc-procs: expected 0 (gRPC in this process) or more front-end processes, got -1" in capsys.readouterr().err


def _serve(args: list[str], tmp_path) -> tuple[subprocess.Popen, str, int, int]:
    """``python -m shapeplan serve ARGS`` on free ports, read until it prints "ready": (process, what it
    printed, HTTP port, gRPC port)."""
    env = {**os.environ, "SHAPEPLAN_CACHE_DIR": str(tmp_path / "plans")}
    p = subprocess.Popen([sys.executable, "-m", "shapeplan", "serve", *args, "--port", "0", "--grpc-port", "0",
                          "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    lines: list[str] = []
    deadline = time.monotonic() + 180
    try:
        while not any(line.startswith("ready") for line in lines):
            line = p.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
    except BaseException:
        _stop(p)
        raise
    text = "".join(lines)
    http_port, grpc_port = map(int, re.search(r"http://127.0.0.1:(\d+), gRPC on 127.0.0.1:(\d+)", text).groups())
    return p, text, http_port, grpc_port


def _stop(p: subprocess.Popen) -> int:
    """SIGTERM, as a service manager stops it; its exit status."""
    p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise


@pytest.mark.parametrize("grpc_procs", [0, 2])
def test_serve_process_end_to_end(tmp_path, grpc_procs) -> None:
    """... with gRPC in the server process, and in two front-end processes that end with it."""
    model = str(tmp_path / "tiny.onnx")
    mlp_onnx(model)
    p, _, http_port, grpc_port = _serve([model, "--grpc-procs", str(grpc_procs)], tmp_path)
    children: list[int] = []
    try:
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [1.0] * 8}]})
        req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/models/tiny/infer", body.encode())
        with urllib.request.urlopen(req) as r:
            assert json.loads(r.read())["outputs"][0]["shape"] == [1, 4]
        tg = pytest.importorskip("tritonclient.grpc")
        c = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert c.is_model_ready("tiny")
        c.close()
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
        assert len(children) == grpc_procs
    finally:
        rc = _stop(p)
    assert rc == 0
    for child in children:                            # the front ends ended (and were reaped) with the server
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)


def test_both_servers_on_one_port(tmp_path) -> None:
    """``shapeplan serve --model-repository DIR --model LLM``: the KServe routes and the OpenAI routes on one
    HTTP port (one app, one /metrics), KServe's gRPC beside it; each protocol keeps its own error shape."""
    pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from shapeplan.llm.demo import make_tiny_checkpoint
    ckpt = make_tiny_checkpoint(str(tmp_path / "ckpt"), "llama")
    (tmp_path / "repo").mkdir()
    mlp_onnx(str(tmp_path / "repo" / "mlp.onnx"))
    p, text, http_port, grpc_port = _serve(["--model-repository", str(tmp_path / "repo"), "--model", ckpt,
                                            "--served-model-name", "tiny", "--mode", "emulated_replay",
                                            "--max-num-seqs", "4", "--max-kv-cache-length", "512"], tmp_path)
    try:
        assert f"serving 'tiny' (OpenAI API) on http://127.0.0.1:{http_port}/v1" in text
        import openai
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      temperature=0)
        assert r.usage.completion_tokens == 4 or r.choices[0].finish_reason == "stop"
        tg = pytest.importorskip("tritonclient.grpc")
        th = pytest.importorskip("tritonclient.http")
        x = np.ones((2, 8), np.float32)
        for mod, port in ((th, http_port), (tg, grpc_port)):
            client = mod.InferenceServerClient(f"127.0.0.1:{port}")
            i = mod.InferInput("x", [2, 8], "FP32")
            i.set_data_from_numpy(x)
            np.testing.assert_allclose(client.infer("mlp", [i]).as_numpy("y"), mlp_ref(x), rtol=1e-5, atol=1e-6)
            client.close()
        metrics = httpx.get(f"http://127.0.0.1:{http_port}/metrics").text
        assert 'shapeplan_inference_count_total{model="mlp",version="1"}' in metrics
        assert 'model_name="tiny"' in metrics
        r2 = httpx.get(f"http://127.0.0.1:{http_port}/v2/models/mlp/nope")
        assert r2.status_code == 404 and isinstance(r2.json()["error"], str)          # KServe's shape
        r3 = httpx.get(f"http://127.0.0.1:{http_port}/v1/nope")
        assert r3.status_code == 404 and r3.json()["error"]["type"]                  # OpenAI's shape
    finally:
        rc = _stop(p)
    assert rc == 0
