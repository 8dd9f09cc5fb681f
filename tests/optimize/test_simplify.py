"""IdentityRemoval, CastElimination, BroadcastElimination, Reordering, ReshapeChainFolding,
ConcatSplitSimplification, SliceOfConcat, GatherOfConstant, ConstantConditionWhere,
RedundancyElimination, ArithmeticChainFolding, StrengthReduction, ShapeFolding, CSE."""
import numpy as np

import shapeplan as sp
from shapeplan.optimize import (arithmetic_chain, broadcast, cast_elimination, concat_split, cse,
                                identity_removal, redundancy, reordering, reshape_chain, shape_folding,
                                slice_gather, strength_reduction, where_const)

from tests.optimize.util import assert_same, need, ops_of, run_pass

I64 = np.int64


def _x(g, shape=(2, 3, 4), dt="float32", name="x"):
    return g.placeholder(name, dt, shape)


def test_identity_removal():
    g = sp.Graph(); x = _x(g)
    y = g.op.Transpose(g.op.Identity(x), perm=[0, 1, 2])
    g.set_outputs(g.op.Relu(g.op.Concat(y, axis=0)))
    g2, n = run_pass(g, identity_removal.run)
    assert ops_of(g2) == ["Relu"] and n == 3
    assert_same(g, g2)


def test_identity_removal_keeps_real_transpose():
    g = sp.Graph(); x = _x(g)
    g.set_outputs(g.op.Relu(g.op.Transpose(x, perm=[0, 2, 1])))
    assert run_pass(g, identity_removal.run)[1] == 0


def test_cast_elimination():
    need("Cast")
    g = sp.Graph(); x = _x(g)
    a = g.op.Cast(x, to=1)                                   # f32 -> f32
    b = g.op.Cast(g.op.Cast(a, to=11), to=1)                 # f32 -> f64 -> f32 (lossless)
    g.set_outputs(g.op.Relu(b))
    g2, n = run_pass(g, cast_elimination.run)
    assert ops_of(g2) == ["Relu"]
    assert_same(g, g2)


def test_cast_lossy_chain_kept():
    need("Cast")
    g = sp.Graph(); x = _x(g)
    g.set_outputs(g.op.Cast(g.op.Cast(x, to=6), to=1))     # f32 -> i32 -> f32 truncates
    g2, n = run_pass(g, cast_elimination.run)
    assert ops_of(g2) == ["Cast", "Cast"]
    assert_same(g, g2)


def test_broadcast_elimination():
    g = sp.Graph(); x = _x(g, (4, 8))
    b = g.op.Expand(np.ones(8, np.float32), np.array([4, 8], I64))
    e = g.op.Expand(x, np.array([4, 8], I64))
    g.set_outputs(g.op.Add(b, e))
    g2, n = run_pass(g, broadcast.run)
    assert ops_of(g2) == ["Add"]
    assert g2.nodes[0].inputs[1].kind is sp.ValueKind.CONSTANT        # canonical: constant second
    assert_same(g, g2)


def test_broadcast_needed_expand_kept():
    g = sp.Graph(); x = _x(g, (1, 8))
    g.set_outputs(g.op.Add(g.op.Expand(x, np.array([4, 8], I64)), np.ones(8, np.float32)))
    g2, _ = run_pass(g, broadcast.run)
    assert "Expand" in ops_of(g2)
    assert_same(g, g2)


def test_reordering_double_transpose():
    g = sp.Graph(); x = _x(g)
    a = g.op.Transpose(g.op.Transpose(x, perm=[1, 0, 2]), perm=[1, 0, 2])
    b = g.op.Transpose(g.op.Transpose(x, perm=[1, 0, 2]), perm=[0, 2, 1])
    g.set_outputs(a, b)
    g2, n = run_pass(g, reordering.run)
    assert n == 2 and ops_of(g2) == ["Identity", "Transpose"]
    assert g2.nodes[1].attrs["perm"] == [1, 2, 0]
    assert_same(g, g2)


