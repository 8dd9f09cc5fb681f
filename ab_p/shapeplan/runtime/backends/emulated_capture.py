"""emulated_replay capture: record the torch call each kernel makes and bind it for replay.

A CUDA graph records the kernel launches of one run and replays them with fixed pointers. The CPU
emulation does the same one level up: the capture run executes every slot's kernel under a
``TorchFunctionMode`` that records the torch-level calls it makes, and each slot becomes one *step*:

* ``out``:    the kernel made exactly one torch call; it is re-issued as ``func(*args, out=buf)``
              into a preallocated buffer (checked bit-exact against the kernel's own result at capture;
              internal registers with disjoint lifetimes share buffers).
* ``call``:   one torch call without an ``out=`` form (views, ``relu``, ``layer_norm``): re-issued
              directly, without the kernel's Python wrappers.
* ``alias``:  the kernel returned one of its inputs (``Identity``, a same-dtype ``Cast``): no code.
* ``kernel``: anything else (several calls, value reads, multi-output, random, mutating): the slot's
              bound kernel, exactly as slot_by_slot runs it.

Metadata reads (``x.shape``, ``x.dtype``, ``x.dim()`` ...) are ignored: the segment's shapes and dtypes
are frozen, and only shape-stable slots are specialised. Value reads (``tolist``, ``item``, ...) are
ignored only on registers fixed for the plan (constants, plan-constant slots). The steps then become
one straight-line function whose bound objects are closure variables::

    def segment_0(R):
        f0(R[0], R[1], out=b0)          # Add  -> pooled buffer b0
        f1(b0, out=b1)                  # Tanh -> pooled buffer b1
        v7 = f2(b1)                     # Relu (no out= form)
        B7.copy_(v7); R[7] = B7         # live-out into the runner's stable buffer
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from shapeplan.ops.registry import Trait

ABSENT = -1
_NO_SPECIALISE = Trait.RANDOM | Trait.MUTATES_INPUT | Trait.CONTROL_FLOW | Trait.SEQUENCE

_T = torch.Tensor
_META_GETTERS = frozenset(getattr(_T, n) for n in ("shape", "dtype", "device", "ndim", "layout", "is_cuda",
                                                     "is_cpu", "is_sparse", "is_quantized", "is_meta",
                                                     "requires_grad", "is_leaf") if hasattr(_T, n))
_META_METHODS = frozenset(getattr(_T, n) for n in ("size", "dim", "stride", "numel", "nelement", "ndimension",
                                                    "is_contiguous", "element_size", "is_floating_point",
                                                    "is_complex", "is_signed", "get_device", "storage_offset",
                                                    "__len__") if hasattr(_T, n))
_VALUE_READS = frozenset(getattr(_T, n) for n in ("tolist", "item", "__int__", "__float__", "__bool__",
                                                   "__index__", "numpy", "__array__") if hasattr(_T, n))
#: Tensor methods whose ``torch.<name>`` function takes its arguments in another order
_REORDERED = frozenset({"where"})
_PLAIN = (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format, slice, type(Ellipsis))


def _is_meta(func: Any) -> bool:
    if getattr(func, "__name__", None) == "__get__":
        return getattr(func, "__self__", None) in _META_GETTERS
    try:
        return func in _META_METHODS
    except TypeError:
        return False


class _Recorder(TorchFunctionMode):
    """Records (func, args, kwargs, result) of the top-level torch calls a kernel makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _is_meta(func):
            self.calls.append((func, args, kwargs, out))
        return out


@dataclass(slots=True)
class Step:
    kind: str                                    # out | call | alias | kernel
    slot: Any
    fn: Callable[..., Any] | None = None         # the recorded torch call (kernel: the slot's kernel)
    out_fn: Callable[..., Any] | None = None     # out: the same call's ``out=`` form
    args: tuple = ()                             # argument specs: ("reg", r) | ("const", v) | ("seq", type, specs)
    kwargs: tuple = ()                           # ((name, spec), ...)
    src: int = ABSENT                            # alias: the input register


@dataclass(slots=True)
class Program:
    fn: Callable[[list[Any]], None]
    source: str
    steps: list[Step]
    pool_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ capture run

