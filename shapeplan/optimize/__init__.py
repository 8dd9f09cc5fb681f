"""Graph optimizer (pass manager). Placeholder until the pass catalogue lands: returns a copy."""
from __future__ import annotations

import os
from typing import Any

from shapeplan.ir.graph import Graph


def optimize(graph: Graph, skip: list[str] | None = None, **kw: Any) -> Graph:
    g = graph.copy()
    if os.environ.get("SHAPEPLAN_OPTIMIZER", "1") == "0":
        return g
    return g
