"""The model repository: which files are served under which names, with which per-model config.

Layout (``shapeplan serve --model-repository DIR``)::

    DIR/resnet50.onnx              served as "resnet50" with the default config
    DIR/encoder/model.pt2          served as "encoder" (a directory: its one .onnx / .pt2 file,
    DIR/encoder/config.json        or model.onnx / model.pt2 when there are several) + its config
    DIR/net/config.pbtxt           Triton's layout: served as "net", version "3" (the newest the
    DIR/net/1/model.onnx           config's version_policy allows), config.pbtxt's fields mapped onto
    DIR/net/3/model.onnx           ours (``config_from_pbtxt``)

Hugging Face checkpoint directories and ``.gguf`` files are LLMs: they belong to the OpenAI server
(``shapeplan serve --model``) and are skipped here, with the reason logged.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

from shapeplan.errors import ModelError
from shapeplan.serve.errors import BadRequestError, ModelLoadError, ModelNotFoundError, UnavailableError
from shapeplan.serve.kserve.shm import SharedMemoryRegions

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
    version: str = "1"


# ----------------------------------------------------------------------------------- Triton's layout
# A Triton model repository: DIR/NAME/config.pbtxt and DIR/NAME/<version>/model.onnx. The version
# policy picks which version is served (one per model here); config.pbtxt's fields map onto ModelConfig.

_PBTXT_LIST = re.compile(r"""("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|#[^\n]*)|([A-Za-z_]\w*)(\s*)\[""")


def read_pbtxt(path: str) -> Any:
    """A config.pbtxt as the ``ModelConfig`` message (the fields ``proto`` declares; others are skipped).
    ``field [ ... ]`` (Triton's list syntax, which protobuf's skipper does not take for a field it does
    not know) is read as ``field: [ ... ]``, its equivalent."""
    from google.protobuf import text_format

    from shapeplan.serve.kserve import proto as pb
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read the model config: {e}") from None
    text = _PBTXT_LIST.sub(lambda m: m.group(1) if m.group(1) is not None else f"{m.group(2)}:{m.group(3)}[", text)
    cfg = pb.ModelConfig()
    try:
        text_format.Parse(text, cfg, allow_unknown_field=True)
    except text_format.ParseError as e:
        raise ModelError(f"{path}: line {e}") from None
    return cfg


#: the platform / backend names of config.pbtxt each kind of model file may have
_PLATFORMS = {".onnx": ({"", "onnxruntime_onnx"}, {"", "onnxruntime"}), ".pt2": ({""}, {"", "pytorch"})}


def config_from_pbtxt(c: Any, path: str, name: str, model: str) -> ModelConfig:
    """Triton's config (``read_pbtxt``) as ours: max_batch_size; dynamic_batching (present: on, with its
    max_queue_delay_microseconds; absent: off, as in Triton); instance_group (the counts added up; KIND_CPU
    -> cpu, KIND_GPU -> cuda or cuda:N for one GPU, KIND_AUTO -> the server's device)."""
    platforms, backends = _PLATFORMS[os.path.splitext(model)[1]]
    if c.platform not in platforms or c.backend not in backends:
        what = f"platform {c.platform!r}" if c.platform not in platforms else f"backend {c.backend!r}"
        raise ModelError(f"{path}: {what} is not one shapeplan runs for {os.path.basename(model)} (ONNX: platform "
                         "'onnxruntime_onnx' or backend 'onnxruntime'; torch.export .pt2: backend 'pytorch')")
    if c.name and c.name != name:
        raise ModelError(f"{path}: name {c.name!r} is not the model's directory name {name!r}")
    if c.max_batch_size < 0:
        raise ModelError(f"{path}: max_batch_size must be >= 0, got {c.max_batch_size}")
    kinds = {g.kind for g in c.instance_group} - {pb_kind("KIND_AUTO"), pb_kind("KIND_MODEL")}
    gpus = sorted({i for g in c.instance_group for i in g.gpus})
    device = None
    if len(kinds) > 1:
        raise ModelError(f"{path}: instance groups on both CPU and GPU; shapeplan runs a model's instances on one device")
    if kinds == {pb_kind("KIND_GPU")}:
        if len(gpus) > 1:
            raise ModelError(f"{path}: instance groups on GPUs {gpus}; shapeplan runs a model's instances on one "
                             "device: list one GPU")
        device = f"cuda:{gpus[0]}" if gpus else "cuda"
    elif kinds == {pb_kind("KIND_CPU")}:
        device = "cpu"
    count = sum(max(g.count, 1) * max(len(g.gpus), 1) for g in c.instance_group) or 1
    batching = c.HasField("dynamic_batching")
    return ModelConfig(max_batch_size=c.max_batch_size, dynamic_batching=batching,
                       max_queue_delay_us=c.dynamic_batching.max_queue_delay_microseconds if batching else 100,
                       device=device, instance_count=count)


