"""Generate one Triton kernel for a run of elementwise slots.

A run of contiguous elementwise slots of one output shape (``Sub -> Mul -> Sigmoid -> Mul``) becomes
one kernel: each external input is loaded once, every intermediate stays in registers, and only the
values read after the run (or plan outputs) are stored::

    slots:  t0 = Add(x, b)   t1 = Sigmoid(t0)   y = Mul(t0, t1)          3 launches, 7 tensor passes
    fused:  v0 = load x; v1 = load b (broadcast); v2 = v0 + v1; v3 = sigmoid(v2); store v2 * v3

Arithmetic is float32; a value whose slot output is fp16/bf16 is rounded to that dtype right where the
unfused kernel would round it, so fused and slot-by-slot results differ only by the libm of
transcendental functions. Shapes, strides and broadcasts are frozen into the source (a plan has fixed
shapes); the source is written under ``<cache>/triton_src/fused_<hash>.py`` and Triton's compile cache
sits under ``<cache>/triton``, so a kernel compiles once per machine.

Lowerings are data: ``ELEMENTWISE_LOWERINGS`` maps an op to a function
``(args, attrs, consts) -> expression | None`` (None declines: the slot stays unfused) and is attached
to the op table (``OpDef.triton``). ``fusion_score`` decides whether a run pays.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_TL = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32"}

#: cost model (H200): one kernel launch inside a CUDA graph, and sustained memory bandwidth
LAUNCH_US = 2.0
BANDWIDTH_BYTES_PER_US = 3.5e6
MIN_GAIN_US = 0.5
BLOCK = 1024


# ---- lowerings: op -> Triton expression over float32 operands -------------------------------------

def _c(v: float) -> str:
    return repr(float(v)) if math.isfinite(v) else ("float('inf')" if v > 0 else "-float('inf')")


def _pow(a: list[str], attrs: dict, consts: list[float | None]) -> str | None:
    e = consts[1] if len(consts) > 1 else None
    return {1.0: f"{a[0]}", 2.0: f"({a[0]} * {a[0]})", 3.0: f"({a[0]} * {a[0]} * {a[0]})",
            0.5: f"tl.sqrt({a[0]})", -1.0: f"(1.0 / {a[0]})", -0.5: f"tl.math.rsqrt({a[0]})"}.get(e) \
        if e is not None else None


def _clip(a: list[str], attrs: dict, consts: list[float | None]) -> str | None:
    lo = consts[1] if len(a) > 1 and a[1] is not None else attrs.get("min", -math.inf)
    hi = consts[2] if len(a) > 2 and a[2] is not None else attrs.get("max", math.inf)
    if lo is None or hi is None:                        # a non-constant bound: leave it to torch
        return None
    x = a[0]
    if math.isfinite(lo):
        x = f"tl.maximum({x}, {_c(lo)})"
    if math.isfinite(hi):
        x = f"tl.minimum({x}, {_c(hi)})"
    return x


def _gelu(a: list[str], attrs: dict, consts: list[float | None]) -> str:
    x = a[0]
    if attrs.get("approximate", "none") == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"(0.5 * {x} * (2.0 * tl.sigmoid(2.0 * ({inner}))))"
    return f"(0.5 * {x} * (1.0 + tl.math.erf({x} * 0.7071067811865476)))"


def _u(template: str) -> Callable[..., str]:
    return lambda a, attrs, consts: template.format(*a)


ELEMENTWISE_LOWERINGS: dict[str, Callable[..., str | None]] = {
    "Add": _u("({0} + {1})"), "Sub": _u("({0} - {1})"), "Mul": _u("({0} * {1})"), "Div": _u("({0} / {1})"),
    "Neg": _u("(-{0})"), "Abs": _u("tl.abs({0})"), "Exp": _u("tl.exp({0})"), "Log": _u("tl.log({0})"),
    "Sqrt": _u("tl.sqrt({0})"), "Reciprocal": _u("(1.0 / {0})"), "Sigmoid": _u("tl.sigmoid({0})"),
    "Relu": _u("tl.maximum({0}, 0.0)"), "Tanh": _u("(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)"),
    "Erf": _u("tl.math.erf({0})"), "Sin": _u("tl.sin({0})"), "Cos": _u("tl.cos({0})"),
    "Floor": _u("tl.floor({0})"), "Ceil": _u("tl.ceil({0})"), "Identity": _u("{0}"),
    "Max": lambda a, attrs, c: _fold("tl.maximum", a), "Min": lambda a, attrs, c: _fold("tl.minimum", a),
    "Sum": lambda a, attrs, c: "(" + " + ".join(a) + ")",
    "Pow": _pow, "Clip": _clip, "Gelu": _gelu,
    "Cast": _u("{0}"),                                     # the output dtype rounding does the cast
    "LeakyRelu": lambda a, attrs, c: f"tl.where({a[0]} >= 0.0, {a[0]}, {a[0]} * {_c(attrs.get('alpha', 0.01))})",
    "Elu": lambda a, attrs, c: f"tl.where({a[0]} >= 0.0, {a[0]}, {_c(attrs.get('alpha', 1.0))} * (tl.exp({a[0]}) - 1.0))",
    "HardSigmoid": lambda a, attrs, c: (f"tl.minimum(tl.maximum({_c(attrs.get('alpha', 0.2))} * {a[0]} + "
                                        f"{_c(attrs.get('beta', 0.5))}, 0.0), 1.0)"),
    "HardSwish": _u("({0} * tl.minimum(tl.maximum({0} / 6.0 + 0.5, 0.0), 1.0))"),
    "Softplus": _u("tl.where({0} > 20.0, {0}, tl.log(1.0 + tl.exp({0})))"),
    "Silu": _u("({0} * tl.sigmoid({0}))"),
}


def _fold(fn: str, a: list[str]) -> str:
    x = a[0]
    for y in a[1:]:
        x = f"{fn}({x}, {y})"
    return x


def attach_lowerings() -> None:
    """Attach ``ELEMENTWISE_LOWERINGS`` to the op table (ops missing from the table are skipped)."""
    from shapeplan.ops.registry import set_triton_lowering
    for name, fn in ELEMENTWISE_LOWERINGS.items():
        set_triton_lowering(name, ElementwiseLowering(fn))


@dataclass(frozen=True, slots=True)
class ElementwiseLowering:
    expr: Callable[..., str | None]


# ---- what the generator sees ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Meta:
    """Frozen layout of one register's tensor (recorded during warm-up)."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    offset: int = 0        # data_ptr % 16: Triton specializes pointers on 16-byte alignment

    @staticmethod
    def of(t: torch.Tensor) -> "Meta":
        return Meta(tuple(t.shape), tuple(t.stride()), t.dtype, t.data_ptr() % 16)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(slots=True)
