"""Fixtures shared by the whole test suite.

Before anything imports Triton (``import shapeplan.llm`` does, see shapeplan/llm/pipeline.py; it patches
nothing): on a
machine without CUDA its interpreter runs the kernels on CPU tensors, which needs ``TRITON_INTERPRET=1``
before the first ``import triton``, and its compile cache goes to a temporary directory
(tests/triton_setup.py says the same for modules run on their own)."""
import os
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# CPU pipelines keep quantized weights packed (the reference path every quantized test means to run; its
# auto mode dequantizes small models once: tests/llm/test_quantized_models.py sets it per test there)
os.environ.setdefault("SHAPEPLAN_QUANT_CPU", "packed")
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sp-triton-"))

from shapeplan import diagnostics  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """``pytest -n auto`` (the README's test command): a worker per CPU this process may use, at most 8 (each
    worker imports torch and holds its own Triton interpreter state; past 8 they add memory, not speed)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cpus))


@pytest.fixture
def diag():
    diagnostics.reset()
    diagnostics.enable("ALL", level="full")
    yield diagnostics
    diagnostics.disable()
    diagnostics.reset()


@pytest.fixture
def one_thread():
    """Tiny matrices: intra-op threads only add contention on a shared 2-core machine."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def triton_attention():
    """Decode steps run the Triton split-K attention kernel, and the test fails if it ever fell back."""
    from shapeplan.ops import llm as llm_ops
    old = llm_ops.set_decode_attention("triton")
    llm_ops._triton_failed.clear()
    yield
    assert not llm_ops._triton_failed, llm_ops._triton_failed     # the kernel ran, no silent fallback
    llm_ops.set_decode_attention(old)
