"""``KServeServer``: a model repository behind the KServe v2 HTTP and gRPC endpoints.

    with KServeServer(ModelRepository(discover("models/")), http_port=0, grpc_port=0) as s:
        ...   # s.http_port, s.grpc_port

Start order: listeners first (so health/live answers and ready says 503 while the models compile
and warm up), then the models; stop in reverse.

While a server runs, the interpreter's GIL switch interval is ``GIL_SWITCH_INTERVAL_S`` (Python's
default is 5 ms): a model's worker thread lets the GIL go inside each copy, device transfer and CUDA
synchronization of a batch, and each time it waits up to one interval to get it back from the busy
gRPC / HTTP event loops (docs/serve.md, "Performance").
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Sequence

from shapeplan.serve.kserve.repository import ModelRepository

log = logging.getLogger("shapeplan.serve")

#: the default request size limit (HTTP body, gRPC message); gRPC's own default is 4 MiB
DEFAULT_MAX_REQUEST_BYTES = 8 << 20
GIL_SWITCH_INTERVAL_S = 0.0005


class _SwitchInterval:
    """Lowers ``sys.setswitchinterval`` while at least one server runs; the last one out restores it."""
    _lock = threading.Lock()
    _users = 0
    _saved = 0.0

    @classmethod
    def enter(cls) -> None:
        with cls._lock:
            if cls._users == 0:
                cls._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(cls._saved, GIL_SWITCH_INTERVAL_S))
            cls._users += 1

    @classmethod
    def leave(cls) -> None:
        with cls._lock:
            cls._users -= 1
            if cls._users == 0:
                sys.setswitchinterval(cls._saved)


class KServeServer:
    def __init__(self, repo: ModelRepository, host: str = "127.0.0.1", http_port: int | None = 8000,
                 grpc_port: int | None = 8001, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 routers: Sequence[Any] = (), log_level: str = "warning", grpc_procs: int = 0,
                 grpc_arena_bytes: int | None = None, app: Any = None) -> None:
        """``None`` for a port: that transport is off. ``routers``: more FastAPI routers for the same app.
        ``app``: serve the KServe routes on this FastAPI app instead of a new one (the OpenAI server's, so that
        one port carries both protocols); its ``state.registry`` gets the KServe metrics.
        ``grpc_procs``: 0 serves gRPC in this process; N > 0 in N front-end processes that hand each
        request to this one (``grpc_server.GrpcRelays``; for many clients with large requests), each with a
        shared-memory arena of ``grpc_arena_bytes`` for the requests in flight (default: 64 MiB or four of
        the largest request, whichever is more; a request that finds no room goes through the socket)."""
        if grpc_procs < 0:
            raise ValueError(f"grpc_procs: expected 0 (gRPC in this process) or more front-end processes, got {grpc_procs}")
        self.repo, self.host = repo, host
        self._ports = (http_port, grpc_port)
        self.max_request_bytes = max_request_bytes
        self._routers, self._log_level = list(routers), log_level
        self.grpc_procs, self.grpc_arena_bytes = grpc_procs, grpc_arena_bytes
        self._app = app
        self.http: Any = None
        self.grpc: Any = None
        self._switch = False

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http is not None else None

    @property
    def grpc_port(self) -> int | None:
        return self.grpc.port if self.grpc is not None else None

    def start(self) -> "KServeServer":
        try:
            self.start_listeners()
            self.repo.start()
        except BaseException:
            self.stop()
            raise
        return self

    def start_listeners(self) -> None:
        if not self._switch:
            _SwitchInterval.enter()
            self._switch = True
        http_port, grpc_port = self._ports
        if http_port is not None:
            from prometheus_client import CollectorRegistry

            from shapeplan.serve.app import HttpServer, build_app
            from shapeplan.serve.kserve import http
            from shapeplan.serve.kserve.metrics import KServeCollector
            routers = [http.router(self.repo, self.max_request_bytes), *self._routers]
            if self._app is None:
                registry = CollectorRegistry()
                registry.register(KServeCollector(self.repo))
                app = build_app(routers, registry=registry)
            else:
                app = self._app
                for r in routers:
                    app.include_router(r)
                app.state.registry.register(KServeCollector(self.repo))
                self._app = None                    # mounted once, even if the listeners start again
            self.http = HttpServer(app, self.host, http_port, log_level=self._log_level).start()
        if grpc_port is not None:
            from shapeplan.serve.kserve.grpc_server import GrpcRelays, GrpcServer
            if self.grpc_procs:
                self.grpc = GrpcRelays(self.repo, self.host, grpc_port, max_request_bytes=self.max_request_bytes,
                                       procs=self.grpc_procs, arena_bytes=self.grpc_arena_bytes).start()
            else:
                self.grpc = GrpcServer(self.repo, self.host, grpc_port, max_request_bytes=self.max_request_bytes).start()

    def stop(self) -> None:
        if self.grpc is not None:
            self.grpc.stop()
            self.grpc = None
        if self.http is not None:
            self.http.stop()
            self.http = None
        self.repo.stop()
        if self._switch:
            _SwitchInterval.leave()
            self._switch = False

    def __enter__(self) -> "KServeServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
