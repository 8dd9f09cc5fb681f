"""Control flow: If, Loop, Scan (opset 8 and 9+), and calls of model-local ONNX functions.

A body subgraph is compiled once, at bind time, into its own Plan and executed with the
slot-by-slot runner. Outer-scope values a body reads arrive as the control node's implicit
inputs (appended after the explicit ones by the plan compiler); they are matched to the body
plan's capture registers by name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from shapeplan.errors import ExecutionError, ModelError
from shapeplan.ir.graph import Graph, Node
from shapeplan.ops.registry import Trait, register

if TYPE_CHECKING:
    import onnx

CF = Trait.CONTROL_FLOW


class Body:
    """A compiled subgraph: ``run(inputs, implicit) -> outputs``."""

    def __init__(self, graph: Graph, outer_names: Sequence[str], owner: Node) -> None:
        from shapeplan.plan.compiler import compile_plan   # lazy: the compiler imports the op table
        self.graph = graph
        self.plan = compile_plan(graph)
        pos = {n: i for i, n in enumerate(outer_names)}
        missing = [n for n, _ in self.plan.captures if n not in pos]
        if missing:
            raise ModelError(f"node {owner.describe()}: body {graph.name!r} reads outer values {missing} "
                             f"that the node does not list as implicit inputs")
        self.captures = [(reg, pos[name]) for name, reg in self.plan.captures]
        self.n_inputs = len(self.plan.inputs)
        self._consts: dict[torch.device, list[tuple[int, Any]]] = {}

    def _constants(self, device: torch.device) -> list[tuple[int, Any]]:
        c = self._consts.get(device)
        if c is None:
            c = [(r, d.to(device) if isinstance(d, torch.Tensor) else d) for r, d in self.plan.constants]
            self._consts[device] = c
        return c

    def run(self, inputs: Sequence[Any], implicit: Sequence[Any], device: torch.device) -> list[Any]:
        from shapeplan.runtime.backends.slot_by_slot import run_slot_by_slot
        plan = self.plan
        regs: list[Any] = [None] * plan.n_regs
        for (_, r), v in zip(plan.inputs, inputs):
            regs[r] = v
        for r, d in self._constants(device):
            regs[r] = d
        for r, i in self.captures:
            regs[r] = implicit[i]
        return run_slot_by_slot(plan, regs)


def _device_of(values: Sequence[Any]) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
        if isinstance(v, list):
            for x in v:
                if isinstance(x, torch.Tensor):
                    return x.device
    return torch.device("cpu")


def _body(node: Node, attr: str) -> Body:
    g = node.attrs.get(attr)
    if not isinstance(g, Graph):
        raise ModelError(f"node {node.describe()}: attribute {attr!r} must be a graph")
    return Body(g, [v.name for v in node.implicit_inputs], node)


def _unused(*_: Any, **__: Any) -> Any:    # control ops run through their bind hook
    raise ExecutionError("control-flow kernels run through their bind hook")


def _check_count(node: Node, body: Body, want: int, what: str) -> None:
    if len(body.graph.outputs) < want:
        raise ModelError(f"node {node.describe()}: {what} has {len(body.graph.outputs)} outputs, "
                         f"expected at least {want}")


# ---------------------------------------------------------------------------------------- If


def _bind_if(node: Node, opset: int) -> Callable[..., tuple]:
    then_b, else_b = _body(node, "then_branch"), _body(node, "else_branch")
    n_exp = len(node.inputs)

    def call(*args: Any) -> tuple:
        cond, implicit = args[0], args[n_exp:]
        body = then_b if bool(cond.reshape(-1)[0]) else else_b
        return tuple(body.run((), implicit, _device_of(args)))

    return call


register("If", since=1, traits=CF, bind=_bind_if)(_unused)


# ---------------------------------------------------------------------------------------- Loop


def _bind_loop(node: Node, opset: int) -> Callable[..., tuple]:
    body = _body(node, "body")
    n_exp = len(node.inputs)
    n_carried = n_exp - 2
    n_scan = len(body.graph.outputs) - 1 - n_carried
    if n_scan < 0:
        raise ModelError(f"node {node.describe()}: Loop body has {len(body.graph.outputs)} outputs for "
                         f"{n_carried} loop-carried values (needs cond + carried + scan outputs)")
    scan_dtypes = [v.dtype.torch if v.dtype is not None and v.dtype.torch is not None else torch.float32
                   for v in body.graph.outputs[1 + n_carried:]]

    def call(*args: Any) -> tuple:
        m, cond = args[0], args[1]
        carried = list(args[2:n_exp])
        implicit = args[n_exp:]
        device = _device_of(args)
        max_trip = None if m is None else int(m.reshape(-1)[0])
        keep_going = True if cond is None else bool(cond.reshape(-1)[0])
        cond_t = cond if cond is not None else torch.tensor(True, device=device)
        scans: list[list[Any]] = [[] for _ in range(n_scan)]
        it = 0
        while keep_going and (max_trip is None or it < max_trip):
            iter_t = torch.tensor(it, dtype=torch.int64, device=device)
            outs = body.run([iter_t, cond_t, *carried], implicit, device)
            cond_t = outs[0]
            keep_going = bool(cond_t.reshape(-1)[0])
            carried = list(outs[1:1 + n_carried])
            for k in range(n_scan):
                scans[k].append(outs[1 + n_carried + k])
            it += 1
        stacked = [torch.stack(s) if s else torch.empty((0,), dtype=scan_dtypes[k], device=device)
                   for k, s in enumerate(scans)]
        return tuple(carried + stacked)

    return call


register("Loop", since=1, traits=CF, bind=_bind_loop)(_unused)


# ---------------------------------------------------------------------------------------- Scan


def _scan_core(body: Body, states: list[Any], scan_inputs: list[torch.Tensor], implicit: Sequence[Any],
               in_axes: list[int], in_dirs: list[int], out_axes: list[int], out_dirs: list[int],
               n_out_scan: int, device: torch.device) -> tuple[list[Any], list[torch.Tensor]]:
    steps = scan_inputs[0].shape[in_axes[0]] if scan_inputs else 0
    outs_per_step: list[list[torch.Tensor]] = [[] for _ in range(n_out_scan)]
    for t in range(steps):
        slices = []
        for x, ax, dr in zip(scan_inputs, in_axes, in_dirs):
            slices.append(x.select(ax, steps - 1 - t if dr else t))
        outs = body.run([*states, *slices], implicit, device)
        states = list(outs[:len(states)])
        for k in range(n_out_scan):
            outs_per_step[k].append(outs[len(states) + k])
    results = []
    for k, seq in enumerate(outs_per_step):
        if out_dirs[k]:
            seq = seq[::-1]
        if not seq:
            results.append(torch.empty((0,), device=device))
            continue
        ax = out_axes[k]
        rank = seq[0].dim() + 1
        results.append(torch.stack(seq, ax + rank if ax < 0 else ax))
    return states, results


def _bind_scan9(node: Node, opset: int) -> Callable[..., tuple]:
    body = _body(node, "body")
    a = node.attrs
    n_exp = len(node.inputs)
    m = int(a["num_scan_inputs"])
    n_state = n_exp - m
    n_out_scan = len(node.outputs) - n_state
    in_dirs = list(a.get("scan_input_directions") or [0] * m)
    out_dirs = list(a.get("scan_output_directions") or [0] * n_out_scan)
    out_axes_attr = list(a.get("scan_output_axes") or [0] * n_out_scan)

    def call(*args: Any) -> tuple:
        states, xs = list(args[:n_state]), list(args[n_state:n_exp])
        in_axes = [ax % x.dim() for ax, x in zip(a.get("scan_input_axes") or [0] * m, xs)]
        st, ys = _scan_core(body, states, xs, args[n_exp:], in_axes, in_dirs, out_axes_attr, out_dirs,
                            n_out_scan, _device_of(args))
        return tuple(st + ys)

    return call


def _bind_scan8(node: Node, opset: int) -> Callable[..., tuple]:
    """Scan-8: every input has a leading batch axis; optional sequence_lens per batch entry."""
    body = _body(node, "body")
    a = node.attrs
    n_exp = len(node.inputs)
    m = int(a["num_scan_inputs"])
    n_state = n_exp - 1 - m
    n_out_scan = len(node.outputs) - n_state
    dirs = list(a.get("directions") or [0] * m)

    def call(*args: Any) -> tuple:
        seq_lens = args[0]
        states, xs = list(args[1:1 + n_state]), list(args[1 + n_state:n_exp])
        device = _device_of(args)
        batch = (states[0] if states else xs[0]).shape[0]
        finals: list[list[Any]] = [[] for _ in range(n_state)]
        scans: list[list[torch.Tensor]] = [[] for _ in range(n_out_scan)]
        for b in range(batch):
            steps = xs[0].shape[1] if xs else 0
            n = steps if seq_lens is None else int(seq_lens.reshape(-1)[b])
            st, ys = _scan_core(body, [s[b] for s in states], [x[b, :n] for x in xs], args[n_exp:],
                                [0] * m, dirs, [0] * n_out_scan, [0] * n_out_scan, n_out_scan, device)
            for i, s in enumerate(st):
                finals[i].append(s)
            for k, y in enumerate(ys):
                if n < steps:        # pad unused steps with zeros
                    pad = torch.zeros((steps - n, *y.shape[1:]), dtype=y.dtype, device=device)
                    y = torch.cat([y, pad])
                scans[k].append(y)
        return tuple([torch.stack(f) for f in finals] + [torch.stack(s) for s in scans])

    return call


register("Scan", since=8, traits=CF, bind=_bind_scan8)(_unused)
register("Scan", since=9, traits=CF, bind=_bind_scan9)(_unused)


# ---------------------------------------------------------------------------------------- functions


def _substitute_attrs(nodes: Sequence[onnx.NodeProto], values: dict[str, onnx.AttributeProto]) -> list:
    """Copy ``nodes`` with every ``ref_attr_name`` attribute replaced by the caller's value."""
    import onnx                                # lazy: onnx pulls in ml_dtypes (~1 s)
    out = []
    for n in nodes:
        new = onnx.NodeProto()
        new.CopyFrom(n)
        del new.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name not in values:
                    continue                      # not given, no default: the attribute is absent
                na = onnx.AttributeProto()
                na.CopyFrom(values[a.ref_attr_name])
                na.name = a.name
                new.attribute.append(na)
                continue
            na = onnx.AttributeProto()
            na.CopyFrom(a)
            if na.type == onnx.AttributeProto.GRAPH:
                sub = na.g
                subs = _substitute_attrs(sub.node, values)
                del sub.node[:]
                sub.node.extend(subs)
            new.attribute.append(na)
        out.append(new)
    return out


