
import shapeplan as sp
from shapeplan.optimize import peephole

from tests.optimize.util import assert_same, ops_of, run_pass


def test_pairs_collapse():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (4,))
    a = g.op.Relu(g.op.Relu(x))
    b = g.op.Neg(g.op.Neg(x))
    c = g.op.Abs(g.op.Abs(x))
    d = g.op.Log(g.op.Exp(x))
    g.set_outputs(g.op.Add(g.op.Add(a, b), g.op.Add(c, d)))
    g2, n = run_pass(g, peephole.run)
    assert n == 4
    assert ops_of(g2).count("Relu") == 1 and "Neg" not in ops_of(g2) and "Log" not in ops_of(g2)
    assert_same(g, g2)


def test_exp_log_needs_fast_math(monkeypatch):
    g = sp.Graph()
    x = g.placeholder("x", "float32", (4,))
    g.set_outputs(g.op.Exp(g.op.Log(x)))        # wrong for x <= 0: must stay
    g2, n = run_pass(g, peephole.run)
    assert n == 0 and ops_of(g2) == ["Log", "Exp"]
    assert_same(g, g2)
    monkeypatch.setenv("SHAPEPLAN_OPTIMIZER_FAST_MATH", "1")
    g3, n = run_pass(g, peephole.run)
    assert n == 1


def test_neg_neg_output_keeps_name():
    g = sp.Graph()
    x = g.placeholder("x", "float32", (4,))
    g.set_outputs(g.op.Neg(g.op.Neg(x)))
    g2, _ = run_pass(g, peephole.run)
    assert g2.outputs[0].name == g.outputs[0].name
    assert_same(g, g2)
