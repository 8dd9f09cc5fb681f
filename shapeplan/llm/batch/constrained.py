"""Constrained decoding in the serving core: the masked sampling plan and each step's host work.

A batch with a constrained row splits its decode step in two plans (rows without a constraint in the
same batch get an all-ones mask, so they draw exactly what they draw alone; a batch without one never
comes here and runs today's fused plan, with no mask anywhere)::

    forward  (the decoder, outputs "logits", "next_position")          [B, V]
    sampler  ApplyTokenBitmask(logits, token_bitmask) -> ArgMax | SampleToken -> next_token  [B, 1]

``token_bitmask`` (int32 [B, ceil(V / 32)], xgrammar's layout) is the sampler plan's input, copied into
its staging buffer (a stable address) and applied on the device inside the captured sampler. The mask
of step k depends on token k-1, and so does step k's forward (its input token), but the forward does
not need the mask: so the step is queued as forward k, then the host reads token k-1 back (the copy was
queued right after sampler k-1, so it waits for the sampler only), lets each row's matcher accept it,
fills the masks of step k, and queues the mask copy and sampler k. The host work runs while the device
runs forward k (``overlap=False`` does it before queuing the forward: the benchmark's comparison).

Forced runs (the grammar allows one continuation, e.g. ``", "name": "`` between JSON fields): a request
commits to xgrammar's tokens of the run (shapeplan/llm/grammar.py ``GrammarState``) and then either
takes them at once, prefilled in the next step (``BatchEngine._jump_forward``), or decodes them in
lockstep with its batch under one-token masks; the tokens are the same either way. It takes them at
once before its prompt's prefill (free: they join it) and, when the round had at most ``JUMP_ROWS``
constrained rows, from ``JUMP_MIN`` tokens on at a round's end (a batch-1 prefill per jump costs more
than decoding the run with a large batch); such a round ends early for a run of ``JUMP_BREAK`` tokens
or more (that costs the forward already queued, so shorter runs wait for the round's end).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from shapeplan import diagnostics
from shapeplan.errors import ConstraintError
from shapeplan.ir.graph import Graph
from shapeplan.llm.batch.runner import Readback, logprob_rows
from shapeplan.llm.batch.sequence import Sequence, Status
from shapeplan.llm.constraint import Constraint
from shapeplan.llm.grammar import GrammarState, fill_rows, grammars_for
from shapeplan.llm.model import SAMPLING_STATE

if TYPE_CHECKING:
    from shapeplan.llm.batch.runner import ModelRunner
    from shapeplan.llm.tokenizer import Tokenizer

SP = "shapeplan"
#: forced tokens that a request takes without decoding at the end of a round (one prefill call instead)
JUMP_MIN = 2
#: forced tokens that end a round early (the forward already queued for every row is wasted)
JUMP_BREAK = 4
#: the most constrained rows in a round for which forced runs are prefilled rather than decoded
JUMP_ROWS = 4


def sampler_graph(vocab: int, dtype: str, state: dict[str, torch.Tensor]) -> Graph:
    """The masked sampling plan: logits [B, V] and token_bitmask int32 [B, ceil(V/32)] in, the picks
    out (``next_token``: greedy, ``next_token_sampled``: SampleToken with each row's settings, read
    from the decoder's sampling variables ``state`` by ``state_slots``, as the decoder reads them)."""
    g = Graph("masked_sampler")
    logits = g.placeholder("logits", dtype, ("batch", vocab))
    bitmask = g.placeholder("token_bitmask", "int32", ("batch", -(-vocab // 32)))
    positions = g.placeholder("positions", "int64", ("batch",))               # the step's sampling counter
    slots = g.placeholder("state_slots", "int64", ("batch",))
    op = g.op
    masked = op.ApplyTokenBitmask(logits, bitmask, _domain=SP)                 # [B, V]
    params, seed, seen, adjust = (op.Gather(g.variable(n, state[n]), slots, axis=0) for n in SAMPLING_STATE)
    greedy = op.ArgMax(masked, axis=-1, keepdims=1)                            # [B, 1]
    sampled = op.SampleToken(masked, params, seed, positions, seen, adjust, _domain=SP)
    for v, name in ((greedy, "next_token"), (sampled, "next_token_sampled")):
        del g.values[v.name]
        v.name = name
        g.values[name] = v
    g.set_outputs(greedy, sampled)
    return g


@dataclass(slots=True)
class StructuredStats:
    """Counters of constrained decoding (lifetime; the benchmark reads them)."""
    steps: int = 0              # masked decode steps (sampler calls in decode rounds)
    row_steps: int = 0          # constrained rows summed over those steps
    host_s: float = 0.0         # matchers' accept + mask filling + forced-run checks, on the host
    wait_s: float = 0.0         # the host waiting for a step's token (the device still busy)
    first_tokens: int = 0       # first tokens sampled under a mask after a prefill
    jumps: int = 0              # forced runs taken without decoding
    jump_tokens: int = 0
    early_ends: int = 0         # rounds ended early for a forced run

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


class Structured:
    """Constrained decoding for one pipeline: grammars for its tokenizer (host) and the masked sampler
    (device), both made at first use. Engine-thread methods: ``sample_first``, ``decode``, ``forced``."""

    def __init__(self, runner: "ModelRunner", tokenizer: "Tokenizer | None", vocab_size: int, mode: str) -> None:
        self.runner, self.tokenizer, self.vocab_size, self.mode = runner, tokenizer, vocab_size, mode
        self.width = -(-vocab_size // 32)
        self.overlap = True
        self.jump_ok = True                              # the last round had at most JUMP_ROWS constrained rows
        self.stats = StructuredStats()
        self._engine: Any = None
        self._host: torch.Tensor | None = None          # [max rows, W] int32 (pinned on CUDA)
        self._dev: torch.Tensor | None = None
        self._readback = Readback(runner.device)

    # ------------------------------------------------------------------ requests (any thread)
    def start(self, constraint: Constraint, stop_ids: frozenset[int]) -> GrammarState:
        """Compile ``constraint`` (cached) and start a matcher; raises ConstraintError."""
        if not isinstance(constraint, Constraint):
            raise ConstraintError(f"Sampling(constraint=...) takes a shapeplan.llm.Constraint, "
                                  f"got {type(constraint).__name__}")
        if self.tokenizer is None:
            raise ConstraintError("structured output needs the pipeline's tokenizer; this pipeline has none")
        if not all(n in getattr(self.runner.engine, "variables", {}) for n in SAMPLING_STATE):
            raise ConstraintError("structured output runs on single-device pipelines (not with tp / placement)")
        return grammars_for(self.tokenizer, self.vocab_size, tuple(stop_ids)).start(constraint)

    def forced(self, seq: Sequence) -> list[int]:
        """The forced run ``seq`` takes at once (not accepted yet; [] for none): its committed run when it
        has JUMP_MIN tokens or more and taking it pays (see the module doc). Either way, same tokens."""
        st = seq.constraint
        st.catch_up(seq.tokens[seq.prompt_len:])
        if seq.status is not Status.WAITING and not self.jump_ok:
            return []
        run = st.forced_run()
        return list(run) if len(run) >= JUMP_MIN else []

    # ------------------------------------------------------------------ the sampler plan
    def _sampler(self) -> Any:
        if self._engine is None:
            from shapeplan.runtime.engine import Engine
            r = self.runner
            state = {n: r.engine.variables[n] for n in SAMPLING_STATE}
            dtype = r.engine.graph.values["logits"].dtype.name
            eng = Engine(sampler_graph(self.vocab_size, dtype, state), device=r.device, mode=self.mode,
                         adopt_variables=True)
            if any(eng.variables[n] is not state[n] for n in SAMPLING_STATE):
                raise ConstraintError("the masked sampler could not share the decoder's sampling state")
            rows = max(r.decode_buckets)
            self._host = torch.full((rows, self.width), -1, dtype=torch.int32, pin_memory=r.cuda)
            self._dev = torch.full((rows, self.width), -1, dtype=torch.int32, device=r.device) if r.cuda \
                else self._host
            self._engine = eng
            diagnostics.record("COMPILE", "masked sampler built", vocab=self.vocab_size, rows=rows)
        return self._engine

    def _settle(self, out: str, rows: int) -> None:
        """As ``ModelRunner.settle``: drive the sampler's plan for ``rows`` through its lifecycle first."""
        r, eng = self.runner, self._sampler()
        key = ("masked " + out, rows, 1)
        if key in r.settled:
            return
        r.settled.add(key)
        from shapeplan.runtime.runner import Phase
        if eng.exec_mode.value in ("slot_by_slot", "shape_inference_only"):
            return
        dev = r.device
        dtype = r.engine.graph.values["logits"].dtype.torch
        feeds = {"logits": torch.zeros(rows, self.vocab_size, dtype=dtype, device=dev),
                 "token_bitmask": torch.full((rows, self.width), -1, dtype=torch.int32, device=dev),
                 "positions": torch.zeros(rows, dtype=torch.int64, device=dev),
                 "state_slots": torch.full((rows,), r.pad_slot, dtype=torch.int64, device=dev)}
        for _ in range(8):
            eng.run(feeds, outputs=[out])
            if eng.phase in (Phase.REPLAYING, Phase.REPLAY_BLOCKED):
                break

    def warmup(self, stop_ids: frozenset[int]) -> None:
        """Settle every plan a constrained request may use: each decode bucket's forward with the
        ``logits`` output and its sampler plans, each prefill bucket's ``logits`` plan (first tokens);
        and build xgrammar's view of the tokenizer (~3 s for a 128k vocabulary on a slow host)."""
        if self.tokenizer is not None:
            _ = grammars_for(self.tokenizer, self.vocab_size, tuple(stop_ids)).compiler
        r = self.runner
        for b in r.decode_buckets:
            r.settle("logits", b, 1)
            for out in ("next_token", "next_token_sampled"):
                self._settle(out, b)
        for s in r.prefill_buckets:
            r.settle("logits", 1, s)
        for out in ("next_token", "next_token_sampled"):
            self._settle(out, 1)

    # ------------------------------------------------------------------ engine calls (engine thread)
    def sample_first(self, seq: Sequence, logits: torch.Tensor, next_position: torch.Tensor) -> torch.Tensor:
        """The first token of a constrained request, from its prefill's logits ([1, V]): [1, 1]."""
        st = seq.constraint
        st.catch_up(seq.tokens[seq.prompt_len:])
        out = "next_token" if seq.sampling.is_plain_greedy else "next_token_sampled"
        self._settle(out, 1)
        t0 = time.perf_counter()
        mask = torch.empty(1, self.width, dtype=torch.int32)
        st.fill(mask, 0)
        self.stats.host_s += time.perf_counter() - t0
        self.stats.first_tokens += 1
        dev = self.runner.device
        res = self._engine.run({"logits": logits, "token_bitmask": mask.to(dev), "positions": next_position,
                                "state_slots": torch.tensor([seq.slot], dtype=torch.int64).to(dev)}, outputs=[out])
        return res[out]

    def decode(self, seqs: list[Sequence], steps: int) -> torch.Tensor:
        """Up to ``steps`` decode steps of every row, masked; returns the tokens, [steps run, len(seqs)],
        on the host (fewer steps when a forced run ends the round early); when an unconstrained row of
        the batch wants logprobs, the packed rows of ``runner.pack`` instead, [steps run, len(seqs), W]."""
        r, n = self.runner, len(seqs)
        rows = r.decode_bucket(n)
        states: list[GrammarState | None] = [s.constraint for s in seqs] + [None] * (rows - n)
        for s in seqs:
            if s.constraint is not None:
                s.constraint.catch_up(s.tokens[s.prompt_len:])
        self.jump_ok = sum(st is not None for st in states) <= JUMP_ROWS
        out = "next_token" if all(s.sampling.is_plain_greedy for s in seqs) else "next_token_sampled"
        r.settle("logits", rows, 1)
        self._settle(out, rows)
        slots, lengths, table, ids, pos = r.decode_feeds(seqs, rows)
        marks = r._marks(seqs)
        host, dev_mask = self._host[:rows], self._dev[:rows]
        got: list[list[int]] = []
        packs: list[torch.Tensor] = []                 # per step, when a row wants logprobs
        lp = any(s.logprobs is not None for s in seqs)
        pending = None
        for k in range(steps):
            feeds = {"input_ids": ids, "positions": pos, "lengths": lengths, "block_tables": table,
                     "state_slots": slots}
            res = r.engine.run(feeds, outputs=["logits", "next_position"]) if self.overlap else None
            if self._host_step(states, pending, got, host):
                self.stats.early_ends += 1
                break                                  # ids, pos: the next round's inputs
            if res is None:
                res = r.engine.run(feeds, outputs=["logits", "next_position"])
            if dev_mask is not host:
                dev_mask.copy_(host, non_blocking=True)
            tok = self._engine.run({"logits": res["logits"], "token_bitmask": dev_mask,
                                    "positions": res["next_position"], "state_slots": slots}, outputs=[out])[out]
            pending = self._readback.request(tok.reshape(-1))    # queued before the next forward
            if lp:
                packs.append(logprob_rows(res["logits"], tok, r.top_k))
            ids, pos = tok, res["next_position"]
            r._mark_seen(seqs, tok, slots, marks)
            self.stats.steps += 1
            self.stats.row_steps += sum(st is not None for st in states)
        else:
            self._host_step(states, pending, got, None)
        r.calls += 2 * len(got)
        r.slot_tok[slots] = ids[:, 0]
        r.slot_pos[slots] = pos
        if lp and got:
            return torch.stack(packs[:len(got)]).cpu()[:, :n]
        return torch.tensor(got, dtype=torch.int64)[:, :n]

    def _host_step(self, states: list[GrammarState | None], pending: Any, got: list[list[int]],
                   host: torch.Tensor | None) -> bool:
        """Read the last step's tokens back (if any), let each live row's matcher accept its token, and fill
        the next step's masks into ``host`` (None: the round is over). True: end the round now (a row's
        committed forced run of JUMP_BREAK tokens or more, which it will take at once)."""
        if pending is not None:
            t0 = time.perf_counter()
            toks = Readback.get(pending)
            t1 = time.perf_counter()
            self.stats.wait_s += t1 - t0
            got.append(toks)
            for st, t in zip(states, toks):
                if st is not None and st.end < 0:
                    st.accept(t)
            t0 = t1
        else:
            t0 = time.perf_counter()
            if host is not None:
                host.fill_(-1)                        # rows without a constraint, padding rows
        if host is not None:
            fill_rows([(i, st) for i, st in enumerate(states) if st is not None], host)
        self.stats.host_s += time.perf_counter() - t0
        return pending is not None and host is not None and self.jump_ok and \
            any(st is not None and len(st.run) >= JUMP_BREAK for st in states)
