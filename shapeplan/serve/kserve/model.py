"""One served model: its protocol metadata, request validation, and the instances that run it.

A request is checked here, on the caller's thread (names, datatypes, shapes, batch size), so a bad
request never reaches a worker nor another client's batch; it then goes on the model's queue and the
caller waits on its future (``submit``: a concurrent future; ``infer``: awaited on the caller's event
loop). Each instance (``batcher.Batcher``) is one thread owning one engine.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shapeplan.errors import InputError, ModelError
from shapeplan.runtime.feeds import validate_feeds
from shapeplan.serve.errors import UnavailableError
from shapeplan.serve.kserve.batcher import Batcher
from shapeplan.serve.kserve.batching import Work, bucket_ladder, deliver
from shapeplan.serve.kserve.metrics import ModelStats
from shapeplan.serve.kserve.protocol import InferRequest, datatype_of, datatype_of_array
from shapeplan.serve.kserve.config import ModelConfig

DEFAULT_MAX_BATCH = 32


@dataclass(slots=True)
class TensorSpec:
    name: str
    datatype: str                  # protocol datatype: FP32, INT64, ...
    shape: tuple                   # ints; a str / None for a dimension that varies

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype,
                "shape": [d if isinstance(d, int) else -1 for d in self.shape]}


@dataclass(slots=True)
class ModelSpec:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    values: list[Any]              # the graph's input Values (validate_feeds)
    max_batch_size: int            # 0: no batch dimension
    batching: bool                 # dynamic batching on
    buckets: tuple[int, ...]       # batch sizes an engine call is padded to
    by_name: dict[str, TensorSpec] = field(default_factory=dict)     # the inputs by name

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.inputs}

    @classmethod
    def from_graph(cls, graph: Any, cfg: ModelConfig, name: str) -> "ModelSpec":
        def spec(v: Any, kind: str) -> TensorSpec:
            if v.dtype is None:
                raise ModelError(f"model {name!r}: {kind} {v.name!r} has no declared dtype")
            shape = tuple(v.shape) if v.shape is not None else ()
            return TensorSpec(v.name, datatype_of(v.dtype.name, f"model {name!r}: {kind} {v.name!r}"), shape)
        inputs = [spec(v, "input") for v in graph.inputs]
        outputs = [spec(v, "output") for v in graph.outputs]
        fixed = [t for t in inputs if not t.shape or isinstance(t.shape[0], int)]
        mbs = cfg.max_batch_size
        if mbs is None:
            mbs = DEFAULT_MAX_BATCH if inputs and not fixed else 0
        elif mbs > 0 and fixed:
            t = fixed[0]
            raise ModelError(f"model {name!r}: max_batch_size is {mbs} but input {t.name!r} has shape "
                             f"{t.metadata()['shape']}: a batched model's inputs need a first dimension "
                             "that can vary (-1); set max_batch_size 0")
        batching = mbs > 0 and cfg.dynamic_batching
        return cls(inputs, outputs, list(graph.inputs), mbs, batching, bucket_ladder(mbs) if batching else ())

    def metadata(self, name: str, version: str, platform: str) -> dict[str, Any]:
        return {"name": name, "versions": [version], "platform": platform,
                "inputs": [t.metadata() for t in self.inputs], "outputs": [t.metadata() for t in self.outputs]}


class ServedModel:
    def __init__(self, name: str, path: str, config: ModelConfig, version: str = "1") -> None:
        self.name, self.path, self.config, self.version = name, path, config, version
        self.platform = "onnx" if path.endswith(".onnx") else "pytorch_export"
        self.spec: ModelSpec | None = None
        self.stats = ModelStats()
        self.queue: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self.instances = [Batcher(self, i) for i in range(config.instance_count)]
        self._lock = threading.Lock()
        self._gate = threading.Lock()       # ``ready`` and joining the queue, together
        self._valid: set[tuple] = set()
        self.ready = False
        self.successor: ServedModel | None = None      # the model that replaced this one (a reload)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for b in self.instances:
            b.start()

    def wait_ready(self) -> None:
        for b in self.instances:
            b.wait_ready()
        self.ready = True

    def stop(self) -> None:
        with self._gate:                    # after this, no request joins the queue (``_queue``)
            self.ready = False
        for _ in self.instances:
            self.queue.put(None)
        for b in self.instances:
            b.join()
        left = []                           # anything still queued: the server is going away
        while True:
            try:
                w = self.queue.get_nowait()
            except queue.Empty:
                break
            if w is not None:
                left.append((w, None, UnavailableError(f"model {self.name!r} stopped before running the request")))
        deliver(left)

    def describe(self, graph: Any) -> ModelSpec:
        """Called by each instance once its engine is compiled; the first one sets the spec."""
        with self._lock:
            if self.spec is None:
                self.spec = ModelSpec.from_graph(graph, self.config, self.name)
            return self.spec

    def metadata(self) -> dict[str, Any]:
        if self.spec is None:
            raise UnavailableError(f"model {self.name!r} is still loading")
        return self.spec.metadata(self.name, self.version, self.platform)

    def triton_config(self) -> dict[str, Any]:
        """The model's configuration as Triton's ModelConfig (JSON form; the model configuration extension:
        what ``tritonclient``'s ``get_model_config`` reads), our own config and buckets under "shapeplan"
        (gRPC leaves that out)."""
        spec = self.spec
        if spec is None:
            raise UnavailableError(f"model {self.name!r} is still loading")
        batch = 1 if spec.max_batch_size else 0

        def tensors(ts: list[TensorSpec]) -> list[dict[str, Any]]:
            return [{"name": t.name, "data_type": "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}",
                     "dims": t.metadata()["shape"][batch:]} for t in ts]
        device = self.config.device or "cpu"
        group: dict[str, Any] = {"count": len(self.instances), "kind": "KIND_CPU" if device == "cpu" else "KIND_GPU"}
        if device.startswith("cuda:"):
            group["gpus"] = [int(device.split(":", 1)[1])]
        out: dict[str, Any] = {
            "name": self.name, "platform": "onnxruntime_onnx" if self.platform == "onnx" else "",
            "backend": "onnxruntime" if self.platform == "onnx" else "pytorch",
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": spec.max_batch_size,
            "input": tensors(spec.inputs), "output": tensors(spec.outputs), "instance_group": [group],
            "shapeplan": {**self.config.to_dict(), "buckets": list(spec.buckets)}}
        if spec.batching:
            out["dynamic_batching"] = {"max_queue_delay_microseconds": self.config.max_queue_delay_us}
        return out

    # ------------------------------------------------------------------ requests
    def submit(self, req: InferRequest) -> "Future[dict[str, np.ndarray]]":
        """Check ``req`` against the model and queue it; the future gives {output name: array}."""
        return self._queue(req, Future(), None)

    async def infer(self, req: InferRequest) -> dict[str, np.ndarray]:
        """``submit`` for a coroutine: the result comes to this event loop together with the rest of its
        batch (one hand-off per batch, not a wake-up per request)."""
        loop = asyncio.get_running_loop()
        return await self._queue(req, loop.create_future(), loop)

    def _queue(self, req: InferRequest, future: Any, loop: Any) -> Any:
        t0 = time.perf_counter_ns()
        if not self.ready or self.spec is None:
            if self.successor is not None:          # reloaded while this request was on its way
                return self.successor._queue(req, future, loop)
            raise UnavailableError(f"model {self.name!r} is not ready")
        try:
            work = self._work(req, t0, future, loop)
        except InputError:
            self.stats.request_done(False, time.perf_counter_ns() - t0)
            raise
        with self._gate:
            if self.ready:
                self.queue.put(work)
                return future
        if self.successor is not None:
            return self.successor._queue(req, future, loop)
        raise UnavailableError(f"model {self.name!r} stopped before it could queue the request")

    def _work(self, req: InferRequest, t0: int, future: Any, loop: Any) -> Work:
        spec = self.spec
        assert spec is not None
        feeds = req.feeds
        by_name = spec.by_name
        missing = [t.name for t in spec.inputs if t.name not in feeds]
        extra = [k for k in feeds if k not in by_name]
        if missing or extra:
            what = " and ".join(p for p in (f"missing input(s) {missing}" if missing else "",
                                            f"unknown input(s) {extra}" if extra else "") if p)
            sig = ", ".join(f"{t.name}: {t.datatype}{t.metadata()['shape']}" for t in spec.inputs)
            raise InputError(f"{what}; model {self.name!r} expects ({sig})")
        for name, a in feeds.items():
            t = by_name[name]
            got = datatype_of_array(a)
            if got != t.datatype:
                raise InputError(f"input {name!r}: expected datatype {t.datatype} (shape "
                                 f"{t.metadata()['shape']}), got {got} (shape {list(a.shape)})")
        sig = tuple((k, a.dtype.str, a.shape) for k, a in feeds.items())
        if sig not in self._valid:
            validate_feeds(spec.values, feeds)      # ranks, static dimensions
            if len(self._valid) > 4096:
                self._valid.clear()
            self._valid.add(sig)
        outputs = None
        if req.outputs is not None:
            known = [t.name for t in spec.outputs]
            bad = [o for o in req.outputs if o not in known]
            if bad:
                raise InputError(f"unknown output(s) {bad}; model {self.name!r} has outputs {known}")
            if len(set(req.outputs)) != len(req.outputs):
                raise InputError(f"an output is requested twice: {req.outputs}")
            outputs = tuple(req.outputs)
        rows = 0
        if spec.max_batch_size:
            rows_of = {k: a.shape[0] for k, a in feeds.items()}
            rows = next(iter(rows_of.values()))
            if len(set(rows_of.values())) > 1:
                raise InputError(f"the inputs disagree on the batch (first) dimension: {rows_of}")
            if not 1 <= rows <= spec.max_batch_size:
                raise InputError(f"a batch of {rows} rows: model {self.name!r} takes 1 to "
                                 f"{spec.max_batch_size} rows per request (max_batch_size)")
        key = tuple(feeds[t.name].shape[1:] for t in spec.inputs)
        return Work(feeds, outputs, rows, key, future, t0, loop)

    # ------------------------------------------------------------------ statistics
    def plan_stats(self) -> list[dict[str, Any]]:
        out = []
        for b in self.instances:
            out.extend(b.plan_stats())
        return out

    def statistics(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, **self.stats.snapshot(),
                "plan_stats": self.plan_stats()}
