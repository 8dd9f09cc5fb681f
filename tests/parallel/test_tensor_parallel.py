"""Tensor parallelism: TP=2 over gloo (two spawned processes on this machine) gives the same greedy
tokens as TP=1; the shards reassemble the weights; the graph holds the expected collectives."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from shapeplan.errors import ExecutionError, ModelError
from shapeplan.llm import GenerationPipeline, Sampling, preset_config
from shapeplan.llm.model import build_graph
from shapeplan.llm.weights import random_weights
from shapeplan.parallel import TensorParallel, spawn
from shapeplan.parallel.run import tokens_worker

PROMPT = [5, 17, 42, 7, 99, 3, 250, 11, 64, 8, 120, 33]
KW = dict(max_prefill_length=32, max_kv_cache_length=96)


def _tp1(path: str, n: int, mode: str) -> list[int]:
    pipe = GenerationPipeline.from_pretrained(path, mode=mode, progress=False, **KW)
    return pipe.generate(PROMPT, max_new_tokens=n, sampling=Sampling.greedy()).token_ids


def test_tp2_gloo_greedy_tokens_identical_to_tp1(checkpoints):
    cases = [("llama", "auto", 24), ("qwen2", "auto", 24), ("qwen2", "slot_by_slot", 12)]
    work = [dict(path=checkpoints(mt), ids=PROMPT, max_new_tokens=n, mode=mode, **KW) for mt, mode, n in cases]
    got = spawn(tokens_worker, 2, work, threads=1)[0]          # rank 0's tokens, one list per case
    for (mt, mode, n), tokens in zip(cases, got):
        assert len(tokens) == n
        assert tokens == _tp1(checkpoints(mt), n, mode), (mt, mode)


def test_shards_reassemble_the_weights_and_pad_the_vocabulary():
    cfg = dataclasses.replace(preset_config("llama-tiny", "float32"), vocab_size=511)     # 511 = 2 * 256 - 1
    w = random_weights(cfg, seed=1)
    parts = [TensorParallel(r, 2).shard(cfg, w) for r in range(2)]
    local = parts[0][0]
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == \
        (cfg.num_heads // 2, cfg.num_kv_heads // 2, cfg.intermediate_size // 2, 511)
    p = "model.layers.1."
    cat0 = lambda name: torch.cat([s[1][name] for s in parts], 0)        # noqa: E731
    cat1 = lambda name: torch.cat([s[1][name] for s in parts], 1)        # noqa: E731
    for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight"):
        assert torch.equal(cat0(p + name), w[p + name]), name
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        assert torch.equal(cat1(p + name), w[p + name]), name
    emb = cat0("model.embed_tokens.weight")
    assert emb.shape[0] == 512 and torch.equal(emb[:511], w["model.embed_tokens.weight"])
    assert not emb[511].any()                                       # padding row
    assert parts[1][1][p + "input_layernorm.weight"] is w[p + "input_layernorm.weight"]   # replicated


def test_tp_graph_has_two_allreduces_per_layer_and_gathers_the_logits():
    cfg = dataclasses.replace(preset_config("llama-tiny", "float32"), vocab_size=511)
    g = build_graph(cfg, random_weights(cfg), max_kv_cache_length=32, tp=TensorParallel(1, 2))
    hist = g.op_histogram()
    assert hist["shapeplan::AllReduce"] == 2 * cfg.num_layers + 1          # o, down per layer + embedding
    assert hist["shapeplan::AllGather"] == 2                               # logits, all_logits
    out = {v.name: v for v in g.outputs}
    assert out["logits"].shape == (1, 511) and out["all_logits"].shape[-1] == 511    # padding sliced off
    kv = g.values["k_cache_0"].shape
    assert kv[1] == cfg.num_kv_heads // 2


def test_tp_size_must_divide_heads():
    cfg = preset_config("llama-tiny", "float32")            # 4 heads, 2 kv heads
    with pytest.raises(ModelError, match="num_key_value_heads=2"):
        TensorParallel(0, 4).shard(cfg, random_weights(cfg))


def test_collectives_without_a_process_group_are_a_clean_error():
    from shapeplan.ops.collective import all_gather, all_reduce
    with pytest.raises(ExecutionError, match="torch.distributed"):
        all_reduce(torch.ones(2))
    with pytest.raises(ExecutionError, match="torch.distributed"):
        all_gather(torch.ones(2), world_size=2)


def test_generate_cli_tp2_prints_the_tp1_text(checkpoints, capfd):
    from shapeplan.cli import main
    path = checkpoints("llama")
    args = ["generate", "--model", path, "--prompt", "Hello world", "--max-new-tokens", "8",
            "--max-prefill-length", "32", "--max-kv-cache-length", "64",
            "--presence-penalty", "0.8", "--frequency-penalty", "0.4", "--min-p", "0.05"]   # (each rank's rows)
    assert main([*args, "--tp", "2"]) == 0
    tp2 = capfd.readouterr().out
    assert main(args) == 0
    assert tp2 == capfd.readouterr().out


def test_hang_dump_prints_every_stack_after_the_given_seconds(tmp_path):
    """``SHAPEPLAN_HANG_DUMP_S``: a worker still running after N seconds writes its Python stacks to
    stderr (how a rank stuck in a collective shows where)."""
    import os
    import subprocess
    import sys
    code = ("import time; from shapeplan.parallel.launch import arm_hang_dump; "
            "assert arm_hang_dump() == 0.5; time.sleep(1.2)")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "SHAPEPLAN_HANG_DUMP_S": "0.5"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Thread" in p.stderr and 'File "<string>", line 1' in p.stderr      # where the main thread waits
    q = subprocess.run([sys.executable, "-c", code.replace("0.5", "0")], capture_output=True, text=True,
                       timeout=120, env={k: v for k, v in os.environ.items() if k != "SHAPEPLAN_HANG_DUMP_S"})
    assert q.returncode == 0 and "Thread" not in q.stderr                        # off by default


def test_bench_tp2_fails_fast_with_the_rank_and_the_error(capfd):
    """A config that fails on a rank ends the TP bench with that rank's error at once (a failure of
    one rank alone must not leave the others waiting in a collective)."""
    from shapeplan.cli import main
    assert main(["bench", "--preset", "llama-tiny", "--tp", "2", "--config", "slot_by_slot", "--prompt-len", "16",
                 "--max-kv-cache-length", "8", "--new-tokens", "4"]) == 1
    err = capfd.readouterr().err
    assert "error: WorkerError: tensor-parallel worker failed" in err and "max_prefill_length" in err
    assert "[rank 0] bench config slot_by_slot failed" in err or "[rank 1] bench config slot_by_slot failed" in err


def test_leave_group_destroys_the_group_and_gives_up_on_a_destroy_that_hangs(monkeypatch, capfd):
    """``leave_group`` collects garbage (captured CUDA graphs keep NCCL's destroy waiting) and destroys
    the group; a destroy that does not return in time is left on a daemon thread and reported, so a
    worker whose result is sent can still exit."""
    import threading

    import torch.distributed as dist

    from shapeplan.parallel.launch import free_port, leave_group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    assert leave_group() is True and not dist.is_initialized()
    assert leave_group() is True                                   # nothing to leave

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    release = threading.Event()
    real = dist.destroy_process_group
    monkeypatch.setattr(dist, "destroy_process_group", lambda: (release.wait(30), real()))
    try:
        assert leave_group(timeout_s=0.2) is False
        assert "did not return within 0.2 s" in capfd.readouterr().err
    finally:
        release.set()
    for _ in range(100):                                           # the daemon thread finishes the destroy
        if not dist.is_initialized():
            break
        threading.Event().wait(0.05)
    assert not dist.is_initialized()
