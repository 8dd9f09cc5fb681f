"""xgrammar glue: compile a ``Constraint`` for a tokenizer (cached) and follow one request with a matcher.

xgrammar is imported here only, and only when a constraint is used (``pip install 'shapeplan[structured]'``).
Its TokenizerInfo is built from our tokenizer file (no download); the stop tokens are the pipeline's
EOS ids, so the grammar lets a request end only where its text is complete. Compiled grammars are cached
per (tokenizer, vocabulary size, stop ids) and constraint: a repeated schema costs a dict lookup.
"""
from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from shapeplan.errors import ConstraintError
from shapeplan.llm.constraint import TOOL_CLOSE, TOOL_OPEN, Constraint
from shapeplan.llm.tokenizer import Tokenizer
from shapeplan.llm.xgrammar_gaps import Utf8Guard, json_strings_fix


def xgrammar() -> Any:
    try:
        import xgrammar as xgr
    except ImportError:
        raise ConstraintError("structured output needs the xgrammar package: pip install 'shapeplan[structured]'") \
            from None
    return xgr


#: a next-token mask allowing at most this many tokens is where the grammar may force a run (below)
NARROW = 32


@dataclass(slots=True, eq=False)
class GrammarState:
    """One request's matcher. ``accepted``: generated tokens it has taken (sampled or forced, in order);
    ``end``: the generated-token count at which the grammar ended (its stop token taken, or complete with
    nothing more allowed), -1 while it goes on; ``last_byte``: the last byte of the text so far.

    Forced runs: where the next mask is narrow (at most NARROW tokens) and the grammar forces a
    continuation, the request commits to xgrammar's tokens of it (``run``) and each next mask allows
    only the run's next token. The serving core may take the whole run at once (a prefill) or decode it
    in lockstep with the batch: the tokens are the same, and they depend on the request's own tokens only,
    so a seeded constrained request gives the same text in any batch."""
    matcher: Any
    constraint: Constraint
    grammars: "Grammars"
    accepted: int = 0
    end: int = -1
    last_byte: int = -1
    run: list[int] = field(default_factory=list)     # committed forced tokens, not yet taken
    _ruled: int = -1                                # ``accepted`` when the forced-run rule last ran

    def ended(self, generated: int) -> bool:
        return 0 <= self.end <= generated

    def _took(self, token: int) -> None:
        self.accepted += 1
        if self.run:
            self.run = self.run[1:] if self.run[0] == token else []
        b = self.grammars.utf8.token_bytes(token)
        if b:
            self.last_byte = b[-1]
        if self.matcher.is_terminated():
            self.end = self.accepted

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise ConstraintError(f"token {token} was sampled outside the mask of {self.constraint.describe()} "
                                  f"(after {self.accepted} tokens)")
        self._took(token)

    def take(self, tokens: list[int]) -> list[int]:
        """Accept ``tokens`` while the grammar takes them; returns the accepted prefix."""
        out = []
        for t in tokens:
            if self.end >= 0 or not self.matcher.accept_token(t):
                self.run = []
                break
            self._took(t)
            out.append(t)
        return out

    def catch_up(self, generated: list[int]) -> None:
        """Take the generated tokens this matcher has not seen yet (a first token, picked by the prefill)."""
        for t in generated[self.accepted:]:
            if self.end >= 0:
                return
            self.accept(t)

    def fill(self, bitmask: Any, i: int) -> None:
        """Row ``i`` of ``bitmask`` (int32, CPU): the tokens allowed next (all, once the grammar ended)."""
        fill_rows([(i, self)], bitmask)

    def forced_run(self) -> list[int]:
        """The committed forced tokens (the rule run now if it has not for this state; see the class)."""
        if self.end < 0 and not self.run and self._ruled != self.accepted:
            import torch
            scratch = torch.empty(1, self.grammars.utf8.width, dtype=torch.int32)
            self.fill(scratch, 0)
        return self.run

    def _filled(self, row: Any) -> None:
        """After the matcher filled ``row``: the end of a grammar without a stop token, the UTF-8 guard,
        the forced-run rule."""
        if self.matcher.is_completed() and not bool(row.any()):    # complete, and no stop token to allow
            self.end = self.accepted
            row.fill_(-1)
            return
        self.grammars.utf8.restrict(row, self.last_byte)
        a = row.numpy()
        if self.run:                  # a run from our own tokenizer (older xgrammar): checked token by token
            if (int(a[self.run[0] // 32]) >> (self.run[0] % 32)) & 1:
                _one_hot(row, self.run[0])
                return
            self.run = []
        self._ruled = self.accepted
        if _allows_at_most(a, NARROW):
            ids = self._forced()
            if ids and (int(a[ids[0] // 32]) >> (ids[0] % 32)) & 1:
                self.run = ids
                _one_hot(row, ids[0])

    def _forced(self) -> list[int]:
        m = self.matcher
        if self.grammars.jump_tokens:
            return list(m.find_jump_forward_tokens())
        s = m.find_jump_forward_string()
        return self.grammars.tokenizer.encode(s, add_special_tokens=False) if s else []


def _allows_at_most(words: Any, most: int) -> bool:
    import numpy as np
    nz = np.flatnonzero(words)
    return len(nz) <= most and sum((w & 0xFFFFFFFF).bit_count() for w in words[nz].tolist()) <= most


def _one_hot(row: Any, token: int) -> None:
    row.fill_(0)
    bit = 1 << (token % 32)
    row[token // 32] = bit - (1 << 32) if bit >= 1 << 31 else bit


#: constrained rows from which a step's masks are filled by xgrammar's thread pool (BatchGrammarMatcher),
#: where the host has the cores for it (``_pool``); fewer rows are filled one by one
BATCH_FILL_ROWS = 8
_pool_state: list = []


def _pool() -> Any:
    """xgrammar's BatchGrammarMatcher on a host with 8 or more cores, else None (on 2 shared cores its
    threads cost more than they save: 390 us vs 13 us for 8 masks of a 128k vocabulary)."""
    if not _pool_state:
        import os
        xgr = xgrammar()
        ok = (os.cpu_count() or 1) >= 8 and hasattr(xgr, "BatchGrammarMatcher")
        _pool_state.append(xgr.BatchGrammarMatcher() if ok else None)
    return _pool_state[0]


def fill_rows(rows: list[tuple[int, GrammarState]], bitmask: Any, pool: Any = None) -> None:
    """Fill ``bitmask[i]`` (int32 [B, W], CPU) for every (i, state) in ``rows``: each state's next-token
    mask (all ones once its grammar ended). ``pool``: a BatchGrammarMatcher to use (default: ``_pool()``
    when there are BATCH_FILL_ROWS live rows or more)."""
    live = []
    for i, st in rows:
        if st.end >= 0:
            bitmask[i].fill_(-1)
        elif st.run and st.grammars.jump_tokens:     # inside a committed run of xgrammar's tokens
            _one_hot(bitmask[i], st.run[0])
        else:
            live.append((i, st))
    if pool is None and len(live) >= BATCH_FILL_ROWS:
        pool = _pool()
    if pool is not None and live:
        pool.batch_fill_next_token_bitmask([st.matcher for _, st in live], bitmask, [i for i, _ in live])
    else:
        for i, st in live:
            st.matcher.fill_next_token_bitmask(bitmask, i)
    for i, st in live:
        st._filled(bitmask[i])


class Grammars:
    """Compiled grammars for one tokenizer, model vocabulary and stop set; thread-safe (requests compile
    their constraint on the caller's thread, so a bad schema raises at submit)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: tuple[int, ...], max_entries: int = 512) -> None:
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, stop_ids
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._compiler: Any = None
        self.hits = self.misses = 0
        self.jump_tokens = False
        self.utf8: Utf8Guard = None  # type: ignore[assignment]

    @property
    def compiler(self) -> Any:
        if self._compiler is None:
            with self._lock:
                if self._compiler is None:
                    xgr = xgrammar()
                    info = tokenizer_info(self.tokenizer, self.vocab_size, self.stop_ids)
                    self.utf8 = Utf8Guard(_raw_vocab(info, self.stop_ids), self.vocab_size)
                    self.jump_tokens = hasattr(xgr.GrammarMatcher, "find_jump_forward_tokens")
                    self._compiler = xgr.GrammarCompiler(info)
        return self._compiler

    def compile(self, c: Constraint) -> Any:
        with self._lock:
            got = self._compiled.get(c)
            if got is not None:
                self._compiled.move_to_end(c)
                self.hits += 1
                return got
        compiler = self.compiler
        try:
            got = _compile(compiler, c)
        except ConstraintError:
            raise
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError with the reason
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ConstraintError(f"{c.kind}: xgrammar cannot compile it: {_clean(msg)}") from None
        with self._lock:
            self.misses += 1
            self._compiled[c] = got
            while len(self._compiled) > self.max_entries:
                self._compiled.popitem(last=False)
        return got

    def start(self, c: Constraint) -> GrammarState:
        return GrammarState(xgrammar().GrammarMatcher(self.compile(c)), c, self)


_BY_TOKENIZER: "weakref.WeakKeyDictionary[Tokenizer, dict[tuple, Grammars]]" = weakref.WeakKeyDictionary()
_BY_LOCK = threading.Lock()


def grammars_for(tokenizer: Tokenizer, vocab_size: int, stop_ids: tuple[int, ...]) -> Grammars:
    """The shared ``Grammars`` of (tokenizer, vocabulary size, stop ids)."""
    with _BY_LOCK:
        per = _BY_TOKENIZER.setdefault(tokenizer, {})
        key = (vocab_size, tuple(sorted(stop_ids)))
        if key not in per:
            per[key] = Grammars(tokenizer, vocab_size, key[1])
        return per[key]


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, stop_ids: tuple[int, ...]) -> Any:
    """xgrammar's TokenizerInfo from our tokenizer (its ``tokenizers`` object wrapped as a fast HF
    tokenizer, so xgrammar detects byte-level / byte-fallback vocabularies as it does for HF models)."""
    xgr = xgrammar()
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend())
    stops = list(stop_ids) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None)
    return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stops)


def _raw_vocab(info: Any, stop_ids: tuple[int, ...]) -> list[bytes]:
    """Each token's bytes as xgrammar reads them (special tokens: none)."""
    vocab = list(info.decoded_vocab)
    for t in set(info.special_token_ids) | set(stop_ids):
        if 0 <= t < len(vocab):
            vocab[t] = b""
    return vocab


def _compile(compiler: Any, c: Constraint) -> Any:
    ws = dict(any_whitespace=False) if c.whitespace == "compact" else \
        dict(any_whitespace=True, max_whitespace_cnt=c.max_whitespace)
    if c.kind == "json_object":
        return compiler.compile_json_schema({"type": "object"}, strict_mode=False, **ws)
    if c.kind == "json_schema":
        return compiler.compile_json_schema(json.dumps(json_strings_fix(c.schema)), **ws)
    if c.kind == "regex":
        return compiler.compile_regex(c.spec)
    if c.kind == "grammar":
        return compiler.compile_grammar(c.spec)
    if c.kind == "choice":
        return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in c.choices))
    return compiler.compile_structural_tag(tool_call_tag(c))


def tool_call_tag(c: Constraint) -> dict[str, Any]:
    """The structural tag of a tool_call constraint: one tag per tool, ``<tool_call>\\n{"name": "NAME",
    "arguments": `` + its parameters as compact JSON + ``}\\n</tool_call>``; "auto" lets free text
    around calls (the tag starts at the trigger ``<tool_call>``), "required" / a name allow calls only."""
    xgr = xgrammar()
    tools = c.tools if c.tool_choice in ("auto", "required") else [t for t in c.tools if t["name"] == c.tool_choice]
    ws = dict(any_whitespace=False) if c.whitespace == "compact" else \
        dict(any_whitespace=True, max_whitespace_cnt=c.max_whitespace)
    tags = []
    for t in tools:
        args = str(xgr.Grammar.from_json_schema(json.dumps(json_strings_fix(t["parameters"])), **ws))
        tags.append({"type": "tag", "begin": TOOL_OPEN + '{"name": ' + json.dumps(t["name"]) + ', "arguments": ',
                     "content": {"type": "grammar", "grammar": args}, "end": "}" + TOOL_CLOSE})
    one = not c.parallel or c.tool_choice not in ("auto", "required")
    if c.tool_choice == "auto":
        fmt = {"type": "triggered_tags", "triggers": [TOOL_OPEN.strip()], "tags": tags, "stop_after_first": one}
    else:
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
               "stop_after_first": one}
    return {"type": "structural_tag", "format": fmt}


def _clean(msg: str) -> str:
    """xgrammar's message without its C++ source location prefix ("[time] file.cc:123: ")."""
    import re
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", msg)
