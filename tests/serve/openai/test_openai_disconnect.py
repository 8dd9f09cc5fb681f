"""A client that goes away aborts its request at once, streamed or not: the engine ends it with
"abort" long before its max_tokens and every KV block comes back (read from ``/metrics``)."""
from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.serve.openai.conftest import MODEL

LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


def _idle(server) -> bool:
    return server.metric("shapeplan:num_requests_running") == 0 and server.metric("shapeplan:kv_blocks_used") == 0


def _aborts(server) -> float:
    return server.metric("shapeplan:requests_finished_total", reason="abort")


def _generated(server) -> float:
    return server.metric("shapeplan:generation_tokens_total")


def _check_aborted(server, aborts0: float, tokens0: float, n: int = 1) -> None:
    server.wait_for(lambda: _aborts(server) >= aborts0 + n and _idle(server), timeout=30)
    assert _aborts(server) == aborts0 + n
    assert _generated(server) - tokens0 < n * LONG["max_tokens"]          # stopped well before its end


@pytest.mark.parametrize("n", [1, 2])
def test_a_streaming_client_that_disconnects_frees_its_blocks(server, n):
    server.wait_for(lambda: _idle(server))
    aborts0, tokens0 = _aborts(server), _generated(server)
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True, "n": n,
                                                                     "seed": 1}, timeout=60) as r:
        lines = r.iter_lines()
        assert next(ln for ln in lines if ln).startswith("data: ")          # generating
        assert server.metric("shapeplan:kv_blocks_used") > 0
    # leaving the block closed the connection
    _check_aborted(server, aborts0, tokens0, n)
    assert server.post("/v1/completions", json={**LONG, "max_tokens": 3}).status_code == 200


def test_a_waiting_client_that_disconnects_frees_its_blocks(server):
    server.wait_for(lambda: _idle(server))
    aborts0, tokens0 = _aborts(server), _generated(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=httpx.Timeout(60, read=0.5))
    _check_aborted(server, aborts0, tokens0)


def test_a_chat_client_that_closes_its_socket_mid_request_is_aborted(server):
    server.wait_for(lambda: _idle(server))
    aborts0, tokens0 = _aborts(server), _generated(server)
    body = (b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000, '
            b'"ignore_eos": true}' % MODEL.encode())
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        server.wait_for(lambda: server.metric("shapeplan:kv_blocks_used") > 0)
        time.sleep(0.2)
    _check_aborted(server, aborts0, tokens0)
