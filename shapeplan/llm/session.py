"""Requests' results and conversations: GenerationResult, Session (a conversation whose K/V stays in
the cache between turns) and TextStream (text deltas with stop-string hold-back)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, Sequence

from shapeplan.errors import InputError, LifecycleError
from shapeplan.llm.metrics import Metrics
from shapeplan.llm.sampling import Sampling
from shapeplan.llm.tokenizer import StreamDecoder

if TYPE_CHECKING:
    from shapeplan.llm.pipeline import GenerationPipeline


@dataclass(slots=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str                 # "stop" (EOS / stop string) or "length"
    metrics: Metrics = field(default_factory=Metrics)


class Session:
    """A conversation: ``tokens`` is the whole context so far, ``cached`` how many of them have valid
    K/V in the KV blocks the session holds (the last generated token is not yet in them). Each turn is
    one request to the serving core that takes those blocks over, so only the new tokens are prefilled;
    ``close()`` gives the blocks back (their full blocks stay in the prefix cache when it is on)."""

    def __init__(self, pipe: GenerationPipeline) -> None:
        self.pipe = pipe
        self.tokens: list[int] = []
        self.cached = 0
        self.messages: list[dict[str, str]] = []
        self.closed = False
        self._last: Any = None                    # the last turn's Sequence, whose blocks the session holds

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._give_back()

    def _give_back(self) -> None:
        last, self._last = self._last, None
        if last is not None and last.blocks:
            blocks, last.blocks = last.blocks, []
            self.pipe.batch.release_blocks(blocks)

    def _new_ids(self, prompt: str | Sequence[int], chat: bool) -> list[int]:
        pipe = self.pipe
        if chat and isinstance(prompt, str):
            if pipe.tokenizer is None:
                raise InputError("chat needs a tokenizer")
            self.messages.append({"role": "user", "content": prompt})
            full = pipe.tokenizer.encode(pipe.tokenizer.apply_chat_template(self.messages),
                                         add_special_tokens=False)
            common = 0
            for a, b in zip(full, self.tokens):
                if a != b:
                    break
                common += 1
            self.cached = min(self.cached, common)
            self.tokens = self.tokens[:self.cached]
            return full[self.cached:]
        return pipe.encode(prompt, add_special_tokens=not self.tokens)

    def stream_tokens(self, prompt: str | Sequence[int], max_new_tokens: int = 256,
                      sampling: Sampling | None = None, *, chat: bool = False,
                      truncate: str | None = None) -> Generator[tuple[list[int], str | None, Any], None, None]:
        if self.closed:
            raise LifecycleError("session is closed")
        pipe = self.pipe
        sampling = sampling or Sampling.greedy()
        new = self._new_ids(prompt, chat)
        room = pipe.max_kv_cache_length - 1                   # context tokens that leave room to generate
        if not self.tokens and len(new) > room and truncate == "left":
            warnings.warn(f"prompt of {len(new)} tokens left-truncated to {room}", stacklevel=3)
            new = new[-room:]
        context = self.tokens[:self.cached] + self.tokens[self.cached:] + new
        if not new and len(context) == len(self.tokens):
            raise InputError("empty prompt: nothing to generate from")
        if len(context) > room:
            raise InputError(f"the context ({self.cached} cached + {len(context) - self.cached} new tokens) "
                             f"does not fit the KV cache of max_kv_cache_length={pipe.max_kv_cache_length} tokens "
                             f"with room to generate" + ("" if self.tokens else " (truncate='left' keeps the last tokens)"))
        handle = pipe.batch.submit(context, max_new_tokens=max_new_tokens, sampling=sampling, keep_blocks=True,
                                   reuse=self._last, reuse_tokens=self.cached)
        if self._last is not None and self._last.blocks:    # not taken over (nothing reusable): give back
            self._give_back()
        self._last = None
        try:
            for ev in handle:
                if ev.finish_reason is None:
                    yield ev.token_ids, None, None
                    continue
                handle.raise_for_error()
                seq = handle.sequence
                generated = list(handle.token_ids)
                eos_cut = next((i + 1 for i, t in enumerate(generated) if t in pipe.eos_token_ids), None)
                generated = generated[:eos_cut] if eos_cut else generated
                self.tokens = context + generated
                self.cached = min(seq.computed, len(self.tokens) - 1)
                self._last = seq                            # the session keeps this turn's blocks
                if chat:
                    self.messages.append({"role": "assistant", "content": pipe.decode(generated)})
                yield ev.token_ids, ev.finish_reason, (handle.metrics, new, generated)
                return
        finally:
            # the caller stopped reading, or the turn failed: its blocks (and this session's, which it took
            # over) go back to the pool, and the next turn prefills the whole conversation
            if self._last is None:
                self.cached = 0
                pipe.batch.drop_kept(handle)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 256, sampling: Sampling | None = None,
               **kw: Any) -> "TextStream":
        return TextStream(self.stream_tokens(prompt, max_new_tokens, sampling, **kw), self.pipe, sampling)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, sampling: Sampling | None = None,
                 *, chat: bool = False, truncate: str | None = None,
                 on_text: Callable[[str], None] | None = None) -> GenerationResult:
        stream = self.stream(prompt, max_new_tokens, sampling, chat=chat, truncate=truncate)
        for delta in stream:
            if on_text is not None:
                on_text(delta)
        assert stream.result is not None
        return stream.result


class TextStream:
    """``for delta in pipe.stream(...)``: text as it is produced; ``.result`` afterwards."""

    def __init__(self, events: Generator[tuple[list[int], str | None, Any], None, None], pipe: GenerationPipeline,
                 sampling: Sampling | None, session: Session | None = None) -> None:
        self._events, self._pipe, self._session = events, pipe, session
        self._stops = (sampling or Sampling()).stop
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        pipe = self._pipe
        text = StopText(pipe.tokenizer, self._stops)
        try:
            for ids, finish, extra in self._events:
                if finish is not None:
                    metrics, prompt_ids, generated = extra
                    delta = text.finish(pipe.decode(generated))
                    if delta:
                        yield delta
                    self.result = GenerationResult(text.sent, generated, prompt_ids, finish, metrics)
                    return
                delta = text.push(ids)
                if delta:
                    yield delta
        finally:
            self._events.close()            # a stream left early ends its request now (Session.stream_tokens)
            if self._session is not None:
                self._session.close()


class StopText:
    """The text of a request's generated tokens as deltas, cut before the first stop string: while
    tokens arrive (``push``) a tail that could begin a stop string is held back, so a stream never shows
    part of one; ``finish`` gives the rest from the final text. ``sent`` is everything given so far.
    Without a tokenizer every delta is empty."""

    def __init__(self, tokenizer: Any, stops: tuple[str, ...]) -> None:
        self._dec = StreamDecoder(tokenizer) if tokenizer is not None else None
        self.stops = stops
        self.sent = ""

    def push(self, ids: list[int]) -> str:
        if self._dec is None or not ids:
            return ""
        self._dec.push(ids)
        safe = _until_stop(self._dec.emitted, self.stops, hold=True)
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            delta, self.sent = safe[len(self.sent):], safe
            return delta
        return ""

    def finish(self, text: str) -> str:
        """The delta that completes ``text`` (all generated tokens decoded), cut at a stop string."""
        text = _until_stop(text, self.stops, hold=False)
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return delta


def _until_stop(text: str, stops: tuple[str, ...], *, hold: bool) -> str:
    """``text`` cut before the first stop string; with ``hold``, also without a tail that could be
    the start of a stop string completed by later tokens (so a stream never shows part of one)."""
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    if cut >= 0:
        return text[:cut]
    if hold:
        for k in range(min(len(text), max((len(s) for s in stops), default=1) - 1), 0, -1):
            if any(s.startswith(text[-k:]) for s in stops):
                return text[:-k]
    return text
