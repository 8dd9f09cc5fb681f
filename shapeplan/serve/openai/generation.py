"""OpenAI requests through the serving core: a validated request becomes a ``Job`` (prompts as token
ids, one ``Sampling`` per choice, how many tokens), each choice one engine request (``Choice``), and
the choices' events become one JSON answer (``complete``) or a stream of SSE chunks (``stream``).

Both race generation against the client going away: a task waits on the ASGI ``receive`` channel,
which yields ``http.disconnect`` when the connection closes (the body has been read, so nothing
else arrives there), and aborts every choice at once; the engine frees their KV blocks at its next
step and their last events (``abort``) end the answer.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

import torch

from shapeplan.errors import ConstraintError, ModelError
from shapeplan.llm.batch import RequestHandle, TokenEvent, TokenLogprob
from shapeplan.llm.config import read_json
from shapeplan.llm.constraint import Constraint, parse_tool_calls
from shapeplan.llm.sampling import Sampling
from shapeplan.llm.session import StopText
from shapeplan.serve.openai import errors
from shapeplan.serve.openai.errors import BadRequest, ModelNotFound, Unsupported
from shapeplan.serve.openai.metrics import Latency
from shapeplan.serve.openai.reasoning import ReasoningStream, opens_reasoning, split
from shapeplan.serve.openai.protocol import (ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                             chat_logprobs, completion_logprobs, usage, vllm_constraint)

Receive = Callable[[], Awaitable[dict]]
_I64 = 1 << 63
_ECHO_ROWS = 256             # prompt rows whose log-softmax an echo computes at once


@dataclass(slots=True, frozen=True)
class GenerationDefaults:
    """Sampling defaults from a checkpoint's ``generation_config.json``; unset fields fall back to
    OpenAI's (temperature 1, top_p 1). ``do_sample: false`` there makes greedy the default."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    min_p: float | None = None

    @classmethod
    def from_checkpoint(cls, path: str | None) -> "GenerationDefaults":
        f = os.path.join(path, "generation_config.json") if path and os.path.isdir(path) else None
        if f is None or not os.path.exists(f):
            return cls()
        cfg = read_json(f)
        num = (int, float)
        temp = cfg.get("temperature") if isinstance(cfg.get("temperature"), num) else None
        if cfg.get("do_sample") is False:
            temp = 0.0
        return cls(temp, *(cfg.get(k) if isinstance(cfg.get(k), t) else None
                           for k, t in (("top_p", num), ("top_k", int), ("repetition_penalty", num),
                                        ("max_new_tokens", int), ("min_p", num))))


@dataclass(slots=True)
class Echo:
    """A prompt as an echoing completion answers it: its text, and with logprobs the legacy ``logprobs`` object
    of its tokens (the first token has none, as OpenAI's)."""
    text: str
    logprobs: dict | None


@dataclass(slots=True)
class Job:
    chat: bool
    prompts: list[list[int]]
    max_tokens: list[int]                    # per prompt
    samplings: list[Sampling]                # per choice of a prompt (seed + j)
    logprobs: int | None                     # top alternatives per token (None: no logprobs)
    ignore_eos: bool
    stream: bool
    include_usage: bool
    token_ids: bool                          # return_token_ids
    id: str = ""
    created: int = 0
    constraint: Constraint | None = None     # response_format / tools (structured output)
    tools: bool = False                      # answers are parsed for tool calls
    echo: bool = False                       # completions: each choice starts with its prompt
    echoes: list[Echo] = field(default_factory=list)       # per prompt (prepare_echo)
    reasoning: bool = False                  # chat: <think> ... </think> apart (--reasoning-parser)
    thinking: bool = False                   # the prompt opened <think>

    @property
    def n(self) -> int:
        return len(self.samplings)


