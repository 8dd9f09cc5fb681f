"""Checkpoint tensors straight into device memory: positional reads into pinned staging buffers on a few
threads, each buffer copied to the device on its thread's own stream while the next one is read.

The memory-mapped path (``weights.py``) hands the device a view of the map: one synchronous copy per
tensor from pageable memory, which CUDA stages through its own small pinned buffer, after a page fault
per 4 KiB page of the map; one thread does all of it. Here each thread reads ``CHUNK`` bytes of the file
with ``os.preadv`` (no GIL, no faults: the kernel copies from the page cache into the pinned buffer)
and queues an asynchronous copy of the buffer into the destination's bytes; it reads its next chunk
into its other buffer meanwhile. A tensor is only ever written by copies of its own bytes, so the
pieces may land in any order. A checkpoint dtype other than the target one is copied as stored into a
temporary device tensor and converted there (never on the host). Everything is written before
``load`` returns (each thread waits for its stream).

    plan = [(name, file, offset, nbytes, dest), ...]     # dest: the device tensor (or temporary) to fill
    load(plan, device) -> writes every dest

On the CPU (tests) the same code runs with ordinary buffers and synchronous copies.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from shapeplan import env
from shapeplan.errors import ModelError

#: bytes per staging buffer (each thread has two)
CHUNK = 16 << 20


@dataclass(slots=True)
class Piece:
    path: str
    offset: int              # in the file
    nbytes: int
    dest: torch.Tensor       # uint8 [nbytes], a slice of the destination tensor's bytes
    name: str


def threads() -> int:
    """``SHAPEPLAN_LOAD_THREADS`` (default: 4, at most the CPUs)."""
    n = env.get("SHAPEPLAN_LOAD_THREADS")
    return max(1, n if n is not None else min(4, os.cpu_count() or 1))


def pieces(name: str, path: str, offset: int, dest: torch.Tensor, chunk: int | None = None) -> list[Piece]:
    """``dest``'s bytes (a contiguous tensor) as pieces of at most ``chunk`` (default ``CHUNK``) bytes read
    from ``path`` at ``offset``."""
    chunk = chunk or CHUNK
    if not dest.is_contiguous():
        raise ModelError(f"tensor {name!r}: load destination is not contiguous")
    flat = dest.reshape(-1).view(torch.uint8)
    n = flat.numel()
    return [Piece(path, offset + a, min(chunk, n - a), flat[a:a + chunk], name) for a in range(0, n, chunk)]


def load(plan: list[Piece], device: torch.device, *, num_threads: int | None = None,
         on_progress: Callable[[int], None] | None = None) -> None:
    """Fill every piece's ``dest`` from its file (see the module docstring); ``on_progress(nbytes)`` is
    called from the worker threads as pieces are read. Errors (a short read, an OSError) raise
    ModelError naming the tensor and the file."""
    if not plan:
        return
    cuda = device.type == "cuda"
    n_threads = max(1, min(num_threads or threads(), len(plan)))
    biggest = max(p.nbytes for p in plan)
    fds: dict[str, int] = {}
    try:
        for p in plan:
            if p.path not in fds:
                fds[p.path] = os.open(p.path, os.O_RDONLY)
    except OSError as e:
        for fd in fds.values():
            os.close(fd)
        raise ModelError(f"cannot open checkpoint file: {e}") from None
    todo = iter(plan)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def next_piece() -> Piece | None:
        with lock:
            return None if errors else next(todo, None)

    def work() -> None:
        try:
            if cuda and device.index is not None:
                torch.cuda.set_device(device.index)
            stream = torch.cuda.Stream(device) if cuda else None
            bufs = [torch.empty(biggest, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
            views = [memoryview(b.numpy()) for b in bufs]
            events: list = [None, None]
            i = 0
            while (p := next_piece()) is not None:
                k = i % 2
                if events[k] is not None:
                    events[k].synchronize()         # the copy out of this buffer is done
                _read(fds[p.path], views[k][:p.nbytes], p)
                if cuda:
                    with torch.cuda.stream(stream):
                        p.dest.copy_(bufs[k][:p.nbytes], non_blocking=True)
                        events[k] = torch.cuda.Event()
                        events[k].record(stream)
                else:
                    p.dest.copy_(bufs[k][:p.nbytes])
                if on_progress is not None:
                    on_progress(p.nbytes)
                i += 1
            if stream is not None:
                stream.synchronize()                # every copy of this thread has landed
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            with lock:
                errors.append(e)

    try:
        if n_threads == 1:
            work()
        else:
            ts = [threading.Thread(target=work, name=f"shapeplan-load-{i}", daemon=True) for i in range(n_threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    finally:
        for fd in fds.values():
            os.close(fd)
    if errors:
        e = errors[0]
        if isinstance(e, ModelError):
            raise e
        raise ModelError(f"loading checkpoint weights failed: {type(e).__name__}: {e}") from e


def _read(fd: int, view: memoryview, p: Piece) -> None:
    """Read ``p.nbytes`` at ``p.offset`` into ``view`` (looping over short reads)."""
    done = 0
    while done < p.nbytes:
        try:
            got = os.preadv(fd, [view[done:]], p.offset + done)
        except OSError as e:
            raise ModelError(f"{p.path}: reading tensor {p.name!r} failed: {e}") from None
        if got <= 0:
            raise ModelError(f"{p.path}: tensor {p.name!r} lies beyond the end of the file (truncated?)")
        done += got