class EwNode:
    """One elementwise slot in a run: ``out = lower(ins)``."""
    op_type: str
    lower: Callable[..., str | None]
    attrs: dict[str, Any]
    ins: tuple[int, ...]
    out: int


@dataclass(slots=True)
class FusedKernel:
    name: str
    source: str
    inputs: tuple[int, ...]                 # registers, in launcher argument order
    outputs: tuple[int, ...]                # registers the kernel stores
    out_shape: tuple[int, ...]
    out_dtypes: tuple[torch.dtype, ...]
    numel: int
    op_types: tuple[str, ...]
    kernel: Any = None
    score: float = 0.0
    path: str = ""
    in_metas: tuple[Meta, ...] = ()         # layouts baked into the source

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for t, m in zip(inputs, self.in_metas):
            if tuple(t.shape) != m.shape or tuple(t.stride()) != m.stride or t.dtype != m.dtype:
                raise ValueError(f"{self.name}: input {list(t.shape)}/{t.stride()}/{t.dtype} differs from "
                                 f"the layout it was generated for {list(m.shape)}/{m.stride}/{m.dtype}")
        dev = inputs[0].device
        outs = tuple(torch.empty(self.out_shape, dtype=d, device=dev) for d in self.out_dtypes)
        grid = ((self.numel + BLOCK - 1) // BLOCK,)
        self.kernel[grid](*inputs, *outs, BLOCK=BLOCK, num_warps=4)
        return outs


# ---- fusion score ------------------------------------------------------------------------------------

def fusion_score(n_ops: int, bytes_unfused: int, bytes_fused: int) -> float:
    """Estimated microseconds saved per call by one fused kernel instead of ``n_ops`` kernels.

    Launches saved (``n_ops - 1``, each ``LAUNCH_US`` inside a graph) plus device-memory traffic saved
    at ``BANDWIDTH_BYTES_PER_US``. A run pays when the score is at least ``MIN_GAIN_US``; a lone op
    never pays (torch's kernel already does one pass)."""
    if n_ops < 2:
        return 0.0
    return (n_ops - 1) * LAUNCH_US + max(0, bytes_unfused - bytes_fused) / BANDWIDTH_BYTES_PER_US


# ---- source generation -------------------------------------------------------------------------------

def _index_expr(meta: Meta, out_shape: tuple[int, ...]) -> str | None:
    """Offset expression of the element of ``meta``'s tensor that broadcasts to output index ``offs``."""
    if meta.numel == 1:
        return None                                         # a scalar: one load, broadcast in registers
    rank = len(out_shape)
    shape = (1,) * (rank - len(meta.shape)) + meta.shape
    stride = (0,) * (rank - len(meta.stride)) + meta.stride
    stride = tuple(0 if s == 1 and o != 1 else st for s, o, st in zip(shape, out_shape, stride))
    contiguous = []
    acc = 1
    for d in reversed(out_shape):
        contiguous.append(acc)
        acc *= d
    contiguous.reverse()
    if tuple(stride) == tuple(contiguous) or all(d == 1 or s == c for d, s, c in zip(out_shape, stride, contiguous)):
        return "offs"
    terms = []
    for d, (size, st, inner) in enumerate(zip(out_shape, stride, contiguous)):
        if st == 0 or size == 1:
            continue
        idx = "offs" if inner == 1 else f"(offs // {inner})"
        if d > 0:
            idx = f"({idx} % {size})"
        terms.append(idx if st == 1 else f"{idx} * {st}")
    return " + ".join(terms) if terms else "0"


def generate_source(nodes: Sequence[EwNode], metas: dict[int, Meta], outputs: Sequence[int],
                    consts: dict[int, float]) -> tuple[str, tuple[int, ...]] | None:
    """Triton source for ``nodes`` (name placeholder ``KERNEL``) and its input registers; None declines."""
    produced = {n.out for n in nodes}
    out_shape = metas[nodes[0].out].shape
    inputs: list[int] = []
    for n in nodes:
        for r in n.ins:
            if r not in produced and r not in inputs:
                inputs.append(r)
    for r in (*inputs, *produced):
        m = metas.get(r)
        if m is None or m.dtype not in FLOATS:
            return None
    var: dict[int, str] = {}
    body: list[str] = []
    for i, r in enumerate(inputs):
        idx = _index_expr(metas[r], out_shape)
        var[r] = f"a{i}"
        if idx is None:
            body.append(f"    a{i} = tl.load(IN{i}).to(tl.float32)")
        else:
            body.append(f"    a{i} = tl.load(IN{i} + ({idx}), mask=mask, other=0.0).to(tl.float32)")
    for k, n in enumerate(nodes):
        args = [var[r] for r in n.ins]
        expr = n.lower(args, n.attrs, [consts.get(r) for r in n.ins])
        if expr is None:
            return None
        v = f"v{k}"
        dt = metas[n.out].dtype
        body.append(f"    {v} = {expr}" if dt is torch.float32 else f"    {v} = ({expr}).to({_TL[dt]}).to(tl.float32)")
        var[n.out] = v
    params = [f"IN{i}" for i in range(len(inputs))] + [f"OUT{j}" for j in range(len(outputs))]
    head = [f"def KERNEL({', '.join(params)}, BLOCK: tl.constexpr):",
            "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
            f"    mask = offs < {metas[nodes[0].out].numel}"]
    tail = [f"    tl.store(OUT{j} + offs, {var[r]}.to(OUT{j}.dtype.element_ty), mask=mask)"
            for j, r in enumerate(outputs)]
    return "\n".join(head + body + tail) + "\n", tuple(inputs)


_HEADER = ("# generated by shapeplan.runtime.backends.triton.codegen; safe to delete\n"
           "import triton\nimport triton.language as tl\n\n\n@triton.jit\n")
_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def load_kernel(body: str) -> tuple[str, Any, str]:
    """Write (once) and import the kernel whose source is ``body``; returns (name, jit fn, path)."""
    from shapeplan.runtime.backends.triton.env import source_dir   # Triton's cache under ours first
    digest = hashlib.sha256(body.encode()).hexdigest()[:20]
    name = f"fused_{digest}"
    with _lock:
        path = source_dir() / f"{name}.py"
        text = _HEADER + body.replace("def KERNEL(", f"def {name}(", 1)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)                          # atomic: a reader sees all or nothing
        if name not in _loaded:
            spec = importlib.util.spec_from_file_location(f"shapeplan_triton_src.{name}", path)
            module = importlib.util.module_from_spec(spec)     # type: ignore[arg-type]
            sys.modules[spec.name] = module                     # type: ignore[union-attr]
            spec.loader.exec_module(module)                     # type: ignore[union-attr]
            _loaded[name] = getattr(module, name)
        return name, _loaded[name], str(path)


