"""The OpenAI request bodies this server accepts and the JSON pieces it answers with.

Requests are pydantic models in strict mode with unknown fields forbidden, so a wrong type (``"n":
"2"``), an out-of-range value (``max_tokens: 0``) or a misspelt field is a 400 that names the field
(``parse``). Answers are plain dicts: a stream builds one per chunk, so they are kept cheap.

Beyond OpenAI's fields, vLLM's structured-output extensions (``structured_outputs``, ``guided_json`` / ``_regex`` /
``_choice`` / ``_grammar``: ``vllm_constraint``) and six more of its extensions: ``top_k``, ``min_p``,
``repetition_penalty`` (sampling), ``stop_token_ids`` (end after any of these tokens, even with ``ignore_eos``),
``ignore_eos`` (run to ``max_tokens``: benchmarks) and ``return_token_ids`` (every choice and chunk also carries
its token ids: how ``shapeplan bench --serve`` counts tokens, even on a checkpoint-less preset that has no
tokenizer).
"""
from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shapeplan.llm.batch import TokenLogprob
from shapeplan.llm.constraint import Constraint
from shapeplan.llm.model import TOP_LOGPROBS
from shapeplan.serve.openai.errors import BadRequest

_INT64 = 1 << 63


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)                     # -1 or 0: off (vLLM)
    min_p: float | None = Field(None, ge=0, le=1)             # 0: off (vLLM)
    stop_token_ids: list[int] | None = None                   # (vLLM) end after any of these tokens
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    stop: str | list[str] | None = None
    repetition_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    # vLLM's structured-output extensions (one of them at most; chat's response_format / tools not beside them)
    structured_outputs: dict[str, Any] | None = None          # {json | regex | choice | grammar | json_object: ...}
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)                    # OpenAI's default; null: the rest of the context
    # (0: only with echo, to score a prompt)
    logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None        # an assistant turn that called tools
    tool_call_id: str | None = None                       # a tool's answer

    def for_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        for k in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)                  # the older name of max_completion_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


class TokenizeRequest(_Strict):
    """vLLM's ``POST /tokenize``: a prompt, or chat messages rendered with the chat template."""
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True                       # (prompt) the tokenizer's BOS
    add_generation_prompt: bool = True                    # (messages) the template's assistant prefix
    tools: list[dict[str, Any]] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    """vLLM's ``POST /detokenize``."""
    model: str | None = None
    tokens: list[int]


#: vLLM's structured-output kinds -> the Constraint each makes of its value
_VLLM_KINDS = {"json": Constraint.json_schema, "regex": Constraint.regex, "choice": Constraint.choice,
               "grammar": Constraint.grammar, "json_object": lambda _: Constraint.json_object()}


def vllm_constraint(req: Any) -> tuple[Any, str] | tuple[None, None]:
    """(the Constraint of vLLM's structured-output fields, the field that gave it), or (None, None). More than
    one of them, or a value the constraint cannot take, is a BadRequest naming the field."""
    from shapeplan.errors import ConstraintError
    given = [(f"guided_{k}", k, getattr(req, f"guided_{k}")) for k in ("json", "regex", "choice", "grammar")
             if getattr(req, f"guided_{k}") is not None]
    so = req.structured_outputs or {}
    given += [(f"structured_outputs.{k}", k, v) for k, v in so.items() if v is not None and v is not False]
    if not given:
        return None, None
    if len(given) > 1:
        raise BadRequest(f"give one structured-output constraint, not {len(given)} ({', '.join(g[0] for g in given)})",
                         given[1][0])
    param, kind, value = given[0]
    if kind not in _VLLM_KINDS:
        raise BadRequest(f"unknown field '{param}' (structured_outputs takes {', '.join(_VLLM_KINDS)})", param,
                         "unknown_parameter")
    try:
        return _VLLM_KINDS[kind](value), param
    except ConstraintError as e:
        raise BadRequest(str(e), param) from None


_EXPECTED = {"prompt": "a string, an array of strings, an array of token ids or an array of arrays of token ids",
             "stop": "a string or an array of strings", "content": "a string or an array of text parts"}

R = TypeVar("R", bound=BaseModel)


def parse(cls: type[R], raw: bytes) -> R:
    """``raw`` (the request body) as ``cls``, or a BadRequest naming the first field at fault."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:    # bad JSON or UTF-8, an integer of 4,300+ digits, deep nesting
        raise BadRequest(f"the request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise _bad(e.errors()[0]) from None


def _bad(err: dict) -> BadRequest:
    path = [p for p in err["loc"] if isinstance(p, int) or ("[" not in p and p not in ("str", "int", "float"))]
    param = ".".join(str(p) for p in path) or None
    field = next((p for p in reversed(path) if isinstance(p, str)), "")
    if err["type"] == "extra_forbidden":
        return BadRequest(f"unknown field '{param}'", param, "unknown_parameter")
    if err["type"] == "missing":
        return BadRequest(f"'{param}' is required", param, "missing_required_parameter")
    if field in _EXPECTED and len(err["loc"]) > len(path):      # a union member's error: say what fits
        return BadRequest(f"invalid type for '{param}': expected {_EXPECTED[field]}", param, "invalid_type")
    return BadRequest(f"invalid value for '{param}': {err['msg']}", param, "invalid_value")


# ---------------------------------------------------------------------------- answers
def usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def completion_logprobs(tokens: list[str], lps: list[TokenLogprob], top_text: list[list[str]], offset: int) -> dict:
    """The legacy completions ``logprobs`` object of some tokens; ``offset``: text before the first."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    tops = []
    for names, lp in zip(top_text, lps):
        top: dict[str, float] = {}
        for s, (_, v) in zip(names, lp.top):
            top.setdefault(s, v)                # keyed by text: of two tokens with one text, the likelier
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps], "top_logprobs": tops,
            "text_offset": offsets}


def chat_logprobs(tokens: list[str], lps: list[TokenLogprob], top_text: list[list[str]]) -> dict:
    """The chat ``logprobs`` object (``content``: one entry per token, with its top alternatives)."""
    return {"content": [{"token": t, "logprob": lp.logprob, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())}
                                          for s, (_, v) in zip(names, lp.top)]}
                        for t, lp, names in zip(tokens, lps, top_text)]}
