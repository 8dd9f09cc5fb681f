"""The KServe v2 inference protocol over compiled models.

repository (which models; config: config.json's keys; triton_config: config.pbtxt) -> model (metadata,
request checks, queue) -> batcher (one worker thread per instance: dynamic batching, buckets, warm-up,
pinned plans) ; protocol (tensors <-> JSON / binary / protobuf) ; shm (system shared memory regions) ;
http (FastAPI routes) ; grpc_server (grpcio) ; metrics (statistics, Prometheus) ; server (all of it
started and stopped together). The repository also loads, reloads and unloads models while the server
runs (model control "explicit" and "poll").
"""
from __future__ import annotations

from shapeplan.serve.kserve.repository import CONFIG_KEYS, ModelConfig, ModelRepository, discover, single
from shapeplan.serve.kserve.server import DEFAULT_MAX_REQUEST_BYTES, KServeServer

__all__ = ["CONFIG_KEYS", "DEFAULT_MAX_REQUEST_BYTES", "KServeServer", "ModelConfig", "ModelRepository",
           "discover", "single"]
