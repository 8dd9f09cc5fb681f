"""KServe v2 gRPC server: ``inference.GRPCInferenceService`` over grpcio.

The service is registered by hand (one table, rpc name -> handler) with raw-bytes (de)serialization,
so that a request that is not valid protobuf is this server's INVALID_ARGUMENT, not grpcio's
INTERNAL. Messages come from ``shapeplan.serve.kserve.proto`` (no generated ``_pb2_grpc`` module).
A message over ``max_request_bytes`` is refused by grpcio itself with RESOURCE_EXHAUSTED. Handlers
run on grpcio's thread pool and wait on the model's future; the engines run on their own threads.
"""
from __future__ import annotations

from concurrent import futures
from typing import Any, Callable

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

import shapeplan
from shapeplan.serve.errors import BadRequestError, describe, status_of
from shapeplan.serve.kserve import proto as pb
from shapeplan.serve.kserve import protocol


class Service:
    """The rpc handlers: each takes the request message and returns the response message."""

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

    def ModelInfer(self, req: Any) -> Any:
        model = self.repo.get(req.model_name, req.model_version)
        decoded = protocol.decode_grpc(req)
        outputs = model.submit(decoded).result()
        return protocol.encode_grpc(pb.ModelInferResponse(), req.model_name, model.version, decoded, outputs)

    def ModelStatistics(self, req: Any) -> Any:
        models = [self.repo.get(req.name, req.version)] if req.name else list(self.repo)
        return json_format.ParseDict({"model_stats": [m.statistics() for m in models]},
                                     pb.ModelStatisticsResponse())


def _handler(name: str, fn: Callable[[Any], Any], request_cls: Any) -> grpc.RpcMethodHandler:
    def call(raw: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            try:
                req = request_cls.FromString(raw)
            except DecodeError as e:
                raise BadRequestError(f"{name}: the request is not a valid {request_cls.__name__} "
                                      f"protobuf message: {e}") from None
            return fn(req).SerializeToString()
        except Exception as e:  # noqa: BLE001 - every failure is this call's own status
            context.abort(getattr(grpc.StatusCode, status_of(e).grpc), describe(e))
            raise   # unreachable: abort raises
    return grpc.unary_unary_rpc_method_handler(call)       # no (de)serializers: bytes in, bytes out


class GrpcServer:
    def __init__(self, repo: Any, host: str, port: int, *, max_request_bytes: int, workers: int = 64) -> None:
        service = Service(repo)
        handlers = {name: _handler(name, getattr(service, name), req_cls) for name, (req_cls, _) in pb.METHODS.items()}
        self._pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shapeplan-grpc")
        self._server = grpc.server(
            self._pool,
            handlers=[grpc.method_handlers_generic_handler(pb.SERVICE, handlers)],
            options=[("grpc.max_receive_message_length", max_request_bytes),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", 0)])
        self.host = host
        self.port = self._server.add_insecure_port(f"{'[' + host + ']' if ':' in host else host}:{port}")
        if self.port == 0:
            raise OSError(f"gRPC: cannot listen on {host}:{port}")

    def start(self) -> "GrpcServer":
        self._server.start()
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        self._server.stop(grace).wait()
        self._pool.shutdown(wait=True)          # grpcio leaves the handler threads to us
