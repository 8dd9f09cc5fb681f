"""Pattern tables (tinygrad ``PatternMatcher`` style): node patterns, their matching, the Match.

Pattern inputs: ``P(...)`` matches the producer of the value (which must have no other reader,
unless ``shared=True``), a string binds any value under that name (a name used twice must bind the
same value), ``C(name, pred)`` binds a constant tensor, ``ANY`` matches anything. Binary ops with
the COMMUTATIVE trait are tried in both input orders. A replacement function gets a :class:`Match`
and returns the value that replaces the root node's first output, or None to decline.

The matching functions take the Rewriter ``rw`` (use-lists, producers, traits) as first argument.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from shapeplan.ir.graph import Node, Value, ValueKind
from shapeplan.optimize.rewrite.optable import COMMUTATIVE

if TYPE_CHECKING:
    from shapeplan.optimize.rewrite.rewriter import Rewriter


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


# ------------------------------------------------------------------------------ matching
def match(rw: "Rewriter", pat: P, node: Node) -> Match | None:
    if not quick(rw, pat, node):
        return None
    m = Match(rw, node)
    return m if match_node(rw, pat, node, m) else None


def quick(rw: "Rewriter", pat: P, node: Node) -> bool:
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
    return n == 2 and bool(rw.traits(node) & COMMUTATIVE) and _quick_order(pins, (ins[1], ins[0]))


def match_node(rw: "Rewriter", pat: P, node: Node, m: Match) -> bool:
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
    if n == 2 and len(pins) == 2 and rw.traits(node) & COMMUTATIVE:
        orders: tuple = (ins, (ins[1], ins[0]))
    else:
        orders = (ins,)                     # zip() below stops at len(pins) <= n
    match_value = _match_value
    for order in orders:
        saved_binds, saved_len = dict(m.binds), len(m.nodes)
        ok = True
        for p, v in zip(pins, order):
            if not match_value(rw, p, v, m):
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


def _match_value(rw: "Rewriter", p: Any, v: Value | None, m: Match) -> bool:
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
        t = rw.const_value(v)
        if t is None or (p.pred is not None and not _safe_pred(p.pred, t)):
            return False
        if p.name in m.binds and m.binds[p.name] is not t:
            return False
        m.binds[p.name] = t
        m.binds[p.name + "_value"] = v
        return True
    if isinstance(p, P):
        prod = rw.producer(v)
        if prod is None or (not p.shared and not rw.single_use(v)):
            return False
        return match_node(rw, p, prod, m)
    return False


def _quick_order(pins: tuple, ins: Any) -> bool:
    return quick_checks(tuple(enumerate(pins)), ins)


def quick_checks(checks: tuple, ins: Any) -> bool:
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


def clear() -> None:
    """Forget the cached predicate answers."""
    _PRED_CACHE.clear()
    _PRED_BY_VALUE.clear()
