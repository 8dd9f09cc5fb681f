"""ONNX Runtime's session API over shapeplan: ``import shapeplan.ort as ort`` in place of
``import onnxruntime as ort``, and an ``InferenceSession`` runs on a compiled, replayed plan.

    import shapeplan.ort as ort
    sess = ort.InferenceSession("model.onnx", providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    [(i.name, i.type, i.shape) for i in sess.get_inputs()]       # as onnxruntime gives them
    y, = sess.run(None, {"x": x})                                  # outputs in the graph's order
    y, = sess.run(["y"], {"x": x})

What maps (docs/runtime.md, "ONNX Runtime's API"): ``providers`` pick the device (the first one
available: CUDA or TensorRT -> ``cuda`` when torch sees a GPU, CPU -> ``cpu``); ``SessionOptions``'
``graph_optimization_level`` ``ORT_DISABLE_ALL`` turns our optimizer off (every other level leaves it
on); ``run`` takes arrays, or lists it converts to the input's declared type (as onnxruntime does), and
returns numpy arrays. What does not:
``OrtValue`` / I/O binding, custom-op libraries, provider options (given ones are an error), profiling.
Errors are shapeplan's typed exceptions (``InputError`` for a bad feed, naming the input).
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from shapeplan.errors import InputError, ModelError

#: onnxruntime's provider names this module runs, in onnxruntime's order of preference
CUDA_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
CPU_PROVIDER = "CPUExecutionProvider"

#: shapeplan dtype name -> onnxruntime's type string
_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "float64": "tensor(double)",
          "bfloat16": "tensor(bfloat16)", "int8": "tensor(int8)", "int16": "tensor(int16)", "int32": "tensor(int32)",
          "int64": "tensor(int64)", "uint8": "tensor(uint8)", "uint16": "tensor(uint16)", "uint32": "tensor(uint32)",
          "uint64": "tensor(uint64)", "bool": "tensor(bool)", "string": "tensor(string)",
          "complex64": "tensor(complex64)", "complex128": "tensor(complex128)"}


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


@dataclass
class SessionOptions:
    """onnxruntime's options object; ``graph_optimization_level`` is read, the rest is kept and unused."""
    graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    log_severity_level: int = 2
    extra: dict[str, Any] = field(default_factory=dict)

    def add_session_config_entry(self, key: str, value: str) -> None:
        self.extra[key] = value


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, type string ("tensor(float)"), shape (ints,
    names of symbolic dimensions, None for an unknown one)."""
    name: str
    type: str
    shape: list


@dataclass(frozen=True)
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


def get_available_providers() -> list[str]:
    import torch
    return [*CUDA_PROVIDERS, CPU_PROVIDER] if torch.cuda.is_available() else [CPU_PROVIDER]


def get_device() -> str:
    return "GPU" if len(get_available_providers()) > 1 else "CPU"


def _pick(providers: Sequence[Any] | None) -> tuple[str, str]:
    """(device, provider) of the first provider given that runs here (onnxruntime's fallback order)."""
    names = []
    for p in providers or [CPU_PROVIDER]:
        if isinstance(p, tuple):
            name, options = p
            if options:
                raise ValueError(f"provider {name!r}: provider options {options!r} are not supported here")
            p = name
        if p not in (*CUDA_PROVIDERS, CPU_PROVIDER):
            raise ValueError(f"unknown provider {p!r}; shapeplan.ort runs {[*CUDA_PROVIDERS, CPU_PROVIDER]}")
        names.append(p)
    available = get_available_providers()
    for p in names:
        if p in available:
            return ("cuda" if p in CUDA_PROVIDERS else "cpu"), p
    return "cpu", CPU_PROVIDER                  # as onnxruntime: what is not available falls back to the CPU


def _node_args(values: Sequence[Any]) -> list[NodeArg]:
    out = []
    for v in values:
        dtype = v.dtype.name if v.dtype is not None else None
        shape = [d if isinstance(d, (int, str)) else None for d in v.shape] if v.shape is not None else []
        out.append(NodeArg(v.name, _TYPES.get(dtype, f"tensor({dtype})"), shape))
    return out


class InferenceSession:
    def __init__(self, path_or_bytes: str | bytes | os.PathLike, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, provider_options: Sequence[Any] | None = None,
                 **kwargs: Any) -> None:
        import shapeplan as sp
        if provider_options:
            raise ValueError("provider_options are not supported here")
        if kwargs:
            raise TypeError(f"InferenceSession: unexpected argument(s) {sorted(kwargs)}")
        options = sess_options or SessionOptions()
        device, self._provider = _pick(providers)
        src = os.fspath(path_or_bytes) if isinstance(path_or_bytes, os.PathLike) else path_or_bytes
        if not isinstance(src, (str, bytes, bytearray)):
            raise ModelError(f"InferenceSession: expected a model path or its bytes, got {type(src).__name__}")
        self._src = src
        optimize = options.graph_optimization_level != GraphOptimizationLevel.ORT_DISABLE_ALL
        self._engine = sp.compile(bytes(src) if isinstance(src, bytearray) else src, device=device,
                                  optimize=optimize)
        graph = self._engine.graph
        self._inputs, self._outputs = _node_args(graph.inputs), _node_args(graph.outputs)
        self._input_names = [i.name for i in self._inputs]
        self._numpy_types = {v.name: v.dtype.numpy for v in graph.inputs if v.dtype is not None}
        self._output_names = [o.name for o in self._outputs]
        self._sess_options = options

    # ------------------------------------------------------------------ what onnxruntime's session has
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return []

    def get_providers(self) -> list[str]:
        return [self._provider] if self._provider == CPU_PROVIDER else [self._provider, CPU_PROVIDER]

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def get_modelmeta(self) -> ModelMetadata:
        import onnx
        m = onnx.load_from_string(self._src) if isinstance(self._src, (bytes, bytearray)) else \
            onnx.load(self._src, load_external_data=False)
        return ModelMetadata(m.producer_name, m.graph.name, m.domain, m.doc_string, m.graph.doc_string,
                             m.model_version, {p.key: p.value for p in m.metadata_props})

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """The outputs ``output_names`` (None or empty: all, in the graph's order) for ``input_feed``."""
        if not isinstance(input_feed, Mapping):
            raise InputError(f"input_feed must be a dict of input name -> array, got {type(input_feed).__name__}")
        unknown = [k for k in input_feed if k not in self._input_names]
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {self._input_names}")
        names = list(output_names) if output_names else list(self._output_names)
        bad = [n for n in names if n not in self._output_names]
        if bad:
            raise InputError(f"unknown output(s) {bad}; the model's outputs are {self._output_names}")
        # a list becomes an array of the input's declared type, as onnxruntime converts it
        feeds = {k: v if isinstance(v, np.ndarray) else np.asarray(v, dtype=self._numpy_types.get(k))
                 for k, v in input_feed.items()}
        want = None if names == self._output_names else list(dict.fromkeys(names))
        out = self._engine.run(feeds, outputs=want)
        return [np.asarray(out[n]) for n in names]

    def end_profiling(self) -> str:
        return ""

    def disable_fallback(self) -> None:
        pass

    def enable_fallback(self) -> None:
        pass
