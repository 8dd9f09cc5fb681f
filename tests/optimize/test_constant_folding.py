import numpy as np

import shapeplan as sp
from shapeplan.ir.graph import ValueKind
from shapeplan.optimize import constant_folding

from tests.optimize.util import assert_same, ops_of, run_pass


def test_folds_constant_subgraph():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2, 2))
    c = g.op.Add(np.ones((2, 2), np.float32), np.full((2, 2), 2, np.float32))
    g.set_outputs(g.op.Mul(x, g.op.Sqrt(c)))
    g2, n = run_pass(g, constant_folding.run)
    assert n == 2 and ops_of(g2) == ["Mul"]
    assert_same(g, g2)


def test_output_becomes_constant_keeps_name():
    g = sp.Graph()
    g.placeholder("x", "float32", (1,))
    y = g.op.Neg(np.ones(3, np.float32))
    g.set_outputs(y)
    g2, n = run_pass(g, constant_folding.run)
    assert n == 1 and g2.outputs[0].name == y.name and g2.outputs[0].kind is ValueKind.CONSTANT
    assert_same(g, g2)


def test_does_not_fold_inputs_or_huge_results():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    big = g.op.Expand(np.float32(1), np.array([512, 512], np.int64))
    g.set_outputs(g.op.Add(x, np.ones(2, np.float32)), big)
    g2, n = run_pass(g, constant_folding.run)
    assert n == 0 and sorted(ops_of(g2)) == ["Add", "Expand"]
