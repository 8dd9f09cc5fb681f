"""Triton's model configuration and layout, read as ours: ``config.pbtxt`` (``read_pbtxt``,
``config_from_pbtxt``), its JSON form in a load request (``config_from_json``) and the version directories
(``version_in``). The messages are the part of Triton's ``ModelConfig`` that ``proto`` declares."""
from __future__ import annotations

import logging
import os
import re
from typing import Any

from shapeplan.errors import ModelError
from shapeplan.serve.kserve.config import CONFIG_KEYS, MODEL_SUFFIXES, ModelConfig, model_file

log = logging.getLogger("shapeplan.serve")

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


def version_in(d: str, policy: Any, filename: str, where: str) -> tuple[str, str] | None:
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
        elif (f := model_file(sub)) is not None:
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
