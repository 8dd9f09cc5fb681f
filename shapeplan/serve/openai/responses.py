"""OpenAI's Responses API, ``POST /v1/responses``, over the same serving core as chat completions.

A request's ``instructions`` and ``input`` (a string, or items: messages, ``function_call`` items and their
``function_call_output`` s) become chat messages rendered with the checkpoint's template; ``text.format``
(``json_object``, ``json_schema``) and function ``tools`` become the chat path's constraint (structured
output, Hermes tool calls). The answer is a ``response`` object whose ``output`` holds one ``message`` item
(one ``output_text`` part) or the ``function_call`` items the model made. Streamed, it is OpenAI's sequence
of typed server-sent events: ``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` per engine read-back, the ``.done`` events,
then ``response.completed``, or ``response.incomplete`` when ``max_output_tokens`` cut the answer
(``response.failed`` if the engine failed it). A tool-call answer is parsed once complete, so its items come
at the end, each with one ``response.function_call_arguments.delta``.

Answers are kept in memory (``ResponseStore``: the last ``STORED`` of them, the oldest dropped first) unless a
request says ``store: false``: ``GET /v1/responses/{id}`` returns one, ``DELETE`` drops it, and a request with
``previous_response_id`` continues that conversation (its input and output items come before the new input; as
OpenAI's, its ``instructions`` are not carried over). An unknown id is a 404. ``background`` is a 400
(``unsupported_parameter``), as are input images and files, tools other than functions, reasoning settings,
``include`` and ``top_logprobs``. With ``shapeplan serve --reasoning-parser`` (reasoning.py) an answer's ``<think>
... </think>`` is a ``reasoning`` item (a ``reasoning_text`` part) before the message, streamed as
``response.reasoning_text.delta`` events; a reasoning item sent back as input is accepted and left out of the
prompt. vLLM's structured-output fields (``structured_outputs``, ``guided_*``) are taken as on the chat endpoint.
Sampling takes ``temperature`` and ``top_p`` and vLLM's extensions of the other endpoints (``top_k``, ``min_p``,
``repetition_penalty``, ``seed``, ``stop``, ``stop_token_ids``, ``ignore_eos``); ``metadata`` comes back as sent.
"""
from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal

from pydantic import BaseModel, Field, ValidationError

from shapeplan.errors import ConstraintError
from shapeplan.llm.constraint import Constraint, parse_tool_calls
from shapeplan.serve.openai import errors
from shapeplan.serve.openai.errors import BadRequest, NotFound, Unsupported
from shapeplan.serve.openai.generation import Choice, Job, OpenAIModel, Receive, _merged, _watch
from shapeplan.serve.openai.protocol import _INT64, _bad, _Strict, vllm_constraint
from shapeplan.serve.openai.reasoning import CLOSE, ReasoningStream, opens_reasoning, split


class ResponsesRequest(_Strict):
    model: str
    input: str | list[Any]                                   # items are checked one by one (_messages)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    text: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None                                  # (default true: kept in the ResponseStore)
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tool_calls: int | None = Field(None, ge=1)
    # vLLM's extensions, as on /v1/chat/completions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class _Part(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None                     # (an earlier answer's parts, sent back)
    logprobs: list[Any] | None = None


class _Message(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class _FunctionCall(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class _FunctionCallOutput(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None


class _Reasoning(_Strict):
    """An earlier answer's reasoning item, sent back: accepted and left out of the prompt (as chat templates
    leave out earlier turns' reasoning)."""
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


_ITEMS: dict[str, type[BaseModel]] = {"message": _Message, "function_call": _FunctionCall,
                                      "function_call_output": _FunctionCallOutput, "reasoning": _Reasoning}


@dataclass(slots=True)
class _Sampling:
    """What ``OpenAIModel._job`` reads of a request (the chat fields the Responses API lacks: their defaults)."""
    req: ResponsesRequest
    n: int = 1
    stream_options: None = None
    return_token_ids: bool = False
    logit_bias: None = None
    presence_penalty: None = None
    frequency_penalty: None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.req, name)


#: answers the ResponseStore keeps (the oldest dropped first)
STORED = 1024


@dataclass(slots=True)
class _Stored:
    response: dict
    history: list[dict[str, Any]]          # the chat messages up to this answer's input (no instructions)


class ResponseStore:
    """Finished answers by id, with the chat messages that led to them, the newest ``size`` of them. Used on the
    event loop's thread only."""

    def __init__(self, size: int = STORED) -> None:
        self.size = size
        self._items: OrderedDict[str, _Stored] = OrderedDict()

    def put(self, response: dict, history: list[dict[str, Any]]) -> None:
        self._items[response["id"]] = _Stored(response, history)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, rid: str, param: str | None = None) -> _Stored:
        if rid not in self._items:
            raise NotFound(f"no response with id '{rid}' (this server keeps the last {self.size} stored responses)",
                           param)
        return self._items[rid]

    def delete(self, rid: str) -> dict:
        self.get(rid)
        del self._items[rid]
        return {"id": rid, "object": "response", "deleted": True}

    def conversation(self, rid: str) -> list[dict[str, Any]]:
        """The chat messages of a stored answer's conversation, its own output included."""
        st = self.get(rid, "previous_response_id")
        return st.history + _items_to_messages(st.response["output"], "previous_response_id")


@dataclass(slots=True)
class ResponseJob:
    req: ResponsesRequest
    job: Job
    history: list[dict[str, Any]]          # the conversation before this answer (no instructions): what is stored
    store: ResponseStore
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)
    reasoning_id: str = field(default_factory=lambda: "rs_" + uuid.uuid4().hex)

    def keep(self, response: dict) -> dict:
        """``response``, kept in the store unless the request said ``store: false``."""
        if self.req.store is not False:
            self.store.put(response, self.history)
        return response


