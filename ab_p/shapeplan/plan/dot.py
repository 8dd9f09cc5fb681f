"""Graphviz DOT export of a plan: one cluster per segment (gaps dashed), slots as nodes, registers as
edges. Per-segment states (from a runner) colour the clusters when given."""
from __future__ import annotations

from typing import Any

_COLOURS = {"REPLAYING": "palegreen", "FAILED": "lightcoral", "GAP": "lightgrey", "NEEDS_WARMUP": "lightyellow",
            "NEEDS_COMPILE": "lightyellow", "CAPTURE_PENDING": "khaki"}


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plan_to_dot(plan: Any, states: dict[int, str] | None = None, name: str = "plan") -> str:
    lines = [f"digraph {_q(name)} {{", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
    producer: dict[int, int] = {}
    for s in plan.slots:
        for r in s.outs:
            if r >= 0:
                producer[r] = s.index
    for n, r in plan.inputs:
        lines.append(f"  r{r} [label={_q(n)}, shape=ellipse, style=filled, fillcolor=lightblue];")
    for n, r in plan.variables:
        lines.append(f"  r{r} [label={_q(n + ' (var)')}, shape=ellipse, style=filled, fillcolor=orange];")
    for s in plan.slots:
        if s.index in plan.const_slots:
            lines.append(f"  s{s.index} [label={_q(f'#{s.index} {s.op_type} (const)')}, style=dotted];")
    for seg in plan.segments:
        st = (states or {}).get(seg.index, "GAP" if not seg.capturable else "")
        style = "dashed" if not seg.capturable else "filled"
        colour = _COLOURS.get(st, "white")
        label = f"segment {seg.index}{' ' + st if st else ''}"
        lines.append(f"  subgraph cluster_{seg.index} {{")
        lines.append(f"    label={_q(label)}; style={style}; fillcolor={colour};")
        for i in seg.slot_ids:
            s = plan.slots[i]
            lines.append(f"    s{i} [label={_q(f'#{i} {s.op_type}')}];")
        lines.append("  }")
    for s in plan.slots:
        for r in s.ins:
            if r < 0:
                continue
            src = f"s{producer[r]}" if r in producer else f"r{r}"
            if r in producer or any(r == x for _, x in plan.inputs) or any(r == x for _, x in plan.variables):
                lines.append(f"  {src} -> s{s.index} [label={_q(plan.reg_names[r])}, fontsize=8];")
    for n, r in plan.outputs:
        lines.append(f"  out_{r} [label={_q(n)}, shape=ellipse, style=filled, fillcolor=lightblue];")
        src = f"s{producer[r]}" if r in producer else f"r{r}"
        lines.append(f"  {src} -> out_{r};")
    lines.append("}")
    return "\n".join(lines) + "\n"
