"""The model runner: every engine call of the serving core (made on the engine thread).

Decode runs one plan per batch bucket: ``n`` running rows are padded to the smallest bucket ``B >= n``
(padding rows have length 0: they write nothing and read nothing), so only a handful of shape
signatures exist; each is driven through its lifecycle (warm-up, freeze, capture) on padding-only
feeds before its first real use ("settled"), so every call whose tokens a request sees is a replay.
Within a round of ``k`` decode steps the host does not wait: each step's ``next_token`` and
``next_position`` outputs are the next step's inputs, and the tokens collect in a device buffer that
is read back once, at the end of the round. Prefill runs one plan per prompt-length bucket (batch 1,
padded tokens write nothing). Per-request sampling settings live in rows of the sampling variables
(one row per state slot), so a row's temperature, top-k/p, penalty and seed never reach another row.
The additive terms (presence / frequency penalty, logit bias) are a float row per slot on the logits
(``logit_adjust``): set at admission from the bias and the request's generated tokens so far (a resumed
request's included), then updated on the device after each step of a row that has them (the token's
frequency penalty, and its presence penalty the first time: ``_generated`` remembers which it produced).
What a round's tokens update is worked out once per round (``_marks``), not per step.

Log-probabilities: a batch where some request asked for them runs the plans that also compute the
graph's logprob outputs (the default plans do not), and each step's pick is packed with them into
one float64 row (``pack``: token, its log-probability, the top K log-probabilities, their ids) that
comes back in the same read-back as the tokens would; ``unpack`` takes a row apart on the host.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from shapeplan import diagnostics, env
from shapeplan.llm.batch.scheduler import Chunk
from shapeplan.llm.batch.sequence import Sequence, TokenLogprob
from shapeplan.llm.model import TOP_LOGPROBS, PagedKV


#: most requests packed into one prefill call (rows of a power of two)
PREFILL_ROWS = 16


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _masked(c: Chunk) -> bool:
    """A constrained request's final prompt chunk: its first token is drawn by the masked sampler."""
    return c.final and c.seq.generated == 0 and c.seq.constraint is not None


def decode_buckets(max_num_seqs: int, smallest: int = 1) -> list[int]:
    """1, 2, 4, 8, 16, then every multiple of 8 up to ``max_num_seqs`` (always included); buckets
    below ``smallest`` are left out (the CPU starts at 16: see ``GenerationPipeline``)."""
    out = [b for b in (1, 2, 4, 8, 16) if b < max_num_seqs]
    out += list(range(24, max_num_seqs, 8))
    out.append(max_num_seqs)
    small = [b for b in out if b >= smallest]
    return small or [out[-1]]


