"""KServe v2 gRPC server: ``inference.GRPCInferenceService`` over grpcio's asyncio server.

The service is registered by hand (one table, rpc name -> handler) with raw-bytes (de)serialization,
so that a request that is not valid protobuf is this server's INVALID_ARGUMENT, not grpcio's
INTERNAL. Messages come from ``shapeplan.serve.kserve.proto`` (no generated ``_pb2_grpc`` module);
``ModelInfer`` and ``ModelStreamInfer`` (Triton's streaming extension) read and write their messages
with ``wire`` (zero-copy inputs) and fall back to upb for what ``wire`` does not read. A message over
``max_request_bytes`` is refused by grpcio itself with RESOURCE_EXHAUSTED (on a stream: the stream
ends with that status).

Why asyncio: every rpc is handled on one event-loop thread, which hands requests to the models'
worker threads and gets each batch's results back in one hand-off. The thread-pool server ran each
rpc on its own thread: under load 32+ threads fought the workers for the GIL, and a worker that
released it (a device copy, a CUDA sync) waited for it again behind all of them (docs/serve.md,
"Performance"). Every server of the process shares one loop thread: grpcio binds its asyncio
completion queue to the first loop that uses it, so a loop may not go away while grpcio lives.
"""
from __future__ import annotations

import asyncio
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

import shapeplan
from shapeplan.serve.errors import BadRequestError, describe, status_of
from shapeplan.serve.kserve import proto as pb
from shapeplan.serve.kserve import protocol, relay, wire


class Service:
    """The rpc handlers but ModelInfer: each takes the request message and returns the response message."""

    def __init__(self, repo: Any) -> None:
        self.repo = repo

    def ServerLive(self, req: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, req: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.repo.ready)

    def ModelReady(self, req: Any) -> Any:
        return pb.ModelReadyResponse(ready=self.repo.is_ready(req.name, req.version))

    def ServerMetadata(self, req: Any) -> Any:
        return pb.ServerMetadataResponse(name="shapeplan", version=shapeplan.__version__, extensions=protocol.EXTENSIONS)

    def ModelMetadata(self, req: Any) -> Any:
        return json_format.ParseDict(self.repo.get(req.name, req.version).metadata(), pb.ModelMetadataResponse())

    def ModelConfig(self, req: Any) -> Any:
        config = json_format.ParseDict(self.repo.get(req.name, req.version).triton_config(), pb.ModelConfig(),
                                       ignore_unknown_fields=True)          # "shapeplan": ours, HTTP only
        return pb.ModelConfigResponse(config=config)

    def RepositoryIndex(self, req: Any) -> Any:
        return json_format.ParseDict({"models": self.repo.index(req.ready)}, pb.RepositoryIndexResponse())

    def RepositoryModelLoad(self, req: Any) -> Any:
        params = protocol.grpc_parameters(req.parameters)
        self.repo.load(req.model_name, *protocol.load_parameters(req.model_name, params))
        return pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, req: Any) -> Any:
        self.repo.unload(req.model_name)
        return pb.RepositoryModelUnloadResponse()

    def SystemSharedMemoryStatus(self, req: Any) -> Any:
        regions = self.repo.shared_memory.status(req.name)
        return json_format.ParseDict({"regions": {r["name"]: r for r in regions}},
                                     pb.SystemSharedMemoryStatusResponse())

    def SystemSharedMemoryRegister(self, req: Any) -> Any:
        self.repo.shared_memory.register(req.name, req.key, req.offset, req.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, req: Any) -> Any:
        self.repo.shared_memory.unregister(req.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def ModelStatistics(self, req: Any) -> Any:
        models = [self.repo.get(req.name, req.version)] if req.name else list(self.repo)
        return json_format.ParseDict({"model_stats": [m.statistics() for m in models]},
                                     pb.ModelStatisticsResponse())


def _parse(name: str, request_cls: Any, raw: bytes) -> Any:
    try:
        return request_cls.FromString(bytes(raw))      # a front end's request is a view of its arena
    except DecodeError as e:
        raise BadRequestError(f"{name}: the request is not a valid {request_cls.__name__} "
                              f"protobuf message: {e}") from None


async def _abort(context: Any, e: Exception) -> None:
    await context.abort(getattr(grpc.StatusCode, status_of(e).grpc), describe(e))


Call = Callable[[bytes], Awaitable[bytes]]
#: rpcs that wait (a model compiling, a model's queue draining): run on a thread, not on the event loop
BLOCKING = ("RepositoryModelLoad", "RepositoryModelUnload")


def calls(repo: Any) -> dict[str, Call]:
    """Every unary rpc as ``async (request bytes) -> response bytes``, raising the call's error: served
    by this process's gRPC server and, for ``--grpc-procs``, by the front ends' (``GrpcRelays``)."""
    service = Service(repo)
    table: dict[str, Call] = {}
    for name, (request_cls, _) in pb.METHODS.items():
        if name in ("ModelInfer", "ModelStreamInfer"):
            continue

        async def call(raw: bytes, name: str = name, fn: Any = getattr(service, name), cls: Any = request_cls) -> bytes:
            return fn(_parse(name, cls, raw)).SerializeToString()

        async def blocking(raw: bytes, name: str = name, fn: Any = getattr(service, name), cls: Any = request_cls
                           ) -> bytes:
            req = _parse(name, cls, raw)
            return (await asyncio.get_running_loop().run_in_executor(None, fn, req)).SerializeToString()
        table[name] = blocking if name in BLOCKING else call

    async def infer(raw: bytes) -> bytes:
        return await _infer(repo, _read_infer("ModelInfer", raw))
    table["ModelInfer"] = infer
    return table


def _handler(call: Call) -> grpc.RpcMethodHandler:
    async def handle(raw: bytes, context: Any) -> bytes:
        try:
            return await call(raw)
        except Exception as e:  # noqa: BLE001 - every failure is this call's own status
            await _abort(context, e)
            raise   # unreachable: abort raises
    return grpc.unary_unary_rpc_method_handler(handle)       # no (de)serializers: bytes in, bytes out


def _read_infer(rpc: str, raw: bytes) -> Any:
    """An infer request: ``wire``'s zero-copy view, or upb's message for what ``wire`` does not read."""
    return wire.read_infer_request(raw) or _parse(rpc, pb.ModelInferRequest, raw)


async def _infer(repo: Any, req: Any, *, stream: bool = False) -> bytes:
    """Run a read infer request on its model; the serialized response (``stream``: wrapped for
    ModelStreamInfer)."""
    model = repo.get(req.model_name, req.model_version)
    decoded = protocol.decode_grpc(req, repo.shared_memory)
    outputs = protocol.classify(decoded, await model.infer(decoded), bool(model.spec.max_batch_size))
    placed = protocol.place_outputs(decoded, outputs, repo.shared_memory)
    return protocol.encode_grpc(req.model_name, model.version, decoded, outputs, stream=stream, placed=placed)


def _stream_error(message: str, model_name: str, model_version: str, id: str) -> bytes:
    """A ``ModelStreamInferResponse`` that carries a request's error: ``error_message``, and an
    ``infer_response`` with the request's model and id only (so that a client with several requests in
    flight on the stream knows which one failed; empty when the request could not be read)."""
    head = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=head if head.ByteSize() else None
                                       ).SerializeToString()


