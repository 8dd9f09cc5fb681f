"""The checked-in descriptor set is protoc's output for the checked-in .proto, and its messages are the
ones the official client (tritonclient.grpc) puts on the wire: same names, field numbers and types."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("google.protobuf")
from google.protobuf import descriptor_pb2  # noqa: E402

from shapeplan.serve.kserve import proto as pb  # noqa: E402

PROTO_DIR = os.path.dirname(pb.DESCRIPTOR_SET)


def _files(path: str) -> list:
    with open(path, "rb") as f:
        return list(descriptor_pb2.FileDescriptorSet.FromString(f.read()).file)


def test_descriptor_set_matches_the_proto(tmp_path) -> None:
    pytest.importorskip("grpc_tools")
    out = tmp_path / "set.binpb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}",
                    os.path.join(PROTO_DIR, "grpc_predict_v2.proto")], check=True)
    assert _files(str(out)) == _files(pb.DESCRIPTOR_SET), \
        "the .proto changed: regenerate grpc_predict_v2.binpb with the command in its header"


def _repeated(f) -> bool:
    return f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED


def _fields(desc) -> dict:
    return {f.name: (f.number, f.type, _repeated(f), f.message_type.full_name if f.message_type else None)
            for f in desc.fields}


def _walk(desc, out: dict) -> dict:
    out[desc.full_name] = desc
    for n in desc.nested_types:
        _walk(n, out)
    return out


def test_wire_compatible_with_tritonclient() -> None:
    triton = pytest.importorskip("tritonclient.grpc.service_pb2")
    ours: dict = {}
    for name in pb._CLASSES:
        _walk(getattr(pb, name).DESCRIPTOR, ours)
    config = pytest.importorskip("tritonclient.grpc.model_config_pb2")       # config.pbtxt's messages
    theirs: dict = {}
    for module in (triton, config):
        for m in module.DESCRIPTOR.message_types_by_name.values():
            _walk(m, theirs)
    shared = sorted(set(ours) & set(theirs))
    assert "inference.ModelInferRequest.InferInputTensor" in shared and "inference.ModelStatistics" in shared
    assert "inference.ModelConfig" in shared and "inference.ModelVersionPolicy.Specific" in shared
    assert set(ours) - set(theirs) == {"inference.PlanStatistics"}          # ours only
    for enum in ("DataType",):
        mine_e = {v.name: v.number for v in pb.ModelInput.DESCRIPTOR.fields_by_name["data_type"].enum_type.values}
        assert mine_e == {v.name: v.number for v in config.DESCRIPTOR.enum_types_by_name[enum].values}
    kinds = pb.ModelInstanceGroup.DESCRIPTOR.enum_types_by_name["Kind"].values
    assert {v.name: v.number for v in kinds} == \
        {v.name: v.number for v in config.ModelInstanceGroup.DESCRIPTOR.enum_types_by_name["Kind"].values}
    for name in shared:
        mine, other = _fields(ours[name]), _fields(theirs[name])
        for field, spec in mine.items():
            if field in other:
                assert spec == other[field], (name, field)
            else:       # ours only: a number clients do not use
                assert name == "inference.ModelStatistics" and field == "plan_stats", (name, field)
    service = triton.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for rpc, (req, res) in pb.METHODS.items():
        m = service.methods_by_name[rpc]
        assert (m.input_type.full_name, m.output_type.full_name) == (req.DESCRIPTOR.full_name, res.DESCRIPTOR.full_name)


def test_messages_do_not_clash_with_tritonclient_in_one_process() -> None:
    pytest.importorskip("tritonclient.grpc.service_pb2")
    req = pb.ModelInferRequest(model_name="m")
    req.raw_input_contents.append(b"\x00" * 4)
    assert pb.ModelInferRequest.FromString(req.SerializeToString()).model_name == "m"
    with pytest.raises(AttributeError, match="no message 'Nope'"):
        pb.Nope  # noqa: B018
