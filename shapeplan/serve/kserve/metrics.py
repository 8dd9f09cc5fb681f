"""Per-model statistics (the KServe/Triton statistics extension's counters) and their Prometheus view.

``ModelStats`` is the one source: the statistics endpoints return ``ModelStats.snapshot()`` (plus the
plan cache's state) and ``/metrics`` reads the same numbers at scrape time through ``KServeCollector``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class ModelStats:
    """Request-level (success / fail / queue) and execution-level (one engine call per batch) counters."""

    PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.durations = {p: Duration() for p in self.PHASES}
        self.inference_count = 0            # request rows served
        self.execution_count = 0            # engine calls
        self.last_inference_ms = 0
        self.batches: dict[int, tuple[Duration, Duration, Duration]] = {}

    def request_done(self, ok: bool, ns: int, count: int = 1) -> None:
        """``count`` requests finished, ``ns`` their summed time from submit to result."""
        with self._lock:
            self.durations["success" if ok else "fail"].add(ns, count)

    def executed(self, size: int, rows: int, queue_ns: list[int], input_ns: int, infer_ns: int,
                 output_ns: int) -> None:
        """One engine call of ``size`` rows (padded) serving ``rows`` request rows."""
        n = len(queue_ns)
        with self._lock:
            d = self.durations
            d["queue"].add(sum(queue_ns), n)
            d["compute_input"].add(input_ns, n)
            d["compute_infer"].add(infer_ns, n)
            d["compute_output"].add(output_ns, n)
            b = self.batches.get(size)
            if b is None:
                b = self.batches[size] = (Duration(), Duration(), Duration())
            for dur, ns in zip(b, (input_ns, infer_ns, output_ns)):
                dur.add(ns)
            self.inference_count += rows
            self.execution_count += 1
            self.last_inference_ms = int(time.time() * 1000)

    def snapshot(self) -> dict[str, Any]:
        """The statistics extension's per-model fields (Triton's names)."""
        with self._lock:
            return {
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {p: d.to_json() for p, d in self.durations.items()},
                "batch_stats": [{"batch_size": size, "compute_input": b[0].to_json(),
                                 "compute_infer": b[1].to_json(), "compute_output": b[2].to_json()}
                                for size, b in sorted(self.batches.items())],
            }


class KServeCollector:
    """A prometheus-client collector over a ``ModelRepository`` (register it on the app's registry)."""

    def __init__(self, repo: Any) -> None:
        self.repo = repo

    def describe(self) -> list:
        return []            # no describe at registration time (the models may still be loading)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        labels = ["model", "version"]
        fams = {
            "requests": CounterMetricFamily("shapeplan_inference_requests", "inference requests by outcome",
                                            labels=labels + ["outcome"]),
            "rows": CounterMetricFamily("shapeplan_inference_count", "request rows (batch entries) served",
                                        labels=labels),
            "exec": CounterMetricFamily("shapeplan_inference_exec_count", "engine calls (one per batch)",
                                        labels=labels),
            "seconds": CounterMetricFamily("shapeplan_inference_duration_seconds",
                                           "cumulative time by phase (queue, compute_input, compute_infer, "
                                           "compute_output, success, fail)", labels=labels + ["phase"]),
            "replays": CounterMetricFamily("shapeplan_plan_replays", "segment replays of the model's plans",
                                           labels=labels),
            "plans": GaugeMetricFamily("shapeplan_plans", "plans in the model's plan caches, by phase",
                                       labels=labels + ["phase"]),
            "ready": GaugeMetricFamily("shapeplan_model_ready", "1 when the model serves requests",
                                       labels=labels),
        }
        for m in self.repo:
            lv = [m.name, m.version]
            s = m.stats.snapshot()
            st = s["inference_stats"]
            fams["requests"].add_metric(lv + ["success"], st["success"]["count"])
            fams["requests"].add_metric(lv + ["fail"], st["fail"]["count"])
            fams["rows"].add_metric(lv, s["inference_count"])
            fams["exec"].add_metric(lv, s["execution_count"])
            for phase, d in st.items():
                fams["seconds"].add_metric(lv + [phase], d["ns"] / 1e9)
            plans = m.plan_stats()
            fams["replays"].add_metric(lv, sum(p["replays"] for p in plans))
            by_phase: dict[str, int] = {}
            for p in plans:
                by_phase[p["phase"]] = by_phase.get(p["phase"], 0) + 1
            for phase, n in sorted(by_phase.items()):
                fams["plans"].add_metric(lv + [phase], n)
            fams["ready"].add_metric(lv, 1.0 if m.ready else 0.0)
        yield from fams.values()
