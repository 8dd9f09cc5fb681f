"""What goes into one engine call, and how its results get back: the pure parts of dynamic batching.

``Work`` is one queued request; ``groups_of`` puts compatible ones together (equal non-batch shapes,
at most ``max_batch_size`` rows); ``fit`` decides whether a group runs whole, padded up to its bucket,
or only its head that fills a smaller bucket exactly; ``split`` cuts a batched result into each
request's rows; ``deliver`` settles the requests' futures, one hand-off per event loop.

Why ``fit``: plans exist only for the bucket sizes (1, 2, 4, ... max_batch_size), so 17 rows cost as
much as 32. Under a steady closed loop of clients, requests arrive spread over the previous call, and
padding every batch up wastes engine time; running the 16 that fill a bucket and letting the 17th
join the next call often serves more rows per second. ``fit`` compares the two with the measured time
of each bucket (``Costs``), so a model whose calls cost the same at any size (a small CPU model) keeps
padding, and one whose time grows with the batch (a CNN on a GPU) splits.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import InvalidStateError
from dataclasses import dataclass
from typing import Any

import numpy as np

#: fit splits a group only when that serves this much more rows per second: the times are averages of
#: noisy wall-clock measurements, and the requests left over wait one more call
SPLIT_GAIN = 1.1


def bucket_ladder(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``max_batch_size``, then ``max_batch_size``."""
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return tuple(sizes) + (max_batch_size,) if max_batch_size > 0 else ()


def bucket_of(rows: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds ``rows`` (``rows`` itself past the last one)."""
    return next((b for b in buckets if b >= rows), rows)


@dataclass(slots=True)
class Work:
    """One request in the queue."""
    feeds: dict[str, np.ndarray]
    outputs: tuple[str, ...] | None         # the outputs to return (None: every output)
    rows: int                               # batch rows (0: the model has no batch dimension)
    key: tuple                              # requests with equal keys can share an engine call
    future: Any                             # concurrent Future, or an asyncio Future of ``loop``
    t_queued: int                           # perf_counter_ns at submit
    loop: asyncio.AbstractEventLoop | None = None


Done = tuple[Work, Any, "BaseException | None"]     # a request, its result, its error


def groups_of(works: list[Work], limit: int) -> list[list[Work]]:
    """Compatible requests (equal keys) together, in arrival order, each group at most ``limit`` rows."""
    open_group: dict[tuple, list[Work]] = {}
    groups: list[list[Work]] = []
    for w in works:
        g = open_group.get(w.key)
        if g is None or sum(x.rows for x in g) + w.rows > limit:
            g = open_group[w.key] = []
            groups.append(g)
        g.append(w)
    return groups


class Costs:
    """Seconds per batched call (copies in, engine, results out) by (key, bucket): the warm-up's last call,
    then a moving average."""

    def __init__(self) -> None:
        self._s: dict[tuple[tuple, int], float] = {}

    def add(self, key: tuple, size: int, seconds: float) -> None:
        old = self._s.get((key, size))
        self._s[(key, size)] = seconds if old is None else 0.9 * old + 0.1 * seconds

    def get(self, key: tuple, size: int) -> float | None:
        return self._s.get((key, size))


def fit(group: list[Work], buckets: tuple[int, ...], costs: Costs) -> tuple[list[Work], list[Work]]:
    """(run now, run next time): the whole group padded up to its bucket, or its longest head that fits
    the bucket below, whichever serves more rows per second (when both are measured; the head only by a
    margin, ``SPLIT_GAIN``)."""
    rows = sum(w.rows for w in group)
    hi = bucket_of(rows, buckets)
    below = [b for b in buckets if b < rows]
    if hi == rows or not below:
        return group, []
    head, n = 0, 0
    while group[head].rows + n <= below[-1]:
        n += group[head].rows
        head += 1
    key = group[0].key
    t_all, t_head = costs.get(key, hi), costs.get(key, bucket_of(n, buckets))
    if head == 0 or t_all is None or t_head is None or n / t_head <= SPLIT_GAIN * rows / t_all:
        return group, []
    return group[:head], group[head:]


def stack(arrays: list[np.ndarray], size: int) -> np.ndarray:
    """[rows_i, ...] x n -> [size, ...]: concatenated, padded with copies of the last row (numpy: for
    dtypes that have no torch twin; the others go through the instance's staging buffers)."""
    rows = sum(a.shape[0] for a in arrays)
    if len(arrays) == 1 and rows == size:
        return arrays[0]
    pad = [np.repeat(arrays[-1][-1:], size - rows, axis=0)] if size > rows else []
    return np.concatenate(arrays + pad, axis=0)


def split(out: dict[str, np.ndarray], rows: list[int]) -> list[dict[str, np.ndarray]]:
    """One batched result -> each request's rows (views: every call's outputs are fresh arrays)."""
    res: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, a in out.items():
        start = 0
        for i, n in enumerate(rows):
            res[i][name] = a[start:start + n]
            start += n
    return res


def deliver(done: list[Done]) -> None:
    """Settle each request's future: a concurrent one here, asyncio ones on their event loop, one
    ``call_soon_threadsafe`` per loop for the whole list (one wake-up of the loop per batch)."""
    by_loop: dict[Any, list[Done]] = {}
    for d in done:
        if d[0].loop is None:
            _settle([d])
        else:
            by_loop.setdefault(d[0].loop, []).append(d)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, items)
        except RuntimeError:                # the loop is closed: its server is gone, and so is the caller
            pass


def _settle(done: list[Done]) -> None:
    for w, result, error in done:
        f = w.future
        if f.done():                        # cancelled (the client went away)
            continue
        try:
            if error is not None:
                f.set_exception(error)
            else:
                f.set_result(result)
        except (InvalidStateError, asyncio.InvalidStateError):
            pass                            # cancelled meanwhile
