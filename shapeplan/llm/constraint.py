"""Structured-output constraints: what a request's text must match (``Sampling(constraint=...)``).

A ``Constraint`` is plain data (hashable: the grammar cache's key); nothing here imports xgrammar,
which compiles it (shapeplan/llm/grammar.py) when a request uses it. Builders::

    Constraint.json_object()                       any JSON object
    Constraint.json_schema(schema)                 a dict, a JSON string or a pydantic model class
    Constraint.regex(pattern)
    Constraint.grammar(ebnf)                       xgrammar's EBNF (GBNF-like), root rule ``root``
    Constraint.choice(["yes", "no"])               exactly one of the strings
    Constraint.tool_call(tools, choice="auto")     "auto" | "required" | a tool's name
    Constraint.from_openai(response_format=..., tools=..., tool_choice=...)

JSON is compact by default: ``", "`` and ``": "`` separators, no other whitespace, so a model cannot
emit whitespace forever; ``whitespace="flexible"`` allows any JSON whitespace (runs of at most
``max_whitespace`` characters). Tool calls are written in the Hermes format that many chat templates
use, one block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

``parse_tool_calls(text)`` turns generated text back into ``ToolCall``s (``.to_openai()``).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from shapeplan.errors import ConstraintError

KINDS = ("json_object", "json_schema", "regex", "grammar", "choice", "tool_call")
TOOL_OPEN, TOOL_CLOSE = "<tool_call>\n", "\n</tool_call>"


@dataclass(frozen=True, slots=True)
class Constraint:
    """One request's output constraint. Build it with the class methods; ``spec`` holds the schema,
    pattern, grammar, choices or tools as compact text (equal constraints compare and hash equal; a
    schema keeps its key order, which is the order the properties are generated in)."""
    kind: str
    spec: str = ""
    whitespace: str = "compact"       # JSON: "compact" | "flexible"
    max_whitespace: int = 8           # "flexible": the longest whitespace run
    tool_choice: str = "auto"         # tool_call: "auto" | "required" | a tool's name
    parallel: bool = True             # tool_call: more than one call allowed

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"constraint kind must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.whitespace not in ("compact", "flexible"):
            raise ConstraintError(f"whitespace must be 'compact' or 'flexible', got {self.whitespace!r}")
        if self.max_whitespace < 1:
            raise ConstraintError(f"max_whitespace must be >= 1, got {self.max_whitespace}")

    # ------------------------------------------------------------------ builders
    @classmethod
    def json_object(cls, *, whitespace: str = "compact", max_whitespace: int = 8) -> "Constraint":
        return cls("json_object", "", whitespace, max_whitespace)

    @classmethod
    def json_schema(cls, schema: Any, *, whitespace: str = "compact", max_whitespace: int = 8) -> "Constraint":
        """``schema``: a JSON Schema as a dict, a JSON string, or a pydantic model class."""
        return cls("json_schema", _canonical(_schema_dict(schema)), whitespace, max_whitespace)

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError(f"regex: expected a non-empty pattern string, got {pattern!r}")
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, ebnf: str) -> "Constraint":
        """An EBNF grammar in xgrammar's syntax (``root ::= ...``; llama.cpp's GBNF is close)."""
        if not isinstance(ebnf, str) or not ebnf.strip():
            raise ConstraintError("grammar: expected EBNF text with a root rule (root ::= ...)")
        return cls("grammar", ebnf)

    @classmethod
    def choice(cls, options: list[str] | tuple[str, ...]) -> "Constraint":
        opts = list(options) if isinstance(options, (list, tuple)) else None
        if not opts or not all(isinstance(o, str) and o for o in opts):
            raise ConstraintError(f"choice: expected a non-empty list of non-empty strings, got {options!r}")
        return cls("choice", json.dumps(opts, ensure_ascii=False))

    @classmethod
    def tool_call(cls, tools: list[dict[str, Any]], choice: str | dict[str, Any] = "auto", *,
                  parallel: bool = True) -> "Constraint":
        """``tools``: OpenAI-style ``{"type": "function", "function": {"name", "description",
        "parameters"}}`` or flat ``{"name", "parameters"}`` dicts. ``choice``: "auto" (text, or calls
        whose arguments follow their schema), "required" (one or more calls, nothing else), or a tool's
        name / OpenAI's ``{"type": "function", "function": {"name": ...}}`` (exactly one call of it).
        ``parallel=False``: at most one call."""
        norm = _tools(tools)
        name = _choice_name(choice)
        if name not in ("auto", "required") and name not in {t["name"] for t in norm}:
            raise ConstraintError(f"tool_choice names {name!r}, which is not among the tools "
                                  f"({', '.join(t['name'] for t in norm)})")
        return cls("tool_call", _canonical(norm), tool_choice=name, parallel=parallel)

    @classmethod
    def from_openai(cls, response_format: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None,
                    tool_choice: str | dict[str, Any] | None = None,
                    parallel_tool_calls: bool = True) -> "Constraint | None":
        """The constraint of an OpenAI chat-completions request, or None when it has none.

        ``tools`` with ``tool_choice`` "auto" (the default), "required" or a named function give a
        ``tool_call`` constraint; "none" (or no tools) leaves ``response_format``:
        ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"name", "schema",
        "strict"}}`` or ``{"type": "text"}``. Raises ``ConstraintError`` naming what is wrong."""
        if tools and (tool_choice or "auto") != "none":
            return cls.tool_call(tools, tool_choice or "auto", parallel=parallel_tool_calls)
        if tool_choice not in (None, "none", "auto") and not tools:
            raise ConstraintError("tool_choice is set but no tools were given")
        if response_format is None:
            return None
        if not isinstance(response_format, dict):
            raise ConstraintError(f"response_format must be an object, got {type(response_format).__name__}")
        kind = response_format.get("type")
        if kind in (None, "text"):
            return None
        if kind == "json_object":
            return cls.json_object()
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise ConstraintError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}")
            return cls.json_schema(spec["schema"])
        raise ConstraintError(f"response_format type must be text, json_object or json_schema; got {kind!r}")

    # ------------------------------------------------------------------ views
    @property
    def schema(self) -> dict[str, Any] | None:
        return json.loads(self.spec) if self.kind == "json_schema" else None

    @property
    def tools(self) -> list[dict[str, Any]]:
        return json.loads(self.spec) if self.kind == "tool_call" else []

    @property
    def choices(self) -> list[str]:
        return json.loads(self.spec) if self.kind == "choice" else []

    def describe(self) -> str:
        text = self.spec if len(self.spec) <= 80 else self.spec[:77] + "..."
        return f"{self.kind}({text})" if text else self.kind


# ---------------------------------------------------------------------------------------- tool calls
@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str                    # the arguments object as JSON text
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def to_openai(self) -> dict[str, Any]:
        """An entry of an OpenAI chat completion's ``message.tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