def stream_call(repo: Any) -> Call:
    """One ``ModelStreamInfer`` request: its ``ModelStreamInferResponse``, an error in band (never raises)."""
    async def one(raw: bytes) -> bytes:
        req: Any = None
        try:
            req = _read_infer("ModelStreamInfer", raw)
            return await _infer(repo, req, stream=True)
        except Exception as e:  # noqa: BLE001 - every failure is this request's own response
            return _stream_error(describe(e), *((req.model_name, req.model_version, req.id)
                                                if req is not None else ("", "", "")))
    return one


def _stream_infer_handler(repo: Any) -> grpc.RpcMethodHandler:
    """Triton's streaming extension: requests come on one bidirectional stream and are served
    concurrently (those of a batched model batch together, with each other and with unary calls); each
    gets one ``ModelStreamInferResponse``, in the order they finish (the response carries the
    request's ``id``). A bad request gets a response with its ``error_message`` and the stream goes on.
    The stream's loop is ``relay.stream_handler`` (shared with the front-end processes)."""
    one = stream_call(repo)

    async def answer(raw: bytes, context: Any) -> bytes:
        return await one(raw)
    return relay.stream_handler(answer)


class _Loop:
    """The process's one event-loop thread for gRPC, started on first use and kept (it idles in epoll)."""
    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coro: Any) -> Any:
        """Run ``coro`` on the loop and wait for its result."""
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="shapeplan-grpc-loop", daemon=True).start()
                cls._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, cls._loop).result()


class GrpcServer:
    def __init__(self, repo: Any, host: str, port: int, *, max_request_bytes: int) -> None:
        handlers = {name: _handler(call) for name, call in calls(repo).items()}
        handlers["ModelStreamInfer"] = _stream_infer_handler(repo)
        address = f"{'[' + host + ']' if ':' in host else host}:{port}"

        async def make() -> tuple[Any, int]:
            server = grpc.aio.server(
                handlers=[grpc.method_handlers_generic_handler(pb.SERVICE, handlers)],
                options=[("grpc.max_receive_message_length", max_request_bytes),
                         ("grpc.max_send_message_length", -1),
                         ("grpc.so_reuseport", 0)])
            try:
                return server, server.add_insecure_port(address)
            except RuntimeError:            # grpcio: "Failed to bind to address"
                return server, 0

        self._server, self.port = _Loop.run(make())
        self.host = host
        if self.port == 0:
            raise OSError(f"gRPC: cannot listen on {host}:{port}")

    def start(self) -> "GrpcServer":
        _Loop.run(self._server.start())
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        _Loop.run(self._server.stop(grace))


