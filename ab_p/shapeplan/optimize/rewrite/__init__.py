"""Rewrite machinery every pass shares: a graph view, pattern tables, and the helpers around them.

A :class:`Rewriter` (rewriter.py) wraps one Graph for the duration of one pass: use-lists,
replacement, insertion right before the replaced node, the dead-node sweep and one rebuild of
``graph.nodes`` per pass.

Local rewrites are data (tinygrad ``PatternMatcher`` style; patterns.py, run by rules.py)::

    RULES = [
        (P("Neg", P("Neg", "x")), lambda m: m["x"]),                  # neg(neg(x)) -> x
        (P("Add", "x", C("c", is_zero)), lambda m: m.keep_shape("x")),  # x + 0 -> x
    ]
    count = apply_rules(graph, RULES, "Peephole")

The modules: events.py (where applied rewrites are reported), optable.py (memoized op-table
lookups), rewriter.py, patterns.py, rules.py, predicates.py (dtype / constant / shape helpers).
Everything the passes use is re-exported here.
"""
from __future__ import annotations

from shapeplan.optimize.rewrite import events, optable, patterns
from shapeplan.optimize.rewrite.events import EventSink, log, sink
from shapeplan.optimize.rewrite.optable import KEEP_TRAITS, cached_lookup
from shapeplan.optimize.rewrite.patterns import ANY, C, Match, P, Rule
from shapeplan.optimize.rewrite.predicates import (all_equal, close_to, dtype_of, int_list, is_float, is_int,
                                                   norm_axis, shapes_equal, static_shape)
from shapeplan.optimize.rewrite.rewriter import Rewriter, shared
from shapeplan.optimize.rewrite.rules import apply_rules, rewrite_ops


def reset_sink() -> None:
    """Re-read env / re-probe diagnostics and drop the lookup caches (called once per optimize())."""
    events.reset()
    optable.clear()                 # the op table may have grown since the last optimize()
    patterns.clear()


__all__ = ["ANY", "C", "EventSink", "KEEP_TRAITS", "Match", "P", "Rewriter", "Rule", "all_equal", "apply_rules", "rewrite_ops",
           "cached_lookup", "close_to", "dtype_of", "int_list", "is_float", "is_int", "log", "norm_axis",
           "reset_sink", "shapes_equal", "shared", "sink", "static_shape"]
