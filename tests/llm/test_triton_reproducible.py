"""Seeded sampling is reproducible in triton mode (issue 6): every execution of a plan whose results a
request sees runs the same kernels. Before the fix, a plan's first calls (slot-by-slot, warm-up, the
compile call) ran torch kernels and only later calls the Triton ones, so the first request of a bf16
pipeline sampled from differently rounded logits than the second.

On CPU the Triton backend runs through Triton's interpreter with capture replaced by an eager run of
the chosen steps (no CUDA graphs), which is the same kernel choice as on the GPU."""
from __future__ import annotations


import pytest
import torch

from tests.triton_setup import CUDA  # noqa: E402 - before anything imports Triton

from shapeplan.llm import GenerationPipeline, Sampling  # noqa: E402
from shapeplan.runtime.backends import get_backend, register_backend  # noqa: E402
from shapeplan.runtime.backends.cuda_graphs import GraphHandle  # noqa: E402
from shapeplan.runtime.backends.triton.backend import TritonBackend  # noqa: E402
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


def _kv(pipe, blocks: list[int], used: int):
    """Every layer's K and V of the first ``used`` positions held in ``blocks`` (a session's)."""
    bs = pipe.block_size
    out = {}
    for name, pool in pipe.engine.variables.items():
        if "cache" in name:                  # [NB, Hkv, BS, D] -> [Hkv, positions, D]
            rows = pool[torch.tensor(blocks)].permute(1, 0, 2, 3).reshape(pool.shape[1], -1, pool.shape[3])
            out[name] = rows[:, :used].clone()
    assert used <= len(blocks) * bs
    return out


def test_seeded_bf16_sampling_reproducible_in_triton_mode(triton_on_cpu):
    dev = "cuda" if CUDA else "cpu"
    pipe = GenerationPipeline.from_preset("llama-tiny", device=dev, dtype="bfloat16", mode="triton",
                                          max_prefill_length=32, max_kv_cache_length=96, sync_every=4,
                                          prefix_cache=False)
    prompt = list(range(3, 20))
    samp = Sampling.random(temperature=0.9, top_p=0.9, seed=7)
    used = len(prompt) + 11
    runs = []
    for _ in range(2):                       # each in a session, which holds its blocks to be read
        with pipe.start_session() as s:
            res = s.generate(prompt, max_new_tokens=12, sampling=samp)
            runs.append((res.token_ids, _kv(pipe, s._last.blocks, used)))
    (a, kv_a), (b, kv_b) = runs
    assert a == b
    for name in kv_a:                        # K/V written by the two requests: bit for bit the same
        assert torch.equal(kv_a[name], kv_b[name]), name
    # every plan a request used had finished its lifecycle before the request's own call
    assert all(r.phase in (Phase.REPLAYING, Phase.REPLAY_BLOCKED) for r in pipe.engine.runners())
    fused = [s for r in pipe.engine.runners() for s in r.segments
             if s.handle is not None and any(st.kind != "slot" for st in s.handle.steps)]
    # Triton ran: on CUDA the ops' own kernels (the fused GEMV, the paged write and attention) at least;
    # on the CPU the decoder's norms, gate and q's RoPE now live inside RMSNormMatMul / PagedAttention, so
    # the backend may find nothing left to lower (its kernels are tested in tests/runtime/triton)
    assert fused or CUDA or not any(n.op_type in ("RMSNormalization", "SkipRMSNormalization", "SiluMul",
                                                  "RotaryEmbedding") for n in pipe.engine.graph.nodes), \
        "the graph has row-wise ops but no Triton step was chosen"


def test_kernel_warmup_covers_every_distinct_triton_step(triton_on_cpu, monkeypatch, checkpoints):
    """What the parallel warm-up launches at compile time (on CUDA; here the selection and the
    zero-input launches run through the interpreter): one launch per distinct kernel specialization,
    from the layouts the backend recorded, each running on zero-filled inputs."""
    from shapeplan.runtime.backends.triton import warmup as tw
    dev = torch.device("cuda" if CUDA else "cpu")
    seen: set = set()
    calls = []

    def warm(seg, steps, metas):
        distinct = tw.distinct_kernels(seg, steps, metas, seen)
        for st in distinct:
            outs = tw.launch_zeros(st, metas, dev)
            assert all(torch.isfinite(o.float()).all() for o in outs if isinstance(o, torch.Tensor))
        calls.append((sum(st.kind != "slot" for st in steps), {st.members[0].node.op_type for st in distinct}))
        return len(distinct)

    monkeypatch.setattr(tw, "warm_kernels", warm)
    # Qwen3: its per-head q/k norms stay RMSNormalization ops (the block's other norms, the SiLU gate and
    # q's RoPE ride inside RMSNormMatMul and PagedAttention, which are not Triton steps of the backend)
    pipe = GenerationPipeline.from_pretrained(checkpoints("qwen3"), device=str(dev), dtype="bfloat16", mode="triton",
                                              max_prefill_length=16, max_kv_cache_length=48, progress=False)
    pipe.generate([3, 4, 5], max_new_tokens=2)
    (n_prefill, first), (n_decode, _) = calls[0], calls[1]          # prefill plan, then decode plan
    assert "RMSNormalization" in first
    assert len(first) < n_prefill and n_decode > 0


def test_decode_attention_prewarm_runs_in_background():
    """The pipeline's start-up warm-up (CUDA pipelines start it at construction) runs on the warm-up
    pool: Triton's import, cache key and driver as jobs a capture waits for, and the prefill's paged KV
    write, the decode step's write + attention kernel and the greedy pick's ArgMax as compile-only jobs
    it need not wait for; all finish without error."""
    from shapeplan.llm.config import preset_config
    from shapeplan.llm.model import PagedKV
    from shapeplan.llm.pipeline import _prewarm_decode_kernels
    from shapeplan.runtime.backends.triton import warmup as tb
    cfg = preset_config("llama-tiny", "bfloat16")
    tb.wait_background()
    paged = PagedKV(num_blocks=33, block_size=16, max_blocks=3, state_slots=5)
    jobs = _prewarm_decode_kernels(cfg, torch.bfloat16, torch.device("cuda" if CUDA else "cpu"), paged)
    assert len(jobs) == 3 and all(f not in tb._pending for f in jobs)
    for f in jobs:
        f.result(timeout=120)                   # raises what the warm-up raised
    for f in list(tb._pending):
        f.result(timeout=120)
    tb.wait_background()
    assert not tb._pending