class GrpcRelays:
    """``--grpc-procs N``: N front-end processes (``relay.py``) listen on the gRPC port (the kernel spreads
    the connections over them) and hand each request to this process through a shared-memory arena and
    a Unix socket; this process serves it with the same ``calls`` as ``GrpcServer`` and sends the answer
    back. For a ResNet-50-sized request this process then spends 0.35-0.39 ms of CPU instead of 0.85-1.01
    (2-vCPU box, staging copies included; docs/serve.md, "Performance"). The port is bound with
    ``SO_REUSEPORT``."""

    START_TIMEOUT_S = 60.0

    def __init__(self, repo: Any, host: str, port: int, *, max_request_bytes: int, procs: int,
                 arena_bytes: int | None = None) -> None:
        self.host, self.procs = host, procs
        self._calls = calls(repo)
        self._stream = stream_call(repo)
        self._methods = [m for m in pb.METHODS if m != "ModelStreamInfer"] + ["ModelStreamInfer"]
        self._dir = tempfile.mkdtemp(prefix="shapeplan-grpc-")
        self._hub_path = os.path.join(self._dir, "hub.sock")
        self._hellos: asyncio.Queue | None = None
        self._conns: set[Any] = set()
        self._children: list[subprocess.Popen] = []
        self._maps: list[mmap.mmap] = []
        arena = arena_bytes or max(64 << 20, 4 * max_request_bytes)

        async def listen() -> Any:
            self._hellos = asyncio.Queue()
            return await asyncio.start_unix_server(self._connection, path=self._hub_path)
        self._hub = _Loop.run(listen())
        self.port = port
        args = [sys.executable, "-c", relay.LAUNCH, relay.__file__, "--hub", self._hub_path, "--host", host,
                "--service", pb.SERVICE, "--unary", ",".join(self._methods[:-1]), "--stream", self._methods[-1],
                "--max-request-bytes", str(max_request_bytes), "--arena-bytes", str(arena)]
        try:                            # the first binds (port 0: any free one), the rest share its port
            for n in (1, procs - 1):
                self._children += [subprocess.Popen(args + ["--port", str(self.port)], stdin=subprocess.DEVNULL)
                                   for _ in range(n)]
                for _ in range(n):
                    got = _Loop.run(self._hello())
                    if not got:
                        raise OSError(f"gRPC: cannot listen on {host}:{self.port}")
                    self.port = got
        except BaseException:
            self.stop()
            raise

    async def _hello(self) -> int:
        """The port the next front end to start listens on (0: it could not bind)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.START_TIMEOUT_S
        while loop.time() < deadline:
            try:
                return await asyncio.wait_for(self._hellos.get(), 0.25)
            except asyncio.TimeoutError:
                for child in self._children:
                    if child.poll() is not None:
                        raise OSError(f"gRPC: a front-end process exited (status {child.returncode}) before it "
                                      "was ready") from None
        raise OSError(f"gRPC: a front-end process did not start in {self.START_TIMEOUT_S:.0f} s")

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        tasks: set[asyncio.Task] = set()
        try:
            (n,) = relay.HELLO.unpack(await reader.readexactly(relay.HELLO.size))
            hello = json.loads(await reader.readexactly(n))
            if hello["port"]:
                with open(hello["arena"], "r+b") as f:
                    arena = mmap.mmap(f.fileno(), hello["arena_bytes"])
                os.unlink(hello["arena"])                   # both ends hold it mapped; gone when they exit
                self._maps.append(arena)
                view = memoryview(arena)
            self._hellos.put_nowait(hello["port"])
            if not hello["port"]:
                return
            while True:
                rid, method, kind, off, size = relay.REQUEST.unpack(await reader.readexactly(relay.REQUEST.size))
                raw = await reader.readexactly(size) if off == relay.INLINE else view[off:off + size]
                task = asyncio.ensure_future(self._answer(writer, rid, self._methods[method], kind, raw))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass                                            # the front end exited
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, rid: int, method: str, kind: int, raw: Any) -> None:
        status = 0
        try:
            body = await (self._stream(raw) if kind == relay.STREAM else self._calls[method](raw))
        except Exception as e:  # noqa: BLE001 - every failure is this call's own status
            status = getattr(grpc.StatusCode, status_of(e).grpc).value[0]
            body = describe(e).encode()
        if not writer.is_closing():                         # after this reply the front end reuses raw's region
            writer.writelines([relay.REPLY.pack(rid, status, len(body)), body])

    def start(self) -> "GrpcRelays":
        return self                                         # the front ends serve from their hello on

    def stop(self, grace: float | None = 1.0) -> None:
        async def close() -> None:
            self._hub.close()
            for w in list(self._conns):                     # EOF: each front end stops its server and exits
                w.close()
        _Loop.run(close())
        for child in self._children:
            try:
                child.wait(timeout=max(grace or 0.0, 0.0) + 5.0)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self._children.clear()
        for arena in self._maps:
            try:
                arena.close()
            except BufferError:                             # a request's view still alive: the GC unmaps it
                pass
        self._maps.clear()
        shutil.rmtree(self._dir, ignore_errors=True)
