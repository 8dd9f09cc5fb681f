"""Offline batches in OpenAI's Batch API format: ``shapeplan batch -i requests.jsonl -o results.jsonl``.

Each input line is one request, as OpenAI's Batch API takes them::

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [...]}}

and each output line its answer, in the input's order (written as soon as every line before it is done)::

    {"id": "batch_req_...", "custom_id": "r1", "response": {"status_code": 200, "request_id": "...", "body": {...}},
     "error": null}

The requests go to the OpenAI server's own app in this process (``build_openai_app``, through httpx's ASGI
transport: no socket), so a line gets exactly what ``shapeplan serve`` would answer, the same checks and
errors included. They are sent concurrently, at most ``in_flight`` at a time, and the batched engine
decodes them together. A line that is not a request (not JSON, no ``custom_id``, a ``custom_id`` seen
before, a URL the batch does not take, ``stream: true``) gets ``response: null`` and an ``error``
naming what is wrong; a request the server refuses gets its status code and error body, as OpenAI's
batch output has them. Neither stops the batch.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import IO, Any

#: the endpoints a batch line may name (OpenAI's Batch API takes these three and embeddings)
URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


@dataclass
class BatchReport:
    lines: int = 0
    ok: int = 0
    failed: int = 0                  # answered with an error status
    invalid: int = 0                 # not a request (the line's own error)
    completion_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)     # the first few, for the summary

    def summary(self) -> str:
        rate = self.completion_tokens / self.seconds if self.seconds else 0.0
        return (f"{self.lines} lines: {self.ok} answered, {self.failed} refused by the server, {self.invalid} not "
                f"requests; {self.completion_tokens} tokens generated in {self.seconds:.1f} s ({rate:.1f} tok/s)")


def parse_line(text: str, seen: set[str]) -> tuple[str | None, dict | None, str | None]:
    """(custom_id, request, error): the request ({"url", "body"}) or what is wrong with the line."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        return None, None, f"the line is not JSON: {e}"
    if not isinstance(doc, dict):
        return None, None, f"the line must be a JSON object, got {type(doc).__name__}"
    cid = doc.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return None, None, "the line has no custom_id (a non-empty string)"
    if cid in seen:
        return cid, None, f"custom_id {cid!r} is used by an earlier line; each must be unique"
    seen.add(cid)
    method, url, body = doc.get("method", "POST"), doc.get("url"), doc.get("body")
    if method != "POST":
        return cid, None, f"method {method!r}: a batch line is a POST"
    if url not in URLS:
        return cid, None, f"url {url!r}: a batch line posts to one of {list(URLS)}"
    if not isinstance(body, dict):
        return cid, None, f"body must be the request's JSON object, got {type(body).__name__}"
    if body.get("stream"):
        return cid, None, "stream: true is not available in a batch (each answer is written whole)"
    unknown = sorted(set(doc) - {"custom_id", "method", "url", "body"})
    if unknown:
        return cid, None, f"unknown field(s) {unknown}; a line has custom_id, method, url and body"
    return cid, {"url": url, "body": body}, None


def models_named(lines: list[str]) -> set[str]:
    """The ``model`` the requests of a batch file name (lines that do not parse are skipped)."""
    names = set()
    for text in lines:
        try:
            body = json.loads(text).get("body")
        except (ValueError, AttributeError):
            continue
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            names.add(body["model"])
    return names


def _output(cid: str | None, response: dict | None, error: dict | None) -> str:
    return json.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": cid, "response": response,
                       "error": error}, ensure_ascii=False)


async def run_batch(app: Any, lines: list[str], out: IO[str], *, in_flight: int = 256,
                    progress: IO[str] | None = sys.stderr) -> BatchReport:
    """Answer every line of ``lines`` (the input file's non-blank lines) with ``app``; write the output
    lines to ``out`` in the input's order."""
    import httpx
    report = BatchReport(lines=len(lines))
    seen: set[str] = set()
    parsed = [parse_line(text, seen) for text in lines]
    done: list[str | None] = [None] * len(lines)
    next_out = 0
    gate = asyncio.Semaphore(max(1, in_flight))
    t0 = time.perf_counter()
    last_note = t0

    def flush() -> None:
        nonlocal next_out, last_note
        while next_out < len(done) and done[next_out] is not None:
            out.write(done[next_out] + "\n")
            done[next_out] = ""             # written: keep the slot, drop the text
            next_out += 1
        out.flush()
        now = time.perf_counter()
        if progress is not None and now - last_note > 5.0:
            last_note = now
            finished = sum(x is not None for x in done)
            print(f"batch: {finished}/{len(done)} done, {report.completion_tokens} tokens, {now - t0:.0f} s",
                  file=progress, flush=True)

    async def one(k: int, client: Any) -> None:
        cid, req, error = parsed[k]
        if req is None:
            report.invalid += 1
            if len(report.errors) < 5:
                report.errors.append(f"line {k + 1}: {error}")
            done[k] = _output(cid, None, {"code": "invalid_request", "message": f"line {k + 1}: {error}"})
        else:
            async with gate:
                r = await client.post(req["url"], json=req["body"])
            try:
                body = r.json()
            except ValueError:
                body = {"error": {"message": r.text, "type": "server_error"}}
            if r.status_code == 200:
                report.ok += 1
                report.completion_tokens += int((body.get("usage") or {}).get("completion_tokens")
                                                or (body.get("usage") or {}).get("output_tokens") or 0)
            else:
                report.failed += 1
                if len(report.errors) < 5:
                    msg = (body.get("error") or {}).get("message", r.text) if isinstance(body, dict) else r.text
                    report.errors.append(f"line {k + 1} ({cid}): {r.status_code} {msg}")
            done[k] = _output(cid, {"status_code": r.status_code,
                                    "request_id": r.headers.get("x-request-id") or f"req_{uuid.uuid4().hex}",
                                    "body": body}, None)
        flush()

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shapeplan-batch", timeout=None) as client:
        await asyncio.gather(*(one(k, client) for k in range(len(lines))))
    flush()
    report.seconds = time.perf_counter() - t0
    return report
