import numpy as np

import shapeplan as sp
from shapeplan.optimize import algebraic

from tests.optimize.util import assert_same, ops_of, run_pass


def test_identities():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (2, 3))
    a = g.op.Add(x, np.zeros(3, np.float32))
    b = g.op.Mul(a, np.float32(1))
    c = g.op.Sqrt(g.op.Mul(b, b))
    d = g.op.Pow(g.op.Abs(c), np.float32(0.5))
    g.set_outputs(d)
    g2, n = run_pass(g, algebraic.run)
    assert n == 4 and ops_of(g2) == ["Abs", "Abs", "Sqrt"]
    assert_same(g, g2)


def test_broadcasting_identity_not_removed():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (1,))
    g.set_outputs(g.op.Add(x, np.zeros(4, np.float32)))   # broadcasts [1] -> [4]
    g2, n = run_pass(g, algebraic.run)
    assert n == 0
    assert_same(g, g2)


def test_times_zero_ints_only(monkeypatch):
    g = sp.Graph()
    i = g.placeholder("i", "int64", (3,))
    f = g.placeholder("f", "float32", (3,))
    g.set_outputs(g.op.Mul(i, np.zeros(3, np.int64)), g.op.Mul(f, np.zeros(3, np.float32)))
    g2, n = run_pass(g, algebraic.run)
    assert n == 1 and ops_of(g2) == ["Mul"]            # float x*0 kept (NaN/inf)
    assert_same(g, g2)
    monkeypatch.setenv("SHAPEPLAN_OPTIMIZER_FAST_MATH", "1")
    g3, n = run_pass(g, algebraic.run)
    assert n == 2
