"""The KServe v2 gRPC messages, built at import from the checked-in descriptor set.

``grpc_predict_v2.binpb`` is protoc's ``--descriptor_set_out`` of ``grpc_predict_v2.proto`` (the
command is in the .proto's header; tests/serve/test_kserve_proto.py regenerates it and compares).
The message classes are made here, through protobuf's public runtime API, in a descriptor pool of
our own rather than from a generated ``_pb2.py``:

* a generated module registers its names in protobuf's default pool, where tritonclient's
  ``service_pb2`` (same package ``inference``, same message names, more of them) already lives:
  importing both in one process fails with "duplicate symbol 'inference.ServerLiveRequest'";
* a generated module pins the protobuf runtime to at least the generator's version (7.35 for
  grpcio-tools 1.85), while this loader needs only ``message_factory.GetMessageClass`` (4.22+).

Usage: ``from shapeplan.serve.kserve import proto as pb; pb.ModelInferRequest(model_name="m")``.
"""
from __future__ import annotations

import os
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = "inference.GRPCInferenceService"
DESCRIPTOR_SET = os.path.join(os.path.dirname(__file__), "grpc_predict_v2.binpb")


def _load() -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    with open(DESCRIPTOR_SET, "rb") as f:
        files = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
    pool = descriptor_pool.DescriptorPool()
    for fd in files:
        pool.AddSerializedFile(fd.SerializeToString())
    classes = {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{fd.package}.{m.name}"))
               for fd in files for m in fd.message_type}
    methods = {m.name: (classes[m.input_type.rsplit(".", 1)[1]], classes[m.output_type.rsplit(".", 1)[1]])
               for fd in files for svc in fd.service for m in svc.method}
    return classes, methods


_CLASSES, METHODS = _load()     # METHODS: rpc name -> (request class, response class)
globals().update(_CLASSES)


def __getattr__(name: str) -> Any:
    raise AttributeError(f"no message {name!r} in {os.path.basename(DESCRIPTOR_SET)}; "
                         f"it has {sorted(_CLASSES)}")
