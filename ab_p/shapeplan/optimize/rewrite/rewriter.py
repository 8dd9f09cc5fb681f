"""The Rewriter: one pass's view of a graph (use-lists, replacement, insertion, dead-node sweep).

It keeps a use-list (value -> reading nodes) up to date as values are replaced, removes nodes that
die as a consequence, inserts new nodes *right before the node they replace* (so reads of mutable
state keep their place relative to ``MUTATES_INPUT`` nodes) and rebuilds ``graph.nodes`` once per
pass in :meth:`Rewriter.commit`. While the pass manager runs, all passes share one (:class:`shared`).
"""
from __future__ import annotations

import bisect
from typing import Any, Iterable

import torch

from shapeplan.ir.graph import Graph, Node, Value, ValueKind
from shapeplan.ir.shape_inference import infer_node
from shapeplan.ops.registry import OpDef, Trait
from shapeplan.optimize.rewrite import events
from shapeplan.optimize.rewrite.optable import CONTROL_FLOW, KEEP, MUTATES, TRAITS, cached_lookup, subgraphs_mutate
from shapeplan.optimize.rewrite.patterns import Match, P, match

#: id(graph) -> the Rewriter shared by all passes while the pass manager runs on that graph
_ACTIVE: dict[int, "Rewriter"] = {}


class shared:
    """Context manager: all passes run on ``graph`` inside it share one Rewriter."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def __enter__(self) -> "shared":
        _ACTIVE[id(self.graph)] = Rewriter(self.graph, "")
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.pop(id(self.graph), None)


class Rewriter:
    """One pass's view of a graph: use-lists, replacement, insertion, dead-node sweep."""

    def __init__(self, graph: Graph, pass_name: str = "") -> None:
        self.g = graph
        self.pass_name = pass_name
        self._tc: dict[Any, int] = {}                # Node -> trait bits
        self.users: dict[Any, list[Node]] = {}     # Value -> reading nodes (keys hold the object)
        users = self.users
        for n in graph.nodes:
            for v in n.inputs:
                if v is not None:
                    lst = users.get(v)
                    if lst is None:
                        users[v] = [n]
                    else:
                        lst.append(n)
            if n.implicit_inputs:
                for v in n.implicit_inputs:
                    users.setdefault(v, []).append(n)
        self._positions()
        self.output_ids = {id(v) for v in graph.outputs}
        # values read by subgraphs by name (implicit inputs / captures): never renamed or replaced
        self.captured_names: set[str] = set()
        self.implicit: set[int] = set()
        for n in graph.nodes:
            if n.implicit_inputs:
                self.implicit.update(id(v) for v in n.implicit_inputs)
            if n.attrs:
                for sub in n.subgraphs():
                    _collect_capture_names(sub, self.captured_names)
        self.dead: set[Any] = set()                 # Node objects removed by this pass
        self.inserts: dict[Any, list[Node]] = {}    # Node -> new nodes to place before it
        self.changed = 0
        self.removed = 0

    @classmethod
    def get(cls, graph: Graph, pass_name: str) -> "Rewriter":
        """The pass manager's shared rewriter for ``graph`` (kept in sync across passes), or a new one."""
        rw = _ACTIVE.get(id(graph))
        if rw is None or rw.g is not graph:
            return cls(graph, pass_name)
        rw.pass_name, rw.changed, rw.removed = pass_name, 0, 0
        return rw

    def _positions(self) -> None:
        nodes = self.g.nodes
        self.pos: dict[Any, int] = dict(zip(nodes, range(len(nodes))))
        self.mutator_pos: list[int] = []
        self.mutated: set[int] = set()
        mut = MUTATES
        tc, traits = self._tc, self.traits
        for i, n in enumerate(nodes):
            t = tc.get(n)
            if (traits(n) if t is None else t) & mut:
                self.mutator_pos.append(i)
                self.mutated.update(id(v) for v in n.inputs if v is not None)

    # ---- queries
    def opdef(self, n: Node) -> OpDef | None:
        return cached_lookup(n.op_type, n.domain, self.g.opset(n.domain))

    def traits(self, n: Node) -> int:
        """The node's trait bits as a plain int (enum.Flag arithmetic is slow in hot loops)."""
        t = self._tc.get(n)
        if t is not None:
            return t
        key = (n.op_type, n.domain, self.g.opset_imports.get(n.domain) or self.g.opset(n.domain))
        t = TRAITS.get(key)
        if t is None:
            od = cached_lookup(*key)
            t = TRAITS[key] = od.traits.value if od is not None else 0
        self._tc[n] = t
        return t

    def has(self, n: Node, trait: Trait) -> bool:
        return bool(self.traits(n) & trait.value)

    def readers(self, v: Value) -> list[Node]:
        lst = self.users.get(v)
        if not lst:
            return []
        dead = self.dead
        return [n for n in lst if n not in dead] if dead else list(lst)

    def has_readers(self, v: Value) -> bool:
        """``bool(self.readers(v))`` without building the list (shared constants have long ones)."""
        lst = self.users.get(v)
        if not lst:
            return False
        dead = self.dead
        if not dead:
            return True
        for n in lst:
            if n not in dead:
                return True
        return False

    def pinned(self, v: Value) -> bool:
        """A graph output or a value that a subgraph reads by name."""
        return id(v) in self.output_ids or id(v) in self.implicit or v.name in self.captured_names

    def single_use(self, v: Value) -> bool:
        """Exactly one node reads ``v`` (possibly in several input slots) and it is not pinned."""
        lst = self.users.get(v)
        if not lst:
            return False
        dead = self.dead
        first = None
        for n in lst:
            if n in dead:
                continue
            if first is None:
                first = n
            elif n is not first:
                return False
        return first is not None and not self.pinned(v)

    def alive(self, n: Node) -> bool:
        return n not in self.dead

    def producer(self, v: Value | None) -> Node | None:
        if v is None or v.kind is not ValueKind.INTERMEDIATE:
            return None
        p = v.producer
        return p if p is not None and p not in self.dead else None

    @staticmethod
    def const_value(v: Value | None) -> torch.Tensor | None:
        if v is not None and v.kind is ValueKind.CONSTANT and isinstance(v.data, torch.Tensor):
            return v.data
        return None

    @staticmethod
    def scalar(v: Value | None) -> float | None:
        """The value of a constant with exactly one element (any rank), else None."""
        t = Rewriter.const_value(v)
        if t is None or t.numel() != 1 or t.dtype.is_complex:
            return None
        return float(t.item())          # one element, any rank

    def supported(self, op_type: str, domain: str = "") -> bool:
        return cached_lookup(op_type, domain, self.g.opset(domain)) is not None

    def fused_domain(self, op_type: str) -> str | None:
        """Where a fused op lives at this graph's opset: ai.onnx first, then the shapeplan domain."""
        if self.supported(op_type, ""):
            return ""
        if self.supported(op_type, "shapeplan"):
            self.g.opset_imports.setdefault("shapeplan", 1)
            return "shapeplan"
        return None

    @staticmethod
    def same_type(v: Value, like: Value) -> Value | None:
        """``v`` when it provably has ``like``'s dtype and shape (so it can stand in for it)."""
        if v.dtype is None or v.dtype != like.dtype or v.shape is None or like.shape is None:
            return None
        if len(v.shape) != len(like.shape):
            return None
        for a, b in zip(v.shape, like.shape):
            if a is None or b is None or a != b:
                return None
        return v

    # ---- building
    def op(self, op_type: str, inputs: list[Value | None], attrs: dict[str, Any] | None = None, *,
           domain: str = "", n_out: int = 1, like: Value | None = None, before: Node) -> Any:
        """Create a node placed right before ``before``; returns its output (tuple if n_out > 1)."""
        g = self.g
        node = g.add_node(op_type, inputs, {k: v for k, v in (attrs or {}).items() if v is not None},
                          num_outputs=n_out, domain=domain)
        g.nodes.pop()                                  # placed at commit()
        self.inserts.setdefault(before, []).append(node)
        self.pos[node] = self.pos.get(before, len(g.nodes))
        for v in node.all_inputs:
            if v is not None:
                self.users.setdefault(v, []).append(node)
        if like is not None and n_out == 1:          # the new node computes `like`: same type
            o = node.outputs[0]
            o.dtype, o.shape = like.dtype, like.shape
            return o
        try:
            infer_node(node, g.opset(domain))
        except Exception:  # noqa: BLE001 - an unknown shape is fine
            pass
        return node.outputs[0] if n_out == 1 else tuple(node.outputs)

    def const(self, data: Any, like: Value | None = None) -> Value:
        t = data if isinstance(data, torch.Tensor) else torch.as_tensor(data)
        if like is not None and like.dtype is not None and like.dtype.torch is not None:
            t = t.to(like.dtype.torch)
        return self.g.constant(t.contiguous(), name=self.g.fresh_name("opt_const"))

    # ---- replacement
    def replace(self, old: Value, new: Value, before: Node | None = None) -> bool:
        """Make every reader of ``old`` read ``new``; keeps output names. False when impossible."""
        if old is new:
            return False
        if id(old) in self.implicit or old.name in self.captured_names:
            return False                        # a subgraph reads it by name
        if id(old) in self.output_ids:
            if new.kind is ValueKind.CONSTANT and old.producer is not None and \
                    isinstance(new.data, torch.Tensor):
                prod = old.producer                    # the output itself becomes that constant
                prod.outputs = [Value("", old.dtype, old.shape, producer=prod) if o is old else o
                                for o in prod.outputs]
                old.kind, old.data, old.producer = ValueKind.CONSTANT, new.data, None
                old.dtype, old.shape = new.dtype, new.shape
                self.changed += 1
                self.sweep(prod)
                return True
            if not self._rename_into_output(old, new):
                prod = old.producer
                if prod is None or prod.op_type == "Identity" and prod.inputs and prod.inputs[0] is new:
                    return False
                # keep the output's name: old := Identity(new)
                ident = Node("Identity", [new], [old], {}, "", self.g.fresh_name("Identity"))
                if prod is not None:                  # detach: prod's slot becomes an unused output
                    prod.outputs = [Value("", old.dtype, old.shape, producer=prod) if o is old else o
                                    for o in prod.outputs]
                old.producer = ident
                self.inserts.setdefault(before or prod, []).append(ident)
                self.pos[ident] = self.pos.get(before or prod, 0)
                self.users.setdefault(new, []).append(ident)
                self.changed += 1
                if prod is not None:
                    self.sweep(prod)
                return True
            return True
        self._move_readers(old, new)
        self.changed += 1
        if old.producer is not None:
            self.sweep(old.producer)
        return True

    def _move_readers(self, old: Value, new: Value) -> None:
        """Every node reading ``old`` (as input or implicit input) reads ``new`` instead."""
        readers = self.users.pop(old, [])
        for n in readers:
            n.inputs = [new if v is old else v for v in n.inputs]
            if n.implicit_inputs:
                n.implicit_inputs = [new if v is old else v for v in n.implicit_inputs]
        self.users.setdefault(new, []).extend(readers)

    def _rename_into_output(self, old: Value, new: Value) -> bool:
        if (new.kind is not ValueKind.INTERMEDIATE or new.producer is None or id(new) in self.output_ids
                or self.pinned(new)):
            return False
        g = self.g
        prod = old.producer
        self._move_readers(old, new)
        if g.values.get(new.name) is new:
            del g.values[new.name]
        if g.values.get(old.name) is old:
            del g.values[old.name]
        new.name = old.name
        g.values[new.name] = new
        g.outputs = [new if v is old else v for v in g.outputs]
        self.output_ids.discard(id(old))
        self.output_ids.add(id(new))
        old.name = ""                                 # the dead producer's output is now anonymous
        self.changed += 1
        if prod is not None:
            self.sweep(prod)
        return True

    def removable(self, n: Node) -> bool:
        t = self.traits(n)
        if t & KEEP:
            return False
        if t & CONTROL_FLOW and subgraphs_mutate(n, self.g):
            return False
        return True

    def sweep(self, n: Node) -> None:
        """Remove ``n`` (and, transitively, its producers) when nothing reads its outputs."""
        stack = [n]
        while stack:
            node = stack.pop()
            if node in self.dead or not self.removable(node):
                continue
            if any(self.has_readers(o) or self.pinned(o) for o in node.outputs):
                continue
            self._kill(node)
            for v in node.all_inputs:
                p = self.producer(v)
                if p is not None:
                    stack.append(p)

    def _kill(self, node: Node) -> None:
        self.dead.add(node)
        self.removed += 1
        for o in node.outputs:
            self.users.pop(o, None)
        for v in node.all_inputs:
            if v is not None:
                lst = self.users.get(v)
                if lst is not None:
                    try:
                        lst.remove(node)
                    except ValueError:
                        pass
        for o in node.outputs:
            if o.name and self.g.values.get(o.name) is o and id(o) not in self.output_ids:
                del self.g.values[o.name]

    def crosses_mutation(self, nodes: Iterable[Node], root: Node) -> bool:
        """True when a MUTATES_INPUT node sits between the earliest of ``nodes`` and ``root``."""
        if not self.mutator_pos:
            return False
        lo = min((self.pos.get(n, 0) for n in nodes), default=self.pos.get(root, 0))
        hi = self.pos.get(root, 0)
        i = bisect.bisect_right(self.mutator_pos, lo)
        return i < len(self.mutator_pos) and self.mutator_pos[i] < hi

    def emit(self, message: str, declined: bool = False, **fields: Any) -> None:
        events.sink().emit(self.pass_name, message, declined=declined, **fields)

    # ---- finish
    def commit(self) -> int:
        """Write the node list back (inserts placed, dead nodes dropped); returns #changes."""
        if self.dead or self.inserts:
            out: list[Node] = []
            dead, inserts = self.dead, self.inserts
            for n in self.g.nodes:
                if inserts and n in inserts:
                    self._emit_inserts(n, out)
                if n not in dead:
                    out.append(n)
            self.g.nodes = out
            self.dead = set()
            self.inserts = {}
            self._positions()
        return self.changed

    def _emit_inserts(self, n: Node, out: list[Node]) -> None:
        for new in self.inserts.pop(n, ()):
            self._emit_inserts(new, out)
            if new not in self.dead:
                out.append(new)

    def match(self, pat: P, node: Node) -> Match | None:
        """``pat`` matched at ``node`` (see patterns.py), or None."""
        return match(self, pat, node)


def _collect_capture_names(g: Graph, out: set[str]) -> None:
    out.update(v.name for v in g.captures)
    for n in g.nodes:
        for sub in n.subgraphs():
            _collect_capture_names(sub, out)