_CALL = re.compile(re.escape(TOOL_OPEN.strip()) + r"\s*(.*?)\s*" + re.escape(TOOL_CLOSE.strip()), re.S)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside complete tool-call blocks, stripped; the calls in order). A block that does not
    hold ``{"name": str, "arguments": object}`` is left in the text; so is an unfinished one (a request
    cut by ``max_new_tokens``). A finish reason of "tool_calls" fits when the list is not empty."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    last = 0
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and isinstance(obj.get("arguments"), dict)):
            continue
        kept.append(text[last:m.start()])
        last = m.end()
        calls.append(ToolCall(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False)))
    kept.append(text[last:])
    return "".join(kept).strip(), calls


# ---------------------------------------------------------------------------------------- helpers
def _canonical(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _schema_dict(schema: Any) -> dict[str, Any] | bool:
    if hasattr(schema, "model_json_schema"):                     # a pydantic model class
        schema = schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"json_schema: the schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError(f"json_schema: expected a dict, a JSON string or a pydantic model, "
                              f"got {type(schema).__name__}")
    return schema


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ConstraintError("tool_call: expected a non-empty list of tools")
    out, seen = [], set()
    for i, t in enumerate(tools):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(t, dict) and t.get("type", "function") != "function":
            raise ConstraintError(f"tools[{i}]: only function tools are supported, got type {t.get('type')!r}")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise ConstraintError(f"tools[{i}]: a function name of 1-64 letters, digits, '_', '.' or '-' is "
                                  f"needed, got {name!r}")
        if name in seen:
            raise ConstraintError(f"tools[{i}]: the name {name!r} is used twice")
        seen.add(name)
        params = fn.get("parameters")
        params = {"type": "object"} if params is None else _schema_dict(params)
        out.append({"name": name, "parameters": params})
    return out


def _choice_name(choice: Any) -> str:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if isinstance(name, str):
            return name
    raise ConstraintError(f"tool_choice must be 'auto', 'required', a tool's name or "
                          f"{{'type': 'function', 'function': {{'name': ...}}}}; got {choice!r}")
