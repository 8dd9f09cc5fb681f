"""Graph optimizer: a pass manager over a named pipeline of passes (one module per pass).

    g2 = optimize(g)                                   # a new Graph; ``g`` is not mutated
    g2, report = optimize_with_report(g, skip=["CommonSubexpressionElimination"])
    print(report.to_text())

The pipeline reads top to bottom; the names are the user-facing skip names
(``skip=[...]`` or ``SHAPEPLAN_OPTIMIZER_SKIP=Name,Name``). See docs/optimizer.md.
"""
from __future__ import annotations

from typing import Iterable

from shapeplan.ir.graph import Graph
from shapeplan.optimize import (activation_fusion, algebraic, arithmetic_chain, attention_fusion,
                                broadcast, cast_elimination, concat_split, constant_folding, conv_bn, cse, dce,
                                horizontal_fusion, identity_removal, matmul_add, normalization_fusion,
                                peephole, redundancy, reordering, reshape_chain, shape_folding,
                                slice_gather, strength_reduction, where_const)
from shapeplan.optimize.manager import OptimizeReport, PassStats, run_pipeline

PIPELINE = [
    ("DeadCodeElimination", dce.run),
    ("ConstantFolding", constant_folding.run),
    ("ShapeFolding", shape_folding.run),
    ("IdentityRemoval", identity_removal.run),
    ("CastElimination", cast_elimination.run),
    ("BroadcastElimination", broadcast.run),
    ("Reordering", reordering.run),
    ("ReshapeChainFolding", reshape_chain.run),
    ("ConcatSplitSimplification", concat_split.run),
    ("SliceOfConcat", slice_gather.run_slice),
    ("GatherOfConstant", slice_gather.run_gather),
    ("ConstantConditionWhere", where_const.run),
    ("AlgebraicIdentities", algebraic.run),
    ("Peephole", peephole.run),
    ("RedundancyElimination", redundancy.run),
    # fusions see the graph before strength reduction rewrites pow(x, 2) and divisions
    ("NormalizationFusion", normalization_fusion.run),
    ("AttentionFusion", attention_fusion.run),
    ("ActivationFusion", activation_fusion.run),
    ("HorizontalFusion", horizontal_fusion.run),
    ("MatMulAddFusion", matmul_add.run),
    ("ConvBatchNormFolding", conv_bn.run),
    ("ArithmeticChainFolding", arithmetic_chain.run),
    ("StrengthReduction", strength_reduction.run),
    ("CommonSubexpressionElimination", cse.run),
]

PASS_NAMES = [name for name, _ in PIPELINE]


def optimize_with_report(graph: Graph, skip: Iterable[str] | None = None,
                         max_iterations: int = 3) -> tuple[Graph, OptimizeReport]:
    """Optimize a copy of ``graph``; returns ``(optimized_graph, report)``."""
    return run_pipeline(graph, PIPELINE, skip, max_iterations)


def optimize(graph: Graph, skip: Iterable[str] | None = None, max_iterations: int = 3) -> Graph:
    """Optimize a copy of ``graph`` (the input is never mutated)."""
    return optimize_with_report(graph, skip, max_iterations)[0]


__all__ = ["PIPELINE", "PASS_NAMES", "OptimizeReport", "PassStats", "optimize", "optimize_with_report"]
