"""The op table: one registry of OpDefs, keyed by (domain, op_type) and versioned by opset.

An op is data: a torch kernel, a shape function and traits. Adding an op means adding one entry::

    @register("Relu", traits=Trait.ELEMENTWISE, shape=same_as(0))
    def relu(x):
        return torch.relu(x)

Kernel convention: ``kernel(*inputs, **attrs)`` returns one value or a tuple. ONNX attributes are
passed as keyword arguments, so the kernel's signature *is* the attribute schema (defaults included).
Reserved keyword-only parameters a kernel may declare to receive context at bind time:
``_n_out`` (number of outputs the node has), ``_opset`` (the opset version in force),
``_node`` (the Node itself: for control flow), ``_n_in`` (number of explicit inputs).
Missing optional inputs arrive as ``None``; trailing missing inputs are dropped.
"""
from __future__ import annotations

import difflib
import enum
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from shapeplan.errors import ModelError, UnsupportedOpError


class Trait(enum.Flag):
    NONE = 0
    ELEMENTWISE = enum.auto()          # out[i] depends only on in[i] (after broadcast)
    REDUCTION = enum.auto()            # reduces over axes
    COMMUTATIVE = enum.auto()          # binary op with f(a, b) == f(b, a)
    VALUE_DEPENDENT_SHAPE = enum.auto()  # output shape depends on input *values* (Reshape, Expand...)
    DYNAMIC_OUTPUT_SIZE = enum.auto()  # output size known only after running (NonZero, Unique)
    SHAPE_ONLY_OUTPUT = enum.auto()    # output depends only on input shapes (Shape, Size)
    CREATES_VALUE = enum.auto()        # creates a fresh tensor independent of inputs' data (ConstantOfShape)
    MUTATES_INPUT = enum.auto()        # writes into an input in place (CacheWrite)
    HOST_SYNC = enum.auto()            # needs the host to read device data (segment boundary)
    CONTROL_FLOW = enum.auto()         # If / Loop / Scan
    RANDOM = enum.auto()               # nondeterministic without a seed
    NOT_CAPTURABLE = enum.auto()       # must run outside a captured segment for another reason
    VIEW = enum.auto()                 # output may alias input storage (Reshape, Identity)
    SEQUENCE = enum.auto()             # consumes/produces ONNX sequences or optionals (host objects)


#: traits that end a captured segment
SEGMENT_BREAKERS = (Trait.DYNAMIC_OUTPUT_SIZE | Trait.HOST_SYNC | Trait.CONTROL_FLOW
                    | Trait.NOT_CAPTURABLE | Trait.SEQUENCE)


@dataclass(slots=True)
class OpDef:
    name: str
    domain: str
    since: int
    kernel: Callable[..., Any]
    traits: Trait = Trait.NONE
    shape: Callable[..., Any] | None = None     # shape(node) -> list[(DType|None, Shape|None)]
    bind: Callable[..., Any] | None = None      # custom bind(node, opset) -> callable(*inputs)
    doc: str = ""
    _params: dict[str, inspect.Parameter] = field(default_factory=dict)
    #: optional Triton lowering (runtime/backends/triton/fusion.py attaches them); None = torch only
    triton: Any = None
    #: input positions the kernel reads as host values (split sizes, shapes, axes, pads, repeats, k).
    #: A constant there is bound at compile time as a CPU tensor (``bind_kernel``) and a plan-constant
    #: one is kept on the host at freeze (``runner.freeze``), so a captured segment never syncs on it.
    host_inputs: tuple[int, ...] = ()

    @property
    def capturable(self) -> bool:
        return not (self.traits & SEGMENT_BREAKERS)

    def has(self, trait: Trait) -> bool:
        return bool(self.traits & trait)


_DOMAIN_ALIASES = {"ai.onnx": ""}
_TABLE: dict[tuple[str, str], list[OpDef]] = {}
_loaded = False


def _norm_domain(domain: str) -> str:
    return _DOMAIN_ALIASES.get(domain, domain)