#: Triton's ModelConfig fields (top level): a load's JSON config with one of them that is not also a
#: config.json key is Triton's JSON form of config.pbtxt
TRITON_FIELDS = frozenset({
    "name", "platform", "backend", "version_policy", "max_batch_size", "input", "output", "batch_input",
    "batch_output", "optimization", "dynamic_batching", "sequence_batching", "ensemble_scheduling",
    "instance_group", "default_model_filename", "cc_model_filenames", "metric_tags", "parameters",
    "model_warmup", "model_operations", "model_transaction_policy", "model_repository_agents", "response_cache"})


def config_from_json(doc: Any, where: str, name: str, model: str) -> ModelConfig:
    """A load request's ``config``: our config.json keys, or Triton's ModelConfig as JSON (what
    ``tritonclient``'s ``load_model(config=...)`` sends to Triton; mapped as config.pbtxt is, its other
    fields skipped)."""
    ours = {k.name for k in CONFIG_KEYS}
    if not isinstance(doc, dict) or not (set(doc) & (TRITON_FIELDS - ours)
                                         or isinstance(doc.get("dynamic_batching"), dict)):
        return ModelConfig.from_dict(doc, where)
    from google.protobuf import json_format

    from shapeplan.serve.kserve import proto as pb
    try:
        c = json_format.ParseDict(doc, pb.ModelConfig(), ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise ModelError(f"{where}: not a Triton model config: {e}") from None
    return config_from_pbtxt(c, where, name, model)


def pb_kind(name: str) -> int:
    from shapeplan.serve.kserve import proto as pb
    return pb.ModelInstanceGroup.Kind.Value(name)


def _version(d: str, policy: Any, filename: str, where: str) -> tuple[str, str] | None:
    """(version, model file) of the version directory ``d`` serves: the newest of those the policy allows
    (one version per model: a policy that allows several serves the newest, logged); None: no versions."""
    if filename and filename != os.path.basename(filename):
        raise ModelError(f"{where}: default_model_filename {filename!r} must be a file name, not a path")
    found: dict[int, str] = {}
    for v in os.listdir(d):
        sub = os.path.join(d, v)
        if not (v.isdigit() and os.path.isdir(sub)):
            continue
        if filename:
            f = os.path.join(sub, filename)
            if os.path.isfile(f) and f.endswith(MODEL_SUFFIXES):
                found[int(v)] = f
        elif (f := _model_file(sub)) is not None:
            found[int(v)] = f
    if not found:
        return None
    allowed = sorted(found)
    choice = policy.WhichOneof("policy_choice") if policy is not None else None
    if choice == "specific":
        allowed = [v for v in allowed if v in set(policy.specific.versions)]
        if not allowed:
            raise ModelError(f"{where}: version_policy specific {list(policy.specific.versions)}, but the versions "
                             f"here are {sorted(found)}")
    wanted = len(allowed) if choice in ("all", "specific") else max(policy.latest.num_versions, 1) if choice else 1
    if min(wanted, len(allowed)) > 1:
        log.warning("%s: the version policy allows versions %s; shapeplan serves one version per model: %d",
                    where, allowed[-wanted:], allowed[-1])
    return str(allowed[-1]), found[allowed[-1]]


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


def _source(root: str, entry: str) -> ModelSource | None:
    """The model the repository entry ``entry`` holds; None (logged) when it holds none. A model directory
    with several model files or a bad config.json is a ModelError."""
    path = os.path.join(root, entry)
    if os.path.isfile(path) and entry.endswith(MODEL_SUFFIXES):
        return ModelSource(os.path.splitext(entry)[0], path, ModelConfig())
    if os.path.isfile(path) and entry.endswith(".gguf"):
        log.info("skipping %s: a GGUF LLM is served by the OpenAI server (shapeplan serve --model)", path)
    elif os.path.isdir(path):
        if _is_llm_dir(path):
            log.info("skipping %s: a Hugging Face checkpoint is served by the OpenAI server", path)
            return None
        cfg, pbtxt = os.path.join(path, "config.json"), os.path.join(path, "config.pbtxt")
        if os.path.exists(cfg) and os.path.exists(pbtxt):
            raise ModelError(f"{path}: both config.json and config.pbtxt; keep one")
        triton = read_pbtxt(pbtxt) if os.path.exists(pbtxt) else None
        model, version = _model_file(path), "1"
        if model is None:                       # Triton's layout: version directories
            got = _version(path, triton.version_policy if triton is not None and triton.HasField("version_policy")
                           else None, triton.default_model_filename if triton is not None else "", pbtxt)
            if got is None and triton is not None:      # a config.pbtxt says this is a model: say what is missing
                want = repr(triton.default_model_filename) if triton.default_model_filename else "a .onnx or .pt2 file"
                raise ModelError(f"{pbtxt}: no version directory (1/, 2/, ...) beside it holds {want}")
            if got is None:
                log.info("skipping %s: no .onnx or .pt2 file in it (nor in a version directory 1/, 2/, ...)", path)
                return None
            version, model = got
        if triton is not None:
            config = config_from_pbtxt(triton, pbtxt, entry, model)
        else:
            config = load_config(cfg) if os.path.exists(cfg) else ModelConfig()
        return ModelSource(entry, model, config, version)
    return None


def _name(entry: str) -> str:
    return os.path.splitext(entry)[0] if entry.endswith(MODEL_SUFFIXES) else entry


def discover(root: str, *, empty_ok: bool = False) -> list[ModelSource]:
    """The models a repository directory holds (see the module docstring), sorted by name. ``empty_ok``:
    a repository without models is not an error (``--model-control-mode explicit`` loads them later)."""
    if not os.path.isdir(root):
        raise ModelError(f"model repository {root!r} is not a directory")
    found: dict[str, ModelSource] = {}
    for entry in sorted(os.listdir(root)):
        s = _source(root, entry)
        if s is None:
            continue
        if s.name in found:
            raise ModelError(f"model repository {root!r}: two entries are named {s.name!r} "
                             f"({found[s.name].path} and {s.path}); rename one")
        found[s.name] = s
    if not found and not empty_ok:
        raise ModelError(f"model repository {root!r} holds no .onnx or .pt2 model")
    return list(found.values())


def names(root: str, *, check: bool = False) -> list[str]:
    """The names of the models in the repository, a malformed one (several model files, a bad config.json)
    included: the repository index lists it and loading it says what is wrong. ``check``: a ``root`` that
    is not a directory is a ModelError (else it has no models)."""
    if check and not os.path.isdir(root):
        raise ModelError(f"model repository {root!r} is not a directory")
    out = set()
    for entry in os.listdir(root) if os.path.isdir(root) else []:
        try:
            if _source(root, entry) is not None:
                out.add(_name(entry))
        except ModelError:
            out.add(_name(entry))
    return sorted(out)


def find(root: str, name: str) -> ModelSource:
    """The model named ``name`` in the repository, read now (its file and config.json as they are on disk)."""
    entries = [e for e in os.listdir(root) if _name(e) == name] if os.path.isdir(root) else []
    sources = [s for e in sorted(entries) if (s := _source(root, e)) is not None]
    if not sources:
        raise ModelNotFoundError(f"no model {name!r} in the model repository {root!r}; it has {names(root)}")
    if len(sources) > 1:
        raise ModelError(f"model repository {root!r}: two entries are named {name!r} "
                         f"({sources[0].path} and {sources[1].path}); rename one")
    return sources[0]


def single(path: str, config: ModelConfig | None = None) -> list[ModelSource]:
    """``shapeplan serve model.onnx``: one model, named after its file."""
    if not (os.path.isfile(path) and path.endswith(MODEL_SUFFIXES)):
        raise ModelError(f"{path!r} is not an .onnx or .pt2 file")
    name = os.path.splitext(os.path.basename(path))[0]
    return [ModelSource(name, path, config or ModelConfig())]


class ModelRepository:
    """The served models by name; starts and stops them together.

    Model control (Triton's ``--model-control-mode``): ``"none"`` serves the models it is given, for the
    server's whole life. ``"explicit"`` (needs ``root``) also loads, reloads and unloads models while the
    server runs (``load`` / ``unload``, the protocol's model repository extension). A reload compiles and
    warms the new model while the old one serves; then requests go to the new one and the old one
    finishes what it has queued. A load that fails leaves the model that served (if any) serving.
    """

    def __init__(self, sources: list[ModelSource], *, device: str = "cpu", mode: str = "auto",
                 root: str | None = None, control: str = "none", poll_secs: float = 15.0) -> None:
        if control not in CONTROL_MODES:
            raise ModelError(f"model control mode {control!r}: expected one of {list(CONTROL_MODES)}")
        if control != "none" and root is None:
            raise ModelError(f"model control mode {control!r} needs the model repository's directory (root)")
        if control == "poll" and not poll_secs > 0:
            raise ModelError(f"the repository poll interval must be > 0 seconds, got {poll_secs}")
        self.device, self.mode, self.root, self.control, self.poll_secs = device, mode, root, control, poll_secs
        self.models: dict[str, Any] = {s.name: self._served(s) for s in sources}
        self._states: dict[str, tuple[str, str]] = {}      # name -> (state, reason) of a model not served now
        self._uploads: dict[str, str] = {}                 # name -> temporary directory of its uploaded files
        self._control = threading.Lock()                   # one load / unload at a time, and stop
        self._closed = False
        self._signatures = {s.name: _signature(root, s) for s in sources} if control == "poll" else {}
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()
        #: the system shared memory regions clients registered (the server's transports share them)
        self.shared_memory = SharedMemoryRegions()

    def _served(self, s: ModelSource) -> Any:
        from shapeplan.serve.kserve.model import ServedModel
        cfg = dataclasses.replace(s.config, device=s.config.device or self.device, mode=s.config.mode or self.mode)
        return ServedModel(s.name, s.path, cfg, s.version)

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
        if self.control == "poll" and self._poller is None:
            self._poller = threading.Thread(target=self._poll, name="shapeplan-serve-poll", daemon=True)
            self._poller.start()

    def stop(self) -> None:
        self._stop_polling.set()
        with self._control:                 # a load in progress finishes first; none starts after
            self._closed = True
            for m in list(self.models.values()):
                m.stop()
            for d in self._uploads.values():
                shutil.rmtree(d, ignore_errors=True)
            self._uploads.clear()
        if self._poller is not None:
            self._poller.join()
            self._poller = None
        self.shared_memory.close()

    @property
    def ready(self) -> bool:
        return all(m.ready for m in list(self.models.values()))

    def get(self, name: str, version: str = "") -> Any:
        m = self.models.get(name)
        if m is None:
            if name in self._states:
                state, reason = self._states[name]
                raise ModelNotFoundError(f"model {name!r} is not loaded ({state.lower()}{': ' + reason if reason else ''})")
            raise ModelNotFoundError(f"unknown model {name!r}; this server has {sorted(self.models)}")
        if version and version != m.version:
            raise ModelNotFoundError(f"model {name!r} has no version {version!r}; it has [{m.version!r}]")
        return m

    def is_ready(self, name: str, version: str = "") -> bool:
        """Whether model ``name`` serves now: False for a model the repository has but does not serve
        (unloaded, never loaded, failed); NOT_FOUND for a name it does not know."""
        if name not in self.models and (name in self._states or (self.root and name in names(self.root))):
            return False
        return self.get(name, version).ready

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.models.values()))

    def __enter__(self) -> "ModelRepository":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ model repository extension
    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository directory and every model served or tried: name, version, state
        (READY, LOADING, UNAVAILABLE; empty: never loaded) and the reason of an UNAVAILABLE one."""
        listed = set(names(self.root)) if self.root else set()
        out = []
        for name in sorted(listed | set(self.models) | set(self._states)):
            m = self.models.get(name)
            if m is not None:
                entry = {"name": name, "version": m.version, "state": "READY" if m.ready else "LOADING", "reason": ""}
            elif name in self._states:
                state, reason = self._states[name]
                entry = {"name": name, "version": "", "state": state, "reason": reason}
            else:
                entry = {"name": name, "version": "", "state": "", "reason": ""}
            if not ready_only or entry["state"] == "READY":
                out.append(entry)
        return out

    def _explicit(self, what: str) -> None:
        if self.control == "poll":
            raise BadRequestError(f"{what}: this server follows its repository directory (model control mode "
                                  "'poll'): change the files there, or start it with --model-control-mode explicit")
        if self.control != "explicit":
            raise BadRequestError(f"{what}: this server's models are fixed (model control mode {self.control!r}); "
                                  "start it with --model-control-mode explicit to load and unload models")

    def load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        """Load ``name`` from the repository directory, or from ``files`` ({"file:<path>": bytes}, one .onnx
        / .pt2 among them); reload it if it is served. ``config``: its config.json as a JSON string (instead
        of the one on disk). Returns once the model is ready; raises ModelLoadError when it cannot load."""
        self._explicit(f"load {name!r}")
        if not name or name != os.path.basename(name) or name in (".", ".."):
            raise BadRequestError(f"load: {name!r} is not a model name")
        self._load(name, config, files)

    def _load(self, name: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        with self._control:
            if self._closed:
                raise UnavailableError(f"load {name!r}: the server is stopping")
            upload = None
            try:
                if files:
                    upload = _write_upload(name, files)
                    source = ModelSource(name, _model_file_in(upload, name), ModelConfig())
                else:
                    source = find(self.root, name)
                if config is not None:
                    try:
                        doc = json.loads(config)
                    except ValueError as e:
                        raise BadRequestError(f"load {name!r}: parameter 'config' is not JSON: {e}") from None
                    source = source._replace(config=config_from_json(doc, f"load {name!r}: parameter 'config'",
                                                                     name, source.path))
            except ModelError as e:
                if upload:
                    shutil.rmtree(upload, ignore_errors=True)
                if name not in self.models:
                    self._states[name] = ("UNAVAILABLE", f"failed to load: {e}")
                raise ModelLoadError(str(e)) from None
            except BaseException:
                if upload:
                    shutil.rmtree(upload, ignore_errors=True)
                raise
            old = self.models.get(name)
            if old is None:
                self._states[name] = ("LOADING", "")
            new = self._served(source)
            try:
                new.start()
                new.wait_ready()
            except BaseException as e:
                new.stop()
                if upload:
                    shutil.rmtree(upload, ignore_errors=True)
                if old is None:
                    self._states[name] = ("UNAVAILABLE", f"failed to load: {e}")
                log.warning("model %s failed to load: %s", name, e)
                raise ModelLoadError(f"failed to load {name!r}: {e}") from None
            self.models[name] = new
            self._states.pop(name, None)
            if old is not None:
                old.successor = new            # a request that found the old model queues on the new one
                old.stop()
            self._retire_upload(name)
            if upload:
                self._uploads[name] = upload
            log.info("model %s %s from %s", name, "reloaded" if old is not None else "loaded", source.path)

    def unload(self, name: str) -> None:
        """Stop serving ``name``: requests already queued are answered, later ones get NOT_FOUND."""
        self._explicit(f"unload {name!r}")
        self._unload(name)

    def _unload(self, name: str, reason: str = "unloaded") -> None:
        with self._control:
            if self._closed:
                raise UnavailableError(f"unload {name!r}: the server is stopping")
            m = self.models.pop(name, None)
            if m is None:
                if name in self._states or (self.root and name in names(self.root)):
                    return                     # not loaded: nothing to do (as Triton)
                raise ModelNotFoundError(f"unload: unknown model {name!r}; this server has {sorted(self.models)}")
            self._states[name] = ("UNAVAILABLE", reason)
            m.stop()
            self._retire_upload(name)
            log.info("model %s unloaded", name)

    # ------------------------------------------------------------------ model control "poll"
    def _poll(self) -> None:
        while not self._stop_polling.wait(self.poll_secs):
            try:
                self.poll_once()
            except UnavailableError:            # stopping
                return
            except Exception:  # noqa: BLE001 - the next scan tries again; the server keeps serving
                log.exception("model repository scan failed")

    def poll_once(self) -> dict[str, str]:
        """One scan of the repository directory: load the models that appeared, reload those whose model
        file or config changed, unload those that went; {name: what was done}. A model that fails to load
        is UNAVAILABLE with the reason in the index (a served one keeps serving) and is tried again when
        its files change."""
        found: dict[str, tuple[Any, Any]] = {}
        for name in names(self.root):
            try:
                src = find(self.root, name)
                found[name] = (src, _signature(self.root, src))
            except (ModelError, ModelNotFoundError) as e:
                found[name] = (e, ("error", str(e)))
        done: dict[str, str] = {}
        for name, (src, sig) in sorted(found.items()):
            if self._signatures.get(name) == sig:
                continue
            self._signatures[name] = sig
            served = name in self.models
            if isinstance(src, Exception):
                if not served:
                    self._states[name] = ("UNAVAILABLE", f"failed to load: {src}")
                log.warning("model %s: %s", name, src)
                done[name] = "failed"
                continue
            try:
                self._load(name)
                done[name] = "reloaded" if served else "loaded"
            except ModelLoadError:
                done[name] = "failed"
        for name in sorted(set(self.models) - set(found)):
            self._unload(name, "removed from the model repository")
            self._signatures.pop(name, None)
            done[name] = "unloaded"
        for name in set(self._signatures) - set(found) - set(self.models):     # failed, then removed
            self._signatures.pop(name)
            self._states.pop(name, None)
        return done

    def _retire_upload(self, name: str) -> None:
        d = self._uploads.pop(name, None)
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)


CONTROL_MODES = ("none", "explicit", "poll")


def _signature(root: str | None, s: ModelSource) -> tuple:
    """What a scan compares to see a model change: its file, version, and the model file's and its config
    file's modification times and sizes."""
    def stamp(path: str) -> tuple | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size
    d = os.path.join(root or "", s.name)
    return (s.path, s.version, stamp(s.path), stamp(os.path.join(d, "config.json")),
            stamp(os.path.join(d, "config.pbtxt")))


def _write_upload(name: str, files: dict[str, bytes]) -> str:
    """``files`` ({"file:<relative path>": bytes}) written under a new temporary directory."""
    d = tempfile.mkdtemp(prefix=f"shapeplan-model-{name}-")
    try:
        for key, data in files.items():
            rel = key[len("file:"):] if key.startswith("file:") else ""
            parts = rel.replace("\\", "/").split("/")
            if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise BadRequestError(f"load {name!r}: parameter {key!r}: expected 'file:<relative path>' "
                                      "inside the model's directory, e.g. 'file:1/model.onnx'")
            path = os.path.join(d, *parts)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return d


def _model_file_in(d: str, name: str) -> str:
    found = sorted(os.path.join(root, f) for root, _, fs in os.walk(d) for f in fs if f.endswith(MODEL_SUFFIXES))
    if len(found) != 1:
        shown = [os.path.relpath(f, d) for f in found]
        raise ModelError(f"load {name!r}: the uploaded files hold {len(found)} model files {shown}; "
                         "expected one .onnx or .pt2")
    return found[0]
