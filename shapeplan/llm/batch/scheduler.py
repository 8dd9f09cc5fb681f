"""The scheduler: which requests run in the next step, and with which blocks (host bookkeeping only;
the runner makes the device calls).

One step = up to ``max_num_batched_tokens`` prompt tokens of prefill (chunks of at most
``max_prefill_length``, one call per chunk, admitted requests first, then new ones in arrival order),
then one decode *round* of ``k`` steps for every running request, all in one captured plan per batch
bucket. Admission needs a free state slot and free blocks for the whole prompt (plus a block of
headroom per running request); the waiting queue is FCFS: a request that does not fit blocks the ones
behind it, so none starves. When a decode round needs blocks that are not free, the running request
that loses least (the fewest computed tokens; the latest arrival on a tie) is preempted: its blocks
are released (its full blocks stay in the prefix cache, so the recompute often hits) and it waits
again in arrival order, keeping every token it generated.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from shapeplan.errors import CapacityError
from shapeplan.llm.batch.blocks import BlockManager
from shapeplan.llm.batch.sequence import Sequence, Status

#: generated-token indexes at which a request's tokens are read back exactly (metrics: ttft, steady,
#: late_steady windows start there, see llm/metrics.py)
METRIC_SYNCS = (0, 2, 19)


@dataclass(slots=True)
class Chunk:
    seq: Sequence
    start: int                 # first position written
    n: int                     # tokens in this chunk
    final: bool                # the last chunk: the request decodes from the next step on


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    steps: int = 0                              # decode steps in the round
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[tuple[Sequence, BaseException]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)   # (src, dst) block copies before the step


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_length: int, max_model_len: int, sync_every: int) -> None:
        self.blocks = blocks
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_prefill_length, self.max_model_len, self.sync_every = max_prefill_length, max_model_len, sync_every
        self.waiting: list[Sequence] = []           # arrival order
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def add(self, seq: Sequence) -> None:
        bisect.insort(self.waiting, seq, key=lambda s: s.arrival)

    # ------------------------------------------------------------------ step planning
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        for seq in list(self.prefilling):              # admitted requests finish their prompt first
            if budget <= 0:
                break
            budget -= self._chunk(seq, budget, plan)
        while self.waiting and budget > 0 and self.free_slots and \
                len(self.prefilling) + len(self.running) < self.max_num_seqs:
            try:
                if not self._admit(self.waiting[0], plan):
                    break                              # FCFS: the head waits, so does everyone behind it
            except CapacityError as e:                 # it can never fit: fail it alone
                plan.failed.append((self.waiting.pop(0), e))
                continue
            seq = self.waiting.pop(0)
            if seq.status is Status.PREFILLING:
                budget -= self._chunk(seq, budget, plan)
        decoding = [s for s in self.running if s not in {c.seq for c in plan.chunks}]
        if decoding:
            plan.steps = self._round_length(decoding)
            plan.decode = self._reserve(decoding, plan)
        return plan

    def _round_length(self, rows: list[Sequence], ahead: int = 0) -> int:
        """``sync_every`` steps, shortened so that every row's tokens 2 and 19 end a round (exact
        metrics) and no row runs far past its last token. ``ahead``: the length of the round after
        one of ``ahead`` steps still in flight (the rows' host state lags by it); 0 when some row
        would have nothing left to generate by then."""
        k = self.sync_every
        for s in rows:
            g = s.generated + ahead                     # tokens known; the round makes g .. g+k-1
            left = min(s.max_new_tokens - g, self.max_model_len - len(s.tokens) - ahead)
            if ahead and left < 1:
                return 0
            for m in METRIC_SYNCS:
                if m >= g:
                    k = min(k, m - g + 1)
                    break
            k = min(k, max(1, left))
        return max(1, k)

    def reserve_ahead(self, rows: list[Sequence], ahead: int) -> int:
        """The next round for ``rows`` while one of ``ahead`` steps is still in flight (async
        scheduling: launched before the host reads the in-flight round's tokens): its length, with
        the blocks it writes reserved, or 0 (nothing launched) when a row may end in the in-flight
        round by length, or blocks are short (a preemption needs the host's view first)."""
        k = self._round_length(rows, ahead)
        if k == 0:
            return 0
        bm = self.blocks
        need = [max(0, bm.blocks_for(min(s.computed + ahead + k, self.max_model_len)) - len(s.blocks)) for s in rows]
        if sum(need) > bm.available:
            return 0
        for s, n in zip(rows, need):
            if n:
                s.blocks += bm.allocate(n)
        return k

    def _admit(self, seq: Sequence, plan: StepPlan) -> bool:
        """Give ``seq`` a state slot and blocks for its whole prompt, or leave everything as it is and
        return False when they are not free. Its leading blocks come from the prefix cache (shared), or
        from the session turn it continues (``seq.blocks`` already held, ``seq.computed`` valid)."""
        bm, bs = self.blocks, self.blocks.block_size
        target = seq.prefill_target()
        held = bool(seq.blocks)
        if held:
            computed = min(seq.computed, target)
            blocks = seq.blocks[:bm.blocks_for(computed)]
        else:
            blocks = bm.match(seq.tokens[:target])
            computed = len(blocks) * bs
            if self._shares_pending_prefix(seq, len(blocks)):
                return False                         # wait: a prefilling request is computing our prefix
        if computed >= target and seq.generated == 0 and computed > 0:
            computed = target - 1                    # the last prompt token is recomputed: its logits
        i = computed // bs                           # the block the first write goes into
        cow = computed % bs != 0 and i < len(blocks) and (not held or bm.shared(blocks[i]))
        need = bm.blocks_for(target + 1) - len(blocks) + (1 if cow else 0)
        headroom = len(self.running) + len(self.prefilling)
        if need + headroom > bm.available:
            if not self.running and not self.prefilling and need > bm.available:
                raise CapacityError(f"request {seq.rid}: {target + 1} tokens need {bm.blocks_for(target + 1)} "
                                    f"KV blocks of {bs}; {bm.available} of the pool's {bm.usable_blocks} are free")
            return False
        if held:
            bm.release(seq.blocks[len(blocks):])
            registered = min(seq.registered, i)
        else:
            for b in blocks:
                bm.hold(b)
            registered = i if cow else len(blocks)
        blocks = list(blocks)
        if cow:                                      # copy the shared block, then write into the copy
            dst = bm.allocate(1)[0]
            plan.copies.append((blocks[i], dst))
            bm.release([blocks[i]])
            blocks[i] = dst
        blocks += bm.allocate(bm.blocks_for(target + 1) - len(blocks))
        seq.blocks, seq.computed, seq.registered = blocks, computed, registered
        seq.chain = bm.chain_key(blocks[:registered])
        if seq.preemptions == 0:
            seq.cached_tokens = computed
        seq.slot = self.free_slots.pop()
        if not seq.admitted:
            seq.admitted = time.perf_counter()       # queue time ends at the first admission
        if computed >= target:                       # nothing to prefill
            self._start_decoding(seq)
        else:
            seq.status = Status.PREFILLING
            self.prefilling.append(seq)
        return True

    def _shares_pending_prefix(self, seq: Sequence, cached_blocks: int) -> bool:
        """Whether a request still prefilling will fill (and cache) full blocks of ``seq``'s prompt
        beyond the ``cached_blocks`` it would hit now: then admitting ``seq`` a step later computes
        those tokens once instead of twice (many requests with one system prompt arriving together)."""
        if not self.blocks.prefix_cache:
            return False
        bs, mine = self.blocks.block_size, seq.tokens[:seq.prefill_target()]
        for other in self.prefilling:
            theirs = other.tokens[:other.prefill_target()]
            full = min(len(mine), len(theirs)) // bs
            if full > cached_blocks and mine[:(cached_blocks + 1) * bs] == theirs[:(cached_blocks + 1) * bs]:
                return True
        return False

    def _chunk(self, seq: Sequence, budget: int, plan: StepPlan) -> int:
        n = min(seq.prefill_target() - seq.computed, budget, self.max_prefill_length)
        final = seq.computed + n == seq.prefill_target()
        plan.chunks.append(Chunk(seq, seq.computed, n, final))
        return n

    def _start_decoding(self, seq: Sequence) -> None:
        seq.status = Status.RUNNING
        if seq in self.prefilling:
            self.prefilling.remove(seq)
        self.running.append(seq)

    def _reserve(self, rows: list[Sequence], plan: StepPlan) -> list[Sequence]:
        """Blocks for every row's positions of this round; preempt until they fit. Returns the rows
        that decode (in their running order)."""
        bm = self.blocks
        while True:
            need = {s: max(0, bm.blocks_for(min(s.computed + plan.steps, self.max_model_len)) - len(s.blocks))
                    for s in rows}
            if sum(need.values()) <= bm.available:
                break
            victim = min(rows + self.prefilling, key=lambda s: (s.computed, -s.arrival))
            self.preempt(victim)
            plan.preempted.append(victim)
            if victim in rows:
                rows.remove(victim)
            plan.chunks = [c for c in plan.chunks if c.seq is not victim]
            if not rows:
                return []
        for s in rows:
            if need[s]:
                s.blocks += bm.allocate(need[s])
        return rows

    # ------------------------------------------------------------------ transitions
    def prefilled(self, chunk: Chunk) -> None:
        seq = chunk.seq
        seq.computed = chunk.start + chunk.n
        self.register_full_blocks(seq)             # later requests with this prefix can share them now
        if chunk.final and seq.status is Status.PREFILLING:
            self._start_decoding(seq)

    def grow(self, seq: Sequence, n: int) -> bool:
        """Room for ``n`` tokens that ``seq`` takes without decoding them (a constrained request's forced
        tokens): a waiting request needs nothing (its prefill covers them); a running one gets the blocks
        they fill and prefills them in the next step. False, with nothing changed, when blocks are short."""
        if seq.status is Status.WAITING:
            return True
        if seq.status is not Status.RUNNING:
            return False
        need = self.blocks.blocks_for(len(seq.tokens) + n) - len(seq.blocks)
        if need > self.blocks.available:
            return False
        if need > 0:
            seq.blocks += self.blocks.allocate(need)
        self.running.remove(seq)
        seq.status = Status.PREFILLING
        self.prefilling.append(seq)
        return True

    def register_full_blocks(self, seq: Sequence) -> None:
        """Enter ``seq``'s newly filled blocks into the prefix cache."""
        bm, bs = self.blocks, self.blocks.block_size
        full = min(seq.computed, len(seq.tokens)) // bs
        while seq.registered < full and seq.chain >= 0:
            i = seq.registered
            seq.chain = bm.register(seq.chain, seq.tokens[i * bs:(i + 1) * bs], seq.blocks[i])
            seq.registered += 1

    def _drop(self, seq: Sequence) -> None:
        for q in (self.waiting, self.prefilling, self.running):
            if seq in q:
                q.remove(seq)
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            seq.slot = -1

    def release(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks (its full ones stay cached) and its slot."""
        self.register_full_blocks(seq)
        if not seq.keep_blocks:
            self.blocks.release(seq.blocks)
            seq.blocks = []
        self._drop(seq)

    def preempt(self, seq: Sequence) -> None:
        self.register_full_blocks(seq)
        self.blocks.release(seq.blocks)
        seq.blocks, seq.computed, seq.registered = [], 0, 0
        self._drop(seq)
        seq.status = Status.WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.add(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish = reason
        seq.status = Status.FINISHED
        self.release(seq)
