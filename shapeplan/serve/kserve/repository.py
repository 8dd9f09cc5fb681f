"""The model repository: which files are served under which names, with which per-model config.

Layout (``shapeplan serve --model-repository DIR``)::

    DIR/resnet50.onnx              served as "resnet50" with the default config
    DIR/encoder/model.pt2          served as "encoder" (a directory: its one .onnx / .pt2 file,
    DIR/encoder/config.json        or model.onnx / model.pt2 when there are several) + its config

Hugging Face checkpoint directories and ``.gguf`` files are LLMs: they belong to the OpenAI server
(``shapeplan serve --model``) and are skipped here, with the reason logged.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from shapeplan.errors import ModelError
from shapeplan.serve.errors import ModelNotFoundError

log = logging.getLogger("shapeplan.serve")

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


class ModelSource(NamedTuple):
    name: str
    path: str
    config: ModelConfig


def _is_llm_dir(path: str) -> bool:
    cfg = os.path.join(path, "config.json")
    try:
        with open(cfg, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and ("architectures" in doc or "model_type" in doc)


def _model_file(d: str) -> str | None:
    files = sorted(f for f in os.listdir(d) if f.endswith(MODEL_SUFFIXES) and os.path.isfile(os.path.join(d, f)))
    if len(files) > 1:
        named = [f for f in files if os.path.splitext(f)[0] == "model"]
        if len(named) != 1:
            raise ModelError(f"{d}: several model files {files}; name the one to serve model.onnx or model.pt2")
        files = named
    return os.path.join(d, files[0]) if files else None


def discover(root: str) -> list[ModelSource]:
    """The models a repository directory holds (see the module docstring), sorted by name."""
    if not os.path.isdir(root):
        raise ModelError(f"model repository {root!r} is not a directory")
    found: list[ModelSource] = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if os.path.isfile(path) and entry.endswith(MODEL_SUFFIXES):
            found.append(ModelSource(os.path.splitext(entry)[0], path, ModelConfig()))
        elif os.path.isfile(path) and entry.endswith(".gguf"):
            log.info("skipping %s: a GGUF LLM is served by the OpenAI server (shapeplan serve --model)", path)
        elif os.path.isdir(path):
            if _is_llm_dir(path):
                log.info("skipping %s: a Hugging Face checkpoint is served by the OpenAI server", path)
                continue
            model = _model_file(path)
            if model is None:
                log.info("skipping %s: no .onnx or .pt2 file in it", path)
                continue
            cfg = os.path.join(path, "config.json")
            found.append(ModelSource(entry, model, load_config(cfg) if os.path.exists(cfg) else ModelConfig()))
    if not found:
        raise ModelError(f"model repository {root!r} holds no .onnx or .pt2 model")
    return found


def single(path: str, config: ModelConfig | None = None) -> list[ModelSource]:
    """``shapeplan serve model.onnx``: one model, named after its file."""
    if not (os.path.isfile(path) and path.endswith(MODEL_SUFFIXES)):
        raise ModelError(f"{path!r} is not an .onnx or .pt2 file")
    name = os.path.splitext(os.path.basename(path))[0]
    return [ModelSource(name, path, config or ModelConfig())]


class ModelRepository:
    """The served models by name; starts and stops them together."""

    def __init__(self, sources: list[ModelSource], *, device: str = "cpu", mode: str = "auto") -> None:
        from shapeplan.serve.kserve.model import ServedModel
        self.models: dict[str, ServedModel] = {}
        for s in sources:
            cfg = dataclasses.replace(s.config, device=s.config.device or device, mode=s.config.mode or mode)
            self.models[s.name] = ServedModel(s.name, s.path, cfg)

    def start(self) -> None:
        """Compile every model and warm up its batch buckets (in each instance's own thread)."""
        try:
            for m in self.models.values():
                m.start()
            for m in self.models.values():
                m.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for m in self.models.values():
            m.stop()

    @property
    def ready(self) -> bool:
        return all(m.ready for m in self.models.values())

    def get(self, name: str, version: str = "") -> Any:
        m = self.models.get(name)
        if m is None:
            raise ModelNotFoundError(f"unknown model {name!r}; this server has {sorted(self.models)}")
        if version and version != m.version:
            raise ModelNotFoundError(f"model {name!r} has no version {version!r}; it has [{m.version!r}]")
        return m

    def __iter__(self) -> Iterator[Any]:
        return iter(self.models.values())

    def __enter__(self) -> "ModelRepository":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
