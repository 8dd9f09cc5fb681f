"""``shapeplan inspect MODEL [--optimize] [--plan] [--json]``: inputs, outputs, op histogram,
unsupported ops; with --optimize the optimizer's per-pass report; with --plan the compiled plan."""
from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe a model: inputs, outputs, ops, unsupported ops, plans")
    p.add_argument("model")
    p.add_argument("--optimize", action="store_true", help="run the optimizer and print its per-pass report")
    p.add_argument("--plan", action="store_true",
                   help="compile, run on zero inputs until the plan replays, print its segments")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dimension for --plan (default 1 for each)")
    p.add_argument("--mode", default="auto", help="execution mode for --plan")
    p.add_argument("--device", default="cpu", help="device for --plan")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.set_defaults(func=_inspect)


def _fmt_value(v: Any) -> str:
    shape = "?" if v.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in v.shape) + "]"
    return f"{v.name}: {v.dtype or '?'}{shape}"


def describe(graph: Any) -> dict[str, Any]:
    from shapeplan.ops.registry import is_supported

    unsupported: dict[str, int] = {}

    def walk(g: Any) -> None:
        for n in g.nodes:
            if not is_supported(n.op_type, n.domain, g.opset(n.domain)):
                key = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
                unsupported[key] = unsupported.get(key, 0) + 1
            for s in n.subgraphs():
                walk(s)

    walk(graph)
    return {
        "name": graph.name,
        "opsets": graph.opset_imports,
        "inputs": [_fmt_value(v) for v in graph.inputs],
        "outputs": [_fmt_value(v) for v in graph.outputs],
        "constants": len(graph.constants),
        "constant_bytes": int(sum(getattr(v.data, "nbytes", 0) or 0 for v in graph.constants)),
        "nodes": len(graph.nodes),
        "op_histogram": graph.op_histogram(),
        "unsupported_ops": unsupported,
    }


def _inspect(args: argparse.Namespace) -> int:
    import shapeplan as sp

    graph = sp.load(args.model)
    doc: dict[str, Any] = {"model": describe(graph)}
    report_text = None
    if args.optimize:
        from shapeplan.optimize import optimize_with_report
        opt, report = optimize_with_report(graph)
        doc["optimized"] = describe(opt)
        doc["optimizer_report"] = report.to_dict()
        report_text = report.to_text()
    if args.plan:
        doc["plan"] = _plan_report(graph, args)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 1 if doc["model"]["unsupported_ops"] else 0
    m = doc["model"]
    print(f"model {m['name']}  (opsets {m['opsets']})")
    print("inputs:");  [print(f"  {s}") for s in m["inputs"]]  # noqa: E702
    print("outputs:"); [print(f"  {s}") for s in m["outputs"]]  # noqa: E702
    print(f"nodes: {m['nodes']}   constants: {m['constants']} ({m['constant_bytes'] / 1e6:.2f} MB)")
    print("op histogram:")
    for op, n in m["op_histogram"].items():
        print(f"  {op:<32} {n}")
    if m["unsupported_ops"]:
        print("UNSUPPORTED ops:", ", ".join(f"{k} x{v}" for k, v in m["unsupported_ops"].items()))
    else:
        print("unsupported ops: none")
    if report_text:
        print(f"\noptimizer: {m['nodes']} -> {doc['optimized']['nodes']} nodes")
        print(report_text)
    if args.plan:
        _print_plan(doc["plan"])
    return 1 if m["unsupported_ops"] else 0


def _zero_feeds(graph: Any, dims: dict[str, int]) -> dict[str, Any]:
    import numpy as np

    from shapeplan.errors import InputError

    feeds = {}
    for v in graph.inputs:
        if v.shape is None or v.dtype is None or v.dtype.numpy is None:
            raise InputError(f"input {v.name!r} has no static tensor type; --plan cannot make a zero input for it")
        shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in v.shape]
        feeds[v.name] = np.zeros(shape, dtype=v.dtype.numpy)
    return feeds


def _plan_report(graph: Any, args: argparse.Namespace) -> dict[str, Any]:
    import shapeplan as sp
    from shapeplan.errors import InputError

    dims = {}
    for item in args.dim:
        name, _, size = item.partition("=")
        if not size.isdigit():
            raise InputError(f"--dim {item!r}: expected NAME=SIZE with an integer size")
        dims[name] = int(size)
    engine = sp.compile(graph, device=args.device, mode=args.mode)
    feeds = _zero_feeds(engine.graph, dims)
    for _ in range(5):                    # warm-up, freeze, compile, capture, replay
        engine.run(feeds)
    return engine.inspect().report()


def _print_plan(rep: dict[str, Any]) -> None:
    summ = rep.get("summary", {})
    print(f"\nplan {rep.get('plan')}: mode {rep.get('mode')} (running {rep.get('running_mode')}) on "
          f"{rep.get('device')}, phase {rep.get('phase')}, {summ.get('slots')} slots, "
          f"{summ.get('segments')} segments ({summ.get('captured_segments')} captured, {summ.get('gaps')} gaps), "
          f"{summ.get('const_slots')} constant slots")
    print(f"  {'seg':>3} {'slots':>11} {'state':<12} {'capt':>4} {'repl':>5}  ops / why it ends")
    for seg in rep.get("segments", []):
        ops = seg.get("ops", [])
        hist: dict[str, int] = {}
        for op in ops:
            hist[op] = hist.get(op, 0) + 1
        ops_s = ", ".join(f"{k}x{v}" if v > 1 else k for k, v in hist.items())
        why = seg.get("failure") or seg.get("reason") or ""
        print(f"  {seg['index']:>3} {seg['first_slot']:>5}-{seg['end_slot']:<5} {seg.get('state', ''):<12} "
              f"{seg.get('captures', 0):>4} {seg.get('replays', 0):>5}  {ops_s[:70]}  [{why}]")
