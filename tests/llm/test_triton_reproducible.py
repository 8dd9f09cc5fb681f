"""Seeded sampling is reproducible in triton mode (issue 6): every execution of a plan whose results a
request sees runs the same kernels. Before the fix, a plan's first calls (slot-by-slot, warm-up, the
compile call) ran torch kernels and only later calls the Triton ones, so the first request of a bf16
pipeline sampled from differently rounded logits than the second.

On CPU the Triton backend runs through Triton's interpreter with capture replaced by an eager run of
the chosen steps (no CUDA graphs), which is the same kernel choice as on the GPU."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")          # must precede the first `import triton`
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sp-triton-"))
pytest.importorskip("triton")
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton needs TRITON_INTERPRET=1 without CUDA", allow_module_level=True)

from shapeplan.llm import GenerationPipeline, Sampling  # noqa: E402
from shapeplan.runtime.backends import get_backend, register_backend  # noqa: E402
from shapeplan.runtime.backends.cuda_graphs import GraphHandle  # noqa: E402
from shapeplan.runtime.backends.triton_backend import TritonBackend  # noqa: E402
from shapeplan.runtime.modes import Mode  # noqa: E402
from shapeplan.runtime.runner import Phase  # noqa: E402


class InterpretedTriton(TritonBackend):
    """The Triton backend on CPU tensors: chosen and checked steps run eagerly instead of a graph."""

    def available(self, device: torch.device) -> str | None:
        return None

    def capture(self, seg, compiled, regs):
        h = GraphHandle(seg, compiled)
        h.steps = self._checked_eager(seg, h.steps, regs)
        h.eager = True                       # replay: run_steps(h.steps) into the stable buffers
        return h


@pytest.fixture
def triton_on_cpu():
    if CUDA:
        yield
        return
    before = get_backend(Mode.TRITON)
    register_backend("triton", InterpretedTriton)
    try:
        yield
    finally:
        register_backend("triton", type(before) if before is not None else TritonBackend)


def _kv(pipe):
    return {k: v.clone() for k, v in pipe.engine.variables.items() if "cache" in k}


def test_seeded_bf16_sampling_reproducible_in_triton_mode(triton_on_cpu):
    dev = "cuda" if CUDA else "cpu"
    pipe = GenerationPipeline.from_preset("llama-tiny", device=dev, dtype="bfloat16", mode="triton",
                                          max_prefill_length=32, max_kv_cache_length=96, sync_every=4)
    prompt = list(range(3, 20))
    samp = Sampling.random(temperature=0.9, top_p=0.9, seed=7)
    a = pipe.generate(prompt, max_new_tokens=12, sampling=samp)
    kv_a = _kv(pipe)
    b = pipe.generate(prompt, max_new_tokens=12, sampling=samp)
    kv_b = _kv(pipe)
    assert a.token_ids == b.token_ids
    used = len(prompt) + 11
    for name in kv_a:                        # K/V written by the two requests: bit for bit the same
        assert torch.equal(kv_a[name][:, :, :used], kv_b[name][:, :, :used]), name
    # every plan a request used had finished its lifecycle before the request's own call
    assert all(r.phase in (Phase.REPLAYING, Phase.REPLAY_BLOCKED) for r in pipe.engine.runners())
    fused = [s for r in pipe.engine.runners() for s in r.segments
             if s.handle is not None and any(st.kind != "slot" for st in s.handle.steps)]
    assert fused, "no Triton step was chosen: the test would not exercise the kernels"
