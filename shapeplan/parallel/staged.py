"""Pipeline placement: one graph cut into per-device stages, each an Engine compiled on its device.

Stage assignment (monotone, so the stages run in order)::

    stage(node) = max(stage of the producers of its inputs,
                      stage of the layer owning each constant / variable it reads)

Layer i's weights and KV cache pin its nodes to the stage of layer i; the embedding goes with the
first stage, the final norm / LM head / sampling with the last; nodes that read only the inputs
(position ids, the causal mask, rotary angles) stay in the first stage and their outputs travel.
A stage is a maximal run of consecutive layers on one device. Each stage is its own sub-graph (the
values it receives become placeholders of the same name), optimized and compiled on its device, so
its segments are captured there (CUDA graphs on a GPU, emulated replay on the CPU): the segment
boundaries between devices are exactly the stage boundaries, where values are copied peer to peer
(``Tensor.to(device)``; between two logical devices on one physical device, a real copy).

``StagedEngine`` looks like an ``Engine`` to the generation pipeline: ``run(feeds, outputs)``,
``variables`` (each stage's tensors, by name), ``graph``, ``inspect()`` (with a placement report).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from shapeplan import diagnostics
from shapeplan.errors import InputError, ModelError
from shapeplan.ir.graph import Graph, Node, Value, ValueKind
from shapeplan.parallel.placement import _FIRST, Placement, layer_of


@dataclass(slots=True)
class Stage:
    index: int
    device_index: int
    device: str
    layers: list[int]
    graph: Graph
    receives: list[str]                       # values computed by earlier stages, read here
    sends: list[str]                          # values computed here, read by later stages
    produces: set[str] = field(default_factory=set)   # every graph output computed here
    engine: Any = None


def stage_of_values(graph: Graph, layer_stage: list[int]) -> dict[int, int]:
    """id(node) -> stage index (see the module docstring)."""
    last = max(layer_stage)
    pinned: dict[int, int] = {}
    for v in graph.constants + graph.variables:
        i = layer_of(v)
        if i is not None:
            pinned[id(v)] = layer_stage[i]
        elif v.kind is ValueKind.CONSTANT and v.name.startswith(_FIRST):
            pinned[id(v)] = 0
        elif v.kind is ValueKind.CONSTANT and (v.name.startswith(("model.norm", "lm_head"))):
            pinned[id(v)] = last
    made: dict[int, int] = {}
    out: dict[int, int] = {}
    for node in graph.nodes:
        s = 0
        for v in node.all_inputs:
            if v is not None:
                s = max(s, made.get(id(v), pinned.get(id(v), 0)))
        out[id(node)] = s
        for o in node.outputs:
            made[id(o)] = s
    return out


def split(graph: Graph, placement: Placement) -> list[Stage]:
    """The stages of ``graph`` under ``placement`` (layer -> device from ``placement.assign``)."""
    layer_dev = placement.assign(graph)
    runs: list[tuple[int, list[int]]] = []          # (device index, layers) per stage
    for i, d in enumerate(layer_dev):
        if runs and runs[-1][0] == d:
            runs[-1][1].append(i)
        else:
            runs.append((d, [i]))
    layer_stage = [0] * len(layer_dev)
    for s, (_, layers) in enumerate(runs):
        for i in layers:
            layer_stage[i] = s
    node_stage = stage_of_values(graph, layer_stage)
    producer_stage = {id(o): node_stage[id(n)] for n in graph.nodes for o in n.outputs}
    readers: dict[str, set[int]] = {}
    for n in graph.nodes:
        for v in n.all_inputs:
            if v is not None:
                readers.setdefault(v.name, set()).add(node_stage[id(n)])
    for v in graph.variables:
        if len(readers.get(v.name, ())) > 1:
            raise ModelError(f"variable {v.name!r} is read by stages {sorted(readers[v.name])}: mutable state "
                             "must live on one device")
    out_names = {v.name for v in graph.outputs}
    stages = []
    for s, (d, layers) in enumerate(runs):
        nodes = [n for n in graph.nodes if node_stage[id(n)] == s]
        stages.append(_stage_graph(graph, s, d, placement.devices[d], layers, nodes, producer_stage,
                                   readers, out_names))
    return stages


def _stage_graph(graph: Graph, s: int, d: int, device: str, layers: list[int], nodes: list[Node],
                 producer_stage: dict[int, int], readers: dict[str, set[int]], out_names: set[str]) -> Stage:
    g = Graph(f"{graph.name}.stage{s}", dict(graph.opset_imports))
    g.metadata.update(graph.metadata, stage=str(s), device=device)
    mapped: dict[int, Value] = {}
    receives: list[str] = []

    def get(v: Value) -> Value:
        m = mapped.get(id(v))
        if m is None:
            if v.kind is ValueKind.CONSTANT:
                m = g.constant(v.data, name=v.name)
            elif v.kind is ValueKind.VARIABLE:
                m = g.variable(v.name, v.data)
            elif v.kind is ValueKind.PLACEHOLDER:
                m = g.placeholder(v.name, v.dtype, v.shape)
            else:                                            # computed by an earlier stage
                assert producer_stage[id(v)] < s, v
                m = g.placeholder(v.name, v.dtype, v.shape)
                receives.append(v.name)
            mapped[id(v)] = m
        return m

    for n in nodes:
        ins = [None if v is None else get(v) for v in n.inputs]
        node = g.add_node(n.op_type, ins, dict(n.attrs), num_outputs=len(n.outputs), domain=n.domain,
                          name=n.name, output_names=[o.name for o in n.outputs])
        node.implicit_inputs = [get(v) for v in n.implicit_inputs]
        for o, new in zip(n.outputs, node.outputs):
            new.dtype, new.shape, new.type_kind, new.elem_type = o.dtype, o.shape, o.type_kind, o.elem_type
            mapped[id(o)] = new
    made = [o for n in nodes for o in n.outputs if o.name]
    sends = [o.name for o in made if any(r > s for r in readers.get(o.name, ()))]
    produces = {o.name for o in made if o.name in out_names}
    g.set_outputs(*[g.values[name] for name in dict.fromkeys(sends + sorted(produces))])
    # placeholders: the model inputs this stage reads (in the model's order), then the received values
    order = {v.name: i for i, v in enumerate(graph.inputs)}
    g.inputs = sorted((v for v in g.inputs if v.name in order), key=lambda v: order[v.name]) \
        + [g.values[name] for name in receives]
    return Stage(s, d, device, layers, g, receives, sends, produces)


class StagedEngine:
    """Engine-like facade over per-device stage engines (see the module docstring)."""

    def __init__(self, graph: Graph, placement: Placement, *, mode: str = "auto", optimize: bool = True,
                 **engine_kw: Any) -> None:
        import shapeplan as sp
        self.graph, self.placement, self.mode = graph, placement, mode
        self.stages = split(graph, placement)
        for st in self.stages:
            st.engine = sp.compile(st.graph, device=st.device, mode=mode, optimize=optimize, **engine_kw)
        self.devices = list(placement.devices)
        self.device = torch.device(self.stages[0].device)
        self.variables: dict[str, Any] = {}
        for st in self.stages:
            self.variables.update(st.engine.variables)
        self._stage_of_output = {name: st.index for st in self.stages for name in st.produces}
        self.output_names = [v.name for v in graph.outputs]
        self.input_names = [v.name for v in graph.inputs]
        self.calls = 0
        self.last_step: dict[tuple[int, int], int] = {}       # (src, dst device index) -> bytes, last call
        self.moved: dict[tuple[int, int], int] = {}           # cumulative
        diagnostics.record("MULTI_DEVICE", "staged engine compiled", stages=len(self.stages),
                           devices=self.devices, layers=[st.layers for st in self.stages],
                           sends=[len(st.sends) for st in self.stages])

    def input_buffers(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, Any]:
        """``Engine.input_buffers``: none (the stages stage their own inputs), so a decode loop copies as usual."""
        return {}

    def run(self, feeds: Mapping[str, Any], outputs: Sequence[str] | None = None, *,
            copy: bool = True) -> dict[str, Any]:
        """``Engine.run``; the results are always the caller's own (``copy`` is accepted for the interface)."""
        want = list(outputs) if outputs is not None else self.output_names
        unknown = [n for n in want if n not in self._stage_of_output]
        if unknown:
            raise InputError(f"requested outputs {unknown} are not outputs of {self.graph.name!r} "
                             f"(outputs: {self.output_names})")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing inputs {missing}; the model takes {self.input_names}")
        last_needed = max(self._stage_of_output[n] for n in want)
        carried: dict[str, tuple[int, Any]] = {}          # value -> (device index, tensor)
        step: dict[tuple[int, int], int] = {}
        result: dict[str, Any] = {}
        for st in self.stages[:last_needed + 1]:
            dev = torch.device(st.device)
            stage_feeds: dict[str, Any] = {}
            for v in st.graph.inputs:
                if v.name in carried:
                    src, x = carried[v.name]
                    stage_feeds[v.name] = self._copy(x, src, st.device_index, dev, step)
                else:
                    stage_feeds[v.name] = feeds[v.name]
            outs = st.sends + [n for n in want if n in st.produces and n not in st.sends]
            got = st.engine.run(stage_feeds, outputs=outs)
            for name in st.sends:
                carried[name] = (st.device_index, got[name])
            for name in want:
                if name in got:
                    result[name] = got[name]
        self.last_step = step
        for k, b in step.items():
            self.moved[k] = self.moved.get(k, 0) + b
        if step:
            diagnostics.record("TRANSFER", "stage boundary copies", level=1, bytes=sum(step.values()),
                               pairs={f"{self.devices[a]}#{a}->{self.devices[b]}#{b}": n for (a, b), n in step.items()})
        self.calls += 1
        return {n: result[n] for n in want}

    @staticmethod
    def _copy(x: Any, src: int, dst: int, dev: torch.device, step: dict[tuple[int, int], int]) -> Any:
        if not isinstance(x, torch.Tensor) or src == dst:
            return x
        step[(src, dst)] = step.get((src, dst), 0) + x.numel() * x.element_size()
        y = x.to(dev, non_blocking=x.is_cuda and dev.type == "cuda")
        return y.clone() if y is x else y          # two logical devices on one physical one: a real copy

    def __call__(self, feeds: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.run({**(feeds or {}), **kw})

    def inspect(self) -> "StagedInspection":
        from shapeplan.parallel.report import StagedInspection
        return StagedInspection(self)

    def close(self) -> None:
        for st in self.stages:
            st.engine.close()
