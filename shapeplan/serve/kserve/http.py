"""KServe v2 HTTP/REST routes (a FastAPI ``APIRouter``; ``shapeplan.serve.app.build_app`` mounts it).

Errors are ``{"error": message}`` with the status ``shapeplan.serve.errors.STATUS`` gives the
exception's class (400 bad input, 404 unknown model, 413 over the size limit, 503 not ready).
"""
from __future__ import annotations

import json
import zlib
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

import shapeplan
from shapeplan.serve.app import read_bounded
from shapeplan.serve.errors import BadRequestError, RequestTooLargeError, describe, status_of
from shapeplan.serve.kserve import protocol

HEADER_LENGTH = "Inference-Header-Content-Length"
INLINE_BYTES = 64 << 10         # bodies up to this size are decoded on the event loop, larger in a thread
DRAIN_FACTOR = 64               # an oversized body is read (and dropped) up to this many limits, so the
                                # client gets its 413 instead of a reset connection


def error_response(e: BaseException) -> JSONResponse:
    return JSONResponse({"error": describe(e)}, status_code=status_of(e).http)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (after gzip/deflate decoding), else RequestTooLargeError."""
    def too_large(n: int | str) -> RequestTooLargeError:
        return RequestTooLargeError(f"the request body has {n} bytes; this server takes at most {limit} "
                                    "(shapeplan serve --max-request-bytes)")
    body, size = await read_bounded(request, limit, DRAIN_FACTOR)
    if body is None:
        raise too_large(request.headers.get("content-length") or f"over {size}")
    encoding = request.headers.get("content-encoding", "").lower()
    if encoding in ("gzip", "deflate"):
        d = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
        try:
            body = d.decompress(body, limit + 1)
        except zlib.error as e:
            raise BadRequestError(f"the body is not valid {encoding} data: {e}") from None
        if len(body) > limit or d.unconsumed_tail:
            raise too_large(f"over {limit} (decompressed)")
    elif encoding not in ("", "identity"):
        raise BadRequestError(f"Content-Encoding {encoding!r} is not supported (gzip, deflate)")
    return body


def router(repo: Any, max_request_bytes: int) -> APIRouter:
    r = APIRouter()

    @r.get("/v2/health/live")
    async def live() -> Any:
        return {"live": True}

    @r.get("/v2/health/ready")
    async def ready() -> Any:
        ok = repo.ready
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @r.get("/v2")
    async def server_metadata() -> Any:
        return {"name": "shapeplan", "version": shapeplan.__version__, "extensions": protocol.EXTENSIONS}

    @r.get("/v2/models/stats")
    async def all_stats() -> Any:
        return {"model_stats": [m.statistics() for m in repo]}

    def answer(fn: Any) -> Any:
        """``fn()``'s value, or the error response of what it raised (an unknown model: 404)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            return error_response(e)

    def ready_response(name: str, version: str) -> JSONResponse:
        ok = repo.is_ready(name, version)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @r.get("/v2/models/{name}")
    @r.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str = "") -> Any:
        return answer(lambda: repo.get(name, version).metadata())

    @r.get("/v2/models/{name}/ready")
    @r.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str = "") -> Any:
        return answer(lambda: ready_response(name, version))

    @r.get("/v2/models/{name}/config")
    @r.get("/v2/models/{name}/versions/{version}/config")
    async def model_config(name: str, version: str = "") -> Any:
        return answer(lambda: repo.get(name, version).triton_config())

    @r.get("/v2/models/{name}/stats")
    @r.get("/v2/models/{name}/versions/{version}/stats")
    async def model_stats(name: str, version: str = "") -> Any:
        return answer(lambda: {"model_stats": [repo.get(name, version).statistics()]})

    async def json_body(request: Request) -> dict:
        body = await read_body(request, max_request_bytes)
        if not body.strip():
            return {}
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise BadRequestError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BadRequestError(f"the request body must be a JSON object, got {type(doc).__name__}")
        return doc

    @r.post("/v2/repository/index")
    async def repository_index(request: Request) -> Any:
        try:
            ready = (await json_body(request)).get("ready", False)
            if not isinstance(ready, bool):
                raise BadRequestError(f"'ready' must be true or false, got {ready!r}")
            return repo.index(ready)
        except Exception as e:  # noqa: BLE001
            return error_response(e)

    @r.post("/v2/repository/models/{name}/load")
    async def repository_load(name: str, request: Request) -> Any:
        try:
            params = (await json_body(request)).get("parameters") or {}
            if not isinstance(params, dict):
                raise BadRequestError(f"'parameters' must be a JSON object, got {type(params).__name__}")
            config, files = protocol.load_parameters(name, params)
            await run_in_threadpool(repo.load, name, config, files)
        except Exception as e:  # noqa: BLE001
            return error_response(e)
        return Response(status_code=200)

    @r.post("/v2/repository/models/{name}/unload")
    async def repository_unload(name: str, request: Request) -> Any:
        try:
            await json_body(request)           # parameters: unload_dependents (no model here has dependents)
            await run_in_threadpool(repo.unload, name)
        except Exception as e:  # noqa: BLE001
            return error_response(e)
        return Response(status_code=200)

    shm = repo.shared_memory

    @r.get("/v2/systemsharedmemory/status")
    @r.get("/v2/systemsharedmemory/region/{region}/status")
    async def shm_status(region: str = "") -> Any:
        return answer(lambda: shm.status(region))

    @r.post("/v2/systemsharedmemory/region/{region}/register")
    async def shm_register(region: str, request: Request) -> Any:
        try:
            doc = await json_body(request)
            unknown = sorted(set(doc) - {"key", "offset", "byte_size"})
            if unknown or not isinstance(doc.get("key"), str):
                raise BadRequestError(f"register {region!r}: expected {{\"key\": str, \"offset\": int, "
                                      f"\"byte_size\": int}}, got {json.dumps(doc)[:200]}")
            shm.register(region, doc["key"], doc.get("offset", 0), doc.get("byte_size"))
        except Exception as e:  # noqa: BLE001
            return error_response(e)
        return Response(status_code=200)

    @r.post("/v2/systemsharedmemory/unregister")
    @r.post("/v2/systemsharedmemory/region/{region}/unregister")
    async def shm_unregister(region: str = "") -> Any:
        shm.unregister(region)
        return Response(status_code=200)

    @r.post("/v2/models/{name}/infer")
    @r.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str = "") -> Any:
        try:
            model = repo.get(name, version)
            body = await read_body(request, max_request_bytes)
            hl = request.headers.get(HEADER_LENGTH)
            try:
                header_length = int(hl) if hl is not None else None
            except ValueError:
                raise BadRequestError(f"{HEADER_LENGTH} must be an integer, got {hl!r}") from None
            if len(body) > INLINE_BYTES:
                req = await run_in_threadpool(protocol.decode_http, body, header_length, shm)
            else:
                req = protocol.decode_http(body, header_length, shm)
            outputs = protocol.classify(req, await model.infer(req), bool(model.spec.max_batch_size))
            placed = protocol.place_outputs(req, outputs, shm)
            content, n = protocol.encode_http(name, model.version, req, outputs, placed)
        except Exception as e:  # noqa: BLE001 - every failure is this request's own response
            return error_response(e)
        if n is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(n)})

    return r
