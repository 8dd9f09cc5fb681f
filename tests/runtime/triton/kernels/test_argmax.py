"""ArgMax / ArgMin of long rows in two Triton kernels (kernels/argmax.py; CPU through Triton's interpreter,
or the GPU) against torch.argmax / argmin: first index of ties, NaN first, rows of -inf, a ragged tail."""
from __future__ import annotations

import pytest
import torch

from tests.triton_setup import CUDA  # noqa: E402 - before anything imports Triton

from shapeplan.runtime.backends.triton.kernels import argmax as A  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("largest", [True, False])
def test_argmax_equals_torch(dtype, largest):
    g = torch.Generator().manual_seed(3)
    n = 3 * A.PER + 777                                   # four splits, the last one ragged
    x = torch.randn(6, n, generator=g).to(dtype)
    x[1, [5, A.PER + 3, n - 1]] = 50.0 if largest else -50.0      # ties across splits: the first wins
    x[2, [A.PER + 9, 2 * A.PER]] = float("nan")                   # NaN: its first index wins
    x[2, 7] = float("inf") if largest else float("-inf")
    x[3] = float("-inf") if largest else float("inf")            # nothing better than the padding value
    x[4, -1] = float("inf") if largest else float("-inf")        # the extreme in the ragged tail
    x[5, 0] = float("nan")
    f = torch.argmax if largest else torch.argmin
    got = A.argmax(x.to(DEV), largest).cpu()
    assert torch.equal(got, f(x, dim=-1)), (got, f(x, dim=-1))


def test_the_argmax_op_takes_the_kernels_on_long_rows():
    """ArgMax on a vocabulary-long row (the LLM's greedy pick) through the op, keepdims both ways."""
    from shapeplan.ops import reduce as R
    for n in (R.TWO_STAGE_MIN + 5, 32000):                  # 128k-class and 32k-class vocabularies
        x = torch.randn(2, 3, n, generator=torch.Generator().manual_seed(1)).to(DEV)
        for keep in (0, 1):
            got = R._arg(x, -1, keep, 0, True)
            assert torch.equal(got.cpu(), torch.argmax(x.cpu(), dim=-1, keepdim=bool(keep)))
    assert R.TRITON_MIN <= 32000 <= R.TWO_STAGE_MIN          # the Triton kernels take 32k rows, torch's two stages not


def test_both_passes_compile_for_sm90():
    from tests.ops.test_quant_ops import _compile_sm90
    res = _compile_sm90("argmax:partial:0", "argmax:partial:1", "argmax:merge:0", "argmax:merge:1")
    assert all(r["ok"] for r in res.values()), {s: r["error"] for s, r in res.items()}
    assert res["argmax:partial:1"]["griddepcontrol"] and res["argmax:merge:1"]["griddepcontrol"]