def responses_job(model: OpenAIModel, req: ResponsesRequest, store: ResponseStore) -> ResponseJob:
    """A validated request as a chat job (one choice); BadRequest / Unsupported name what is wrong."""
    _refuse_unsupported(req)
    shim = _Sampling(req)
    model._check_common(shim)
    if model.tok is None:
        raise BadRequest(f"the model '{model.name}' has no tokenizer, so no chat template: use /v1/completions "
                         "with token ids", "input")
    tools = [_chat_tool(t, i) for i, t in enumerate(req.tools or [])]
    try:
        constraint = Constraint.from_openai(_response_format(req.text), tools or None,
                                            _chat_tool_choice(req.tool_choice), req.parallel_tool_calls is not False)
    except ConstraintError as e:
        raise BadRequest(str(e), "tools" if req.tools or req.tool_choice else "text.format") from None
    guided, param = vllm_constraint(req)
    if guided is not None and constraint is not None:
        raise BadRequest(f"{param} and {'tools' if req.tools else 'text.format'} both constrain the answer: give one",
                         param)
    constraint = constraint or guided
    history = (store.conversation(req.previous_response_id) if req.previous_response_id else []) + _input(req)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    ids = model.render(system + history, tools, "input")
    job = model._job(shim, True, [ids], req.max_output_tokens, req.max_output_tokens is not None, None, "input",
                     "max_output_tokens", constraint)
    job.tools = constraint is not None and constraint.kind == "tool_call"
    if model.reasoning:                        # --reasoning-parser: <think> ... </think> as a reasoning item
        job.reasoning, job.thinking = True, opens_reasoning(model.decode(ids[-16:]))
    job.id = "resp_" + uuid.uuid4().hex
    return ResponseJob(req, job, history, store)


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.background:
        raise Unsupported("background responses are not supported", "background")
    if req.truncation == "auto":
        raise Unsupported("truncation 'auto' is not supported: an input longer than the context is refused",
                          "truncation")
    if req.reasoning:
        raise Unsupported("reasoning settings are not supported", "reasoning")
    if req.include:
        raise Unsupported(f"include {req.include[0]!r} is not supported", "include")
    if req.top_logprobs:
        raise Unsupported("top_logprobs is not supported on /v1/responses (use /v1/chat/completions)",
                          "top_logprobs")
    if req.max_tool_calls is not None:
        raise Unsupported("max_tool_calls is not supported", "max_tool_calls")


def _item(raw: dict[str, Any], i: int, param: str) -> BaseModel:
    kind = raw.get("type", "message")
    cls = _ITEMS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise Unsupported(f"input item type {kind!r} is not supported (supported: {', '.join(_ITEMS)})",
                          f"{param}.{i}.type")
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise _bad({**err, "loc": (param, i, *err["loc"])}) from None


def _text(content: str | list[dict[str, Any]], param: str) -> str:
    """A message's (or a function output's) text: a string, or text parts joined by newlines."""
    if isinstance(content, str):
        return content
    texts = []
    for j, raw in enumerate(content):
        if raw.get("type") not in ("input_text", "output_text"):
            raise Unsupported(f"content part type {raw.get('type')!r} is not supported (text only: input_text, "
                              "output_text)", f"{param}.{j}.type")
        try:
            texts.append(_Part.model_validate(raw).text)
        except ValidationError as e:
            err = e.errors()[0]
            raise _bad({**err, "loc": (*param.split("."), j, *err["loc"])}) from None
    return "\n".join(texts)