def test_reordering_transpose_into_gemm():
    need("MatMul", "Gemm")
    g = sp.Graph(); a = _x(g, (5, 3), name="a"); b = _x(g, (5, 4), name="b")
    g.set_outputs(g.op.MatMul(g.op.Transpose(a, perm=[1, 0]), b))
    g2, n = run_pass(g, reordering.run)
    assert ops_of(g2) == ["Gemm"] and g2.nodes[0].attrs["transA"] == 1
    assert_same(g, g2)


def test_reshape_chain():
    g = sp.Graph(); x = _x(g)
    y = g.op.Reshape(g.op.Reshape(x, np.array([6, 4], I64)), np.array([4, -1], I64))
    g.set_outputs(g.op.Relu(y))
    g2, n = run_pass(g, reshape_chain.run)
    assert ops_of(g2) == ["Reshape", "Relu"] and n == 1
    assert_same(g, g2)


def test_reshape_chain_zero_dim_needs_static():
    g = sp.Graph(); x = g.placeholder("x", "float32", ("b", 12))
    y = g.op.Reshape(g.op.Reshape(x, np.array([-1, 3, 4], I64)), np.array([0, 12], I64))
    g.set_outputs(y)
    g2, n = run_pass(g, reshape_chain.run)
    assert n == 0


def test_concat_split():
    g = sp.Graph(); a = _x(g, (2, 4), name="a"); b = _x(g, (3, 4), name="b")
    cat = g.op.Concat(a, b, axis=0)
    s0, s1 = g.op.Split(cat, np.array([2, 3], I64), axis=0, _outputs=2)
    n1 = g.op.Concat(g.op.Concat(s0, a, axis=0), b, axis=0)
    g.set_outputs(g.op.Relu(s1), n1)
    g2, n = run_pass(g, concat_split.run)
    assert n >= 2 and ops_of(g2).count("Concat") == 1 and "Split" not in ops_of(g2)
    assert_same(g, g2)


def test_slice_of_concat():
    g = sp.Graph(); a = _x(g, (2, 4), name="a"); b = _x(g, (3, 4), name="b")
    cat = g.op.Concat(a, b, axis=0)
    y = g.op.Slice(cat, np.array([2], I64), np.array([5], I64), np.array([0], I64))
    z = g.op.Slice(cat, np.array([3], I64), np.array([4], I64), np.array([0], I64))
    g.set_outputs(g.op.Relu(y), z)
    g2, n = run_pass(g, slice_gather.run_slice)
    assert n == 2 and "Concat" not in ops_of(g2)
    assert_same(g, g2)


def test_slice_across_pieces_kept():
    g = sp.Graph(); a = _x(g, (2, 4), name="a"); b = _x(g, (3, 4), name="b")
    cat = g.op.Concat(a, b, axis=0)
    g.set_outputs(g.op.Slice(cat, np.array([1], I64), np.array([4], I64), np.array([0], I64)))
    assert run_pass(g, slice_gather.run_slice)[1] == 0


def test_gather_of_concat():
    need("Gather")
    g = sp.Graph(); a = _x(g, (1,), "int64", "a"); b = _x(g, (2,), "int64", "b")
    cat = g.op.Concat(a, b, axis=0)
    g.set_outputs(g.op.Gather(cat, np.array(2, I64), axis=0))
    g2, n = run_pass(g, slice_gather.run_gather)
    assert n == 1 and "Concat" not in ops_of(g2)
    assert_same(g, g2)


def test_where_constant_condition():
    g = sp.Graph(); a = _x(g, (2, 3), name="a"); b = _x(g, (2, 3), name="b")
    t = g.op.Where(np.ones((2, 3), bool), a, b)
    f = g.op.Where(np.zeros((2, 3), bool), a, b)
    m = g.op.Where(np.array([True, False, True]), a, b)      # mixed: kept
    g.set_outputs(g.op.Add(t, f), m)
    g2, n = run_pass(g, where_const.run)
    assert n == 2 and ops_of(g2).count("Where") == 1
    assert_same(g, g2)


