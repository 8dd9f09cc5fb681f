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
import threading
from typing import Any, Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

import shapeplan
from shapeplan.serve.errors import BadRequestError, describe, status_of
from shapeplan.serve.kserve import proto as pb
from shapeplan.serve.kserve import protocol, wire


class Service:
    """The rpc handlers but ModelInfer: each takes the request message and returns the response message."""

    def __init__(self, repo: Any) -> None:
        self.repo = repo

    def ServerLive(self, req: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, req: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.repo.ready)

    def ModelReady(self, req: Any) -> Any:
        return pb.ModelReadyResponse(ready=self.repo.get(req.name, req.version).ready)

    def ServerMetadata(self, req: Any) -> Any:
        return pb.ServerMetadataResponse(name="shapeplan", version=shapeplan.__version__, extensions=protocol.EXTENSIONS)

    def ModelMetadata(self, req: Any) -> Any:
        return json_format.ParseDict(self.repo.get(req.name, req.version).metadata(), pb.ModelMetadataResponse())

    def ModelStatistics(self, req: Any) -> Any:
        models = [self.repo.get(req.name, req.version)] if req.name else list(self.repo)
        return json_format.ParseDict({"model_stats": [m.statistics() for m in models]},
                                     pb.ModelStatisticsResponse())


def _parse(name: str, request_cls: Any, raw: bytes) -> Any:
    try:
        return request_cls.FromString(raw)
    except DecodeError as e:
        raise BadRequestError(f"{name}: the request is not a valid {request_cls.__name__} "
                              f"protobuf message: {e}") from None


async def _abort(context: Any, e: Exception) -> None:
    await context.abort(getattr(grpc.StatusCode, status_of(e).grpc), describe(e))


def _handler(name: str, fn: Callable[[Any], Any], request_cls: Any) -> grpc.RpcMethodHandler:
    async def call(raw: bytes, context: Any) -> bytes:
        try:
            return fn(_parse(name, request_cls, raw)).SerializeToString()
        except Exception as e:  # noqa: BLE001 - every failure is this call's own status
            await _abort(context, e)
            raise   # unreachable: abort raises
    return grpc.unary_unary_rpc_method_handler(call)       # no (de)serializers: bytes in, bytes out


def _read_infer(rpc: str, raw: bytes) -> Any:
    """An infer request: ``wire``'s zero-copy view, or upb's message for what ``wire`` does not read."""
    return wire.read_infer_request(raw) or _parse(rpc, pb.ModelInferRequest, raw)


async def _infer(repo: Any, req: Any, *, stream: bool = False) -> bytes:
    """Run a read infer request on its model; the serialized response (``stream``: wrapped for
    ModelStreamInfer)."""
    model = repo.get(req.model_name, req.model_version)
    decoded = protocol.decode_grpc(req)
    outputs = await model.infer(decoded)
    return protocol.encode_grpc(req.model_name, model.version, decoded, outputs, stream=stream)


def _stream_error(message: str, model_name: str, model_version: str, id: str) -> bytes:
    """A ``ModelStreamInferResponse`` that carries a request's error: ``error_message``, and an
    ``infer_response`` with the request's model and id only (so that a client with several requests in
    flight on the stream knows which one failed; empty when the request could not be read)."""
    head = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=head if head.ByteSize() else None
                                       ).SerializeToString()


def _infer_handler(repo: Any) -> grpc.RpcMethodHandler:
    async def call(raw: bytes, context: Any) -> bytes:
        try:
            return await _infer(repo, _read_infer("ModelInfer", raw))
        except Exception as e:  # noqa: BLE001 - every failure is this call's own status
            await _abort(context, e)
            raise
    return grpc.unary_unary_rpc_method_handler(call)


STREAM_MAX_IN_FLIGHT = 256
"""Requests of one ``ModelStreamInfer`` stream being served at once; the stream's next request is read
when one finishes (HTTP/2 flow control then holds the client back), so one stream cannot queue
without bound."""


def _stream_infer_handler(repo: Any) -> grpc.RpcMethodHandler:
    """Triton's streaming extension: requests come on one bidirectional stream and are served
    concurrently (those of a batched model batch together, with each other and with unary calls); each
    gets one ``ModelStreamInferResponse``, in the order they finish (the response carries the
    request's ``id``). A bad request gets a response with its ``error_message`` and the stream goes on."""
    async def one(raw: bytes) -> bytes:
        req: Any = None
        try:
            req = _read_infer("ModelStreamInfer", raw)
            return await _infer(repo, req, stream=True)
        except Exception as e:  # noqa: BLE001 - every failure is this request's own response
            return _stream_error(describe(e), *((req.model_name, req.model_version, req.id)
                                                if req is not None else ("", "", "")))

    async def call(_requests: Any, context: Any) -> None:     # read with context.read()
        slots = asyncio.Semaphore(STREAM_MAX_IN_FLIGHT)
        writing = asyncio.Lock()                    # one write at a time on a call
        tasks: set[asyncio.Task] = set()

        async def serve(raw: bytes) -> None:
            try:
                response = await one(raw)
                async with writing:
                    await context.write(response)
            except (grpc.aio.UsageError, grpc.aio.AbortError, asyncio.InvalidStateError):
                pass                                # the call ended (client gone): nobody to answer
            finally:
                slots.release()

        try:
            while (raw := await context.read()) is not grpc.aio.EOF:
                await slots.acquire()
                task = asyncio.ensure_future(serve(raw))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:                            # the client closed its side: finish what it sent
                await asyncio.wait(set(tasks))
        finally:
            for task in tasks:
                task.cancel()
    return grpc.stream_stream_rpc_method_handler(call)


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
        service = Service(repo)
        handlers = {name: _handler(name, getattr(service, name), req_cls)
                    for name, (req_cls, _) in pb.METHODS.items() if name not in ("ModelInfer", "ModelStreamInfer")}
        handlers["ModelInfer"] = _infer_handler(repo)
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
