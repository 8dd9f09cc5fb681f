"""Placement: which device runs each decoder layer (pipeline parallelism inside one process).

Strategies (``Placement(devices, strategy=...)``):

* ``single``      every layer on ``devices[0]``
* ``pipeline``    contiguous, near-equal layer ranges, one per device, in order
* ``memory_fit``  greedy spill: layers go to device 0 until its budget (``capacity`` bytes, default on
                  CUDA: free memory minus ``reserve``) is used by weights + KV cache, then to device 1 ...
* ``custom``      ``layer_map``: a list (layer i -> device index) or a dict {layer: device index}

The embedding goes with layer 0 and the final norm + LM head with the last layer. Devices are torch
device strings; a device may repeat (``["cpu", "cpu"]``): the entries are distinct *logical* devices
(a simulated topology), and values crossing between them are still copied, so the copies and the
bytes they move are real and measured.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from shapeplan import diagnostics
from shapeplan.errors import ModelError
from shapeplan.ir.graph import Graph, Value

STRATEGIES = ("single", "pipeline", "memory_fit", "custom")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.|^[kv]_cache_(\d+)$")
_FIRST = ("model.embed_tokens",)
_LAST = ("model.norm", "lm_head")


def layer_of(v: Value) -> int | None:
    """Decoder layer a constant / variable belongs to (by its Hugging Face or cache name), else None."""
    m = _LAYER.match(v.name)
    if m:
        return int(m.group(1) or m.group(2))
    return None


def value_nbytes(v: Value) -> int:
    """Bytes the value occupies once materialised (variables: their full, unexpanded shape)."""
    t = v.data
    if not isinstance(t, torch.Tensor):
        return 0
    return t.numel() * t.element_size()


def layer_bytes(graph: Graph) -> tuple[list[int], int, int]:
    """(bytes per layer, bytes of the embedding side, bytes of the head side) of constants + variables."""
    n = num_layers(graph)
    per = [0] * n
    first = last = 0
    seen: set[int] = set()
    variables = {id(v) for v in graph.variables}
    for v in graph.constants + graph.variables:
        t = v.data
        # a variable is materialized on its own (its initial value may be a view shared with others)
        key = t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and t.numel() \
            and id(v) not in variables else id(v)
        if key in seen:
            continue                 # a transposed view and its source count once
        seen.add(key)
        i = layer_of(v)
        if i is not None:
            per[i] += value_nbytes(v)
        elif v.name.startswith(_FIRST):
            first += value_nbytes(v)
        elif v.name.startswith(_LAST):
            last += value_nbytes(v)
    return per, first, last


def num_layers(graph: Graph) -> int:
    ids = [layer_of(v) for v in graph.constants + graph.variables]
    return max((i for i in ids if i is not None), default=-1) + 1


@dataclass(slots=True)
class Placement:
    devices: Sequence[str]
    strategy: str = "pipeline"
    layer_map: Sequence[int] | dict[int, int] | None = None
    capacity: Sequence[int] | None = None        # memory_fit: bytes per device
    reserve: int = 1 << 30                       # memory_fit on CUDA: left free for activations/plans
    assigned: list[int] = field(default_factory=list)   # layer -> device index, after ``assign``

    def __post_init__(self) -> None:
        self.devices = [str(torch.device(d)) for d in self.devices]
        if not self.devices:
            raise ModelError("placement needs at least one device")
        if self.layer_map is not None and self.strategy == "pipeline":
            self.strategy = "custom"
        if self.strategy not in STRATEGIES:
            raise ModelError(f"placement strategy {self.strategy!r} is not one of {', '.join(STRATEGIES)}")

    def assign(self, graph: Graph) -> list[int]:
        """Layer -> device index for ``graph`` (also kept in ``self.assigned``)."""
        n, k = num_layers(graph), len(self.devices)
        if n == 0:
            raise ModelError(f"graph {graph.name!r} has no decoder layers (constants named model.layers.<i>.*)")
        if self.strategy == "single":
            out = [0] * n
        elif self.strategy == "pipeline":
            out = [min(i * k // n, k - 1) for i in range(n)]
        elif self.strategy == "custom":
            out = self._custom(n)
        else:
            out = self._memory_fit(graph)
        self.assigned = out
        per, first, last = layer_bytes(graph)
        used = [0] * k
        for i, d in enumerate(out):
            used[d] += per[i]
        used[out[0]] += first
        used[out[-1]] += last
        diagnostics.record("MULTI_DEVICE", "layers placed", strategy=self.strategy, devices=list(self.devices),
                           layer_device=out, bytes_per_device=used)
        return out

    def _custom(self, n: int) -> list[int]:
        m = self.layer_map
        out = [m.get(i) for i in range(n)] if isinstance(m, dict) else list(m or [])
        if len(out) != n or any(d is None for d in out):
            raise ModelError(f"custom layer map must give a device for each of the {n} layers, got {m!r}")
        bad = [d for d in out if not 0 <= int(d) < len(self.devices)]
        if bad:
            raise ModelError(f"custom layer map names device indices {bad}; devices are 0..{len(self.devices) - 1}")
        return [int(d) for d in out]

    def _memory_fit(self, graph: Graph) -> list[int]:
        caps = list(self.capacity) if self.capacity is not None else [self._free(d) for d in self.devices]
        if len(caps) != len(self.devices):
            raise ModelError(f"memory_fit: {len(caps)} capacities for {len(self.devices)} devices")
        per, first, last = layer_bytes(graph)
        out, d, used = [], 0, first
        for i, b in enumerate(per):
            extra = last if i == len(per) - 1 else 0
            while used + b + extra > caps[d]:
                d += 1
                used = 0
                if d == len(caps):
                    raise ModelError(f"memory_fit: layer {i} ({b} bytes) does not fit; capacities {caps} bytes "
                                     f"for {sum(per) + first + last} bytes of weights and KV cache")
                diagnostics.record("MULTI_DEVICE", "memory_fit spills to the next device", layer=i,
                                   device=self.devices[d], capacity=caps[d - 1])
            out.append(d)
            used += b
        return out

    def _free(self, device: str) -> int:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ModelError(f"memory_fit on {device}: pass capacity=[bytes per device] (free memory is "
                             "only queried on CUDA)")
        free, _ = torch.cuda.mem_get_info(dev)
        return max(0, free - self.reserve)

    def compile(self, graph: Graph, *, mode: str = "auto", optimize: bool = True, **kw: Any):
        """The graph split into per-device stages, each compiled on its device (``StagedEngine``)."""
        from shapeplan.parallel.staged import StagedEngine
        return StagedEngine(graph, self, mode=mode, optimize=optimize, **kw)
