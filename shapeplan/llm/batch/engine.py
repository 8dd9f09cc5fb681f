"""BatchEngine: the serving core's thread. Callers ``submit`` requests (any thread); one engine thread
owns the scheduler, the block manager and every engine call (DESIGN invariant 10), and streams each
request's tokens back through its RequestHandle.

A step: take new requests and aborts from the inbox, ask the scheduler for a plan, copy shared blocks
that a request is about to write into, run the prefill chunks (new requests' first tokens are read
back at once: exact time to first token), then one decode round for every running request, read its
tokens back once, and hand each request its new tokens; finished requests free their blocks and slots
before the next step. An exception in a step fails the requests of that step only (each gets an
"error" event naming the cause); the engine goes on serving the others.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Callable, Sequence as Seq

import torch

from shapeplan import diagnostics, env
from shapeplan.errors import CapacityError, ConstraintError, InputError, QueueFullError
from shapeplan.llm.batch.blocks import BlockManager
from shapeplan.llm.batch.runner import ModelRunner, Readback, unpack
from shapeplan.llm.batch.scheduler import Scheduler, StepPlan
from shapeplan.llm.batch.sequence import RequestHandle, Sequence, Status, TokenEvent, TokenLogprob
from shapeplan.llm.model import TOP_LOGPROBS
from shapeplan.llm.metrics import compute
from shapeplan.llm.sampling import Sampling


class BatchEngine:
    def __init__(self, runner: ModelRunner, scheduler: Scheduler, blocks: BlockManager, *, vocab_size: int,
                 max_model_len: int, eos_token_ids: Seq[int] = (), decode_text: Callable[[list[int]], str] | None = None,
                 max_waiting: int = 4096, on_start: Callable[[], None] | None = None, structured: Any = None) -> None:
        self.runner, self.scheduler, self.blocks = runner, scheduler, blocks
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.eos = frozenset(eos_token_ids)
        self.decode_text = decode_text
        self.max_waiting = max_waiting
        self._on_start = on_start
        self.structured = structured            # constrained decoding (batch/constrained.py) or None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._live: dict[int, Sequence] = {}
        self._readback = Readback(runner.device)
        self._stopping = False
        self._inflight: tuple[list[Sequence], tuple, int] | None = None    # a launched, unread decode round
        self.decode_rounds = 0                  # decode rounds launched (lifetime)
        self.async_rounds = 0                   # of them, launched before the previous one was read back
        # True, False or "auto" (SHAPEPLAN_LAUNCH_AHEAD; auto: every round on a GPU. H100, llama-1b: a lone
        # stream +2.8 %, 4 / 16 / 64 requests at once +3-5 %, the OpenAI server's 8-64 streaming clients +5-15 %).
        # On the CPU a round runs inside its launch, so launching ahead overlaps nothing
        self.launch_ahead: bool | str = {"auto": "auto", "on": True, "off": False}[env.get("SHAPEPLAN_LAUNCH_AHEAD")]
        self.steps = 0
        self.finished_by_reason: dict[str, int] = {}
        self.prefill_tokens = 0                 # tokens computed by prefill calls (lifetime)
        self.generated_tokens = 0

    # ------------------------------------------------------------------ caller side
    def submit(self, prompt_ids: list[int], *, max_new_tokens: int, sampling: Sampling,
               ignore_eos: bool = False, keep_blocks: bool = False, reuse: Sequence | None = None,
               reuse_tokens: int = 0, logprobs: int | None = None) -> RequestHandle:
        """Queue a request; returns its handle at once. ``reuse``: a finished request of a session
        whose blocks were kept (``keep_blocks``): its first ``reuse_tokens`` tokens' K/V are taken over.
        ``logprobs``: each event carries its tokens' log-probabilities and the ``logprobs`` (0 to
        TOP_LOGPROBS) most likely tokens at each position."""
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise InputError("empty prompt: nothing to generate from")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InputError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        for what, named in (("logit_bias", [t for t, _ in sampling.logit_bias]),
                            ("stop_token_ids", sampling.stop_token_ids)):
            bad = [t for t in named if t >= self.vocab_size]
            if bad:
                raise InputError(f"{what} token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if logprobs is not None and not 0 <= logprobs <= TOP_LOGPROBS:
            raise InputError(f"logprobs must be 0 to {TOP_LOGPROBS} (top tokens per position), got {logprobs}")
        if len(ids) >= self.max_model_len:
            raise InputError(f"the prompt has {len(ids)} tokens; the context holds {self.max_model_len} "
                             f"(max_kv_cache_length) with room for at least one generated token")
        total = min(len(ids) + max_new_tokens, self.max_model_len)
        if self.blocks.blocks_for(total) > self.blocks.usable_blocks:
            raise CapacityError(f"a request of {len(ids)} prompt + {max_new_tokens} new tokens needs "
                                f"{self.blocks.blocks_for(total)} KV blocks; the pool has {self.blocks.usable_blocks} "
                                f"(raise kv_cache_bytes)")
        if self._inbox.qsize() + len(self.scheduler.waiting) >= self.max_waiting:
            raise QueueFullError(f"{self.max_waiting} requests are already waiting")
        grammar = None
        if sampling.constraint is not None and logprobs is not None:
            raise InputError("logprobs are not available for a request with a constraint (structured output) yet")
        if sampling.constraint is not None:             # compiled here: a bad schema raises at submit
            if self.structured is None:
                raise ConstraintError("structured output needs a pipeline with a tokenizer")
            grammar = self.structured.start(sampling.constraint, self.eos)
        rid = next(self._ids)
        handle = RequestHandle(rid, ids, self.abort)
        seed = sampling.resolved_seed()
        ends = (frozenset() if ignore_eos else self.eos) | frozenset(sampling.stop_token_ids)
        seq = Sequence(rid, list(ids), len(ids), max_new_tokens, sampling, seed, ends, handle, keep_blocks=keep_blocks,
                       constraint=grammar, logprobs=logprobs)
        if reuse is not None and reuse.blocks:
            seq.blocks, seq.computed = reuse.blocks, min(reuse_tokens, reuse.computed)
            seq.registered, seq.chain = min(reuse.registered, seq.computed // self.blocks.block_size), reuse.chain
            reuse.blocks = []
        handle.sequence = seq
        self._inbox.put(("add", seq))
        self._ensure_thread()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        self._inbox.put(("abort", handle.request_id))
        self._ensure_thread()

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result (or raise its error)."""
        box: list = []
        done = threading.Event()
        self._inbox.put(("call", fn, box, done))
        self._ensure_thread()
        if not done.wait(timeout):
            raise TimeoutError("the engine thread did not answer in time")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else None

    def post(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the engine thread soon, without waiting for it (start-up work)."""
        self._inbox.put(("call", fn, [], threading.Event()))
        self._ensure_thread()

    def release_blocks(self, blocks: list[int]) -> None:
        """Give back blocks a session kept (engine thread)."""
        if blocks:
            self.call(lambda: self.blocks.release(list(blocks)))

    def drop_kept(self, handle: RequestHandle) -> None:
        """A session's turn (``keep_blocks``) that ends without the session taking its blocks over (the caller
        stopped reading, or it failed): abort it if it still runs, then give back the blocks it holds, on the
        engine thread after the abort (the inbox keeps the order; nothing waits, so a generator finalised on
        the engine thread itself cannot deadlock). Without this an abandoned stream's blocks stayed out of the
        pool for good. Nothing once the engine is closed (the pool goes with it)."""
        if self._stopping:
            return
        seq = handle.sequence
        handle.abort()

        def give_back() -> None:
            blocks, seq.blocks = seq.blocks, []
            self.blocks.release(blocks)
        self.post(give_back)

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._stopping = True
            self._inbox.put(("stop",))
            self._thread.join(timeout=30)

    # ------------------------------------------------------------------ the thread
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._start_lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="shapeplan-engine", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        dev = self.runner.device
        if dev.type == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev.index)
        if self._on_start is not None:
            self._on_start()
        sched = self.scheduler
        while not self._stopping:
            self._intake(block=not sched.has_work and self._inflight is None)
            if self._stopping:
                break
            if self._inflight is not None:
                self._next_round()
            elif sched.has_work:
                self._step()

    def _intake(self, block: bool) -> None:
        while True:
            try:
                msg = self._inbox.get(block=block, timeout=None) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            kind = msg[0]
            if kind == "add":
                seq = msg[1]
                self._live[seq.rid] = seq
                self.scheduler.add(seq)
                if seq.constraint is not None:
                    self._jump_forward(seq, time.perf_counter())
            elif kind == "abort":
                seq = self._live.get(msg[1])
                if seq is not None:
                    self._end(seq, "abort")
            elif kind == "call":
                _, fn, box, done = msg
                try:
                    box.append(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    box.append(e)
                done.set()
            elif kind == "stop":
                self._stopping = True
                return

    def _end(self, seq: Sequence, reason: str, error: BaseException | None = None) -> None:
        """Finish ``seq`` (free its blocks and slot) and send its last event."""
        if seq.status is Status.FINISHED:
            return
        self.scheduler.finish(seq, reason)
        self._live.pop(seq.rid, None)
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
        now = time.perf_counter()
        times = seq.token_times
        end = times[max(times)] if times else now
        seq.handle.metrics = compute(seq.arrival, times, end, seq.generated,
                                     prompt_tokens=seq.prompt_len - seq.cached_tokens,
                                     host_syncs=seq.host_syncs, prefill_bucket=seq.prefill_bucket)
        seq.handle.metrics.cached_tokens = seq.cached_tokens
        seq.handle.push(TokenEvent([], reason, error, now))

    def _step(self) -> None:
        sched, runner = self.scheduler, self.runner
        plan = sched.schedule()
        self.steps += 1
        for seq, err in plan.failed:
            self._live.pop(seq.rid, None)
            self.finished_by_reason["error"] = self.finished_by_reason.get("error", 0) + 1
            seq.status = Status.FINISHED
            seq.handle.push(TokenEvent([], "error", err, time.perf_counter()))
        if plan.preempted:
            diagnostics.record("SCHEDULE", "requests preempted (KV blocks ran out)",
                               requests=[s.rid for s in plan.preempted])
        involved = [c.seq for c in plan.chunks] + plan.decode
        try:
            runner.copy_blocks(plan.copies)
            for seq in {id(s): s for s in involved}.values():
                if seq.slot >= 0 and seq.admitted_slot != seq.slot:
                    runner.admit(seq)
                    seq.admitted_slot = seq.slot
            self._prefill(plan)
            if plan.decode:
                self._decode(plan)
        except Exception as e:  # noqa: BLE001 - fail this step's requests, keep serving the others
            diagnostics.record("FALLBACK", "a serving step failed; its requests end with an error",
                               reason=f"{type(e).__name__}: {e}"[:300])
            for seq in {id(s): s for s in involved}.values():
                self._end(seq, "error", e)

    def _prefill(self, plan: StepPlan) -> None:
        firsts: list[tuple[Sequence, torch.Tensor]] = []
        chunks = [c for c in plan.chunks if c.seq.status is not Status.FINISHED]
        budget = self.scheduler.max_num_batched_tokens
        for group, rows, bucket in self.runner.prefill_groups(chunks, self.max_model_len, budget):
            tok = self.runner.prefill(group, rows, bucket)
            for i, chunk in enumerate(group):
                self.prefill_tokens += chunk.n
                self.scheduler.prefilled(chunk)
                if chunk.final and chunk.seq.generated == 0:
                    firsts.append((chunk.seq, tok[i]))
        if firsts:
            picks = [t.reshape(1, -1) for _, t in firsts]       # [1, 1] tokens or [1, W] packed logprobs
            width = max(p.shape[1] for p in picks)
            if width > 1:
                picks = [p if p.shape[1] == width else torch.nn.functional.pad(p.double(), (0, width - 1))
                         for p in picks]
            got = Readback.get(self._readback.request(torch.cat(picks)))
            now = time.perf_counter()
            for (seq, _), row in zip(firsts, got):
                seq.host_syncs += 1
                ids, lps = self._picks(seq, [row if width > 1 else row[0]])
                self._accept(seq, ids, now, logprobs=lps)

    def _decode(self, plan: StepPlan) -> None:
        self._inflight = self._launch(plan.decode, plan.steps)

    def _launch(self, rows: list[Sequence], steps: int) -> tuple[list[Sequence], tuple, int]:
        """A decode round of ``steps`` steps for ``rows``, launched: (rows, its read-back request, steps)."""
        self.decode_rounds += 1
        return rows, self._readback.request(self.runner.decode(rows, steps)), steps

    def _next_round(self) -> None:
        """A decode round is in flight. When nothing else waits (no new request, abort or prompt to
        prefill) and its rows can go on, launch their next round now, from the device-resident tokens
        and positions, before reading the in-flight one back: the device never waits for the host's
        bookkeeping between rounds (async scheduling). Then read the in-flight round's tokens and hand
        them out; rows that ended in it compute one round of tokens that are dropped."""
        rows, pending, steps = self._inflight
        self._inflight = None
        nxt = None
        try:
            sched = self.scheduler
            # every running request must be in this round: one whose prefill ran after the round launched
            # joins the batch in a synchronous step (launching these rows ahead again would leave it out until
            # they end: 64 requests at once decoded as 49 and then 15, 33 % slower, H100, fortieth session)
            quiet = self._ahead() and not self._inbox.qsize() and not sched.waiting and not sched.prefilling \
                and len(sched.running) == len(rows)
            if quiet and all(s.status is Status.RUNNING and s.constraint is None for s in rows):
                k = sched.reserve_ahead(rows, steps)
                if k:
                    nxt = self._launch(rows, k)
                    self.async_rounds += 1
            self._read_round(rows, pending)
        except Exception as e:  # noqa: BLE001 - fail these requests, keep serving the others
            diagnostics.record("FALLBACK", "a serving step failed; its requests end with an error",
                               reason=f"{type(e).__name__}: {e}"[:300])
            for seq in rows:
                self._end(seq, "error", e)
            nxt = None
        self._inflight = nxt
        self.steps += 1

    def _ahead(self) -> bool:
        """Whether a round's successor may launch before it is read back (``launch_ahead``; auto: on a GPU)."""
        return self.runner.cuda if self.launch_ahead == "auto" else bool(self.launch_ahead)

    def _read_round(self, rows: list[Sequence], pending: tuple) -> None:
        got = Readback.get(pending)                                       # [steps][rows]
        now = time.perf_counter()
        for i, seq in enumerate(rows):
            if seq.status is not Status.RUNNING:
                continue
            seq.host_syncs += 1
            ids, lps = self._picks(seq, [step[i] for step in got])
            self._accept(seq, ids, now, decoded=True, logprobs=lps)

    @staticmethod
    def _picks(seq: Sequence, picks: list) -> tuple[list[int], list[TokenLogprob] | None]:
        """Token ids (and logprobs) from read-back picks: ints, or packed rows in a logprobs batch."""
        if picks and isinstance(picks[0], list):
            return unpack(picks, seq.logprobs)
        return picks, None

    def _accept(self, seq: Sequence, new: list[int], now: float, decoded: bool = False, jump: bool = True,
                logprobs: list[TokenLogprob] | None = None) -> None:
        """Append ``new`` tokens to ``seq`` up to its end (EOS, stop string, length, its grammar's end),
        stream them, and finish it there. ``decoded``: each token also put its input's K/V into the
        cache. ``jump``: then take the tokens its grammar forces (``_jump_forward``). ``logprobs``: the
        tokens' logprobs (a request that asked for them)."""
        kept: list[int] = []
        finish = None
        # locals, not seq's attributes: this loop runs for every token of every row of a round (reading a round
        # of 64 rows back is about half of the host's time between two rounds)
        tokens, times, eos, constraint = seq.tokens, seq.token_times, seq.eos, seq.constraint
        generated = len(tokens) - seq.prompt_len
        cap = min(seq.max_new_tokens, self.max_model_len - seq.prompt_len)     # "length" from here on
        for t in new:
            if constraint is not None and constraint.ended(generated):
                finish = "stop"                         # the grammar ended without a stop token
                break
            tokens.append(t)
            kept.append(t)
            times[generated] = now
            generated += 1
            if t in eos or (constraint is not None and constraint.ended(generated)):
                finish = "stop"
            elif generated >= cap:
                finish = "length"
            if finish:
                break
        if decoded:
            seq.computed += len(kept)
        if finish is None and seq.sampling.stop and self.decode_text is not None:
            text = self.decode_text(seq.tokens[seq.prompt_len:])
            if any(s in text for s in seq.sampling.stop):
                finish = "stop"
        self.generated_tokens += len(kept)
        if kept:
            seq.handle.push(TokenEvent(kept, None, None, now, logprobs[:len(kept)] if logprobs else None))
        self.scheduler.register_full_blocks(seq)
        if finish is not None:
            self._end(seq, finish)
        elif seq.constraint is not None and jump:
            self._jump_forward(seq, now)

    def _jump_forward(self, seq: Sequence, now: float) -> None:
        """A constrained request whose grammar forces its next tokens takes them without decoding: they
        are prefilled in the next step, one call instead of a decode step each (batch/constrained.py)."""
        forced = self.structured.forced(seq)
        if forced and self.scheduler.grow(seq, len(forced)):
            forced = seq.constraint.take(forced)
            self.runner.mark_tokens(seq, forced)                # (the penalties count them as generated)
            self.structured.stats.jumps += 1
            self.structured.stats.jump_tokens += len(forced)
            self._accept(seq, forced, now, jump=False)
