"""Pass manager: run the named pass pipeline to a fixed point (at most ``max_iterations`` rounds).

Each pass is ``run(graph) -> int`` (number of rewrites applied; 0 means unchanged). The manager
copies the input graph (it is never mutated), skips passes by name (API ``skip=`` and
``SHAPEPLAN_OPTIMIZER_SKIP=Name,Name``), disables everything with ``SHAPEPLAN_OPTIMIZER=0``,
verifies the IR after optimization (and after every pass with ``SHAPEPLAN_VERIFY=1``) and reports,
per pass, times applied, nodes removed and time spent.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from shapeplan import env
from shapeplan.errors import ModelError
from shapeplan.ir.graph import Graph
from shapeplan.ir.verify import verify
from shapeplan.optimize.rewrite import reset_sink, shared

PassFn = Callable[[Graph], int]


@dataclass(slots=True)
class PassStats:
    name: str
    applied: int = 0          # rewrites applied, summed over iterations
    nodes_removed: int = 0    # net node-count drop attributable to this pass
    seconds: float = 0.0
    runs: int = 0


@dataclass(slots=True)
class OptimizeReport:
    passes: list[PassStats] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    iterations: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    disabled: bool = False

    def stats(self, name: str) -> PassStats:
        for p in self.passes:
            if p.name == name:
                return p
        raise KeyError(f"no pass named {name!r}; passes: {', '.join(p.name for p in self.passes)}")

    def applied(self, name: str) -> int:
        return self.stats(name).applied

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "iterations": self.iterations, "seconds": round(self.seconds, 6),
            "skipped": list(self.skipped), "disabled": self.disabled,
            "passes": [{"name": p.name, "applied": p.applied, "nodes_removed": p.nodes_removed,
                        "seconds": round(p.seconds, 6), "runs": p.runs} for p in self.passes],
        }

    def to_text(self) -> str:
        if self.disabled:
            return "optimizer disabled (SHAPEPLAN_OPTIMIZER=0)"
        w = max([len(p.name) for p in self.passes] + [4])
        lines = [f"optimize: {self.nodes_before} -> {self.nodes_after} nodes "
                 f"({self.nodes_before - self.nodes_after} removed) in {self.iterations} iteration(s), "
                 f"{self.seconds * 1e3:.1f} ms",
                 f"{'pass':<{w}}  {'applied':>7}  {'removed':>7}  {'ms':>8}"]
        for p in self.passes:
            lines.append(f"{p.name:<{w}}  {p.applied:>7}  {p.nodes_removed:>7}  {p.seconds * 1e3:>8.2f}")
        if self.skipped:
            lines.append(f"skipped: {', '.join(self.skipped)}")
        return "\n".join(lines)


def _env_skip() -> set[str]:
    return set(env.get("SHAPEPLAN_OPTIMIZER_SKIP"))


def run_pipeline(graph: Graph, pipeline: list[tuple[str, PassFn]], skip: Iterable[str] | None = None,
                 max_iterations: int = 3) -> tuple[Graph, OptimizeReport]:
    """Optimize a *copy* of ``graph``; returns it with the report."""
    # The copy and the passes allocate many small cyclic (Node <-> Value) objects; with the cyclic
    # collector on, its generation-2 sweeps walk the whole graph again and again (~20-30% of the time
    # on a 10k-node graph). Pause it meanwhile; the garbage is collected normally afterwards.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _run_pipeline(graph, pipeline, skip, max_iterations)
    finally:
        if gc_was_on:
            gc.enable()


def _run_pipeline(graph: Graph, pipeline: list[tuple[str, PassFn]], skip: Iterable[str] | None,
                  max_iterations: int) -> tuple[Graph, OptimizeReport]:
    names = [n for n, _ in pipeline]
    skipped = set(skip or ()) | _env_skip()
    unknown = sorted(s for s in skipped if s not in names)
    if unknown:
        raise ValueError(f"unknown optimizer pass name(s) {unknown} in skip list; passes are: "
                         f"{', '.join(names)}")
    g = graph.copy()
    report = OptimizeReport(nodes_before=len(g.nodes), skipped=sorted(skipped))
    if not env.get("SHAPEPLAN_OPTIMIZER"):
        report.disabled = True
        report.nodes_after = len(g.nodes)
        return g, report
    reset_sink()
    verify_each = env.get("SHAPEPLAN_VERIFY")
    stats = {n: PassStats(n) for n in names}
    report.passes = [stats[n] for n in names]
    t_start = time.perf_counter()
    with shared(g):
        _iterate(g, pipeline, skipped, stats, report, max_iterations, verify_each)
    report.seconds = time.perf_counter() - t_start
    report.nodes_after = len(g.nodes)
    try:
        verify(g, check_ops=False)     # op availability is the importer's concern, not ours
    except ModelError as e:
        raise ModelError(f"IR invalid after optimization (rerun with SHAPEPLAN_VERIFY=1 to find the "
                         f"pass): {e}") from e
    return g, report


def _iterate(g: Graph, pipeline: list[tuple[str, PassFn]], skipped: set[str], stats: dict[str, PassStats],
             report: OptimizeReport, max_iterations: int, verify_each: bool) -> None:
    for it in range(max(1, max_iterations)):
        report.iterations = it + 1
        changed = False
        for name, fn in pipeline:
            if name in skipped:
                continue
            st = stats[name]
            before = len(g.nodes)
            t0 = time.perf_counter()
            try:
                n = int(fn(g) or 0)
            except ModelError as e:
                raise ModelError(f"optimizer pass {name} failed on graph {g.name!r}: {e}") from e
            st.seconds += time.perf_counter() - t0
            st.runs += 1
            st.applied += n
            st.nodes_removed += before - len(g.nodes)
            if n:
                changed = True
                if verify_each:
                    try:
                        verify(g, check_ops=False)
                    except ModelError as e:
                        raise ModelError(f"IR invalid after optimizer pass {name}: {e}") from e
        if not changed:
            break