def build_fused(nodes: Sequence[EwNode], metas: dict[int, Meta], outputs: Sequence[int],
                consts: dict[int, float]) -> FusedKernel | None:
    """One fused kernel for ``nodes`` storing ``outputs``; None when a lowering declines."""
    out_shape = metas[nodes[0].out].shape
    numel = math.prod(out_shape)
    if numel == 0 or numel >= 2 ** 31 or not outputs:
        return None
    gen = generate_source(nodes, metas, outputs, consts)
    if gen is None:
        return None
    body, inputs = gen
    name, fn, path = load_kernel(body)
    return FusedKernel(name, body, inputs, tuple(outputs), out_shape, tuple(metas[r].dtype for r in outputs),
                       numel, tuple(n.op_type for n in nodes), fn, path=path,
                       in_metas=tuple(metas[r] for r in inputs))


@dataclass(slots=True)
class Run:
    """A candidate run: slot positions (into the segment's slot list) and its nodes."""
    positions: list[int] = field(default_factory=list)
    nodes: list[EwNode] = field(default_factory=list)


def find_runs(slots: Sequence[Any], metas: dict[int, Meta]) -> list[Run]:
    """Maximal contiguous runs of lowerable elementwise slots with one output shape (length >= 2)."""
    runs: list[Run] = []
    cur = Run()
    shape: tuple[int, ...] | None = None
    for pos, s in enumerate(slots):
        low = getattr(s.opdef, "triton", None)
        outs = [r for r in s.outs if r != -1]
        ok = isinstance(low, ElementwiseLowering) and len(outs) == 1 and -1 not in s.ins \
            and outs[0] in metas and metas[outs[0]].dtype in FLOATS
        if ok and cur.nodes and metas[outs[0]].shape != shape:
            ok_join = False
        else:
            ok_join = ok
        if not ok_join:
            if len(cur.nodes) >= 2:
                runs.append(cur)
            cur = Run()
            shape = None
            if not ok:
                continue
        cur.positions.append(pos)
        cur.nodes.append(EwNode(s.op_type, low.expr, dict(s.node.attrs), tuple(s.ins), outs[0]))
        shape = metas[outs[0]].shape
    if len(cur.nodes) >= 2:
        runs.append(cur)
    return runs


def run_bytes(nodes: Sequence[EwNode], metas: dict[int, Meta], outputs: Sequence[int]) -> tuple[int, int]:
    """(bytes moved op by op, bytes moved by the fused kernel)."""
    produced = {n.out for n in nodes}
    unfused = sum(metas[r].nbytes for n in nodes for r in (*n.ins, n.out) if r in metas)
    ext = {r for n in nodes for r in n.ins if r not in produced}
    fused = sum(metas[r].nbytes for r in ext if r in metas) + sum(metas[r].nbytes for r in outputs)
    return unfused, fused