def function_graph(node: Node, fproto: onnx.FunctionProto, opset: int) -> Graph:
    """The body of a model-local function, specialized to ``node``'s attributes, as a Graph."""
    import onnx                                # lazy: onnx pulls in ml_dtypes (~1 s)
    from shapeplan.ir.onnx_io import _attr_to_proto, _import_graph
    values = {a.name: a for a in fproto.attribute_proto}
    for k, v in node.attrs.items():
        if not k.startswith("__"):
            values[k] = _attr_to_proto(k, v)
    nodes = _substitute_attrs(fproto.node, values)
    empty = onnx.TypeProto()
    gp = onnx.helper.make_graph(nodes, fproto.name,
                                [onnx.helper.make_value_info(n, empty) for n in fproto.input],
                                [onnx.helper.make_value_info(n, empty) for n in fproto.output])
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in fproto.opset_import}
    opsets.setdefault("", opset if not node.domain else 21)
    opsets.setdefault("shapeplan", 1)
    return _import_graph(gp, opsets, None, outer=None,
                         functions={(fproto.domain, fproto.name): fproto})


def _bind_function(node: Node, opset: int) -> Callable[..., tuple]:
    import onnx                                # lazy: onnx pulls in ml_dtypes (~1 s)
    fproto = node.attrs.get("__function__")
    if not isinstance(fproto, onnx.FunctionProto):
        raise ModelError(f"node {node.describe()}: no model-local function body is attached")
    body = Body(function_graph(node, fproto, opset), [], node)
    n_in = body.n_inputs

    def call(*args: Any) -> tuple:
        ins = list(args[:n_in]) + [None] * (n_in - len(args[:n_in]))
        return tuple(body.run(ins, (), _device_of(args)))

    return call


def register_function(fproto: onnx.FunctionProto) -> None:
    """Make the op table resolve calls of a model-local function (domain, name).

    The entry is generic: each call node carries its own FunctionProto in
    ``node.attrs["__function__"]``, so two models defining the same name do not collide.
    A standard op of the same name keeps precedence.
    """
    from shapeplan.ops.registry import is_supported
    domain = fproto.domain if fproto.domain != "ai.onnx" else ""
    if domain == "" and is_supported(fproto.name, ""):
        return
    register(fproto.name, domain=domain, since=1, traits=CF, bind=_bind_function)(_unused)
