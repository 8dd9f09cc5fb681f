import numpy as np

import shapeplan as sp
from shapeplan.optimize import dce

from tests.optimize.util import assert_same, ops_of, run_pass


def test_removes_unused_nodes_and_constants():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    g.op.Exp(g.op.Add(x, np.ones(2, np.float32)))     # dead
    g.set_outputs(g.op.Relu(x))
    g2, n = run_pass(g, dce.run)
    assert ops_of(g2) == ["Relu"] and n >= 2
    assert not g2.constants
    assert_same(g, g2)


def test_keeps_outputs_and_variables():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2,))
    g.variable("state", np.zeros(2, np.float32))
    a = g.op.Exp(x)
    g.set_outputs(a, g.op.Neg(a))
    g2, n = run_pass(g, dce.run)
    assert n == 0 and ops_of(g2) == ["Exp", "Neg"] and "state" in g2.values