class Choice:
    """One engine request of a job: its handle, text (cut at stop strings), tokens and logprobs, and
    the latency observations it makes as its events arrive."""
    __slots__ = ("index", "handle", "text", "ids", "lps", "finish", "error", "offset", "_t0", "_last", "_lat")

    def __init__(self, index: int, handle: RequestHandle, tokenizer: Any, stops: tuple[str, ...], t0: float,
                 latency: Latency) -> None:
        self.index, self.handle = index, handle
        self.text = StopText(tokenizer, stops)
        self.ids: list[int] = []
        self.lps: list[TokenLogprob] = []
        self.finish: str | None = None
        self.error: BaseException | None = None
        self.offset = 0                       # characters of token text given so far (completions logprobs)
        self._t0, self._last, self._lat = t0, 0.0, latency

    def abort(self) -> None:
        """Abort the engine request unless its last event has arrived here. (The handle's own check
        can lag: the loop may see the last event before the engine thread marks the handle done, and
        a needless abort is a message that counts against the engine's queue.)"""
        if self.finish is None:
            self.handle.abort()

    def take(self, ev: TokenEvent, decode: Callable[[list[int]], str]) -> tuple[str, list[int], list[TokenLogprob]]:
        """Apply one event; returns (new text, new token ids, their logprobs) to send."""
        new, lps = ev.token_ids, ev.logprobs or []
        if new:
            lat = self._lat
            if not self.ids:
                lat.ttft.observe(ev.time - self._t0)
            else:
                gap = (ev.time - self._last) / len(new)
                for _ in new:
                    lat.itl.observe(gap)
            self._last = ev.time
            self.ids += new
            self.lps += lps
        delta = self.text.push(new)
        if ev.finish_reason is None:
            return delta, new, lps
        self.finish, self.error = ev.finish_reason, ev.error          # a last event carries no tokens
        if self.finish == "stop" and self.text.stops:
            keep = _stop_cut(self.ids, self.text.stops, decode)
            self.ids, self.lps = self.ids[:keep], self.lps[:keep]
        delta += self.text.finish(decode(self.ids))
        if self.finish in ("stop", "length"):
            self._lat.e2e.observe(time.perf_counter() - self._t0)
        if self.handle.queue_time is not None:
            self._lat.queue.observe(self.handle.queue_time)
        return delta, new, lps


def _stop_cut(ids: list[int], stops: tuple[str, ...], decode: Callable[[list[int]], str]) -> int:
    """How many leading tokens the answer keeps: the fewest whose text holds a stop string (tokens the
    engine made past it, within the same read-back, are dropped), or all when none does (EOS)."""
    k = len(ids)
    while k > 1 and any(s in decode(ids[:k - 1]) for s in stops):
        k -= 1
    return k


