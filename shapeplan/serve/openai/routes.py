"""The OpenAI-compatible HTTP routes: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``POST /v1/responses`` (responses.py), ``GET /v1/models``, ``GET /health``, and vLLM's ``POST /tokenize`` /
``POST /detokenize`` (``/metrics`` is the app's: see server.py).

Every route reads its body itself (counting bytes against ``max_request_bytes``) and validates it with
the strict models of protocol.py, so every bad request gets OpenAI's error JSON with a 4xx status;
an unexpected failure is a 500 in the same shape, logged, and the server goes on serving."""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
from typing import Any, Awaitable, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from shapeplan.errors import ShapeplanError
from shapeplan.serve.app import read_bounded
from shapeplan.serve.openai import DEFAULT_MAX_REQUEST_BYTES, errors, responses
from shapeplan.serve.openai.errors import BodyTooLarge, ModelNotFound, Unauthorized
from shapeplan.serve.openai.generation import Job, OpenAIModel
from shapeplan.serve.openai.protocol import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, parse

log = logging.getLogger("shapeplan.serve.openai")
_DRAIN_FACTOR = 16          # read (and drop) up to 16x the limit of an oversized body, so the client gets the 413
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), status_code=status,
                    media_type="application/json", headers=headers)


def error_response(e: BaseException) -> Response:
    st = errors.status_of(e)
    if st.http >= 500 and not isinstance(e, ShapeplanError):
        log.error("request failed", exc_info=e)
    return json_response(errors.body(e), st.http, errors.headers(e))


def bearer(api_key: str | None) -> list[Any]:
    """The dependency that checks ``Authorization: Bearer KEY`` (none without a key)."""
    if not api_key:
        return []
    want = f"Bearer {api_key}".encode()

    async def check(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, want):
            raise Unauthorized("a valid API key is needed: Authorization: Bearer KEY")
    return [Depends(check)]


async def read_body(request: Request, limit: int) -> bytes:
    body, size = await read_bounded(request, limit, _DRAIN_FACTOR)
    if body is None:
        raise BodyTooLarge(f"the request body has {size if size <= _DRAIN_FACTOR * limit else 'over %d' % size} "
                           f"bytes; this server accepts at most {limit}")
    return body


def _answers_errors(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    @functools.wraps(fn)
    async def wrapped(*args: Any, **kw: Any) -> Response:
        try:
            return await fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - every failure becomes an error answer; the server goes on
            return error_response(e)
    return wrapped


def openai_router(model: OpenAIModel, *, api_key: str | None = None,
                  max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> APIRouter:
    auth = bearer(api_key)
    r = APIRouter()

    async def answer(job: Job, request: Request, rj: responses.ResponseJob | None = None) -> Response:
        """``job``'s answer: a JSON object or an event stream (``rj``: in the Responses API's shapes)."""
        if job.constraint is not None:       # compile the schema / grammar off the event loop (cached)
            await asyncio.to_thread(model.pipe.compile_constraint, job.constraint)
        if job.echo:                         # the prompts' text and logprobs (a prefill on the engine thread)
            await asyncio.to_thread(model.prepare_echo, job)
            if not any(job.max_tokens):      # max_tokens 0: the prompts are the answer
                if job.stream:
                    return StreamingResponse(model.echo_stream(job), media_type="text/event-stream",
                                             headers=SSE_HEADERS)
                return json_response(model.echo_only(job))
        choices = model.submit(job)
        if job.stream:
            events = responses.stream(model, rj, choices, request.receive) if rj else \
                model.stream(job, choices, request.receive)
            return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
        out = await (responses.complete(model, rj, choices, request.receive) if rj else
                     model.complete(job, choices, request.receive))
        return json_response(out) if out is not None else Response(status_code=499)   # nobody is listening

    @r.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @r.get("/v1/models", dependencies=auth)
    async def models() -> Response:
        return json_response({"object": "list", "data": [model.model_card()]})

    @r.get("/v1/models/{name:path}", dependencies=auth)
    @_answers_errors
    async def one_model(name: str) -> Response:
        if name != model.name:
            raise ModelNotFound(f"the model '{name}' does not exist (this server serves '{model.name}')", "model")
        return json_response(model.model_card())

    @r.post("/v1/completions", dependencies=auth)
    @_answers_errors
    async def completions(request: Request) -> Response:
        req = parse(CompletionRequest, await read_body(request, max_request_bytes))
        return await answer(model.completion_job(req), request)

    @r.post("/v1/chat/completions", dependencies=auth)
    @_answers_errors
    async def chat(request: Request) -> Response:
        req = parse(ChatRequest, await read_body(request, max_request_bytes))
        return await answer(model.chat_job(req), request)

    @r.post("/tokenize", dependencies=auth)
    @_answers_errors
    async def tokenize(request: Request) -> Response:
        return json_response(model.tokenize(parse(TokenizeRequest, await read_body(request, max_request_bytes))))

    @r.post("/detokenize", dependencies=auth)
    @_answers_errors
    async def detokenize(request: Request) -> Response:
        return json_response(model.detokenize(parse(DetokenizeRequest, await read_body(request, max_request_bytes))))

    store = responses.ResponseStore()

    @r.post("/v1/responses", dependencies=auth)
    @_answers_errors
    async def create_response(request: Request) -> Response:
        req = parse(responses.ResponsesRequest, await read_body(request, max_request_bytes))
        rj = responses.responses_job(model, req, store)
        return await answer(rj.job, request, rj)

    @r.get("/v1/responses/{rid}", dependencies=auth)
    @_answers_errors
    async def get_response(rid: str) -> Response:
        return json_response(store.get(rid).response)

    @r.delete("/v1/responses/{rid}", dependencies=auth)
    @_answers_errors
    async def delete_response(rid: str) -> Response:
        return json_response(store.delete(rid))

    return r
