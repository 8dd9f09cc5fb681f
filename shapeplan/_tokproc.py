"""tokenizer.json parsed in a helper process, for the ``generate`` and ``chat`` commands.

``tokenizers`` holds the GIL while it parses a file (a llama-3 vocabulary: 0.24 s on the dev box, 0.4-0.5 s
on the H200's machines), so a thread cannot hide the parse: the Python work beside it waits (measured:
docs/benchmarks/decode.md, twenty-first session). A command knows its checkpoint as it starts, so it starts
a small Python process (``tokenizers`` and ``json`` only, no torch) that parses the file while the command
imports shapeplan.llm and loads the weights, then answers the few calls shapeplan's Tokenizer makes
(encode, decode, token_to_id, get_vocab_size: one JSON line each way over a pipe; a decode of a few hundred
ids is ~0.1 ms). The answers are the library's own, from the same file. Anything else that wants the
``tokenizers`` object itself (structured output's xgrammar) gets one parsed in this process then.

If the helper cannot start, or dies, the Tokenizer parses the file in this process as it would have;
a file that does not parse gives the same ``ModelError`` either way. This module imports nothing heavy:
the command starts the helper before it imports shapeplan.llm.
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

#: the helper: parse argv[1], say so (or why not), then answer one JSON request per line
_HELPER = r"""
import json, sys, time
out = sys.stdout
try:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
except Exception as e:
    out.write(json.dumps({"error": str(e)}) + "\n")
    out.flush()
    sys.exit(0)
out.write(json.dumps({"ok": True, "t": time.time()}) + "\n")
out.flush()
for line in sys.stdin:
    op, args = json.loads(line)
    try:
        if op == "encode":
            r = tok.encode(args[0], add_special_tokens=args[1]).ids
        elif op == "decode":
            r = tok.decode(args[0], skip_special_tokens=args[1])
        elif op == "token_to_id":
            r = tok.token_to_id(args[0])
        else:
            r = tok.get_vocab_size()
        res = {"r": r}
    except Exception as e:
        res = {"error": str(e)}
    out.write(json.dumps(res) + "\n")
    out.flush()
"""

_started: dict[str, "TokenizerProcess"] = {}
#: (name, start, end) on the perf_counter clock: each helper's start and the moment it had parsed its file
#: (``generate --timings`` prints them with the warm-up's parts)
timeline: list[tuple[str, float, float]] = []


@atexit.register
def _close_unclaimed() -> None:                  # helpers no Tokenizer took (e.g. the load failed first)
    for helper in _started.values():
        helper.close()
    _started.clear()


class HelperError(RuntimeError):
    """The helper is gone (it could not start, or died): parse in this process instead."""


class ParseError(ValueError):
    """The helper could not parse the file (the message is the library's)."""


class _Encoding:
    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class TokenizerProcess:
    """The helper process of one tokenizer.json: the subset of ``tokenizers.Tokenizer`` that shapeplan's
    Tokenizer calls. Calls are serialized (one request in flight)."""

    def __init__(self, tokenizer_json: str) -> None:
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self.started = time.perf_counter()
        self.parsed: float | None = None          # when the helper had parsed the file (perf_counter clock), once known
        self._error: str | None = None
        try:
            self._p = subprocess.Popen([sys.executable, "-c", _HELPER, tokenizer_json], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                       encoding="utf-8", bufsize=1)
        except OSError as e:
            raise HelperError(f"cannot start the tokenizer process: {e}") from None

    def wait(self) -> None:
        """Block until the helper has parsed the file; ParseError with the library's message if the file
        does not parse, HelperError if the helper is gone."""
        with self._lock:
            if self._ready is None:
                line = self._p.stdout.readline() if self._p.stdout else ""
                msg = _message(line)
                self._ready = msg is not None and "ok" in msg
                if self._ready and isinstance(msg.get("t"), (int, float)):    # its wall clock, on ours
                    self.parsed = time.perf_counter() - max(0.0, time.time() - msg["t"])
                    timeline.append(("tokenizer", self.started, self.parsed))
                self._error = None if msg is None else msg.get("error")
        if self._error is not None:
            raise ParseError(self._error)
        if not self._ready:
            raise HelperError("the tokenizer process ended before it answered")

    def _call(self, op: str, *args: Any) -> Any:
        self.wait()
        with self._lock:
            try:
                self._p.stdin.write(json.dumps([op, list(args)]) + "\n")
                self._p.stdin.flush()
                line = self._p.stdout.readline()
            except (OSError, ValueError) as e:        # a closed pipe: the helper is gone
                raise HelperError(f"the tokenizer process is gone: {e}") from None
        msg = _message(line)
        if msg is None:
            raise HelperError("the tokenizer process is gone, or said something else than an answer")
        if "error" in msg:
            raise ValueError(msg["error"])
        return msg["r"]

    def encode(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        return _Encoding(self._call("encode", text, add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._call("decode", [int(i) for i in ids], skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._call("token_to_id", token)

    def get_vocab_size(self) -> int:
        return self._call("vocab_size")

    def close(self) -> None:
        """End the helper (closing its stdin ends its loop) and close the pipes; again: nothing."""
        try:
            if self._p.stdin:
                self._p.stdin.close()
            self._p.wait(timeout=5)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self._p.kill()
            self._p.wait()
        if self._p.stdout:
            self._p.stdout.close()


def _message(line: str) -> dict | None:
    """One line of the helper's as a JSON object; None for an end of file or anything else (e.g. a library
    that printed to stdout): the helper is then not to be trusted, and the caller parses here."""
    try:
        msg = json.loads(line) if line else None
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and ("ok" in msg or "error" in msg or "r" in msg) else None


def start(model_dir: str) -> TokenizerProcess | None:
    """Start the helper for ``model_dir``/tokenizer.json (a checkpoint directory that has one; else None),
    so that the first ``Tokenizer(model_dir)`` of this process uses it (``take``). None too when the
    process cannot start (the Tokenizer then parses here)."""
    tj = os.path.abspath(os.path.join(model_dir, "tokenizer.json"))
    if not os.path.isfile(tj):
        return None
    if tj not in _started:
        try:
            _started[tj] = TokenizerProcess(tj)
        except HelperError:
            return None
    return _started[tj]


def start_for_command(model: str) -> None:
    """With ``SHAPEPLAN_TOKENIZER_PROCESS`` (auto: 2 or more CPUs for this process), start the helper for the
    checkpoint directory ``model`` (a generate / chat command as ``import shapeplan`` begins, shapeplan/_light.py;
    the commands and a keep-alive server again first thing; again for the same directory: nothing). With one
    CPU the parse would only take the command's own time; with two, started before torch's import, it runs
    beside that import (dev box, llama-1b: "config + tokenizer" 0.24-0.37 -> 0.000 s, the command 0.1-0.8 s
    shorter; started after the import, it had slowed the graph build by what it saved)."""
    from shapeplan import env
    mode = env.get("SHAPEPLAN_TOKENIZER_PROCESS")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if (mode == "on" or mode == "auto" and cpus >= 2) and os.path.isdir(model):
        start(model)


def take(tokenizer_json: str) -> TokenizerProcess | None:
    """The helper started for this tokenizer.json, handed over once (None if none was started)."""
    return _started.pop(os.path.abspath(tokenizer_json), None)