def _storage(t: Any) -> int | None:
    if isinstance(t, torch.Tensor) and t.numel():
        return t.untyped_storage().data_ptr()
    return None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and a.device == b.device


def _spec(x: Any, by_id: dict[int, int]) -> tuple | None:
    """Argument spec of one recorded argument, or None when it cannot be bound."""
    if isinstance(x, torch.Tensor):
        r = by_id.get(id(x))
        return None if r is None else ("reg", r)
    if type(x) in (list, tuple):
        if any(isinstance(y, torch.Tensor) for y in x):
            specs = [_spec(y, by_id) for y in x]
            return None if any(s is None for s in specs) else ("seq", type(x), tuple(specs))
    return ("const", x) if _plain(x) else None


def _plain(x: Any) -> bool:
    """An immutable host value (nested lists/tuples of them included): safe to bind at capture."""
    if type(x) in (list, tuple) or isinstance(x, torch.Size):
        return all(_plain(y) for y in x)
    return isinstance(x, _PLAIN)


def _fixed_read(call: tuple, fixed: dict[int, torch.Tensor]) -> bool:
    """A value read (tolist/item/...) whose tensors are all fixed for the plan (constants)."""
    func, args, kwargs, out = call
    if isinstance(out, torch.Tensor) or func not in _VALUE_READS:
        return False
    ts = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    return bool(ts) and all(id(t) in fixed or any(_same_view(t, f) for f in fixed.values()) for t in ts)


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def trace_slot(slot: Any, regs: list[Any], stable: frozenset[int], fixed: set[int]) -> Step:
    """Run ``slot`` over ``regs`` (writing its outputs) and return the step that replays it."""
    ins = [None if r == ABSENT else regs[r] for r in slot.ins]
    specialise = (not (slot.opdef.traits & _NO_SPECIALISE) and len(slot.outs) == 1 and slot.outs[0] != ABSENT
                  and all(r == ABSENT or r in stable for r in slot.ins) and slot.outs[0] in stable
                  and not slot.node.implicit_inputs)
    if not specialise:
        outs = slot.fn(*ins)
        _write(slot, regs, outs)
        return Step("kernel", slot, slot.fn)
    rec = _Recorder()
    with rec:
        outs = slot.fn(*ins)
    _write(slot, regs, outs)
    res = outs[0]
    by_id = {id(x): r for r, x in zip(slot.ins, ins) if r != ABSENT and isinstance(x, torch.Tensor)}
    fixed_t = {id(regs[r]): regs[r] for r in slot.ins if r in fixed and isinstance(regs[r], torch.Tensor)}
    calls = [c for c in rec.calls if not _fixed_read(c, fixed_t)]
    if not isinstance(res, torch.Tensor):
        return Step("kernel", slot, slot.fn)
    if not calls:
        src = by_id.get(id(res))
        return Step("alias", slot, src=src) if src is not None else Step("kernel", slot, slot.fn)
    if len(calls) != 1:
        return Step("kernel", slot, slot.fn)
    func, args, kwargs, out = calls[0]
    name = getattr(func, "__name__", "") or ""
    if out is not res or name.endswith("_") or "out" in kwargs:
        return Step("kernel", slot, slot.fn)
    aspec = tuple(_spec(a, by_id) for a in args)
    kspec = tuple((k, _spec(v, by_id)) for k, v in kwargs.items())
    if any(s is None for s in aspec) or any(s is None for _, s in kspec):
        return Step("kernel", slot, slot.fn)
    step = Step("call", slot, func, args=aspec, kwargs=kspec)
    fresh = res.numel() > 0 and res.is_contiguous() and _storage(res) not in \
        {_storage(x) for x in ins if isinstance(x, torch.Tensor)}
    if fresh:
        outfn = _out_variant(func, name, args, kwargs, res)
        if outfn is not None:
            step.kind, step.out_fn = "out", outfn
    return step