def register(name: str, *, domain: str = "", since: int = 1, traits: Trait = Trait.NONE,
             shape: Callable[..., Any] | None = None, bind: Callable[..., Any] | None = None,
             aliases: tuple[str, ...] = (), host_inputs: tuple[int, ...] = ()
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the kernel of op ``name`` from opset ``since`` on.

    ``host_inputs``: positions of inputs the kernel reads on the host (see ``OpDef.host_inputs``)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for n in (name, *aliases):
            opdef = OpDef(n, _norm_domain(domain), since, fn, traits, shape, bind, (fn.__doc__ or "").strip(),
                          host_inputs=tuple(host_inputs))
            opdef._params = dict(inspect.signature(fn).parameters)
            versions = _TABLE.setdefault((opdef.domain, n), [])
            versions[:] = [v for v in versions if v.since != since] + [opdef]
            versions.sort(key=lambda d: d.since)
        return fn

    return deco


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import shapeplan.ops  # noqa: F401  (imports every op family module)


def lookup(op_type: str, domain: str = "", opset: int | None = None) -> OpDef:
    """The OpDef of ``op_type`` in force at ``opset`` (highest ``since`` <= opset)."""
    _ensure_loaded()
    domain = _norm_domain(domain)
    versions = _TABLE.get((domain, op_type))
    if not versions:
        known = [n for (d, n) in _TABLE if d == domain]
        near = difflib.get_close_matches(op_type, known, n=5, cutoff=0.6)
        hint = f"; near matches: {', '.join(near)}" if near else ""
        raise UnsupportedOpError(
            f"op {op_type!r} (domain {domain or 'ai.onnx'!r}, opset {opset}) is not in the op table"
            f"{hint}; the table has {len(known)} ops in that domain (shapeplan.ops.supported_ops() lists them)")
    if opset is None:
        return versions[-1]
    chosen = [v for v in versions if v.since <= opset]
    if not chosen:
        raise UnsupportedOpError(
            f"op {op_type!r} (domain {domain or 'ai.onnx'!r}) needs opset >= {versions[0].since}, "
            f"the model imports opset {opset}")
    return chosen[-1]


def set_triton_lowering(op_type: str, lowering: Any, domain: str = "") -> bool:
    """Attach a Triton lowering to every version of ``op_type``; False when the op is not in the table."""
    _ensure_loaded()
    versions = _TABLE.get((_norm_domain(domain), op_type), [])
    for v in versions:
        v.triton = lowering
    return bool(versions)


def is_supported(op_type: str, domain: str = "", opset: int | None = None) -> bool:
    try:
        lookup(op_type, domain, opset)
        return True
    except UnsupportedOpError:
        return False


def supported_ops(domain: str | None = None) -> list[str]:
    _ensure_loaded()
    return sorted(f"{d}::{n}" if d else n for (d, n) in _TABLE if domain is None or d == domain)


def host_constants(opdef: OpDef, node: Any) -> dict[int, Any]:
    """Input position -> CPU tensor for each ``host_inputs`` position that a graph constant feeds."""
    out: dict[int, Any] = {}
    for i in opdef.host_inputs:
        v = node.inputs[i] if i < len(node.inputs) else None
        data = getattr(v, "data", None)
        if v is not None and getattr(v.kind, "value", None) == "constant" and isinstance(data, torch.Tensor):
            out[i] = data.detach().to("cpu")
    return out


def bind_kernel(opdef: OpDef, node: Any, opset: int) -> Callable[..., tuple]:
    """Resolve attributes and context once; return ``call(*inputs) -> tuple`` of outputs.

    Constant host-read inputs (``OpDef.host_inputs``) are bound here as CPU tensors: the kernel reads
    them without a device sync, which a CUDA graph capture would reject."""
    call = _bind(opdef, node, opset)
    host = host_constants(opdef, node)
    if not host:
        return call
    items = tuple(host.items())

    def call_host(*inputs: Any) -> tuple:
        args = list(inputs)
        for i, t in items:
            if i < len(args):
                args[i] = t
        return call(*args)

    return call_host


def _bind(opdef: OpDef, node: Any, opset: int) -> Callable[..., tuple]:
    if opdef.bind is not None:
        return opdef.bind(node, opset)
    params = opdef._params
    kwargs: dict[str, Any] = {}
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for k, v in node.attrs.items():
        if k not in params and not has_var_kw:
            # ONNX allows attributes we do not use (e.g. doc hints); reject only those we cannot ignore
            raise ModelError(f"node {node.describe()}: op {opdef.name} has no attribute {k!r}; "
                             f"it accepts {', '.join(p for p in params if not p.startswith('_')) or 'none'}")
        kwargs[k] = v
    if "_n_out" in params:
        kwargs["_n_out"] = len(node.outputs)
    if "_opset" in params:
        kwargs["_opset"] = opset
    if "_node" in params:
        kwargs["_node"] = node
    if "_n_in" in params:
        kwargs["_n_in"] = len(node.inputs)
    fn = functools.partial(opdef.kernel, **kwargs) if kwargs else opdef.kernel
    n_in = len(node.inputs)
    while n_in and node.inputs[n_in - 1] is None:
        n_in -= 1                                   # trailing missing optional inputs are dropped

    def call(*inputs: Any) -> tuple:
        out = fn(*inputs[:n_in]) if n_in != len(inputs) else fn(*inputs)
        return out if isinstance(out, tuple) else (out,)

    return call
