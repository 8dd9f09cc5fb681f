"""``/metrics`` of the OpenAI server: Prometheus text format via prometheus-client, every name
prefixed ``shapeplan:`` and labelled ``model_name``.

Gauges and engine counters are read when scraped (``EngineCollector``: plain reads of the engine's
counters and queue lengths, so a scrape never waits for a step); the latency histograms are observed
by the routes as requests stream (``Latency``)."""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

P = "shapeplan:"
LABEL = "model_name"

_TTFT = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
_ITL = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
_E2E = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_QUEUE = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineCollector(Collector):
    """The serving core's state and lifetime counters, read at scrape time."""

    def __init__(self, pipe: Any, model: str) -> None:
        self.pipe, self.model = pipe, model

    def collect(self) -> Iterator[Any]:
        pipe, m = self.pipe, [self.model]
        eng, sc, bm = pipe.batch, pipe.scheduler, pipe.blocks
        # plain reads from another thread: each value is consistent, the set is a snapshot within a step
        running, prefilling, waiting = len(sc.running), len(sc.prefilling), len(sc.waiting)
        used, total = bm.used, bm.usable_blocks

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(P + name, doc, labels=[LABEL])
            g.add_metric(m, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(P + name, doc, labels=[LABEL])
            c.add_metric(m, value)
            return c

        yield gauge("num_requests_running", "Requests admitted (prefilling or decoding).", running + prefilling)
        yield gauge("num_requests_waiting", "Requests waiting for a slot and KV blocks.", waiting)
        yield gauge("kv_blocks_used", "KV blocks held by requests.", used)
        yield gauge("kv_blocks_total", "KV blocks in the pool (the null block not counted).", total)
        yield gauge("kv_blocks_used_fraction", "Fraction of the KV pool held by requests (0 to 1).",
                    used / total if total else 0.0)
        s = bm.stats
        yield counter("prefix_cache_lookups", "Prefix-cache lookups (one per admitted prompt).", s.total_lookups)
        yield counter("prefix_cache_hits", "Lookups that found at least one cached block.", s.total_hits)
        yield counter("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.", s.total_hit_tokens)
        yield counter("generation_tokens", "Tokens generated.", eng.generated_tokens)
        yield counter("prefill_tokens", "Prompt tokens computed by prefill (cache hits excluded).", eng.prefill_tokens)
        yield counter("num_preemptions", "Requests preempted because KV blocks ran out.", sc.preemptions)
        yield counter("decode_rounds", "Decode rounds run (sync_every steps or fewer each).", eng.decode_rounds)
        yield counter("decode_rounds_launched_ahead", "Decode rounds launched before the previous one was read "
                      "back (SHAPEPLAN_LAUNCH_AHEAD).", eng.async_rounds)
        fin = CounterMetricFamily(P + "requests_finished", "Requests finished, by reason (stop, length, abort, "
                                  "error).", labels=[LABEL, "reason"])
        for reason in ("stop", "length", "abort", "error"):
            fin.add_metric([self.model, reason], eng.finished_by_reason.get(reason, 0))
        yield fin


class Latency:
    """What the routes observe per request (children bound to the model label once)."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(P + name, doc, [LABEL], registry=registry, buckets=buckets).labels(model)

        self.ttft = hist("time_to_first_token_seconds", "Request received to its first token.", _TTFT)
        self.itl = hist("inter_token_latency_seconds", "Time between tokens (a read-back's gap spread over its "
                        "tokens).", _ITL)
        self.e2e = hist("e2e_request_latency_seconds", "Request received to its last token.", _E2E)
        self.queue = hist("request_queue_time_seconds", "Submitted to first admitted (slot and KV blocks).", _QUEUE)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of the requests submitted (each of n "
                                     "choices counts).", [LABEL], registry=registry).labels(model)


def registry_for(pipe: Any, model: str) -> tuple[CollectorRegistry, Latency]:
    reg = CollectorRegistry()
    reg.register(EngineCollector(pipe, model))
    return reg, Latency(reg, model)
