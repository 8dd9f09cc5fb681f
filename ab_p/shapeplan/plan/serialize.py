"""Plan files: a documented binary format (no pickle).

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic  b"SHPPLAN\\0"
    8       4     u32 format version (FORMAT_VERSION)
    12      32    sha256 of every byte from offset 44 to the end (content hash)
    44      8     u64 header length H
    52      H     header: UTF-8 JSON (see below)
    52+H    ...   payload: the graph as an ONNX ModelProto (protobuf bytes)

Header JSON: ``{"fingerprint": {...}, "requested": [...]|null, "variables": [names], "reg_names": [...],
"inputs": [[name, reg]], "constants": [reg], "variable_regs": [[name, reg]], "captures": [[name, reg]],
"outputs": [[name, reg]], "slots": [[node_index, [ins], [outs], [release]]], "const_slots": [...],
"shape_stable": [...], "segments": [Segment.to_json()], "meta": {...}}``.

Loading checks magic (foreign file), version, length and hash (truncated or tampered) before parsing
anything, and raises ``CacheError``; the payload is parsed only as ONNX protobuf, never executed.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from shapeplan.errors import CacheError
from shapeplan.ir.graph import Graph, ValueKind

MAGIC = b"SHPPLAN\0"
FORMAT_VERSION = 1
_FIXED = 8 + 4 + 32 + 8


def graph_to_bytes(graph: Graph) -> bytes:
    from shapeplan.ir.onnx_io import to_model_proto
    return to_model_proto(graph).SerializeToString(deterministic=True)


def graph_from_bytes(data: bytes, variables: list[str]) -> Graph:
    import onnx

    from shapeplan.ir import onnx_io
    proto = onnx.load_model_from_string(data)
    try:       # skip ONNX shape inference: the exported value_info already carries the types
        opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in proto.opset_import}
        opsets.setdefault("", 21)
        opsets.setdefault("shapeplan", 1)
        g = onnx_io._import_graph(proto.graph, opsets, None, None, {})
        g.metadata = {p.key: p.value for p in proto.metadata_props}
    except Exception:  # noqa: BLE001 - fall back to the public importer
        g = onnx_io.from_model_proto(proto)
    for name in variables:
        g.values[name].kind = ValueKind.VARIABLE
    return g


def pack(header: dict[str, Any], payload: bytes) -> bytes:
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = struct.pack("<Q", len(h)) + h + payload
    return MAGIC + struct.pack("<I", FORMAT_VERSION) + hashlib.sha256(body).digest() + body


def unpack(data: bytes, what: str = "plan file") -> tuple[dict[str, Any], bytes]:
    if len(data) < _FIXED:
        raise CacheError(f"{what}: truncated ({len(data)} bytes, a header needs {_FIXED})")
    if data[:8] != MAGIC:
        raise CacheError(f"{what}: not a shapeplan plan file (magic {data[:8]!r}, expected {MAGIC!r})")
    (version,) = struct.unpack_from("<I", data, 8)
    if version != FORMAT_VERSION:
        raise CacheError(f"{what}: format version {version}, this build reads version {FORMAT_VERSION}")
    digest, body = data[12:44], data[44:]
    if hashlib.sha256(body).digest() != digest:
        raise CacheError(f"{what}: content hash mismatch (truncated or tampered)")
    (hlen,) = struct.unpack_from("<Q", body, 0)
    if 8 + hlen > len(body):
        raise CacheError(f"{what}: header length {hlen} runs past the end of the file")
    try:
        header = json.loads(body[8:8 + hlen].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CacheError(f"{what}: header is not valid JSON: {e}") from e
    return header, body[8 + hlen:]


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_header(plan: Any) -> dict[str, Any]:
    node_index = {id(n): i for i, n in enumerate(plan.graph.nodes)}
    return {"requested": list(plan.requested) if plan.requested is not None else None,
            "variables": [v.name for v in plan.graph.variables], "reg_names": plan.reg_names,
            "inputs": plan.inputs, "constants": [r for r, _ in plan.constants],
            "variable_regs": plan.variables, "captures": plan.captures, "outputs": plan.outputs,
            "slots": [[node_index[id(s.node)], list(s.ins), list(s.outs), list(s.release)] for s in plan.slots],
            "const_slots": sorted(plan.const_slots), "shape_stable": sorted(plan.shape_stable),
            "segments": [s.to_json() for s in plan.segments], "pinned": sorted(plan.pinned)}


def serialize_plan(plan: Any, fingerprint: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> bytes:
    header = plan_header(plan)
    header["fingerprint"] = fingerprint or {}
    header["meta"] = meta or {}
    return pack(header, graph_to_bytes(plan.graph))


def deserialize_plan(data: bytes, what: str = "plan file") -> Any:
    """bytes -> Plan, rebinding kernels from the op table; the wiring is restored, not recomputed."""
    header, payload = unpack(data, what)
    try:
        graph = graph_from_bytes(payload, header.get("variables", []))
        return plan_from_header(graph, header)
    except CacheError:
        raise
    except Exception as e:  # noqa: BLE001 - anything wrong inside a hash-valid file is still a cache error
        raise CacheError(f"{what}: cannot rebuild the plan: {type(e).__name__}: {e}") from e


def plan_from_header(graph: Graph, header: dict[str, Any]) -> Any:
    from shapeplan.ops.registry import bind_kernel, lookup
    from shapeplan.plan.compiler import Plan, Slot
    from shapeplan.plan.segments import Segment
    names = header["reg_names"]
    values = graph.values
    constants = [(r, values[names[r]].data) for r in header["constants"]]
    slots = []
    for i, (ni, ins, outs, rel) in enumerate(header["slots"]):
        node = graph.nodes[ni]
        opset = graph.opset(node.domain)
        opdef = lookup(node.op_type, node.domain, opset)
        slots.append(Slot(i, node, opdef, bind_kernel(opdef, node, opset), tuple(ins), tuple(outs), tuple(rel)))
    segs = [Segment(s["index"], range(s["first_slot"], s["end_slot"]), s["capturable"], s["reason"],
                    tuple(s["live_in"]), tuple(s["live_out"]), tuple(s["slots"])) for s in header["segments"]]
    req = header["requested"]
    return Plan(graph, len(names), names, [tuple(x) for x in header["inputs"]], constants,
                [tuple(x) for x in header["variable_regs"]], [tuple(x) for x in header["captures"]],
                [tuple(x) for x in header["outputs"]], slots, frozenset(header["pinned"]),
                frozenset(header["const_slots"]), frozenset(header["shape_stable"]), segs,
                None if req is None else tuple(req))
