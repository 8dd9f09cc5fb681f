"""Processes for tensor parallelism: one process per device, joined by ``torch.distributed``.

Two ways to start them:

* ``spawn(fn, world_size, *args, device=...)``: this process starts ``world_size`` workers (spawn start
  method), each calls ``init_distributed`` then ``fn(rank, world_size, *args)``; the return values come
  back in rank order. ``shapeplan generate --tp N`` / ``shapeplan bench --tp N`` use it.
* ``torchrun --nproc-per-node N script.py``: the script calls ``init_from_env()`` (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR/PORT as torchrun sets them).

Backend: NCCL when the device is CUDA, gloo otherwise. ``NCCL_NVLS_ENABLE=0`` is set before NCCL starts
(NVLink multicast off: its buffers are not safe inside captured CUDA graphs on every driver).
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

from shapeplan import diagnostics, env
from shapeplan.errors import ExecutionError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def device_for(device: str, local_rank: int) -> str:
    """This rank's device: ``cuda`` -> ``cuda:<local_rank>``; anything else as given (all ranks on CPU)."""
    d = torch.device(device)
    return f"cuda:{local_rank}" if d.type == "cuda" else str(d)


def init_distributed(rank: int, world_size: int, device: str = "cpu", *, addr: str = "127.0.0.1",
                     port: int | None = None, local_rank: int | None = None) -> str:
    """Join the default process group; returns this rank's device string."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", addr)
    if port is not None:
        os.environ["MASTER_PORT"] = str(port)
    dev = device_for(device, rank if local_rank is None else local_rank)
    if torch.device(dev).type == "cuda":
        torch.cuda.set_device(torch.device(dev))
    if not dist.is_initialized():
        dist.init_process_group(backend_for(dev), rank=rank, world_size=world_size,
                                **({"device_id": torch.device(dev)} if torch.device(dev).type == "cuda" else {}))
    diagnostics.record("PARALLEL", "process group ready", rank=rank, world_size=world_size,
                       backend=dist.get_backend(), device=dev)
    return dev


def init_from_env(device: str = "cuda") -> tuple[int, int, str]:
    """Under torchrun: (rank, world_size, this rank's device)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    return rank, world, init_distributed(rank, world, device, local_rank=local)


def arm_hang_dump() -> float:
    """With ``SHAPEPLAN_HANG_DUMP_S=N``: every thread's Python stack goes to stderr when this process is
    still running N seconds from now, and again every N seconds (a rank stuck in a collective shows
    where). Returns N (0: off)."""
    n = env.get("SHAPEPLAN_HANG_DUMP_S")
    if n > 0:
        import faulthandler
        faulthandler.dump_traceback_later(n, repeat=True)
    return n


def _worker(rank: int, fn: Callable[..., Any], world_size: int, device: str, port: int, threads: int,
            results: Any, args: tuple) -> None:
    arm_hang_dump()
    ok = False
    try:
        if threads:
            torch.set_num_threads(threads)
        dev = init_distributed(rank, world_size, device, port=port)
        out = fn(rank, world_size, dev, *args)
        results.put((rank, True, out))
        ok = True
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        # not re-raised: its traceback would keep this rank's engines, and the CUDA graphs that captured
        # NCCL collectives, alive through leave_group below
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    left = leave_group()
    if not (ok and left):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if ok else 1)       # the result is sent; a destroy that never returns must not keep us


def leave_group(timeout_s: float | None = None) -> bool:
    """Destroy the default process group; False when that did not finish within ``timeout_s`` (default
    ``SHAPEPLAN_DIST_DESTROY_S``, 30 s; the destroy is then left running on a daemon thread).

    NCCL's communicator destroy waits until every CUDA graph that captured one of its collectives has
    been destroyed (pytorch/pytorch#115388): an engine that is garbage but not yet collected (reference
    cycles) would keep it waiting for good. So the garbage is collected and the device synchronized
    first. Under torchrun, drop your pipelines and call this instead of ``destroy_process_group``."""
    if not dist.is_initialized():
        return True
    import gc
    gc.collect()
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        torch.cuda.synchronize()
    if timeout_s is None:
        timeout_s = env.get("SHAPEPLAN_DIST_DESTROY_S")
    done = threading.Event()

    def destroy() -> None:
        dist.destroy_process_group()
        done.set()
    threading.Thread(target=destroy, daemon=True, name="shapeplan-destroy-process-group").start()
    if done.wait(timeout_s):
        return True
    print(f"shapeplan: destroy_process_group() did not return within {timeout_s:g} s "
          "(a CUDA graph that captured NCCL collectives still alive?); leaving it", file=sys.stderr, flush=True)
    return False


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, device: str = "cpu", threads: int = 0) -> list[Any]:
    """Run ``fn(rank, world_size, device_of_rank, *args)`` in ``world_size`` spawned processes joined by a
    process group; returns the ranks' return values (picklable) in rank order. ``fn`` must be importable
    (a module-level function). ``threads``: torch intra-op threads per worker (0 = torch's default)."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    failure: Exception | None = None
    try:
        mp.start_processes(_worker, args=(fn, world_size, device, port, threads, results, args),
                           nprocs=world_size, join=True, start_method="spawn")
    except Exception as e:  # noqa: BLE001 - the worker's own message is preferred below
        failure = e
    got = sorted(_drain(results), key=lambda r: r[0])
    errors = [msg for _, ok, msg in got if not ok]
    if errors or failure is not None:          # a rank may fail and still exit 0 (see _worker)
        raise WorkerError(f"tensor-parallel worker failed: {errors[0] if errors else failure}") from None
    return [out for _, _, out in got]


class WorkerError(ExecutionError, RuntimeError):
    """A tensor-parallel worker failed; the message is that rank's error and traceback."""


def _drain(q: Any) -> list[tuple[int, bool, Any]]:
    out = []
    while not q.empty():
        out.append(q.get())
    return out