class OpenAIModel:
    """One served pipeline under one name: turns requests into jobs and jobs into answers."""

    def __init__(self, pipe: Any, name: str, latency: Latency, defaults: GenerationDefaults | None = None) -> None:
        self.pipe, self.name, self.latency = pipe, name, latency
        self.tok = pipe.tokenizer
        self.defaults = defaults or GenerationDefaults()
        self.context = pipe.max_kv_cache_length
        self.vocab = pipe.cfg.vocab_size
        self.created = int(time.time())
        self.reasoning = False                  # --reasoning-parser: chat answers' <think> ... </think> apart

    # ------------------------------------------------------------------ requests -> jobs
    def completion_job(self, req: CompletionRequest) -> Job:
        self._check_common(req)
        if req.max_tokens == 0 and not req.echo:
            raise BadRequest("max_tokens 0 needs echo: true (a request that only scores its prompt)", "max_tokens")
        if req.suffix:
            raise Unsupported("suffix is not supported", "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise Unsupported("best_of other than n is not supported", "best_of")
        prompts = self._prompts(req.prompt)
        explicit = "max_tokens" in req.model_fields_set
        constraint, param = vllm_constraint(req)
        if constraint is not None and req.logprobs is not None:
            raise Unsupported(f"logprobs are not available with {param} (structured output)", "logprobs")
        job = self._job(req, False, prompts, req.max_tokens, explicit, req.logprobs, "prompt", constraint=constraint)
        job.echo = req.echo
        if req.echo and req.logprobs is not None:
            most = self.pipe.max_prefill_length
            long = next((len(p) for p in prompts if len(p) > most), None)
            if long is not None:
                raise BadRequest(f"echo with logprobs scores the prompt in one prefill of at most {most} tokens "
                                 f"(--max-prefill-length); this prompt has {long}", "prompt")
        return job

    def chat_job(self, req: ChatRequest) -> Job:
        self._check_common(req)
        if req.top_logprobs is not None and not req.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        if self.tok is None:
            raise BadRequest(f"the model '{self.name}' has no tokenizer, so no chat template: use /v1/completions "
                             "with token ids", "messages")
        try:
            constraint = Constraint.from_openai(req.response_format, req.tools, req.tool_choice,
                                                req.parallel_tool_calls is not False)
        except ConstraintError as e:
            raise BadRequest(str(e), "tools" if req.tools or req.tool_choice else "response_format") from None
        guided, param = vllm_constraint(req)
        if guided is not None and constraint is not None:
            raise BadRequest(f"{param} and {'tools' if req.tools else 'response_format'} both constrain the answer: "
                             "give one", param)
        constraint = constraint or guided
        if constraint is not None and req.logprobs:
            raise Unsupported("logprobs are not available with response_format or tools (structured output)",
                              "logprobs")
        ids = self.render([m.for_template() for m in req.messages], req.tools, "messages")
        most = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        lp = (req.top_logprobs or 0) if req.logprobs else None
        job = self._job(req, True, [ids], most, most is not None, lp, "messages", param, constraint)
        job.tools = constraint is not None and constraint.kind == "tool_call"
        if self.reasoning:
            job.reasoning, job.thinking = True, opens_reasoning(self.decode(ids[-16:]))
        return job

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, param: str, *,
               add_generation_prompt: bool = True) -> list[int]:
        """The token ids of ``messages`` (and ``tools``) through the checkpoint's chat template; a template
        that fails on them is a BadRequest naming ``param``."""
        try:
            text = self.tok.apply_chat_template(messages, tools=tools or None,
                                                add_generation_prompt=add_generation_prompt)
            return self.tok.encode(text, add_special_tokens=False)
        except ModelError as e:
            raise BadRequest(str(e), param) from None
        except Exception as e:  # noqa: BLE001 - a jinja2 error of the checkpoint's template on these messages
            raise BadRequest(f"the chat template failed on these messages: {type(e).__name__}: {e}", param) from None

    def tokenize(self, req: TokenizeRequest) -> dict:
        """vLLM's ``/tokenize`` answer: the ids a completion (``prompt``) or chat (``messages``) request would
        send to the engine, their count and the context length."""
        self._named(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise BadRequest("send either 'prompt' or 'messages'", "prompt" if req.prompt is None else "messages")
        if self.tok is None:
            raise BadRequest(f"the model '{self.name}' has no tokenizer", "prompt")
        if req.prompt is not None:
            ids = self.tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            ids = self.render([m.for_template() for m in req.messages], req.tools, "messages",
                              add_generation_prompt=req.add_generation_prompt)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": self.context, "tokens": ids}
        out["token_strs"] = [self._token(t) for t in ids] if req.return_token_strs else None
        return out

    def detokenize(self, req: DetokenizeRequest) -> dict:
        """vLLM's ``/detokenize`` answer: the text of some token ids (special tokens kept)."""
        self._named(req.model)
        if self.tok is None:
            raise BadRequest(f"the model '{self.name}' has no tokenizer", "tokens")
        bad = next((t for t in req.tokens if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise BadRequest(f"token id {bad} is outside the vocabulary [0, {self.vocab})", "tokens")
        return {"prompt": self.tok.decode(req.tokens, skip_special_tokens=False)}

    def _named(self, name: str | None) -> None:
        if name is not None and name != self.name:
            raise ModelNotFound(f"the model '{name}' does not exist (this server serves '{self.name}')", "model")

    def _check_common(self, req: Any) -> None:
        self._named(req.model)
        for key, bias in (req.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()) or int(key) >= self.vocab:
                raise BadRequest(f"logit_bias: {key!r} is not a token id of the vocabulary [0, {self.vocab})",
                                 "logit_bias")
            if not -100 <= bias <= 100:
                raise BadRequest(f"logit_bias: token {key}'s bias {bias} is outside [-100, 100]", "logit_bias")
        bad = next((t for t in req.stop_token_ids or () if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise BadRequest(f"stop_token_ids: {bad} is not a token id of the vocabulary [0, {self.vocab})",
                             "stop_token_ids")
        if req.stream_options is not None and not req.stream:
            raise BadRequest("stream_options is only allowed with stream: true", "stream_options")

    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        elif prompt and isinstance(prompt[0], int):
            prompt = [prompt]
        if not prompt:
            raise BadRequest("the prompt is empty", "prompt")
        out = []
        for p in prompt:
            if isinstance(p, str):
                if self.tok is None:
                    raise BadRequest(f"the model '{self.name}' has no tokenizer: send the prompt as token ids", "prompt")
                p = self.tok.encode(p)
            if not p:
                raise BadRequest("the prompt is empty", "prompt")
            bad = next((t for t in p if not 0 <= t < self.vocab), None)
            if bad is not None:
                raise BadRequest(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab})", "prompt")
            out.append(list(p))
        return out

    def _job(self, req: Any, chat: bool, prompts: list[list[int]], most: int | None, explicit: bool,
             logprobs: int | None, prompt_param: str, most_param: str = "max_tokens",
             constraint: Constraint | None = None) -> Job:
        ctx, d = self.context, self.defaults
        budgets = []
        for p in prompts:
            room = ctx - len(p)
            if room < 1:
                raise BadRequest(f"the prompt has {len(p)} tokens; this model's context is {ctx} tokens, with room "
                                 "for at least one generated token", prompt_param, "context_length_exceeded")
            if most is None:
                budgets.append(min(room, d.max_new_tokens or room))
            elif not explicit:
                budgets.append(min(room, most))
            elif len(p) + most > ctx:
                raise BadRequest(f"this model's context is {ctx} tokens; the request needs {len(p) + most} ({len(p)} "
                                 f"in the prompt, {most} to generate): lower {most_param} or shorten the prompt",
                                 most_param, "context_length_exceeded")
            else:
                budgets.append(most)
        stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if any(not s for s in stops):
            raise BadRequest("a stop string is empty", "stop")
        if stops and self.tok is None:
            raise BadRequest(f"the model '{self.name}' has no tokenizer, so no stop strings", "stop")
        temp = _first(req.temperature, d.temperature, 1.0)
        top_p = _first(req.top_p, d.top_p, 1.0)
        top_k = max(0, _first(req.top_k, d.top_k, 0))
        penalty = _first(req.repetition_penalty, d.repetition_penalty, 1.0)
        min_p = _first(req.min_p, d.min_p, 0.0)
        seeds = [None] * req.n if req.seed is None else [(req.seed + j + _I64) % (2 * _I64) - _I64 for j in range(req.n)]
        bias = {int(k): v for k, v in (req.logit_bias or {}).items()}
        samplings = [Sampling(temperature=temp, top_k=top_k, top_p=top_p, repetition_penalty=penalty, seed=seed,
                              stop=stops, constraint=constraint, presence_penalty=req.presence_penalty or 0.0,
                              frequency_penalty=req.frequency_penalty or 0.0, logit_bias=bias, min_p=min_p,
                              stop_token_ids=tuple(req.stop_token_ids or ()))
                     for seed in seeds]
        include = bool(req.stream_options and req.stream_options.include_usage)
        return Job(chat, prompts, budgets, samplings, logprobs, req.ignore_eos, req.stream, include,
                   req.return_token_ids, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()),
                   constraint)

    def prepare_echo(self, job: Job) -> None:
        """``job.echoes``: each prompt's text and, when logprobs are asked for, its tokens' log-probabilities
        (one prefill of the prompt through the engine thread, ``pipe.score``: the log-softmax of the raw
        logits, as for generated tokens) with their top alternatives and text offsets. Blocks: call it off the
        event loop."""
        k = job.logprobs
        for ids in job.prompts:
            text = self.decode(ids)
            if k is None:
                job.echoes.append(Echo(text, None))
                continue
            logits = self.pipe.score(ids)                                  # [n, V] float: row i predicts i + 1
            lps: list[float | None] = [None]
            tops: list[dict[str, float] | None] = [None]
            for c in range(0, len(ids) - 1, _ECHO_ROWS):                   # a chunk of rows at a time (memory)
                logp = torch.log_softmax(logits[c:c + _ECHO_ROWS][:len(ids) - 1 - c].float(), dim=-1)
                lps += logp.gather(1, torch.tensor(ids[c + 1:c + 1 + len(logp)]).unsqueeze(1)).squeeze(1).tolist()
                top_v, top_i = logp.topk(k, dim=-1)
                for vs, ts in zip(top_v.tolist(), top_i.tolist()):
                    top: dict[str, float] = {}
                    for t, v in zip(ts, vs):
                        top.setdefault(self._token(t), v)  # keyed by text: of two tokens with one text, the likelier
                    tops.append(top)
            offsets = [len(self.decode(ids[:i])) for i in range(len(ids))]
            job.echoes.append(Echo(text, {"tokens": [self._token(t) for t in ids], "token_logprobs": lps,
                                          "top_logprobs": tops, "text_offset": offsets}))

    def echo_only(self, job: Job) -> dict:
        """The answer of an echoing request with ``max_tokens`` 0: each choice its prompt, nothing generated."""
        items = [{"index": p * job.n + j, "text": e.text, "logprobs": e.logprobs, "finish_reason": "length",
                  **({"token_ids": []} if job.token_ids else {})}
                 for p, e in enumerate(job.echoes) for j in range(job.n)]
        return {"id": job.id, "object": "text_completion", "created": job.created, "model": self.name,
                "choices": items, "usage": usage(sum(map(len, job.prompts)), 0)}

    async def echo_stream(self, job: Job) -> AsyncIterator[bytes]:
        """``echo_only`` as a stream: a chunk per choice, the usage chunk when asked for, ``[DONE]``."""
        whole = self.echo_only(job)
        head = {k: whole[k] for k in ("id", "object", "created", "model")}
        extra = {"usage": None} if job.include_usage else {}
        for item in whole["choices"]:
            yield _sse({**head, "choices": [item], **extra})
        if job.include_usage:
            yield _sse({**head, "choices": [], "usage": whole["usage"]})
        yield b"data: [DONE]\n\n"

    # ------------------------------------------------------------------ jobs -> engine requests
    def submit(self, job: Job) -> list[Choice]:
        """One engine request per (prompt, choice); all or none (a refusal aborts those already in)."""
        t0 = time.perf_counter()
        choices: list[Choice] = []
        try:
            for p, (ids, most) in enumerate(zip(job.prompts, job.max_tokens)):
                for j, s in enumerate(job.samplings):
                    h = self.pipe.submit(ids, most, s, ignore_eos=job.ignore_eos, logprobs=job.logprobs)
                    choices.append(Choice(p * job.n + j, h, self.tok, s.stop, t0, self.latency))
        except BaseException:
            for c in choices:
                c.abort()
            raise
        self.latency.prompt_tokens.inc(sum(map(len, job.prompts)) * job.n)
        return choices

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids) if self.tok is not None else ""

    # ------------------------------------------------------------------ choices -> answers
    async def complete(self, job: Job, choices: list[Choice], receive: Receive) -> dict | None:
        """The whole answer, or None when the client went away first (every choice aborted)."""
        watcher = _watch(receive, choices)
        try:
            for c in choices:
                async for ev in c.handle:
                    c.take(ev, self.decode)
        finally:
            watcher.cancel()
            for c in choices:
                c.abort()                                    # cancelled (server shutdown): stop them too
        if any(c.finish == "abort" for c in choices):
            return None
        failed = next((c for c in choices if c.finish == "error"), None)
        if failed is not None:
            raise failed.error or RuntimeError("the engine failed this request")
        out = []
        for c in choices:
            item: dict[str, Any] = {"index": c.index, "finish_reason": c.finish,
                                    "logprobs": self._logprobs(job, c, c.ids, c.lps, 0)}
            if job.chat:
                item["message"], item["finish_reason"] = _final_message(job, c)
            else:
                item["text"] = c.text.sent
                if job.echo:
                    self._echoed(job, c, item)
            if job.token_ids:
                item["token_ids"] = c.ids
            out.append(item)
        return {"id": job.id, "object": "chat.completion" if job.chat else "text_completion", "created": job.created,
                "model": self.name, "choices": out, "usage": self.usage_of(job, choices)}

    async def stream(self, job: Job, choices: list[Choice], receive: Receive) -> AsyncIterator[bytes]:
        """Server-sent events: a chunk per engine event of each choice (the chat's first one names the
        role), the usage chunk when asked for (``choices: []``), then ``[DONE]``."""
        watcher = _watch(receive, choices)
        think = {c.index: ReasoningStream(job.thinking) for c in choices} if job.reasoning else {}
        head = {"id": job.id, "object": "chat.completion.chunk" if job.chat else "text_completion",
                "created": job.created, "model": self.name}
        extra = {"usage": None} if job.include_usage else {}
        try:
            if job.chat:
                first = [{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for c in choices]
                yield _sse({**head, "choices": first, **extra})
            if job.echo:                                     # each choice's prompt first
                for c in choices:
                    e = job.echoes[c.index // job.n]
                    c.offset = len(e.text)
                    yield _sse({**head, "choices": [{"index": c.index, "text": e.text, "logprobs": e.logprobs,
                                                     "finish_reason": None}], **extra})
            async for c, ev in _merged(choices):
                delta, ids, lps = c.take(ev, self.decode)
                if c.finish == "abort":
                    return                                   # the client is gone: nobody reads on
                if c.finish == "error":
                    yield _sse(errors.body(c.error or RuntimeError("the engine failed this request")))
                    break
                if job.tools:                                # tool calls: the answer is parsed at its end
                    delta = ""
                parts: dict[str, str] = {}
                if job.reasoning and not job.tools:          # reasoning_content apart from content
                    thought, said = think[c.index].push(delta, final=c.finish is not None)
                    parts = {k: v for k, v in (("reasoning_content", thought), ("content", said)) if v}
                    delta = said or thought
                if not (delta or c.finish or (ids and (job.token_ids or job.logprobs is not None))):
                    continue
                item: dict[str, Any] = {"index": c.index, "logprobs": self._logprobs(job, c, ids, lps, c.offset),
                                        "finish_reason": c.finish}
                if job.tools and c.finish:
                    message, item["finish_reason"] = _final_message(job, c)
                    item["delta"] = {k: v for k, v in message.items() if k != "role" and v is not None}
                    for i, call in enumerate(item["delta"].get("tool_calls", ())):
                        call["index"] = i
                elif job.reasoning:
                    item["delta"] = parts
                elif job.chat:
                    item["delta"] = {"content": delta} if delta or not c.finish else {}
                else:
                    item["text"] = delta
                if job.token_ids:
                    item["token_ids"] = ids
                yield _sse({**head, "choices": [item], **extra})
            else:
                if job.include_usage:
                    yield _sse({**head, "choices": [], "usage": self.usage_of(job, choices)})
            yield b"data: [DONE]\n\n"
        finally:
            watcher.cancel()
            for c in choices:
                c.abort()

    def _echoed(self, job: Job, c: Choice, item: dict) -> None:
        """A non-streamed completion choice with its prompt in front: the text, and the prompt's logprobs
        before the generated tokens' (their offsets after the prompt's text)."""
        e = job.echoes[c.index // job.n]
        item["text"] = e.text + item["text"]
        if e.logprobs is not None:
            gen = self._logprobs(job, c, c.ids, c.lps, len(e.text))
            item["logprobs"] = {k: e.logprobs[k] + gen[k] for k in e.logprobs}

    def usage_of(self, job: Job, choices: list[Choice]) -> dict:
        """The job's ``usage`` (chat / completions shape); cached tokens counted once per prompt."""
        cached = sum(getattr(c.handle.metrics, "cached_tokens", 0) for c in choices[::job.n])
        return usage(sum(map(len, job.prompts)), sum(len(c.ids) for c in choices), cached)

    def _logprobs(self, job: Job, c: Choice, ids: list[int], lps: list[TokenLogprob], offset: int) -> dict | None:
        if job.logprobs is None:
            return None
        names = [self._token(t) for t in ids]
        tops = [[self._token(t) for t, _ in lp.top] for lp in lps]
        if job.chat:
            return chat_logprobs(names, lps, tops)
        c.offset = offset + sum(map(len, names))
        return completion_logprobs(names, lps, tops, offset)

    def _token(self, t: int) -> str:
        return self.tok.decode([t], skip_special_tokens=False) if self.tok is not None else f"token_id:{t}"

    def model_card(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "shapeplan",
                "max_model_len": self.context}


def _final_message(job: Job, c: Choice) -> tuple[dict, str | None]:
    """A finished chat choice's assistant message and finish reason: its reasoning apart (``--reasoning-parser``),
    the rest parsed for tool calls when the job has tools."""
    thought, text = split(c.text.sent, job.thinking) if job.reasoning else (None, c.text.sent)
    message, finish = _tool_message(text, c.finish) if job.tools else ({"role": "assistant", "content": text},
                                                                       c.finish)
    if thought is not None:
        message["reasoning_content"] = thought
    return message, finish


def _tool_message(text: str, finish: str | None) -> tuple[dict, str | None]:
    """An answer that may hold tool calls: the assistant message and its finish reason ("tool_calls"
    when it called any)."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"role": "assistant", "content": text}, finish
    return {"role": "assistant", "content": content or None, "tool_calls": [c.to_openai() for c in calls]}, "tool_calls"


def _first(*xs: Any) -> Any:
    return next(x for x in xs if x is not None)


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _watch(receive: Receive, choices: list[Choice]) -> asyncio.Task:
    """A task that aborts every choice as soon as the client disconnects."""
    async def wait() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        for c in choices:
            c.abort()
    return asyncio.ensure_future(wait())


async def _merged(choices: list[Choice]) -> AsyncIterator[tuple[Choice, TokenEvent]]:
    """The events of every choice in arrival order (one choice: its handle directly)."""
    if len(choices) == 1:
        async for ev in choices[0].handle:
            yield choices[0], ev
        return
    q: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        async for ev in c.handle:
            q.put_nowait((c, ev))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    live = len(choices)
    try:
        while live:
            c, ev = await q.get()
            live -= ev.finish_reason is not None
            yield c, ev
    finally:
        for t in tasks:
            t.cancel()
