"""Import before anything imports Triton: on a machine without CUDA, Triton's interpreter runs the
kernels on CPU tensors (``TRITON_INTERPRET=1`` must be set before the first ``import triton``), and
Triton's compile cache goes to a temporary directory. Skips the importing test module when Triton is
missing, or when it was already imported without the interpreter on a CUDA-less machine."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sp-triton-"))
pytest.importorskip("triton")
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton needs TRITON_INTERPRET=1 without CUDA", allow_module_level=True)
