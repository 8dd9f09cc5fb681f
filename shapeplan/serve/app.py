"""The one HTTP app of ``shapeplan serve`` and the uvicorn server that runs it.

``build_app(routers, registry)`` mounts each part's router on one FastAPI app (the KServe v2 routes
today; the OpenAI-compatible routes are another router on the same app) and serves ``/metrics``
from one prometheus-client registry that every part registers its collector on::

    registry = CollectorRegistry()
    registry.register(KServeCollector(repo))
    app = build_app([kserve_http.router(repo, limit), openai_router], registry=registry)
"""
from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any, Callable, Sequence

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response


def build_app(routers: Sequence[APIRouter] = (), *, registry: Any = None) -> FastAPI:
    app = FastAPI(title="shapeplan", docs_url=None, redoc_url=None, openapi_url=None)
    for r in routers:
        app.include_router(r)
    if registry is not None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
    return app


async def read_bounded(request: Request, limit: int, drain_factor: int) -> tuple[bytes | None, int]:
    """The request body if it has at most ``limit`` bytes, else ``(None, size)``. An oversized body is
    still read (and dropped) up to ``drain_factor`` limits, so the client gets the error response rather
    than a reset connection; ``size`` is then what was read (past the drain: more than that)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > drain_factor * limit:
            break
    return (b"".join(chunks) if size <= limit else None), size


def serve_until_stopped(start: Callable[[], None], stop: Callable[[], None]) -> None:
    """Run ``start()``, then wait for SIGTERM (from the main thread) or Ctrl-C, then ``stop()`` (also when
    ``start`` raised): the foreground loop of ``shapeplan serve``."""
    stopped = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        start()
        while not stopped.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto is TCP,
    # and with Nagle on, a keep-alive client waits ~40 ms per response (delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class HttpServer:
    """uvicorn over a socket bound here (so ``port=0`` gives the real port at once), in a thread."""

    def __init__(self, app: FastAPI, host: str, port: int, *, log_level: str = "warning") -> None:
        import uvicorn
        self._sock = _listen(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                                                     timeout_graceful_shutdown=2))
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> "HttpServer":
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="shapeplan-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self._sock.close()
