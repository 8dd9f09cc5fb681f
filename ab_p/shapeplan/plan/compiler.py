"""Plan compiler: Graph -> flat list of Slots over an integer register file.

Register layout: placeholders, then constants, then variables, then subgraph captures, then op
outputs in topological order. Each slot holds its pre-bound kernel and the registers it reads and
writes; ``release`` lists the registers whose last reader is this slot (freed right after it runs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from shapeplan.errors import ModelError
from shapeplan.ir.graph import Graph, Node, Value, ValueKind
from shapeplan.ops.registry import OpDef, bind_kernel, lookup

ABSENT = -1


@dataclass(slots=True)
class Slot:
    index: int
    node: Node
    opdef: OpDef
    fn: Callable[..., tuple]
    ins: tuple[int, ...]          # input registers (ABSENT for a missing optional input)
    outs: tuple[int, ...]         # output registers (ABSENT for an unused optional output)
    release: tuple[int, ...] = ()  # registers last read here

    @property
    def op_type(self) -> str:
        return self.node.op_type


@dataclass(slots=True)
class Plan:
    graph: Graph
    n_regs: int
    reg_names: list[str]
    inputs: list[tuple[str, int]]                 # placeholder name -> register
    constants: list[tuple[int, Any]]              # register -> data
    variables: list[tuple[str, int]]              # variable name -> register
    captures: list[tuple[str, int]]               # subgraph outer-scope name -> register
    outputs: list[tuple[str, int]]                # output name -> register
    slots: list[Slot] = field(default_factory=list)
    #: registers that are never released (inputs, constants, variables, outputs)
    pinned: frozenset[int] = frozenset()
    #: slots whose value is fixed for one input-shape signature (computed once at freeze)
    const_slots: frozenset[int] = frozenset()
    #: registers whose shape cannot change between calls with the same input-shape signature
    shape_stable: frozenset[int] = frozenset()
    segments: list[Any] = field(default_factory=list)     # plan.segments.Segment
    requested: tuple[str, ...] | None = None

    @property
    def output_names(self) -> list[str]:
        return [n for n, _ in self.outputs]

    def to_dot(self, **kw: Any) -> str:
        from shapeplan.plan.dot import plan_to_dot
        return plan_to_dot(self, **kw)

    def summary(self) -> dict[str, Any]:
        return {"slots": len(self.slots), "registers": self.n_regs, "const_slots": len(self.const_slots),
                "segments": len(self.segments),
                "captured_segments": sum(1 for s in self.segments if s.capturable),
                "gaps": sum(1 for s in self.segments if not s.capturable)}

    def release_at_step(self) -> dict[int, int]:
        """register -> index of the slot after which it is freed."""
        return {r: s.index for s in self.slots for r in s.release}


def needed_nodes(graph: Graph, outputs: Sequence[Value]) -> list[Node]:
    """Nodes that the requested outputs depend on, in graph order."""
    live = {id(v) for v in outputs}
    keep: list[Node] = []
    for node in reversed(graph.nodes):
        if any(id(o) in live for o in node.outputs) or _has_side_effect(node, graph):
            keep.append(node)
            live.update(id(v) for v in node.all_inputs if v is not None)
    keep.reverse()
    return keep


def _has_side_effect(node: Node, graph: Graph) -> bool:
    from shapeplan.ops.registry import Trait
    try:
        return lookup(node.op_type, node.domain, graph.opset(node.domain)).has(Trait.MUTATES_INPUT)
    except ModelError:
        return False


def compile_plan(graph: Graph, outputs: Sequence[str] | None = None) -> Plan:
    """Compile ``graph`` (already verified) into a Plan computing ``outputs`` (default: all)."""
    if outputs is None:
        out_values = list(graph.outputs)
    else:
        by_name = {v.name: v for v in graph.outputs}
        missing = [n for n in outputs if n not in by_name and n not in graph.values]
        if missing:
            raise ModelError(f"requested outputs {missing} do not exist; graph outputs are "
                             f"{[v.name for v in graph.outputs]}")
        out_values = [by_name.get(n) or graph.values[n] for n in outputs]
    nodes = needed_nodes(graph, out_values)

    reg_of: dict[int, int] = {}
    names: list[str] = []

    def new_reg(v: Value) -> int:
        reg_of[id(v)] = len(names)
        names.append(v.name)
        return reg_of[id(v)]

    inputs = [(v.name, new_reg(v)) for v in graph.inputs]
    constants = [(new_reg(v), v.data) for v in graph.values.values() if v.kind is ValueKind.CONSTANT]
    variables = [(v.name, new_reg(v)) for v in graph.values.values() if v.kind is ValueKind.VARIABLE]
    captures = [(v.name, new_reg(v)) for v in graph.captures]
    slots: list[Slot] = []
    for node in nodes:
        opset = graph.opset(node.domain)
        opdef = lookup(node.op_type, node.domain, opset)
        try:
            fn = bind_kernel(opdef, node, opset)
        except ModelError:
            raise
        except Exception as e:
            raise ModelError(f"node {node.describe()}: cannot bind kernel: {e}") from e
        ins = tuple(ABSENT if v is None else reg_of[id(v)] for v in node.all_inputs)
        outs = tuple(new_reg(o) if o.name else ABSENT for o in node.outputs)
        slots.append(Slot(len(slots), node, opdef, fn, ins, outs))
    output_regs = [(v.name, reg_of[id(v)]) for v in out_values]

    pinned = {r for _, r in inputs} | {r for r, _ in constants} | {r for _, r in variables} \
        | {r for _, r in captures} | {r for _, r in output_regs}
    last_read: dict[int, int] = {}
    for s in slots:
        for r in s.ins:
            if r != ABSENT:
                last_read[r] = s.index
        for r in s.outs:               # an output nobody reads dies where it is born
            if r != ABSENT:
                last_read.setdefault(r, s.index)
    by_slot: dict[int, list[int]] = {}
    for r, i in last_read.items():
        if r not in pinned:
            by_slot.setdefault(i, []).append(r)
    for s in slots:
        s.release = tuple(sorted(by_slot.get(s.index, ())))
    plan = Plan(graph, len(names), names, inputs, constants, variables, captures, output_regs, slots,
                frozenset(pinned), requested=None if outputs is None else tuple(outputs))
    from shapeplan.plan.segments import build_segments, classify
    plan.const_slots, plan.shape_stable = classify(plan)
    plan.segments = build_segments(plan, plan.const_slots)
    return plan


def host_read_registers(plan: Plan) -> frozenset[int]:
    """Registers that every slot running after freeze reads at a ``host_inputs`` position.

    When such a register is plan-constant (a shape computed from ``Shape``/``Concat``), the runner
    keeps it on the host at freeze, so the kernels that read it never sync with the device."""
    host: set[int] = set()
    device: set[int] = {r for _, r in plan.outputs}
    for s in plan.slots:
        if s.index in plan.const_slots:
            continue
        hi = s.opdef.host_inputs
        for i, r in enumerate(s.ins):
            if r != ABSENT:
                (host if i in hi else device).add(r)
    return frozenset(host - device)
