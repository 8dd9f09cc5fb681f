"""Structured output on CUDA (skipped without a GPU; the CPU tests: tests/llm/batch/test_structured.py):
the Triton bitmask kernel inside captured plans, constrained decoding in every GPU mode against
slot_by_slot (float32, greedy: exact tokens), seeded sampled runs that validate, unconstrained rows of a
constrained batch that get their tokens alone, and the overlapped step giving the tokens of the plain one."""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
xgrammar = pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["name", "ok", "color", "n"]}
KW = dict(device="cuda", max_prefill_length=32, max_kv_cache_length=192, progress=False, max_num_seqs=16,
          sync_every=8)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """One intra-op thread, as the CPU LLM tests."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from shapeplan.llm.demo import make_tiny_checkpoint
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("ckpt-structured")), "llama")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_op_in_a_captured_plan_matches_torch(dtype):
    import shapeplan as sp
    from shapeplan.ir.graph import Graph
    from shapeplan.ops.llm import apply_token_bitmask
    v = 128256
    g = Graph("mask")
    x = g.placeholder("x", str(dtype).replace("torch.", ""), ("b", v))
    m = g.placeholder("m", "int32", ("b", -(-v // 32)))
    g.set_outputs(g.op.ApplyTokenBitmask(x, m, _domain="shapeplan"))
    for mode in ("cuda_graphs", "triton"):
        eng = sp.compile(g, device="cuda", mode=mode, optimize=False)
        for seed in range(4):                       # warm-up, capture, replays
            gen = torch.Generator().manual_seed(seed)
            logits = torch.randn(3, v, generator=gen).to(dtype)
            mask = torch.randint(-2 ** 31, 2 ** 31 - 1, (3, -(-v // 32)), generator=gen, dtype=torch.int64).to(torch.int32)
            mask[1] = -1
            got = next(iter(eng.run({"x": logits.cuda(), "m": mask.cuda()}).values())).cpu()
            assert torch.equal(got, apply_token_bitmask(logits, mask)), (mode, seed)


@pytest.mark.parametrize("mode", ["cuda_graphs", "triton"])
def test_constrained_greedy_tokens_match_slot_by_slot(tiny, mode):
    from shapeplan.llm import Constraint, GenerationPipeline, Sampling
    c = Constraint.json_schema(SCHEMA)
    prompts = [f"Record {i}:" for i in range(6)]
    sampling = Sampling.greedy(constraint=c)
    ref = GenerationPipeline.from_pretrained(tiny, mode="slot_by_slot", dtype=torch.float32, **KW)
    want = [r.token_ids for r in ref.generate_batch(prompts, max_new_tokens=100, sampling=sampling)]
    pipe = GenerationPipeline.from_pretrained(tiny, mode=mode, dtype=torch.float32, **KW)
    pipe.warmup(structured=True)
    for _ in range(2):                                 # the second round replays every plan
        got = pipe.generate_batch(prompts, max_new_tokens=100, sampling=sampling)
        assert [r.token_ids for r in got] == want
    for r in got:
        assert r.finish_reason == "stop"
        jsonschema.validate(json.loads(r.text), SCHEMA)
    from shapeplan.runtime.runner import Phase
    phases = {r.phase for r in pipe.structured._engine.runners()}
    assert phases == {Phase.REPLAYING}, phases


def test_sampled_runs_validate_and_unconstrained_rows_keep_their_tokens(tiny):
    from shapeplan.llm import Constraint, GenerationPipeline, Sampling
    pipe = GenerationPipeline.from_pretrained(tiny, mode="auto", dtype=torch.float32, **KW)
    c = Constraint.json_schema(SCHEMA)
    plain = [Sampling.greedy(), Sampling(temperature=1.0, seed=5), Sampling(temperature=0.7, top_p=0.9, seed=6)]
    alone = [pipe.generate(f"plain {i}", 24, s).token_ids for i, s in enumerate(plain)]
    cons = [Sampling(temperature=1.0, seed=100 + i, constraint=c) for i in range(12)]
    res = pipe.generate_batch([f"plain {i}" for i in range(3)] + [f"json {i}" for i in range(12)],
                              max_new_tokens=100, sampling=plain + cons)
    assert [r.token_ids[:24] for r in res[:3]] == alone
    for r in res[3:]:
        assert r.finish_reason == "stop"
        jsonschema.validate(json.loads(r.text), SCHEMA)
    pipe.structured.overlap = False
    again = pipe.generate_batch([f"json {i}" for i in range(12)], max_new_tokens=100, sampling=cons)
    assert [r.token_ids for r in again] == [r.token_ids for r in res[3:]]
    stats = pipe.structured.stats
    assert stats.steps > 0 and stats.host_s > 0 and stats.jumps > 0
