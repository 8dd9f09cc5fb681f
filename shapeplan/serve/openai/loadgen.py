"""``shapeplan bench --serve URL``: streaming clients against a running OpenAI-compatible server.

Per concurrency C: C clients (one asyncio loop, httpx), each sending requests back to back until
``requests`` have been sent (default max(4, 2C)): ``POST /v1/completions`` with ``prompt_len`` random
token ids, ``max_tokens = new_tokens``, greedy, ``ignore_eos`` and ``return_token_ids`` (so tokens are
counted exactly, whatever the tokenizer), ``stream: true``. Per request: time to first token (sent to
the first chunk with tokens) and inter-token latency (each chunk's gap spread over its tokens, as the
in-process serving benchmark does); per level: output tok/s over the run (first request sent to the
last token), TTFT and ITL p50/p99, the median client-side decode rate of one stream, and errors (a
status other than 200, an error event, a stream without ``[DONE]`` or with a wrong token count).
Prefill tokens and preemptions come from the server's ``/metrics`` when it answers.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from shapeplan.errors import ShapeplanError
from shapeplan.llm.bench_serving import ServeRow, percentile


@dataclass(slots=True)
class Sample:
    ok: bool = True
    error: str = ""
    tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    decode_tok_s: float = 0.0
    end: float = 0.0


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """Random token ids below 256 (valid in any vocabulary; no two prompts share a cached block)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(length)] for _ in range(n)]


async def _one(client: Any, model: str, prompt: list[int], new_tokens: int) -> Sample:
    s = Sample()
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "return_token_ids": True}
    t0 = time.perf_counter()
    first = last = 0.0
    done = False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                s.ok, s.error = False, f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                msg = json.loads(line[6:])
                if "error" in msg:
                    s.ok, s.error = False, f"error event: {msg['error'].get('message')}"
                    return s
                n = sum(len(c.get("token_ids") or ()) for c in msg.get("choices", ()))
                if not n:
                    continue
                now = time.perf_counter()
                if not s.tokens:
                    first, s.ttft = now, now - t0
                else:
                    s.itl += [(now - last) / n] * n
                last = now
                s.tokens += n
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        s.ok, s.error = False, f"{type(e).__name__}: {e}"[:200]
        return s
    s.end = last
    if not done or s.tokens != new_tokens:
        s.ok, s.error = False, f"stream ended {'without [DONE]' if not done else ''} after {s.tokens} of {new_tokens} tokens"
    if s.tokens > 1 and last > first:
        s.decode_tok_s = (s.tokens - 1) / (last - first)
    return s


async def _level(url: str, model: str, concurrency: int, n_requests: int, prompt_len: int, new_tokens: int,
                 headers: dict[str, str], seed: int) -> tuple[list[Sample], float, float]:
    import httpx
    todo = prompts(n_requests, prompt_len, seed)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(600.0, connect=30.0)
    out: list[Sample] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=timeout) as client:
        async def worker() -> None:
            while todo:
                out.append(await _one(client, model, todo.pop(), new_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        t1 = time.perf_counter()
    return out, t0, t1


def _server_counters(url: str, headers: dict[str, str]) -> dict[str, float]:
    import httpx
    try:
        text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    except Exception:  # noqa: BLE001 - the counters are extras
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("shapeplan:prefill_tokens_total", "shapeplan:num_preemptions_total"):
            if line.startswith(name + "{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def run(url: str, concurrencies: list[int], *, prompt_len: int, new_tokens: int, requests: int = 0,
        api_key: str | None = None, log: Any = print) -> list[ServeRow]:
    """One ServeRow per concurrency (``extra``: errors, decode tok/s of a stream, a sample error)."""
    import httpx
    url = url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        model = httpx.get(url + "/v1/models", headers=headers, timeout=30).raise_for_status().json()["data"][0]["id"]
    except httpx.HTTPError as e:
        raise ShapeplanError(f"no OpenAI-compatible server answers at {url}: {e}") from None
    asyncio.run(_level(url, model, min(8, max(concurrencies)), min(8, max(concurrencies)), prompt_len, 16, headers,
                       seed=99))                                               # warm the server's paths
    rows = []
    for c in concurrencies:
        n = requests or max(4, 2 * c)
        before = _server_counters(url, headers)
        samples, t0, t1 = asyncio.run(_level(url, model, c, n, prompt_len, new_tokens, headers, seed=c))
        after = _server_counters(url, headers)
        good = [s for s in samples if s.ok]
        bad = [s for s in samples if not s.ok]
        end = max((s.end for s in good), default=t1)
        row = ServeRow("shapeplan serve (HTTP)", requests=n, concurrency=c, ok=not bad,
                       error=bad[0].error if bad else "", wall_s=end - t0)
        row.output_tok_s = sum(s.tokens for s in good) / row.wall_s if row.wall_s > 0 else 0.0
        ttft, itl = [s.ttft for s in good], [x for s in good for x in s.itl]
        row.ttft_p50_ms, row.ttft_p99_ms = 1e3 * percentile(ttft, 50), 1e3 * percentile(ttft, 99)
        row.itl_p50_ms, row.itl_p99_ms = 1e3 * percentile(itl, 50), 1e3 * percentile(itl, 99)
        for key, attr in (("shapeplan:prefill_tokens_total", "prefill_tokens"),
                          ("shapeplan:num_preemptions_total", "preemptions")):
            if key in before and key in after:
                setattr(row, attr, int(after[key] - before[key]))
        row.extra = {"errors": len(bad), "stream_decode_tok_s": statistics.median([s.decode_tok_s for s in good])
                     if good else 0.0, "model": model, "url": url}
        rows.append(row)
        log(f"  {c} clients: {row.output_tok_s:.0f} tok/s, TTFT p50 {row.ttft_p50_ms:.1f} ms, {len(bad)} errors")
    return rows


def format_table(rows: list[ServeRow], title: str) -> str:
    head = (f"{'clients':>7} {'reqs':>5} {'errors':>6} {'wall s':>7} {'out tok/s':>10} {'stream tok/s':>12} "
            f"{'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>7} {'prefill':>8} {'preempt':>7}")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.concurrency:>7} {r.requests:>5} {r.extra.get('errors', 0):>6} {r.wall_s:>7.2f} "
                     f"{r.output_tok_s:>10.0f} {r.extra.get('stream_decode_tok_s', 0):>12.0f} {r.ttft_p50_ms:>9.1f} "
                     f"{r.ttft_p99_ms:>8.1f} {r.itl_p50_ms:>8.2f} {r.itl_p99_ms:>7.2f} {r.prefill_tokens:>8} "
                     f"{r.preemptions:>7}")
    lines.append("(TTFT/ITL in ms, seen by the clients; stream tok/s = median decode rate of one stream after its "
                 "first token; prefill / preempt from the server's /metrics)")
    bad = [r for r in rows if r.error]
    lines += [f"  {r.concurrency} clients, first error: {r.error}" for r in bad]
    return "\n".join(lines)