class ModelRunner:
    def __init__(self, engine, paged: PagedKV, device: torch.device, *, decode_buckets: list[int],
                 prefill_buckets: list[int], kv_blocks: torch.Tensor | None = None,
                 before_first_call: Callable[[], None] | None = None,
                 after_first_decode: Callable[[], None] | None = None) -> None:
        self.engine, self.paged, self.device = engine, paged, device
        self.decode_buckets, self.prefill_buckets = sorted(decode_buckets), sorted(prefill_buckets)
        self.kv_blocks = kv_blocks               # [layers, 2, NB, Hkv, BS, D]: the pools as one tensor
        var = engine.variables
        self.params, self.seed, self.seen = var["sampling_params"], var["sampling_seed"], var["seen_tokens"]
        self.adjust = var["logit_adjust"]
        self._generated: torch.Tensor | None = None   # bool [slots, V]: made at the first row with the terms
        self._adjusted: set[int] = set()               # slots whose adjust row is not all zeros
        self._true = torch.ones((), dtype=torch.bool, device=device)    # what a step's marks write
        self.top_k = min(TOP_LOGPROBS, self.seen.shape[1])      # the width of the top_logprobs output
        slots = paged.state_slots
        self.pad_slot = slots - 1
        self.slot_tok = torch.zeros(slots, dtype=torch.int64, device=device)    # each row's next input token
        self.slot_pos = torch.zeros(slots, dtype=torch.int64, device=device)    # ... and its position
        self.settled: set[tuple[str, int, int]] = set()
        self.cuda = device.type == "cuda"
        self.calls = 0
        self._before_first_call = before_first_call
        self._after_first_decode = after_first_decode   # once the first decode call's plan ran
        self.structured = None                   # constrained decoding (batch/constrained.py), set by the pipeline
        self.in_place = env.get("SHAPEPLAN_DECODE_IN_PLACE")     # decode: outputs fed back into the plan's inputs

    def _first_call(self) -> None:
        if self._before_first_call is not None:
            hook, self._before_first_call = self._before_first_call, None
            hook()

    # ------------------------------------------------------------------ buckets and plans
    def decode_bucket(self, n: int) -> int:
        return next(b for b in self.decode_buckets if b >= n)

    def prefill_bucket(self, n: int, start: int, limit: int) -> int:
        for b in self.prefill_buckets:
            if b >= n and start + b <= limit:
                return b
        return n                 # near the end of the context: an exact-length plan

    def padding_feeds(self, rows: int, seq: int) -> dict[str, torch.Tensor]:
        """Feeds of ``rows`` padding rows of ``seq`` tokens: every length 0, so the call writes nothing."""
        dev = self.device
        return {"input_ids": torch.zeros(rows, seq, dtype=torch.int64, device=dev),
                "positions": torch.zeros(rows, dtype=torch.int64, device=dev),
                "lengths": torch.zeros(rows, dtype=torch.int64, device=dev),
                "block_tables": torch.zeros(rows, self.paged.max_blocks, dtype=torch.int32, device=dev),
                "state_slots": torch.full((rows,), self.pad_slot, dtype=torch.int64, device=dev)}

    def settle(self, out: str, rows: int, seq: int, max_calls: int = 8, logprobs: bool = False) -> None:
        """Drive the plan of (``out``, ``rows`` x ``seq``) through its lifecycle on padding rows (which
        write nothing), so the next call replays it. Modes without capture return at once."""
        key = (out + "+logprobs" if logprobs else out, rows, seq)
        if key in self.settled:
            return
        self._first_call()
        self.settled.add(key)
        from shapeplan.runtime.runner import Phase
        eng = self.engine
        if getattr(eng, "exec_mode", None) is None or eng.exec_mode.value in ("slot_by_slot", "shape_inference_only"):
            return
        feeds = self.padding_feeds(rows, seq)
        for _ in range(max_calls):
            eng.run(feeds, outputs=_outputs(out, logprobs))
            if eng.phase in (Phase.REPLAYING, Phase.REPLAY_BLOCKED):
                break
        diagnostics.record("LIFECYCLE", "batch plan settled", outputs=out, rows=rows, tokens=seq, logprobs=logprobs)

    def warmup(self, sampled: bool = True, budget: int = 2048) -> None:
        """Settle every decode bucket (greedy, and sampled when asked) and every greedy prefill plan
        (prompt bucket x packed rows within ``budget`` tokens) now: a server calls this before its first
        request, so no request waits for a capture."""
        for b in self.decode_buckets:
            self.settle("next_token", b, 1)
            if sampled:
                self.settle("next_token_sampled", b, 1)
        for s in self.prefill_buckets:
            rows = 1
            while rows <= PREFILL_ROWS and (rows == 1 or rows * s <= budget):
                self.settle("next_token", rows, s)
                rows *= 2

    # ------------------------------------------------------------------ per-request state
    def admit(self, seq: Sequence) -> None:
        """Write ``seq``'s sampling settings into its state slot (and the context's tokens, for the
        repetition penalty)."""
        sp, slot = seq.sampling, seq.slot
        self.params[slot].copy_(torch.tensor(sp.as_row(), dtype=torch.float32))
        self.seed[slot].fill_(seq.seed)
        if sp.repetition_penalty != 1.0:
            row = self.seen[slot]
            row.zero_()
            ids = [t for t in seq.tokens if 0 <= t < row.shape[0]]
            if ids:
                row[torch.tensor(ids, dtype=torch.int64, device=self.device)] = True
        if sp.adjusts or slot in self._adjusted:
            self._admit_adjust(seq)
        if seq.computed >= seq.prefill_target():                    # resumes decoding at once
            self.slot_tok[slot] = seq.tokens[-1]
            self.slot_pos[slot] = len(seq.tokens) - 1

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks (every layer's K and V) before a request writes into a shared one."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        if self.kv_blocks is not None:
            self.kv_blocks[:, :, dst] = self.kv_blocks[:, :, src]
            return
        for name, pool in self.engine.variables.items():
            if name.startswith(("k_cache_", "v_cache_")):
                pool[dst] = pool[src]

    def _table(self, seqs: list[Sequence], rows: int) -> torch.Tensor:
        t = np.zeros((rows, self.paged.max_blocks), np.int32)
        for i, s in enumerate(seqs):
            t[i, :len(s.blocks)] = s.blocks
        return torch.from_numpy(t).to(self.device, non_blocking=True)

    def _out(self, seqs: list[Sequence]) -> str:
        return "next_token" if all(s.sampling.is_plain_greedy for s in seqs) else "next_token_sampled"

    # ------------------------------------------------------------------ calls
    def prefill_groups(self, chunks: list[Chunk], limit: int, budget: int) -> list[tuple[list[Chunk], int, int]]:
        """Pack prompt chunks into prefill calls: (chunks, rows, tokens) per call. Chunks of similar
        length share a call, ``rows`` (a power of two up to PREFILL_ROWS, padding rows write nothing) x
        ``tokens`` (a prompt bucket) at most ``budget`` entries: one weight read for many requests."""
        groups: list[tuple[list[Chunk], int, int]] = [([c], 1, self.prefill_bucket(c.n, c.start, limit))
                                                      for c in chunks if _masked(c)]   # alone: a sampler plan
        order = sorted((c for c in chunks if not _masked(c)), key=lambda c: c.n)
        cur: list[Chunk] = []
        for c in order + [None]:
            if c is not None:
                trial = cur + [c]
                seq = max(self.prefill_bucket(x.n, x.start, limit) for x in trial)
                rows = _pow2(len(trial))
                fits = rows <= PREFILL_ROWS and rows * seq <= budget and \
                    all(x.start + seq <= limit for x in trial)
                if fits or not cur:
                    cur = trial
                    continue
            if not cur:
                break
            seq = max(self.prefill_bucket(x.n, x.start, limit) for x in cur)
            groups.append((cur, _pow2(len(cur)) if len(cur) > 1 else 1, seq))
            cur = [c] if c is not None else []
        return groups

    def prefill(self, chunks: list[Chunk], rows: int, bucket: int) -> torch.Tensor:
        """One prefill call: each chunk one row of ``bucket`` tokens (padding rows after them). Returns
        the token each row's last position picks ([rows, 1] on the device; meaningful for a new
        request's final chunk only), or when a row wants logprobs the packed rows ([rows, W] float64,
        see ``pack``)."""
        seqs = [c.seq for c in chunks]
        for s in seqs:
            s.prefill_bucket = bucket
        masked = len(chunks) == 1 and _masked(chunks[0])
        out = "logits" if masked else self._out(seqs)    # masked: the first token is drawn by the sampler plan
        lp = not masked and any(s.logprobs is not None for s in seqs)    # (a constrained request has none)
        self.settle(out, rows, bucket, logprobs=lp)
        n = len(chunks)
        ids = torch.zeros(rows, bucket, dtype=torch.int64)
        for i, c in enumerate(chunks):
            ids[i, :c.n] = torch.tensor(c.seq.tokens[c.start:c.start + c.n], dtype=torch.int64)
        pad = rows - n
        dev = self.device
        feeds = {"input_ids": ids.to(dev, non_blocking=True),
                 "positions": torch.tensor([c.start for c in chunks] + [0] * pad, dtype=torch.int64).to(dev),
                 "lengths": torch.tensor([c.n for c in chunks] + [0] * pad, dtype=torch.int64).to(dev),
                 "block_tables": self._table(seqs, rows),
                 "state_slots": torch.tensor([s.slot for s in seqs] + [self.pad_slot] * pad,
                                             dtype=torch.int64).to(dev)}
        res = self.engine.run(feeds, outputs=_outputs(out, lp))
        self.calls += 1
        nxt = res["next_position"]
        tok = self.structured.sample_first(seqs[0], res[out], nxt) if masked else res[out]
        fresh = [i for i, c in enumerate(chunks) if c.final and c.seq.generated == 0]
        known = [i for i, c in enumerate(chunks) if c.final and c.seq.generated > 0]
        if fresh:                                 # the first token: the next decode step's input
            idx = torch.tensor(fresh, device=dev)
            slots = torch.tensor([chunks[i].seq.slot for i in fresh], dtype=torch.int64, device=dev)
            self.slot_tok[slots] = tok[idx, 0]
            self.slot_pos[slots] = nxt[idx]
            firsts = [chunks[i].seq for i in fresh]
            self._mark_seen(firsts, tok[idx], slots, self._marks(firsts))
        for i in known:                           # a recompute: the next input is a known token
            seq = chunks[i].seq
            self.slot_tok[seq.slot] = seq.tokens[-1]
            self.slot_pos[seq.slot] = len(seq.tokens) - 1
        if lp:
            picked = torch.empty(rows, pack_width(self.top_k), dtype=torch.float64, device=dev)
            pack(picked, res, out)
            return picked
        return tok

    def score(self, ids: list[int], blocks: list[int]) -> torch.Tensor:
        """The logits at every position of ``ids`` (one prefill into ``blocks``): [n, V]."""
        n, dev = len(ids), self.device
        bucket = self.prefill_bucket(n, 0, n + max(self.prefill_buckets))
        padded = torch.zeros(1, bucket, dtype=torch.int64)
        padded[0, :n] = torch.tensor(ids, dtype=torch.int64)
        table = torch.zeros(1, self.paged.max_blocks, dtype=torch.int32)
        table[0, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        self._first_call()
        out = self.engine.run({"input_ids": padded.to(dev), "positions": torch.zeros(1, dtype=torch.int64, device=dev),
                               "lengths": torch.tensor([n], device=dev), "block_tables": table.to(dev),
                               "state_slots": torch.full((1,), self.pad_slot, dtype=torch.int64, device=dev)},
                              outputs=["all_logits"])
        return out["all_logits"][0, :n]

    def _admit_adjust(self, seq: Sequence) -> None:
        """``seq``'s row of the additive terms: its logit bias minus its penalties for the tokens it has
        generated so far (none, unless it resumes); zeros for a request without them."""
        sp, slot = seq.sampling, seq.slot
        row = self.adjust[slot]
        row.zero_()
        self._adjusted.discard(slot)
        if not sp.adjusts:
            return
        vocab = row.shape[0]
        if sp.logit_bias:
            ids = [t for t, _ in sp.logit_bias if t < vocab]
            vals = [b for t, b in sp.logit_bias if t < vocab]
            row[torch.tensor(ids, dtype=torch.int64, device=self.device)] = torch.tensor(vals, device=self.device)
        out = [t for t in seq.tokens[seq.prompt_len:] if 0 <= t < vocab]
        gen = self._generated_rows()[slot]
        if out:                                   # a resumed request: its generated tokens so far
            counts = torch.bincount(torch.tensor(out, dtype=torch.int64), minlength=vocab).to(self.device)
            row -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0)
            gen.copy_(counts > 0)
        else:
            gen.zero_()
        self._adjusted.add(slot)

    def _generated_rows(self) -> torch.Tensor:
        if self._generated is None:
            self._generated = torch.zeros(self.seen.shape, dtype=torch.bool, device=self.device)
        return self._generated

    def _marks(self, seqs: list[Sequence]) -> tuple[bool, torch.Tensor | None] | None:
        """What each step's tokens of ``seqs`` update, made once per round: whether a row has a repetition
        penalty (``seen``), and the rows' [n, 2] (frequency, presence) penalties on the device when a row has
        the additive terms (else None); None when a step updates nothing."""
        rep = any(s.sampling.repetition_penalty != 1.0 for s in seqs)
        pen = None
        if any(s.sampling.adjusts for s in seqs):
            pen = torch.tensor([[s.sampling.frequency_penalty, s.sampling.presence_penalty] for s in seqs],
                               dtype=torch.float32).to(self.device, non_blocking=True)
        return (rep, pen) if rep or pen is not None else None

    def _mark_seen(self, seqs: list[Sequence], tok: torch.Tensor, slots: torch.Tensor,
                   marks: tuple[bool, torch.Tensor | None] | None) -> None:
        """After a step: each row's token joins its context (``seen``, for the repetition penalty) and its
        generated tokens (the presence / frequency penalties); ``marks``: ``_marks(seqs)``. Only ``seqs``'
        rows: a padding row's token touches nothing."""
        if marks is None:
            return
        rep, pen = marks
        n = len(seqs)
        idx = (slots[:n], tok.reshape(-1)[:n])
        if rep:
            self.seen.index_put_(idx, self._true)
        if pen is not None:
            gen = self._generated_rows()
            first = ~gen[idx]                                                   # [n]: the token's first time
            self.adjust.index_put_(idx, self.adjust[idx] - pen[:, 0] - pen[:, 1] * first)
            gen.index_put_(idx, self._true)

    def mark_tokens(self, seq: Sequence, tokens: list[int]) -> None:
        """Tokens ``seq`` took without sampling them (a grammar's forced run): counted as sampled ones are."""
        marks = self._marks([seq]) if tokens else None
        if marks is not None:
            slots = torch.tensor([seq.slot], dtype=torch.int64, device=self.device)
            for t in tokens:                      # one at a time: a repeated token counts again
                self._mark_seen([seq], torch.tensor([t], dtype=torch.int64, device=self.device), slots, marks)

    def decode_feeds(self, seqs: list[Sequence], rows: int) -> tuple[torch.Tensor, ...]:
        """A decode step's device inputs for ``seqs`` padded to ``rows``: state slots, lengths (1, 0 for
        padding rows), block tables, and each row's last token and position (kept on the device)."""
        n, dev = len(seqs), self.device
        slots = torch.tensor([s.slot for s in seqs] + [self.pad_slot] * (rows - n),
                             dtype=torch.int64).to(dev, non_blocking=True)
        lengths = torch.tensor([1] * n + [0] * (rows - n), dtype=torch.int64).to(dev, non_blocking=True)
        return slots, lengths, self._table(seqs, rows), self.slot_tok[slots].reshape(rows, 1), self.slot_pos[slots]

    def decode(self, seqs: list[Sequence], steps: int) -> torch.Tensor:
        """``steps`` decode steps of every row; returns the tokens, [steps, len(seqs)], on the device
        (when a row wants logprobs: the packed rows, [steps, len(seqs), W] float64, see ``pack``; a batch
        with a constrained row: masked, on the host, maybe fewer steps; see batch/constrained.py)."""
        if self.structured is not None and any(s.constraint is not None for s in seqs):
            return self.structured.decode(seqs, steps)
        n = len(seqs)
        rows = self.decode_bucket(n)
        out = self._out(seqs)
        lp = any(s.logprobs is not None for s in seqs)
        self.settle(out, rows, 1, logprobs=lp)
        outputs = _outputs(out, lp)
        dev = self.device
        slots, lengths, table, ids, pos = self.decode_feeds(seqs, rows)
        toks = torch.empty(steps, rows, pack_width(self.top_k), dtype=torch.float64, device=dev) if lp \
            else torch.empty(steps, rows, dtype=torch.int64, device=dev)
        marks = self._marks(seqs)
        feeds = {"input_ids": ids, "positions": pos, "lengths": lengths, "block_tables": table, "state_slots": slots}
        # the plan's own input buffers (every feed has one once the plan is frozen): the first step copies the
        # feeds into them, later steps feed them as themselves, a step's next token and position written straight
        # into them (one device copy each, no copy out, no copy in)
        stage = self.engine.input_buffers(feeds, outputs) if self.in_place else {}
        for k in range(steps):
            res = self.engine.run(feeds, outputs=outputs, copy=not stage)
            ids, pos = res[out], res["next_position"]
            if lp:
                pack(toks[k], res, out)
            else:
                toks[k] = ids[:, 0]
            self._mark_seen(seqs, ids, slots, marks)
            if k + 1 < steps:
                if stage:
                    stage["input_ids"].copy_(ids)
                    stage["positions"].copy_(pos)
                    feeds = stage
                else:
                    feeds["input_ids"], feeds["positions"] = ids, pos
        self.calls += steps
        self.slot_tok[slots] = ids[:, 0]
        self.slot_pos[slots] = pos
        if self._after_first_decode is not None:
            hook, self._after_first_decode = self._after_first_decode, None
            hook()
        return toks[:, :n]


def _outputs(out: str, logprobs: bool) -> list[str]:
    """The outputs a call requests: the pick and the next positions (and the pick's logprob outputs)."""
    if logprobs:
        return [out, "next_position", out + "_logprob", "top_logprobs", "top_token_ids"]
    return [out, "next_position"]


def pack_width(k: int) -> int:
    return 2 + 2 * k


def pack(dst: torch.Tensor, res: dict[str, torch.Tensor], out: str) -> None:
    """One step's picks with their logprobs into ``dst`` [rows, 2 + 2K] float64: token id, its
    log-probability, the top K log-probabilities, their token ids (ids < 2**53 are exact in float64)."""
    k = res["top_logprobs"].shape[1]
    dst[:, 0] = res[out][:, 0]
    dst[:, 1] = res[out + "_logprob"][:, 0]
    dst[:, 2:2 + k] = res["top_logprobs"]
    dst[:, 2 + k:] = res["top_token_ids"]


def logprob_rows(logits: torch.Tensor, tok: torch.Tensor, k: int) -> torch.Tensor:
    """``pack``'s rows computed eagerly from a step's logits [B, V] and picks [B, 1] (the masked
    sampler's batches, whose decoder plan outputs the logits): [B, 2 + 2K] float64."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top_lp, top_ids = torch.topk(logp, k, dim=-1)
    return torch.cat([tok.double(), logp.gather(1, tok).double(), top_lp.double(), top_ids.double()], dim=1)


def unpack(picks: list, top: int | None) -> tuple[list[int], list[TokenLogprob] | None]:
    """Host side of ``pack``: a request's picks (rows read back) as token ids, and their logprobs
    with the ``top`` most likely tokens each (None when the request did not ask for logprobs)."""
    ids = [int(p[0]) for p in picks]
    if top is None:
        return ids, None
    k = (len(picks[0]) - 2) // 2 if picks else 0
    n = min(top, k)
    return ids, [TokenLogprob(p[1], tuple((int(p[2 + k + j]), p[2 + j]) for j in range(n))) for p in picks]


class Readback:
    """Device tokens to the host: on CUDA through reused pinned buffers behind an event, so asking does
    not stall the device queue (pinning memory per call costs more than the copy); ``get`` waits for
    the event. Two buffers in turn: two requests may be outstanding (a round in flight while the
    previous one is read)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pinned: dict[tuple[int, torch.dtype], torch.Tensor] = {}   # per turn and dtype (tokens; logprobs)
        self._turn = 0

    def request(self, t: torch.Tensor) -> tuple:
        if not self.cuda:
            return (t.clone(), None)
        n, i = t.numel(), self._turn
        self._turn ^= 1
        buf = self._pinned.get((i, t.dtype))
        if buf is None or buf.numel() < n:
            buf = self._pinned[(i, t.dtype)] = torch.empty(max(n, 4096), dtype=t.dtype, pin_memory=True)
        host = buf[:n].view(t.shape)
        host.copy_(t, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        return (host, ev)

    @staticmethod
    def get(pending: tuple) -> list:
        host, ev = pending
        if ev is not None:
            ev.synchronize()
        return host.tolist()
