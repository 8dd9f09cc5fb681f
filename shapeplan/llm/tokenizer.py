"""Tokenizer (Hugging Face ``tokenizers``), chat template (jinja2) and incremental detokenization."""
from __future__ import annotations

import functools
import json
import os
import threading
import weakref
from datetime import datetime
from typing import Any

from shapeplan.errors import InputError, ModelError
from shapeplan.llm.config import read_json


class Tokenizer:
    def __init__(self, path: str, *, background: bool = False) -> None:
        """``path``'s tokenizer.json (and tokenizer_config.json, chat_template.jinja). ``background``: the
        file is parsed on a thread (a llama-3 vocabulary takes 0.2-0.4 s; ``tokenizers`` holds the GIL
        meanwhile, so this overlaps only work that lets the GIL go), and the first use of the tokenizer, or
        ``wait()``, waits for it and raises its error."""
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.exists(tj):
            raise ModelError(f"{path}: no tokenizer.json (a fast tokenizer file is needed)")
        self._parsed: Any = None
        self._error: ModelError | None = None
        self._thread: threading.Thread | None = None
        self._json = tj
        from shapeplan import _tokproc
        self._helper = _tokproc.take(tj)         # a command started a process that parses it (shapeplan/_tokproc.py)
        if self._helper is not None:
            weakref.finalize(self, self._helper.close)
        if self._helper is None and background:
            self._thread = threading.Thread(target=self._parse, args=(tj,), name="shapeplan-tokenizer", daemon=True)
            self._thread.start()
        elif self._helper is None:
            self._parse(tj)
            self.wait()
        cfg: dict[str, Any] = {}
        tc = os.path.join(path, "tokenizer_config.json")
        if os.path.exists(tc):
            cfg = read_json(tc)
        jt = os.path.join(path, "chat_template.jinja")
        if cfg.get("chat_template") is None and os.path.exists(jt):
            with open(jt, encoding="utf-8") as f:
                cfg = {**cfg, "chat_template": f.read()}
        self._configure(cfg)

    @classmethod
    def from_tokenizer(cls, tok: Any, config: dict[str, Any]) -> "Tokenizer":
        """From a built ``tokenizers.Tokenizer`` and a tokenizer_config-like dict (bos_token,
        eos_token, add_bos_token, chat_template); the GGUF importer uses it."""
        self = cls.__new__(cls)
        self._parsed, self._error, self._thread, self._helper, self._json = tok, None, None, None, "<built>"
        self._configure(config)
        return self

    def _parse(self, tj: str) -> None:
        from tokenizers import Tokenizer as _Tok
        try:
            self._parsed = _Tok.from_file(tj)
        except Exception as e:  # noqa: BLE001 - any parse failure is the file's: reported by wait()
            self._error = ModelError(f"{tj}: cannot load tokenizer: {e}")

    def wait(self) -> "Tokenizer":
        """The parse finished (at once unless ``background`` or a helper process parses it); its
        ``ModelError`` if it failed. A helper that is gone is replaced by a parse here."""
        t = self._thread                       # (another thread may be waiting too)
        if t is not None:
            t.join()
            self._thread = None
        if self._helper is not None and self._parsed is None and self._error is None:
            from shapeplan import _tokproc
            try:
                self._helper.wait()
                self._parsed = self._helper
            except _tokproc.ParseError as e:
                self._error = ModelError(f"{self._json}: cannot load tokenizer: {e}")
                self._drop_helper()
            except _tokproc.HelperError:
                self._parse_here()
        if self._error is not None:
            raise self._error
        return self

    @functools.cached_property
    def _tok(self) -> Any:
        """What encodes and decodes: the ``tokenizers.Tokenizer``, or the helper process that parsed it
        (``shapeplan/_tokproc.py``: the same calls); a background parse waited for once, later reads a
        plain attribute, since every encode / decode goes through it."""
        return self.wait()._parsed

    def backend(self) -> Any:
        """The ``tokenizers.Tokenizer`` object itself (parsed here if a helper process had parsed it: for
        what needs the object, e.g. xgrammar's vocabulary)."""
        self.wait()
        if self._helper is not None and self._parsed is self._helper:
            self._parse(self._json)                   # (encode / decode keep going through the helper)
            if self._error is not None:
                raise self._error
        return self._parsed

    def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        """``self._tok.method(...)``; a helper process that is gone is replaced by a parse here, once."""
        from shapeplan import _tokproc
        try:
            return getattr(self._tok, method)(*args, **kw)
        except _tokproc.HelperError:
            self._parse_here()
            return getattr(self._tok, method)(*args, **kw)

    def _drop_helper(self) -> None:
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.close()

    def _parse_here(self) -> None:
        """The helper process is gone: parse the file in this process instead (``_tok`` then reads it)."""
        self._drop_helper()
        self._parse(self._json)
        self.__dict__.pop("_tok", None)

    def _configure(self, cfg: dict[str, Any]) -> None:
        """The special tokens and chat template of a tokenizer_config-like dict; their ids are looked up at
        first use (a background parse may still run)."""
        self.config = cfg
        self.chat_template: str | None = _default_template(cfg.get("chat_template"))
        self.bos_token = _token_str(cfg.get("bos_token"))
        self.eos_token = _token_str(cfg.get("eos_token"))
        self._add_bos = bool(cfg.get("add_bos_token", False))

    @functools.cached_property
    def bos_token_id(self) -> int | None:
        return self._call("token_to_id", self.bos_token) if self.bos_token else None

    @functools.cached_property
    def eos_token_id(self) -> int | None:
        return self._call("token_to_id", self.eos_token) if self.eos_token else None

    @property
    def add_bos(self) -> bool:
        return self._add_bos and self.bos_token_id is not None

    @property
    def vocab_size(self) -> int:
        return self._call("get_vocab_size")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self._call("encode", text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids  # type: ignore[list-item]
        return ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self._call("decode", ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                            tools: list[dict[str, Any]] | None = None) -> str:
        """Render ``messages`` with the checkpoint's jinja2 chat template (sandboxed); ``tools``: OpenAI
        tool definitions, for templates that describe them to the model (as transformers passes them)."""
        if not self.chat_template:
            # no template: a plain transcript, the least surprising fallback
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + ("assistant: " if add_generation_prompt else "")
        return _compiled(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")


def _raise_exception(msg: str) -> None:
    raise ModelError(f"chat template: {msg}")


@functools.lru_cache(maxsize=1)
def _template_environment() -> Any:
    """The one sandboxed jinja2 environment chat templates are parsed and rendered in (as transformers sets it up)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=False)
    return env


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """A chat template compiled once (compiling it took ~100x its render: it ran on every chat request)."""
    return _template_environment().from_string(template)


def _default_template(t: Any) -> str | None:
    """A tokenizer_config's ``chat_template``: a string, or a list of named ones (``[{"name", "template"}]``,
    as some checkpoints ship their tool-use variant beside it): the one named ``default``."""
    if isinstance(t, list):
        named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
        t = named.get("default")
    return t if isinstance(t, str) else None


def read_chat_template(value: str, flag: str = "--chat-template") -> str:
    """A chat template given on the command line: a file's text (a path that exists), else the text itself when
    it is jinja2 (``{{`` or ``{%`` in it). Checked to parse; an InputError names ``flag`` otherwise."""
    from jinja2 import TemplateSyntaxError
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"{flag} {value}: cannot read it: {e}") from None
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise InputError(f"{flag}: {value!r} is neither a file nor a jinja2 template (no '{{{{' or '{{%' in it)")
    try:
        _template_environment().parse(text)
    except TemplateSyntaxError as e:
        raise InputError(f"{flag}: the template does not parse: line {e.lineno}: {e.message}") from None
    return text


def _token_str(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


class StreamDecoder:
    """Turns a growing list of token ids into text deltas, holding back an incomplete UTF-8 tail."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta
