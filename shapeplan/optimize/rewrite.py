"""Rewrite context and pattern tables: the machinery every pass shares.

A :class:`Rewriter` wraps one Graph for the duration of one pass. It keeps a use-list
(value -> reading nodes) up to date as values are replaced, removes nodes that die as a
consequence, inserts new nodes *right before the node they replace* (so reads of mutable state keep
their place relative to ``MUTATES_INPUT`` nodes) and rebuilds ``graph.nodes`` once at the end.

Local rewrites are data (tinygrad ``PatternMatcher`` style)::

    RULES = [
        (P("Neg", P("Neg", "x")), lambda m: m["x"]),                  # neg(neg(x)) -> x
        (P("Add", "x", C("c", is_zero)), lambda m: m.keep_shape("x")),  # x + 0 -> x
    ]
    count = apply_rules(graph, RULES, "Peephole")

Pattern inputs: ``P(...)`` matches the producer of the value (which must have no other reader,
unless ``shared=True``), a string binds any value under that name (a name used twice must bind the
same value), ``C(name, pred)`` binds a constant tensor, ``ANY`` matches anything. Binary ops with
the COMMUTATIVE trait are tried in both input orders. A replacement function gets a :class:`Match`
and returns the value that replaces the root node's first output, or None to decline.
"""
from __future__ import annotations

import bisect
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from shapeplan.ir.dtypes import DType
from shapeplan.ir.graph import Graph, Node, Value, ValueKind
from shapeplan.ir.shape_inference import infer_node
from shapeplan.ops.registry import OpDef, Trait, lookup

log = logging.getLogger("shapeplan.optimize")

#: nodes that must never be removed even when their outputs are unused
KEEP_TRAITS = Trait.MUTATES_INPUT
_COMMUTATIVE = Trait.COMMUTATIVE.value
_MUTATES = Trait.MUTATES_INPUT.value
_KEEP = KEEP_TRAITS.value
_CONTROL_FLOW = Trait.CONTROL_FLOW.value


# ------------------------------------------------------------------------------ event sink
def _diag_record() -> Callable[..., Any] | None:
    try:
        from shapeplan import diagnostics  # noqa: PLC0415  (built by another module; optional)
    except Exception:  # noqa: BLE001
        return None
    rec = getattr(diagnostics, "record", None)
    return rec if callable(rec) else None


def _fusion_category() -> Any:
    try:
        from shapeplan import diagnostics  # noqa: PLC0415
        cat = getattr(diagnostics, "Category", None)
        return getattr(cat, "FUSION") if cat is not None else "FUSION"
    except Exception:  # noqa: BLE001
        return "FUSION"


class EventSink:
    """Where applied rewrites (and declined fusions) are reported: logging + diagnostics FUSION."""

    def __init__(self) -> None:
        self.log_enabled = os.environ.get("SHAPEPLAN_OPTIMIZER_LOG", "0") not in ("", "0")
        self.record = _diag_record()
        self.category = _fusion_category() if self.record is not None else None
        if self.log_enabled and not log.handlers and not logging.getLogger().handlers:
            h = logging.StreamHandler()            # stderr
            h.setFormatter(logging.Formatter("[shapeplan.optimize] %(message)s"))
            log.addHandler(h)
            log.setLevel(logging.INFO)

    def emit(self, pass_name: str, message: str, declined: bool = False, **fields: Any) -> None:
        if self.log_enabled:
            log.warning("%s: %s%s", pass_name, "declined: " if declined else "", message)
        if self.record is not None:
            try:
                self.record(self.category, f"{pass_name}: {message}", pass_name=pass_name,
                            declined=declined, **fields)
            except Exception:  # noqa: BLE001 - diagnostics must never break optimization
                self.record = None


_SINK: EventSink | None = None
#: (op, domain, opset) -> OpDef | None; misses are cached too (a failed lookup builds a costly hint)
_OPDEFS: dict[tuple[str, str, int], OpDef | None] = {}
_TRAITS: dict[tuple[str, str, int], int] = {}
#: id(graph) -> the Rewriter shared by all passes while the pass manager runs on that graph
_ACTIVE: dict[int, "Rewriter"] = {}


def cached_lookup(op_type: str, domain: str, opset: int) -> OpDef | None:
    key = (op_type, domain, opset)
    try:
        return _OPDEFS[key]
    except KeyError:
        pass
    try:
        od: OpDef | None = lookup(op_type, domain, opset)
    except Exception:  # noqa: BLE001
        od = None
    _OPDEFS[key] = od
    return od


def sink() -> EventSink:
    global _SINK
    if _SINK is None:
        _SINK = EventSink()
    return _SINK


class shared:
    """Context manager: all passes run on ``graph`` inside it share one Rewriter."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def __enter__(self) -> "shared":
        _ACTIVE[id(self.graph)] = Rewriter(self.graph, "")
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.pop(id(self.graph), None)


def reset_sink() -> None:
    """Re-read env / re-probe diagnostics (called once per optimize())."""
    global _SINK
    _SINK = EventSink()
    _OPDEFS.clear()                 # the op table may have grown since the last optimize()
    _PRED_CACHE.clear()
    _PRED_BY_VALUE.clear()
    _TRAITS.clear()


# ------------------------------------------------------------------------------ patterns
class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY = _Any()


@dataclass(slots=True)
class C:
    """Constant input pattern: binds the constant's tensor under ``name`` when ``pred`` holds."""
    name: str
    pred: Callable[[torch.Tensor], bool] | None = None


@dataclass(slots=True)
class P:
    """Node pattern: op type(s), input patterns, optional binding name and node predicate."""
    op: str | tuple[str, ...]
    inputs: tuple[Any, ...] = ()
    name: str | None = None
    pred: Callable[[Node], bool] | None = None
    shared: bool = False          # allow the value to have other readers
    domain: str | None = None     # None: ai.onnx or shapeplan
    op_set: frozenset = frozenset()

    def __init__(self, op: str | tuple[str, ...], *inputs: Any, name: str | None = None,
                 pred: Callable[[Node], bool] | None = None, shared: bool = False,
                 domain: str | None = None) -> None:
        self.op, self.inputs, self.name, self.pred = op, inputs, name, pred
        self.shared, self.domain = shared, domain
        self.op_set = frozenset(self.ops())

    def ops(self) -> tuple[str, ...]:
        return (self.op,) if isinstance(self.op, str) else self.op


@dataclass(slots=True)
class Match:
    rw: "Rewriter"
    root: Node
    binds: dict[str, Any] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.binds[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.binds.get(name, default)

    @property
    def out(self) -> Value:
        return self.root.outputs[0]

    def op(self, op_type: str, *inputs: Value | None, domain: str = "", n_out: int = 1,
           like: Value | None = None, **attrs: Any) -> Any:
        return self.rw.op(op_type, list(inputs), attrs, domain=domain, n_out=n_out, like=like,
                          before=self.root)

    def const(self, data: Any, like: Value | None = None) -> Value:
        return self.rw.const(data, like)

    def keep_shape(self, name: str) -> Value | None:
        """The bound value ``name`` if it has the root output's dtype and (static) shape, else None."""
        return self.rw.same_type(self.binds[name], self.out)


Rule = tuple[P, Callable[[Match], Any]]


# ------------------------------------------------------------------------------ rewriter
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
        mut = _MUTATES
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
        t = _TRAITS.get(key)
        if t is None:
            od = cached_lookup(*key)
            t = _TRAITS[key] = od.traits.value if od is not None else 0
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
        readers = self.users.pop(old, [])
        for n in readers:
            n.inputs = [new if v is old else v for v in n.inputs]
            if n.implicit_inputs:
                n.implicit_inputs = [new if v is old else v for v in n.implicit_inputs]
        self.users.setdefault(new, []).extend(readers)
        self.changed += 1
        if old.producer is not None:
            self.sweep(old.producer)
        return True

    def _rename_into_output(self, old: Value, new: Value) -> bool:
        if (new.kind is not ValueKind.INTERMEDIATE or new.producer is None or id(new) in self.output_ids
                or self.pinned(new)):
            return False
        g = self.g
        prod = old.producer
        readers = self.users.pop(old, [])
        for n in readers:
            n.inputs = [new if v is old else v for v in n.inputs]
            if n.implicit_inputs:
                n.implicit_inputs = [new if v is old else v for v in n.implicit_inputs]
        self.users.setdefault(new, []).extend(readers)
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
        if t & _KEEP:
            return False
        if t & _CONTROL_FLOW and _subgraphs_mutate(n, self.g):
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
        sink().emit(self.pass_name, message, declined=declined, **fields)

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

    # ---- matching
    def match(self, pat: P, node: Node) -> Match | None:
        if not self._quick(pat, node):
            return None
        m = Match(self, node)
        return m if self._match_node(pat, node, m) else None

    def _quick(self, pat: P, node: Node) -> bool:
        """Cheap structural pre-check (op types of direct producers, constant-ness) before matching."""
        pins = pat.inputs
        if not pins:
            return True
        ins = node.inputs
        n = len(ins)
        while n and ins[n - 1] is None:
            n -= 1
        if n != len(pins):
            return False
        if _quick_order(pins, ins):
            return True
        return n == 2 and bool(self.traits(node) & _COMMUTATIVE) and _quick_order(pins, (ins[1], ins[0]))

    def _match_node(self, pat: P, node: Node, m: Match) -> bool:
        if node.op_type not in pat.op_set:
            return False
        if pat.domain is not None and node.domain != pat.domain:
            return False
        if pat.domain is None and node.domain not in ("", "ai.onnx", "shapeplan"):
            return False
        ins = node.inputs
        n = len(ins)
        while n and ins[n - 1] is None:
            n -= 1
        pins = pat.inputs
        if pins and n != len(pins):
            return False
        if pat.pred is not None and not pat.pred(node):
            return False
        if n == 2 and len(pins) == 2 and self.traits(node) & _COMMUTATIVE:
            orders: tuple = (ins, (ins[1], ins[0]))
        else:
            orders = (ins,)                     # zip() below stops at len(pins) <= n
        match_value = self._match_value
        for order in orders:
            saved_binds, saved_len = dict(m.binds), len(m.nodes)
            ok = True
            for p, v in zip(pins, order):
                if not match_value(p, v, m):
                    ok = False
                    break
            if ok:
                if pat.name:
                    m.binds[pat.name] = node
                m.nodes.append(node)
                return True
            m.binds = saved_binds
            del m.nodes[saved_len:]
        return False

    def _match_value(self, p: Any, v: Value | None, m: Match) -> bool:
        if p is ANY:
            return True
        if v is None:
            return p is None
        if isinstance(p, str):
            bound = m.binds.get(p)
            if bound is None:
                m.binds[p] = v
                return True
            return bound is v
        if isinstance(p, C):
            t = self.const_value(v)
            if t is None or (p.pred is not None and not _safe_pred(p.pred, t)):
                return False
            if p.name in m.binds and m.binds[p.name] is not t:
                return False
            m.binds[p.name] = t
            m.binds[p.name + "_value"] = v
            return True
        if isinstance(p, P):
            prod = self.producer(v)
            if prod is None or (not p.shared and not self.single_use(v)):
                return False
            return self._match_node(p, prod, m)
        return False


def _quick_order(pins: tuple, ins: Any) -> bool:
    return _quick_checks(tuple(enumerate(pins)), ins)


def _quick_checks(checks: tuple, ins: Any) -> bool:
    """The structural pre-check over ``(input index, P | C)`` pairs (string / ANY inputs need none)."""
    for i, p in checks:
        v = ins[i]
        if type(p) is P:
            if v is None or v.producer is None or v.kind is not ValueKind.INTERMEDIATE or \
                    v.producer.op_type not in p.op_set:
                return False
        elif type(p) is C:
            # the full match needs a tensor constant the predicate accepts (cached per tensor)
            if v is None or v.kind is not ValueKind.CONSTANT or not isinstance(v.data, torch.Tensor) or \
                    (p.pred is not None and not _safe_pred(p.pred, v.data)):
                return False
    return True


_PRED_CACHE: dict[tuple[int, int], tuple[torch.Tensor, bool]] = {}


def _safe_pred(pred: Callable[[torch.Tensor], bool], t: torch.Tensor) -> bool:
    key = (id(t), id(pred))
    hit = _PRED_CACHE.get(key)
    if hit is not None and hit[0] is t:
        return hit[1]
    # Graphs repeat small constants (0, 1, eps, ...) as separate tensors: a second cache keyed on
    # the contents answers them without running the predicate's torch ops again.
    vkey = None
    if t.numel() <= _PRED_BY_VALUE_MAX and t.device.type == "cpu" and t.is_contiguous() and \
            not t.requires_grad:
        try:
            vkey = (id(pred), t.dtype, tuple(t.shape), t.numpy().tobytes())
        except (TypeError, RuntimeError):       # bf16 / fp8 / conj: numpy has no such dtype
            vkey = None
    vhit = _PRED_BY_VALUE.get(vkey) if vkey is not None else None
    if vhit is not None and vhit[0] is pred:
        r = vhit[1]
    else:
        r = _safe_pred_uncached(pred, t)
        if vkey is not None:
            if len(_PRED_BY_VALUE) > 100_000:
                _PRED_BY_VALUE.clear()
            _PRED_BY_VALUE[vkey] = (pred, r)   # holds pred: its id cannot be reused while cached
    if len(_PRED_CACHE) > 100_000:
        _PRED_CACHE.clear()
    _PRED_CACHE[key] = (t, r)          # holds t: its id cannot be reused while cached
    return r


_PRED_BY_VALUE_MAX = 64
_PRED_BY_VALUE: dict[tuple, tuple[Callable[[torch.Tensor], bool], bool]] = {}


def _safe_pred_uncached(pred: Callable[[torch.Tensor], bool], t: torch.Tensor) -> bool:
    try:
        return bool(pred(t))
    except Exception:  # noqa: BLE001
        return False


def _collect_capture_names(g: Graph, out: set[str]) -> None:
    out.update(v.name for v in g.captures)
    for n in g.nodes:
        for sub in n.subgraphs():
            _collect_capture_names(sub, out)


def _subgraphs_mutate(n: Node, g: Graph) -> bool:
    for sub in n.subgraphs():
        for m in sub.nodes:
            od = cached_lookup(m.op_type, m.domain, sub.opset(m.domain))
            if od is None or od.has(Trait.MUTATES_INPUT):
                return True
            if m.subgraphs() and _subgraphs_mutate(m, sub):
                return True
    return False


def apply_rules(graph: Graph, rules: list[Rule], pass_name: str) -> int:
    """Run a (pattern, replacement) table once over the graph in order; returns #rewrites."""
    by_op: dict[str, list[tuple]] = {}
    for pat, fn in rules:
        checks = tuple((i, p) for i, p in enumerate(pat.inputs) if type(p) is P or type(p) is C)
        for op in pat.ops():
            by_op.setdefault(op, []).append((pat, fn, len(pat.inputs), checks))
    rw = Rewriter.get(graph, pass_name)
    count = 0
    dead, traits, match_node = rw.dead, rw.traits, rw._match_node
    for node in list(graph.nodes):
        cands = by_op.get(node.op_type)
        if not cands or node in dead or not node.outputs:
            continue
        # Rewriter.match() inlined (this loop sees every node of every rule pass): the structural
        # pre-check per candidate rule, then the full match
        ins = node.inputs
        n = len(ins)
        while n and ins[n - 1] is None:
            n -= 1
        swapped = (ins[1], ins[0]) if n == 2 and traits(node) & _COMMUTATIVE else None
        for pat, fn, npins, checks in cands:
            if npins and (n != npins or not (_quick_checks(checks, ins) or
                                             (swapped is not None and _quick_checks(checks, swapped)))):
                continue
            m = Match(rw, node)
            if not match_node(pat, node, m):
                continue
            if rw.crosses_mutation(m.nodes, node):
                continue
            new = fn(m)
            if new is None:
                continue
            if rw.replace(node.outputs[0], new, before=node):
                count += 1
                rw.emit(f"{getattr(fn, '__name__', 'rule')} at {node.describe()}", node=node.name,
                        op=node.op_type)
                break
    rw.commit()
    return count


# ------------------------------------------------------------------------------ small helpers
def is_float(v: Value | None) -> bool:
    return v is not None and v.dtype is not None and v.dtype.is_float


def is_int(v: Value | None) -> bool:
    return (v is not None and v.dtype is not None and v.dtype.torch is not None
            and not v.dtype.torch.is_floating_point and not v.dtype.torch.is_complex
            and v.dtype.name != "bool")


def all_equal(t: torch.Tensor, x: float) -> bool:
    if t.numel() == 0:
        return False
    if t.dtype == torch.bool:
        return bool((t == bool(x)).all())
    return bool((t == x).all())


def close_to(t: torch.Tensor, x: float, rel: float = 1e-3) -> bool:
    return t.numel() == 1 and math.isclose(float(t.reshape(()).item()), x, rel_tol=rel)


def dtype_of(v: Value | None) -> DType | None:
    return None if v is None else v.dtype


def static_shape(v: Value | None) -> tuple[int, ...] | None:
    return tuple(v.shape) if v is not None and v.is_static else None  # type: ignore[arg-type]


def norm_axis(axis: int, rank: int | None) -> int | None:
    if axis >= 0:
        return axis
    return None if rank is None else axis + rank


def int_list(rw: Rewriter, node: Node, attr: str, input_index: int) -> list[int] | None:
    """An int-list parameter given as attribute (old opsets) or constant input (new opsets).

    Returns None when it is not known at compile time; [] when absent."""
    if attr in node.attrs:
        v = node.attrs[attr]
        return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    if len(node.inputs) > input_index and node.inputs[input_index] is not None:
        t = rw.const_value(node.inputs[input_index])
        if t is None:
            return None
        return [int(x) for x in t.reshape(-1).tolist()]
    return []


def shapes_equal(a: Any, b: Any) -> bool:
    """Static or symbolic shapes that are provably equal (no unknown dims)."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and y is not None and x == y for x, y in zip(a, b))