def _out_variant(func: Any, name: str, args: tuple, kwargs: dict, res: torch.Tensor) -> Any:
    """``func`` or ``torch.<name>`` when it accepts ``out=`` and gives the same bits in place."""
    cands = [func]
    if getattr(torch.Tensor, name, None) is func and name not in _REORDERED:   # x.add(y) -> torch.add(x, y)
        alt = getattr(torch, name, None)
        if alt is not None and alt is not func:
            cands.append(alt)
    for f in cands:
        tmp = torch.empty_strided(tuple(res.shape), res.stride(), dtype=res.dtype, device=res.device)
        ptr = tmp.data_ptr()
        try:
            f(*args, **kwargs, out=tmp)
        except Exception:  # noqa: BLE001 - no out= form (or a different signature): try the next
            continue
        if tmp.data_ptr() == ptr and _same_bits(tmp, res):
            return f
    return None


def _write(slot: Any, regs: list[Any], outs: Any) -> None:
    for r, o in zip(slot.outs, outs):
        if r != ABSENT:
            regs[r] = o


# ------------------------------------------------------------------------------------ buffers

def pool(steps: list[Step], produced: dict[int, Any], seg: Any) -> tuple[dict[int, torch.Tensor], int]:
    """Stable buffers for the ``out`` steps' registers; disjoint lifetimes share one byte buffer.

    A register's lifetime runs from its step to the last read of anything aliasing its storage (views
    taken later); a register whose storage escapes the segment (a live-out or a view of one) keeps a
    fresh allocation per call instead (its step is demoted to ``call``)."""
    live_out = set(seg.live_out)
    direct = {}                               # live-out -> its exclusive stable buffer, written in place
    for s in steps:
        r = s.slot.outs[0] if s.kind == "out" else ABSENT
        buf = seg.out_buffers.get(r)
        if r in seg.exclusive_out and buf is not None and _same_layout(buf, produced[r]):
            direct[r] = buf
    pos = {s.slot.outs[0]: i for i, s in enumerate(steps) if s.kind == "out" and s.slot.outs[0] not in direct}
    root: dict[int, int] = {}                 # storage -> register of the ``out`` step that owns it
    for r in pos:
        root[_storage(produced[r])] = r
    last: dict[int, int] = {r: i for r, i in pos.items()}
    n = len(steps)
    for i, s in enumerate(steps):
        for r in s.slot.ins:
            if r == ABSENT:
                continue
            own = root.get(_storage(produced.get(r)))
            if own is not None:
                last[own] = max(last[own], i)
        for r in s.slot.outs:
            if r == ABSENT:
                continue
            own = root.get(_storage(produced.get(r)))
            if own is not None and r in live_out:
                last[own] = n                  # escapes the segment
    for r, i in list(pos.items()):
        if last[r] >= n:
            steps[i].kind = "call"
            del pos[r]
    births: dict[int, list[int]] = {}
    deaths: dict[int, list[int]] = {}
    for r, i in pos.items():
        births.setdefault(i, []).append(r)
        deaths.setdefault(last[r], []).append(r)
    sizes: list[int] = []
    assign: dict[int, int] = {}
    free: list[tuple[int, int]] = []
    for i in range(n):
        for r in births.get(i, ()):
            need = produced[r].numel() * produced[r].element_size()
            k = bisect.bisect_left(free, (need, -1))
            if k < len(free):
                _, b = free.pop(k)
            elif free:
                _, b = free.pop()
                sizes[b] = need
            else:
                b = len(sizes)
                sizes.append(need)
            assign[r] = b
        for r in deaths.get(i, ()):
            bisect.insort(free, (sizes[assign[r]], assign[r]))
    device = seg.device
    phys = [torch.empty(max(1, nb), dtype=torch.uint8, device=device) for nb in sizes]
    bufs = dict(direct)
    for r, b in assign.items():
        t = produced[r]
        bufs[r] = phys[b][:t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    return bufs, sum(sizes)


# ------------------------------------------------------------------------------------ program

def build(seg: Any, steps: list[Step], bufs: dict[int, torch.Tensor], pool_bytes: int = 0) -> Program:
    """The straight-line replay function of ``steps``; every object it uses is a closure variable."""
    live_out = set(seg.live_out)
    bound: list[Any] = []
    names: list[str] = []

    def bind(obj: Any, prefix: str) -> str:
        names.append(f"{prefix}{len(bound)}")
        bound.append(obj)
        return names[-1]

    expr: dict[int, str] = {}
    local: set[int] = set()

    def arg(spec: tuple) -> str:
        if spec[0] == "reg":
            return expr.get(spec[1], f"R[{spec[1]}]")
        if spec[0] == "seq":
            items = ", ".join(arg(s) for s in spec[2])
            return f"[{items}]" if spec[1] is list else f"({items},)"
        return bind(spec[1], "k")

    lines: list[str] = []
    for st in steps:
        slot = st.slot
        if st.kind == "alias":
            r, src = slot.outs[0], expr.get(st.src, f"R[{st.src}]")
            if st.src in local:                # a local may be deleted at its own last read: copy the name
                lines.append(f"v{r} = {src}")
                src = f"v{r}"
                local.add(r)
            expr[r] = src
        elif st.kind in ("out", "call"):
            r = slot.outs[0]
            call = [arg(a) for a in st.args] + [f"{k}={arg(v)}" for k, v in st.kwargs]
            if st.kind == "out":
                b = bind(bufs[r], "B" if bufs[r] is seg.out_buffers.get(r) else "b")
                lines.append(f"{bind(st.out_fn, 'f')}({', '.join(call + [f'out={b}'])})")
                expr[r] = b
            else:
                lines.append(f"v{r} = {bind(st.fn, 'f')}({', '.join(call)})")
                expr[r], _ = f"v{r}", local.add(r)
        else:
            args = ["None" if r == ABSENT else expr.get(r, f"R[{r}]") for r in slot.ins]
            targets = [f"v{r}" if r != ABSENT else "_" for r in slot.outs]
            lines.append(f"{', '.join(targets)}, = {bind(slot.fn, 'f')}({', '.join(args)})")
            for r in slot.outs:
                if r != ABSENT:
                    expr[r] = f"v{r}"
                    local.add(r)
        for r in slot.release:                 # free early, like slot_by_slot
            if r in local and r not in live_out and expr.get(r) == f"v{r}":
                lines.append(f"del v{r}")
                local.discard(r)
    for r in seg.live_out:
        if r in seg.out_buffers and bufs.get(r) is seg.out_buffers[r]:
            lines.append(f"R[{r}] = {expr[r]}")          # written in place by its ``out=`` step
        elif r in seg.out_buffers:
            b = bind(seg.out_buffers[r], "B")
            lines.append(f"{b}.copy_({expr[r]}); R[{r}] = {b}")
        else:                                   # not a tensor of a stable shape: pass it through
            lines.append(f"R[{r}] = {expr[r]}")
    idx = seg.segment.index
    body = "\n".join(f"        {ln}" for ln in lines) or "        pass"
    src = f"def _make({', '.join(names)}):\n    def segment_{idx}(R):\n{body}\n    return segment_{idx}\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<shapeplan replay {seg.plan_key}:{idx}>", "exec"), ns)  # noqa: S102
    counts: dict[str, int] = {}
    for st in steps:
        counts[st.kind] = counts.get(st.kind, 0) + 1
    return Program(ns["_make"](*bound), src, steps, pool_bytes, counts)


def record(seg: Any, regs: list[Any]) -> tuple[list[Step], dict[int, Any]]:
    """The capture run: execute ``seg`` over ``regs`` tracing each slot; returns (steps, produced values)."""
    from shapeplan.errors import ExecutionError, ShapeplanError
    from shapeplan.runtime.backends.slot_by_slot import describe_inputs
    plan = seg.plan
    fixed = {r for r, _ in plan.constants}
    for i in plan.const_slots:
        fixed.update(r for r in plan.slots[i].outs if r != ABSENT)
    steps, produced = [], {}
    for slot in seg.slots:
        try:
            steps.append(trace_slot(slot, regs, plan.shape_stable, fixed))
        except ShapeplanError:
            raise
        except Exception as e:
            raise ExecutionError(f"While executing node {slot.node.describe()} with inputs "
                                 f"({describe_inputs(slot, regs)}): {type(e).__name__}: {e}") from e
        for r in slot.outs:
            if r != ABSENT:
                produced[r] = regs[r]          # kept alive until the buffers are planned (storage identity)
    return steps, produced
