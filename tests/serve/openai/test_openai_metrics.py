"""``/metrics``: Prometheus text with ``shapeplan:`` names labelled by model, counters that move by
exactly what the requests did, and the latency histograms observed once per request (TTFT, e2e,
queue time) and once per token after the first (inter-token latency)."""
from __future__ import annotations

import httpx

from tests.serve.openai.conftest import MODEL

NAMES = ["num_requests_running", "num_requests_waiting", "kv_blocks_used", "kv_blocks_total",
         "kv_blocks_used_fraction", "prefix_cache_lookups_total", "prefix_cache_hits_total",
         "prefix_cache_hit_tokens_total", "prompt_tokens_total", "generation_tokens_total", "prefill_tokens_total",
         "num_preemptions_total", "decode_rounds_total", "decode_rounds_launched_ahead_total",
         "time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
         "e2e_request_latency_seconds_count", "request_queue_time_seconds_count"]


def test_every_metric_is_there_with_the_model_label(server):
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    got = server.metrics()
    for name in NAMES:
        assert f'shapeplan:{name}{{model_name="{MODEL}"}}' in got, name
    for reason in ("stop", "length", "abort", "error"):
        assert f'shapeplan:requests_finished_total{{model_name="{MODEL}",reason="{reason}"}}' in got
    assert 0 <= server.metric("shapeplan:kv_blocks_used_fraction") <= 1
    assert server.metric("shapeplan:kv_blocks_total") == server.pipe.blocks.usable_blocks


def test_counters_and_histograms_move_by_what_the_requests_did(server):
    server.wait_for(lambda: server.metric("shapeplan:num_requests_running") == 0)
    names = ["shapeplan:prompt_tokens_total", "shapeplan:generation_tokens_total",
             "shapeplan:time_to_first_token_seconds_count", "shapeplan:inter_token_latency_seconds_count",
             "shapeplan:e2e_request_latency_seconds_count", "shapeplan:request_queue_time_seconds_count",
             "shapeplan:prefix_cache_lookups_total", "shapeplan:decode_rounds_total"]
    before = {n: server.metric(n) for n in names}
    length0 = server.metric("shapeplan:requests_finished_total", reason="length")
    prompt = "A prompt for the metrics test"
    r = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=12, n=2, temperature=0.8, seed=3,
                                           extra_body={"ignore_eos": True})
    after = {n: server.metric(n) for n in names}
    moved = {n: after[n] - before[n] for n in names}
    assert moved["shapeplan:prompt_tokens_total"] == 2 * r.usage.prompt_tokens          # each choice's prompt
    assert moved["shapeplan:generation_tokens_total"] == r.usage.completion_tokens == 24
    assert moved["shapeplan:time_to_first_token_seconds_count"] == 2
    assert moved["shapeplan:e2e_request_latency_seconds_count"] == 2
    assert moved["shapeplan:request_queue_time_seconds_count"] == 2
    assert moved["shapeplan:inter_token_latency_seconds_count"] == 2 * 11
    assert moved["shapeplan:prefix_cache_lookups_total"] >= 2           # a request may look twice
    assert moved["shapeplan:decode_rounds_total"] >= 2                  # 11 decode steps a choice, rounds of <= 4
    assert server.metric("shapeplan:decode_rounds_launched_ahead_total") == server.pipe.batch.async_rounds
    assert server.metric("shapeplan:requests_finished_total", reason="length") == length0 + 2
    assert server.metric("shapeplan:time_to_first_token_seconds_sum") > 0
