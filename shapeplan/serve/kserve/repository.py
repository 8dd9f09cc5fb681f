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
import shutil
import tempfile
import threading
from typing import Any, Iterator, NamedTuple

from shapeplan.errors import ModelError
from shapeplan.serve.errors import BadRequestError, ModelLoadError, ModelNotFoundError, UnavailableError
from shapeplan.serve.kserve.config import CONFIG_KEYS, MODEL_SUFFIXES, ConfigKey, ModelConfig, load_config, model_file
from shapeplan.serve.kserve.shm import SharedMemoryRegions
from shapeplan.serve.kserve.triton_config import config_from_json, config_from_pbtxt, read_pbtxt, version_in

__all__ = ["CONFIG_KEYS", "MODEL_SUFFIXES", "ConfigKey", "ModelConfig", "ModelRepository", "ModelSource", "discover",
           "find", "load_config", "names", "single"]

log = logging.getLogger("shapeplan.serve")


class ModelSource(NamedTuple):
    name: str
    path: str
    config: ModelConfig
    version: str = "1"


def _is_llm_dir(path: str) -> bool:
    cfg = os.path.join(path, "config.json")
    try:
        with open(cfg, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and ("architectures" in doc or "model_type" in doc)


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
        model, version = model_file(path), "1"
        if model is None:                       # Triton's layout: version directories
            got = version_in(path, triton.version_policy if triton is not None and triton.HasField("version_policy")
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