def _input(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages of the request's ``input`` (``instructions`` not included)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    if not req.input:
        raise BadRequest("the input is empty", "input")
    return _items_to_messages(req.input, "input")


def _items_to_messages(items: list[Any], param: str) -> list[dict[str, Any]]:
    """Items (input items, or a stored answer's output items) as chat messages: consecutive function calls join
    one assistant message's ``tool_calls``, each output is a ``tool`` message, as the chat endpoint takes them."""
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(items):
        if not isinstance(raw, dict):
            raise BadRequest(f"invalid type for '{param}.{i}': expected an object", f"{param}.{i}", "invalid_type")
        item = _item(raw, i, param)
        if isinstance(item, _Message):
            out.append({"role": item.role, "content": _text(item.content, f"{param}.{i}.content")})
        elif isinstance(item, _Reasoning):
            continue
        elif isinstance(item, _FunctionCall):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": _text(item.output, f"{param}.{i}.output")})
    return out


def _chat_tool(t: dict[str, Any], i: int) -> dict[str, Any]:
    """A Responses function tool (``{"type": "function", "name", "parameters", ...}``) in the chat shape."""
    if t.get("type") != "function":
        raise Unsupported(f"tool type {t.get('type')!r} is not supported (function tools only)", f"tools.{i}.type")
    if not isinstance(t.get("name"), str) or not t["name"]:
        raise BadRequest("a function tool needs a 'name' string", f"tools.{i}.name")
    fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise BadRequest("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                             "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as the chat endpoint's ``response_format``."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest(f"text.format must be an object, got {type(fmt).__name__}", "text.format")
    if fmt.get("type") == "json_schema":
        if "schema" not in fmt:
            raise BadRequest("text.format json_schema needs a 'schema'", "text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "schema"), "schema": fmt["schema"]}}
    return fmt


# ---------------------------------------------------------------------------- answers
def _usage(model: OpenAIModel, job: Job, choices: list[Choice]) -> dict:
    """The chat answer's usage in the Responses API's names."""
    u = model.usage_of(job, choices)
    return {"input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"]}


def _response(model: OpenAIModel, rj: ResponseJob, status: str, output: list[dict], usage: dict | None,
              error: dict | None = None) -> dict:
    req, job = rj.req, rj.job
    s = job.samplings[0]
    return {"id": job.id, "object": "response", "created_at": job.created, "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": model.name,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": None, "store": req.store is not False,
            "temperature": s.temperature,
            "top_p": s.top_p, "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "truncation": "disabled",
            "usage": usage, "user": req.user, "metadata": req.metadata or {}}


def _message(rj: ResponseJob, text: str, status: str) -> dict:
    return {"type": "message", "id": rj.message_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _function_calls(text: str) -> tuple[str, list[dict]]:
    """(the text outside tool-call blocks, the calls as ``function_call`` items)."""
    rest, calls = parse_tool_calls(text)
    return rest, [{"type": "function_call", "id": "fc_" + c.id.removeprefix("call_"), "call_id": c.id,
                   "name": c.name, "arguments": c.arguments, "status": "completed"} for c in calls]


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _reasoning(rj: ResponseJob, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": rj.reasoning_id, "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def _reasoning_status(c: Choice) -> str:
    """A reasoning item is complete once ``</think>`` came; else it is as the answer is."""
    return "completed" if CLOSE in c.text.sent else _status(c.finish)


def _output(rj: ResponseJob, c: Choice) -> list[dict]:
    """The answer's output items: its reasoning (``--reasoning-parser``, when it has any), then the function
    calls of a tool answer that made any, else one message."""
    status = _status(c.finish)
    thought, text = split(c.text.sent, rj.job.thinking) if rj.job.reasoning else (None, c.text.sent)
    out = [_reasoning(rj, thought, _reasoning_status(c))] if thought else []
    if rj.job.tools:
        rest, calls = _function_calls(text)
        if calls:
            return out + ([_message(rj, rest, status)] if rest else []) + calls
    return out + [_message(rj, text, status)]


async def complete(model: OpenAIModel, rj: ResponseJob, choices: list[Choice], receive: Receive) -> dict | None:
    """The whole response object, or None when the client went away first."""
    watcher = _watch(receive, choices)
    c = choices[0]
    try:
        async for ev in c.handle:
            c.take(ev, model.decode)
    finally:
        watcher.cancel()
        c.abort()
    if c.finish == "abort":
        return None
    if c.finish == "error":
        raise c.error or RuntimeError("the engine failed this request")
    return rj.keep(_response(model, rj, _status(c.finish), _output(rj, c), _usage(model, rj.job, choices)))


def _event(kind: str, seq: int, **body: Any) -> bytes:
    data = json.dumps({"type": kind, "sequence_number": seq, **body}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


async def stream(model: OpenAIModel, rj: ResponseJob, choices: list[Choice], receive: Receive) -> AsyncIterator[bytes]:
    """The answer as OpenAI's Responses stream events (module doc). A message (or reasoning) item opens with its
    first text; with ``--reasoning-parser`` the reasoning item streams first and closes when the answer begins."""
    watcher = _watch(receive, choices)
    c, seq, job = choices[0], 0, rj.job
    think = ReasoningStream(job.thinking) if job.reasoning else None
    items: list[str] = []                  # the streamed items' kinds, by output index
    thought: list[str] = []                # the reasoning streamed so far

    def ev(kind: str, **body: Any) -> bytes:
        nonlocal seq
        seq += 1
        return _event(kind, seq - 1, **body)

    def ref(kind: str) -> dict:
        return {"item_id": rj.reasoning_id if kind == "reasoning" else rj.message_id,
                "output_index": items.index(kind), "content_index": 0}

    def opened(kind: str) -> list[bytes]:
        items.append(kind)
        if kind == "reasoning":
            empty, part = {**_reasoning(rj, "", "in_progress"), "content": []}, {"type": "reasoning_text", "text": ""}
        else:
            empty = {**_message(rj, "", "in_progress"), "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [ev("response.output_item.added", output_index=len(items) - 1, item=empty),
                ev("response.content_part.added", **ref(kind), part=part)]

    def delta(kind: str, text: str) -> bytes:
        if kind == "reasoning":
            return ev("response.reasoning_text.delta", **ref(kind), delta=text)
        return ev("response.output_text.delta", **ref(kind), delta=text, logprobs=[])

    def closed(kind: str, text: str, status: str) -> list[bytes]:
        if kind == "reasoning":
            return [ev("response.reasoning_text.done", **ref(kind), text=text),
                    ev("response.content_part.done", **ref(kind), part={"type": "reasoning_text", "text": text}),
                    ev("response.output_item.done", output_index=items.index(kind), item=_reasoning(rj, text, status))]
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return [ev("response.output_text.done", **ref(kind), text=text, logprobs=[]),
                ev("response.content_part.done", **ref(kind), part=part),
                ev("response.output_item.done", output_index=items.index(kind), item=_message(rj, text, status))]

    def text_deltas(r: str, t: str) -> list[bytes]:
        """Events for new reasoning ``r`` and new answer text ``t`` (items opened and closed as they begin)."""
        out = []
        if r:
            out += (opened("reasoning") if "reasoning" not in items else []) + [delta("reasoning", r)]
            thought.append(r)
        if t:
            if "message" not in items:
                if "reasoning" in items:
                    out += closed("reasoning", "".join(thought), "completed")
                out += opened("message")
            out.append(delta("message", t))
        return out

    try:
        head = _response(model, rj, "in_progress", [], None)
        yield ev("response.created", response=head)
        yield ev("response.in_progress", response=head)
        async for _, e in _merged(choices):
            new, _, _ = c.take(e, model.decode)
            if c.finish == "abort":
                return                                       # the client is gone: nobody reads on
            if c.finish == "error":
                err = errors.body(c.error or RuntimeError("the engine failed this request"))["error"]
                yield ev("response.failed", response=_response(model, rj, "failed", [], None,
                                                               {"code": "server_error", "message": err["message"]}))
                return
            if job.tools:                                    # a tool answer is parsed once complete
                continue
            r, t = think.push(new, final=c.finish is not None) if think else ("", new)
            for b in text_deltas(r, t):
                yield b
        status, output = _status(c.finish), _output(rj, c)
        if not job.tools:
            if "message" not in items:                       # an empty answer, or one cut while reasoning
                if "reasoning" in items:
                    for b in closed("reasoning", "".join(thought), _reasoning_status(c)):
                        yield b
                for b in opened("message"):
                    yield b
            for b in closed("message", output[-1]["content"][0]["text"], status):
                yield b
        else:
            for i, item in enumerate(output):
                if item["type"] in ("message", "reasoning"):
                    kind = item["type"]
                    text = item["content"][0]["text"]
                    for b in opened(kind) + ([delta(kind, text)] if text else []) + closed(kind, text, item["status"]):
                        yield b
                    continue
                yield ev("response.output_item.added", output_index=i,
                         item={**item, "arguments": "", "status": "in_progress"})
                yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                         delta=item["arguments"])
                yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                         name=item["name"], arguments=item["arguments"])
                yield ev("response.output_item.done", output_index=i, item=item)
                items.append("function_call")
        final = rj.keep(_response(model, rj, status, output, _usage(model, rj.job, choices)))
        yield ev(f"response.{status}", response=final)
    finally:
        watcher.cancel()
        c.abort()
