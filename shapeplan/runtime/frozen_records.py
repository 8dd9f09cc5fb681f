"""Frozen-plan records: a plan's recorded layouts kept on disk, so a warm start skips its eager calls.

A plan's first call runs slot by slot to record every register's shape, strides and dtype (what
``freeze`` allocates stable buffers from), and its second call warms each segment up, where the triton
backend records the layouts (and 16-byte alignment) its kernels are generated for. Only then can it
compile and capture. On the GPU those two eager calls cost more than their run time: they are the first
use of every torch kernel the slot-by-slot path runs (RMSNorm, RoPE, SiLU*mul ... as torch ops) although
the replay runs Triton kernels instead, and CUDA loads each kernel's module on first use. For llama-1b
that is most of the 0.3-0.45 s from the start of a warm pipeline start to its first frozen plan.

When a plan reaches REPLAYING, the runner writes what those calls recorded to
``<cache>/frozen/<key>.json``; the key covers everything the layouts depend on (``record_key``: the
plan's slots, ops and attributes; every constant's, variable's and feed's shape, strides, dtype and
alignment; device, mode and the versions of torch and of shapeplan's sources). A later process whose
plan has the same key freezes on its first call from the record, compiles at once and captures in
that same call: one call instead of three, and no slot-by-slot run. Constant-slot values (shapes the
plan reads on the host) are recomputed from the constants, with meta tensors standing in for the
registers a shape-only op reads.

Nothing depends on a record for correctness: the capture-time check still compares every Triton step
against its torch slots on this call's real inputs (unless this exact layout passed before), a record
that does not fit (a register it lacks, a value only a real run can give) is ignored and the plan runs
its eager calls, and an unreadable file is treated as absent. JSON only (no pickle).

``SHAPEPLAN_FROZEN_RECORDS``: ``1`` on, ``0`` off; default on for CUDA engines (where start-up is
measured), off on the CPU.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any

import torch

from shapeplan import diagnostics, env
from shapeplan.ir.dtypes import dtype_name

VERSION = 1


def enabled(device: torch.device) -> bool:
    on = env.get("SHAPEPLAN_FROZEN_RECORDS")
    return device.type == "cuda" if on is None else on


def directory() -> str:
    from shapeplan.cache.paths import cache_root
    return str(cache_root() / "frozen")


@functools.cache
def _build() -> str:
    """torch's version and a stamp of shapeplan's sources (size and modification time of each file)."""
    from shapeplan.cache.fingerprint import package_stamp
    return f"{torch.__version__}|{package_stamp()}"


def _layout(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        ptr = x.data_ptr() % 16 if x.device.type != "meta" else 0
        return f"T{tuple(x.shape)}{x.stride()}{x.dtype}{x.device.type}@{ptr}"
    return type(x).__name__


def _attr(v: Any) -> str:
    if not isinstance(v, torch.Tensor):
        return repr(v)
    head = f"tensor{tuple(v.shape)}{v.dtype}"
    if v.numel() > 4096:                            # a large attribute: its layout stands for it
        return head
    return head + ":" + hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def record_key(plan: Any, constants: dict[int, Any], variables: dict[str, Any], feeds: list[Any],
               device: torch.device, mode: str) -> str:
    h = hashlib.sha256(f"v{VERSION}|{mode}|{_build()}|{device}".encode())
    if device.type == "cuda":
        h.update(f"{torch.cuda.get_device_name(device)}{torch.cuda.get_device_capability(device)}".encode())
    for s in plan.slots:
        n = s.node
        h.update(f"{n.domain}::{n.op_type}{sorted((k, _attr(v)) for k, v in n.attrs.items())}{s.ins}{s.outs}"
                 f"{s.release}\n".encode())
    h.update(f"{plan.inputs}{plan.outputs}{plan.variables}{plan.captures}{plan.n_regs}".encode())
    for r, t in sorted(constants.items()):
        h.update(f"c{r}{_layout(t)}".encode())
    for name, _ in plan.variables:
        h.update(f"v{name}{_layout(variables.get(name))}".encode())
    for x in feeds:
        h.update(f"f{_layout(x)}".encode())
    return h.hexdigest()[:40]


def _path(key: str) -> str:
    return os.path.join(directory(), f"{key}.json")


def load(key: str) -> dict[str, Any] | None:
    try:
        with open(_path(key), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("version") != VERSION or rec.get("key") != key:
        return None
    return rec


def save(key: str, meta: dict[int, Any], layouts: dict[int, Any], plan_name: str) -> None:
    """Write the record (atomically: a temporary file renamed over the target). A failure only costs
    the next start its eager calls."""
    rec = {"version": VERSION, "key": key,
           "meta": {str(r): [list(m.shape), list(m.stride), dtype_name(m.dtype), m.nbytes,
                             m.contiguous, m.dense] for r, m in meta.items()},
           "layouts": {str(i): lay for i, lay in layouts.items() if lay is not None}}
    try:
        os.makedirs(directory(), exist_ok=True)
        tmp = _path(key) + f".{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(rec, f)
        os.replace(tmp, _path(key))
        diagnostics.record("CACHE", "frozen-plan record written", plan=plan_name, key=key[:12],
                           registers=len(meta))
    except OSError as e:
        diagnostics.record("CACHE", "frozen-plan record not written", plan=plan_name, reason=str(e)[:200])


def reg_meta(rec: dict[str, Any]) -> dict[int, Any]:
    """The record's register layouts as ``RegMeta``s (ValueError when malformed)."""
    from shapeplan.runtime.staging import RegMeta
    out = {}
    for r, (shape, stride, dtype, nbytes, contiguous, dense) in rec["meta"].items():
        dt = getattr(torch, str(dtype), None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"not a dtype: {dtype}")
        out[int(r)] = RegMeta(tuple(int(x) for x in shape), tuple(int(x) for x in stride), dt, int(nbytes),
                              bool(contiguous), bool(dense))
    return out


def entries() -> int:
    d = directory()
    return len([n for n in os.listdir(d) if n.endswith(".json")]) if os.path.isdir(d) else 0