def test_redundancy():
    g = sp.Graph(); x = _x(g)
    a = g.op.Floor(g.op.Floor(x))
    b = g.op.Max(x, x)
    c = g.op.Squeeze(g.op.Unsqueeze(x, np.array([1], I64)), np.array([1], I64))
    g.set_outputs(g.op.Add(g.op.Add(a, b), c))
    g2, n = run_pass(g, redundancy.run)
    assert n == 3 and ops_of(g2).count("Floor") == 1 and "Max" not in ops_of(g2) and "Squeeze" not in ops_of(g2)
    assert_same(g, g2)


def test_arithmetic_chain():
    g = sp.Graph(); x = _x(g)
    a = g.op.Add(g.op.Add(x, np.float32(1)), np.float32(2))
    b = g.op.Mul(g.op.Mul(x, np.float32(2)), np.float32(3))
    c = g.op.Add(g.op.Mul(x, np.float32(2)), g.op.Mul(x, np.float32(5)))
    g.set_outputs(a, b, c)
    g2, n = run_pass(g, arithmetic_chain.run)
    assert n == 3 and len(g2.nodes) == 3
    assert_same(g, g2)


def test_arithmetic_chain_shared_intermediate_kept():
    g = sp.Graph(); x = _x(g)
    t = g.op.Add(x, np.float32(1))
    g.set_outputs(g.op.Add(t, np.float32(2)), t)
    assert run_pass(g, arithmetic_chain.run)[1] == 0


def test_strength_reduction():
    g = sp.Graph(); x = _x(g)
    a = g.op.Pow(x, np.float32(2))
    b = g.op.Div(x, np.float32(4))
    c = g.op.Pow(g.op.Add(g.op.Abs(x), np.float32(1)), np.float32(-1))
    g.set_outputs(a, b, c)
    g2, n = run_pass(g, strength_reduction.run)
    assert n == 3 and "Pow" not in ops_of(g2) and "Div" not in ops_of(g2) and "Reciprocal" in ops_of(g2)
    assert_same(g, g2)


def test_strength_reduction_int_div_kept():
    g = sp.Graph(); i = _x(g, (4,), "int64", "i")
    g.set_outputs(g.op.Div(i, np.int64(3)))
    assert run_pass(g, strength_reduction.run)[1] == 0


def test_shape_folding():
    need("Shape", "Size", "Gather")
    g = sp.Graph(); x = g.placeholder("x", "float32", ("b", 3, 4))
    s = g.op.Gather(g.op.Shape(x), np.array(2, I64), axis=0)
    r = g.op.Size(g.op.Shape(x))
    g.set_outputs(g.op.Add(s, r))
    g2, n = run_pass(g, shape_folding.run)
    assert n == 2 and "Gather" not in ops_of(g2)
    assert_same(g, g2)


def test_cse():
    g = sp.Graph(); x = _x(g)
    a, b = g.op.Relu(x), g.op.Relu(x)
    c, d = g.op.Add(x, a), g.op.Add(a, x)                   # commutative: same
    e, f = g.op.Transpose(x, perm=[0, 2, 1]), g.op.Transpose(x, perm=[1, 0, 2])   # different attrs
    g.set_outputs(g.op.Mul(b, c), d, e, f)
    g2, n = run_pass(g, cse.run)
    assert ops_of(g2).count("Relu") == 1 and ops_of(g2).count("Add") == 1 and ops_of(g2).count("Transpose") == 2
    assert_same(g, g2)


def test_cse_skips_random():
    need("RandomNormalLike")
    g = sp.Graph(); x = _x(g)
    g.set_outputs(g.op.RandomNormalLike(x), g.op.RandomNormalLike(x))
    assert run_pass(g, cse.run)[1] == 0
