"""A real OpenAI-compatible server on loopback (uvicorn in a thread, a free port) over a tiny random
Llama checkpoint with a trained tokenizer and chat template, float32 on the CPU; the tests talk to it
with the ``openai`` client and httpx. ``server`` is shared by a module; ``small_server`` has room for
two waiting requests and an API key."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import torch  # noqa: E402

MODEL = "tiny-llama"
KW = dict(mode="emulated_replay", max_prefill_length=64, max_kv_cache_length=1024, progress=False, sync_every=4,
          max_num_seqs=32)


@dataclass
class Running:
    url: str
    pipe: Any
    server: Any
    api_key: str | None = None

    def client(self, **kw: Any) -> Any:
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, **kw)

    def async_client(self, **kw: Any) -> Any:
        import openai
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=self.api_key or "unused", max_retries=0, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return httpx.post(self.url + path, timeout=60, **kw)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {name{labels}: value} (labels as printed)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=30).text
        out = {}
        for line in text.splitlines():
            m = re.match(r"^(\S+?)(\{.*\})? (\S+)$", line)
            if m and not line.startswith("#"):
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return out

    def metric(self, name: str, **labels: str) -> float:
        want = {"model_name": MODEL, **labels}
        for key, v in self.metrics().items():
            base, _, rest = key.partition("{")
            got = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if base == name and got == want:
                return v
        raise KeyError(name)

    def wait_for(self, cond: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.02)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    from shapeplan.llm.demo import make_tiny_checkpoint
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("ckpt-serve")), "llama")


def _start(path: str, **kw: Any) -> Running:
    from shapeplan.llm import GenerationPipeline
    from shapeplan.serve.app import HttpServer
    from shapeplan.serve.openai.server import build_openai_app
    api_key = kw.pop("api_key", None)
    reasoning = kw.pop("reasoning_parser", None)
    pipe = GenerationPipeline.from_pretrained(path, **{**KW, **kw})
    pipe.warmup()
    app = build_openai_app(pipe, model_name=MODEL, api_key=api_key, checkpoint=path, max_request_bytes=1 << 20,
                           reasoning_parser=reasoning)
    srv = HttpServer(app, "127.0.0.1", 0).start()
    return Running(f"http://127.0.0.1:{srv.port}", pipe, srv, api_key)


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    r = _start(tiny_checkpoint)
    yield r
    r.server.stop()
    r.pipe.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small_server(tiny_checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    r = _start(tiny_checkpoint, max_waiting=2, max_num_seqs=16, api_key="sk-test-key")
    yield r
    r.server.stop()
    r.pipe.close()
    torch.set_num_threads(threads)
