"""A request inside the serving engine (``Sequence``) and the caller's side of it (``RequestHandle``).

The engine thread owns every Sequence; callers hold a RequestHandle, which receives ``TokenEvent``s
through a thread-safe queue (and, for asyncio callers, through their event loop) and can abort.
"""
from __future__ import annotations

import asyncio
import enum
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from shapeplan.errors import RequestAborted, ShapeplanError
from shapeplan.llm.batch.blocks import ROOT
from shapeplan.llm.sampling import Sampling


class Status(enum.Enum):
    WAITING = "waiting"          # queued, or preempted (its blocks freed: recomputed when readmitted)
    PREFILLING = "prefilling"    # admitted: blocks and a state slot held, prompt being prefilled in chunks
    RUNNING = "running"          # decoding
    FINISHED = "finished"


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (log-softmax of its raw logits) and the
    ``top`` most likely tokens at that position as (token id, log-probability), most likely first."""
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class TokenEvent:
    """New tokens of one request. ``finish_reason`` is set on the last event: "stop" (EOS or a stop
    string), "length" (max_new_tokens or the context is full), "abort", or "error" (``error`` says why).
    ``logprobs``: one entry per token in ``token_ids``, for a request submitted with ``logprobs=``."""
    token_ids: list[int]
    finish_reason: str | None = None
    error: BaseException | None = None
    time: float = 0.0
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True, eq=False)
class Sequence:
    rid: int
    tokens: list[int]                       # the prompt, then every generated token kept so far
    prompt_len: int
    max_new_tokens: int
    sampling: Sampling
    seed: int
    eos: frozenset[int]
    handle: "RequestHandle"
    arrival: float = field(default_factory=time.perf_counter)
    status: Status = Status.WAITING
    blocks: list[int] = field(default_factory=list)
    computed: int = 0                       # leading tokens whose K/V are in ``blocks``
    slot: int = -1                          # sampling-state row while admitted
    admitted_slot: int = -1                 # the slot whose sampling state the runner has written
    registered: int = 0                     # leading blocks entered into the prefix cache
    chain: int = ROOT                       # prefix-cache chain key after them
    cached_tokens: int = 0                  # tokens served by the prefix cache at the first admission
    preemptions: int = 0
    finish: str | None = None
    token_times: dict[int, float] = field(default_factory=dict)   # generated index -> host time it was known
    keep_blocks: bool = False               # a session keeps the blocks when the request ends
    prefill_bucket: int = 0
    host_syncs: int = 0
    constraint: Any = None                  # structured output: its GrammarState (shapeplan/llm/grammar.py)
    logprobs: int | None = None             # top log-probabilities wanted per token (None: no logprobs)
    admitted: float = 0.0                   # host time of the first admission (0: still waiting)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def prefill_target(self) -> int:
        """Tokens whose K/V must be written before decoding: the whole prompt for a new request (its
        last position gives the first token), all but the last token for a preempted one (that token is
        the next decode step's input)."""
        return len(self.tokens) if self.generated == 0 else len(self.tokens) - 1


class RequestHandle:
    """The caller's view of a submitted request: iterate ``TokenEvent``s (``for ev in handle``, or
    ``async for ev in handle`` inside an asyncio loop), ``abort()``, ``result()``.

    Events pass through a thread-safe queue; a handle created inside a running asyncio loop (the
    servers) also gets them through that loop (``call_soon_threadsafe``), so ``async for`` never blocks
    the loop."""

    def __init__(self, rid: int, prompt_ids: list[int], abort: Callable[["RequestHandle"], None],
                 on_finish: Callable[["RequestHandle"], Any] | None = None) -> None:
        self.request_id = rid
        self.prompt_token_ids = prompt_ids
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.metrics: Any = None
        self.sequence: Sequence | None = None            # the engine's record (read it after the end only)
        self._abort = abort
        self._on_finish = on_finish
        self._q: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        self._ended = False
        self._done = threading.Event()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            self._aq: asyncio.Queue[TokenEvent] | None = asyncio.Queue()
        except RuntimeError:
            self._loop = self._aq = None

    # ---- engine side (the engine thread calls these)
    def push(self, ev: TokenEvent) -> None:
        if self._done.is_set():
            return
        self.token_ids.extend(ev.token_ids)
        if ev.finish_reason is not None:
            self.finish_reason, self.error = ev.finish_reason, ev.error
            if self._on_finish is not None:
                self._on_finish(self)
        self._q.put(ev)
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, ev)
            except RuntimeError:               # the caller's loop has closed: nobody listens there
                self._loop = None
        if ev.finish_reason is not None:
            self._done.set()

    # ---- caller side
    @property
    def finished(self) -> bool:
        return self._done.is_set()

    @property
    def queue_time(self) -> float | None:
        """Seconds from submission to the first admission (a state slot and KV blocks granted); None
        while the request still waits (or never got in)."""
        s = self.sequence
        return s.admitted - s.arrival if s is not None and s.admitted else None

    def abort(self) -> None:
        """Stop the request now: its KV blocks are freed at the engine's next step and the last event
        has ``finish_reason="abort"``. Aborting a finished request does nothing."""
        if not self._done.is_set():
            self._abort(self)

    def __iter__(self) -> Iterator[TokenEvent]:
        while True:
            ev = self._q.get()
            yield ev
            if ev.finish_reason is not None:
                return

    def __aiter__(self) -> "RequestHandle":
        if self._aq is None:
            raise ShapeplanError("async iteration needs a handle submitted from inside a running asyncio loop")
        return self

    async def __anext__(self) -> TokenEvent:
        if self._aq is None or self._ended:
            raise StopAsyncIteration
        ev = await self._aq.get()
        self._ended = ev.finish_reason is not None
        return ev

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def raise_for_error(self) -> None:
        if self.finish_reason == "error" and self.error is not None:
            raise self.error
        if self.finish_reason == "abort":
            raise RequestAborted(f"request {self.request_id} was aborted")
