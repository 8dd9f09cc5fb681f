"""A served model's configuration: the keys of its config.json (``CONFIG_KEYS``, ``ModelConfig``), and
which file of a model directory is the model (``model_file``)."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from shapeplan.errors import ModelError

MODEL_SUFFIXES = (".onnx", ".pt2")


class ConfigKey(NamedTuple):
    name: str
    type: type
    default: Any
    meaning: str


#: every key a model's config.json may hold (docs/serve.md lists the same table)
CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("max_batch_size", int, None,
              "largest batch (first dimension) one engine call takes; 0: the model does not batch; default: "
              "32 when every input's first dimension can vary, else 0"),
    ConfigKey("dynamic_batching", bool, True,
              "concatenate concurrent requests along the batch dimension (needs max_batch_size > 0)"),
    ConfigKey("max_queue_delay_us", int, 100,
              "when the worker is idle, how long the first request waits for others to join it, in "
              "microseconds (a busy worker takes what is queued and goes)"),
    ConfigKey("device", str, None, "cpu, cuda, cuda:1, ... (default: the server's --device)"),
    ConfigKey("mode", str, None, "execution mode, as in sp.compile (default: the server's --mode)"),
    ConfigKey("instance_count", int, 1, "engines (each with its own worker thread) serving this model"),
)


@dataclass(slots=True)
class ModelConfig:
    max_batch_size: int | None = None
    dynamic_batching: bool = True
    max_queue_delay_us: int = 100
    device: str | None = None
    mode: str | None = None
    instance_count: int = 1

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "ModelConfig":
        if not isinstance(d, dict):
            raise ModelError(f"{where}: expected a JSON object, got {type(d).__name__}")
        keys = {k.name: k for k in CONFIG_KEYS}
        unknown = sorted(set(d) - set(keys))
        if unknown:
            raise ModelError(f"{where}: unknown key(s) {unknown}; the keys are {sorted(keys)}")
        for name, value in d.items():
            want = keys[name].type
            if value is not None and (type(value) is not want):
                raise ModelError(f"{where}: {name!r} must be {want.__name__}, got {value!r}")
        cfg = cls(**d)
        if cfg.max_batch_size is not None and cfg.max_batch_size < 0:
            raise ModelError(f"{where}: 'max_batch_size' must be >= 0, got {cfg.max_batch_size}")
        if cfg.max_queue_delay_us < 0 or cfg.instance_count < 1:
            raise ModelError(f"{where}: 'max_queue_delay_us' must be >= 0 and 'instance_count' >= 1")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


assert [k.name for k in CONFIG_KEYS] == [f.name for f in dataclasses.fields(ModelConfig)]


def load_config(path: str) -> ModelConfig:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read the model config: {e}") from None
    return ModelConfig.from_dict(doc, path)


def model_file(d: str) -> str | None:
    """The model file directly in directory ``d`` (model.onnx / model.pt2 among several), None if none."""
    files = sorted(f for f in os.listdir(d) if f.endswith(MODEL_SUFFIXES) and os.path.isfile(os.path.join(d, f)))
    if len(files) > 1:
        named = [f for f in files if os.path.splitext(f)[0] == "model"]
        if len(named) != 1:
            raise ModelError(f"{d}: several model files {files}; name the one to serve model.onnx or model.pt2")
        files = named
    return os.path.join(d, files[0]) if files else None
