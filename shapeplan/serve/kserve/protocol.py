"""KServe v2 tensors <-> numpy: JSON tensors and the binary-tensor extension (HTTP), typed contents and
raw contents (gRPC). Pure functions; every error is a ``BadRequestError`` naming the input, what was
expected and what came.

Binary layout (both transports): little-endian, row-major; a BYTES tensor is, per element, a 4-byte
little-endian length and then the bytes.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shapeplan.errors import ModelError
from shapeplan.serve.errors import BadRequestError
from shapeplan.serve.kserve import wire
from shapeplan.serve.kserve.shm import Placement, SharedMemoryRegions, placement

try:
    import ml_dtypes
    _BF16: Any = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency of shapeplan
    _BF16 = None

#: the protocol extensions this server implements (server metadata; Triton's names)
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "model_repository",
              "model_repository(unload_dependents)", "system_shared_memory", "classification"]

# protocol datatype -> (numpy dtype, shapeplan dtype name, gRPC InferTensorContents field or None)
DATATYPES: dict[str, tuple[Any, str, str | None]] = {
    "BOOL": (np.dtype(np.bool_), "bool", "bool_contents"),
    "UINT8": (np.dtype(np.uint8), "uint8", "uint_contents"),
    "UINT16": (np.dtype(np.uint16), "uint16", "uint_contents"),
    "UINT32": (np.dtype(np.uint32), "uint32", "uint_contents"),
    "UINT64": (np.dtype(np.uint64), "uint64", "uint64_contents"),
    "INT8": (np.dtype(np.int8), "int8", "int_contents"),
    "INT16": (np.dtype(np.int16), "int16", "int_contents"),
    "INT32": (np.dtype(np.int32), "int32", "int_contents"),
    "INT64": (np.dtype(np.int64), "int64", "int64_contents"),
    "FP16": (np.dtype(np.float16), "float16", None),        # raw / binary only (as in Triton)
    "FP32": (np.dtype(np.float32), "float32", "fp32_contents"),
    "FP64": (np.dtype(np.float64), "float64", "fp64_contents"),
    "BF16": (_BF16, "bfloat16", None),
    "BYTES": (np.dtype(object), "string", "bytes_contents"),
}
_BY_DTYPE_NAME = {name: dt for dt, (_, name, _) in DATATYPES.items()}


def datatype_of(dtype_name: str, what: str) -> str:
    """The protocol datatype of a shapeplan dtype (``what`` names the tensor in the error)."""
    dt = _BY_DTYPE_NAME.get(dtype_name)
    if dt is None:
        raise ModelError(f"{what} has dtype {dtype_name}, which the KServe v2 protocol cannot carry "
                         f"(it has {sorted(_BY_DTYPE_NAME)})")
    return dt


_BY_NUMPY = {npdt: dt for dt, (npdt, _, _) in DATATYPES.items() if npdt is not None and dt != "BYTES"}


def datatype_of_array(a: np.ndarray) -> str:
    dt = _BY_NUMPY.get(a.dtype)
    if dt is not None:
        return dt
    if a.dtype.kind in "OSU":
        return "BYTES"
    raise ModelError(f"an array of numpy dtype {a.dtype} has no KServe v2 datatype")


def _numpy_dtype(name: str, datatype: Any) -> Any:
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequestError(f"input {name!r}: unknown datatype {datatype!r}; the protocol's are "
                              f"{', '.join(DATATYPES)}")
    return DATATYPES[datatype][0]


#: the most elements (zero-length dimensions left out) and dimensions a request's array may have: every
#: array numpy can make of any datatype (its size in bytes an int64), and numpy 1's MAXDIMS
MAX_ELEMENTS, MAX_DIMS = (1 << 63) // 16, 32


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                        and d >= 0 for d in shape):
        raise BadRequestError(f"input {name!r}: shape must be a list of non-negative integers, got {shape!r}")
    if len(shape) > MAX_DIMS or math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise BadRequestError(f"input {name!r}: shape {list(shape)} is not an array shape (at most {MAX_DIMS} "
                              f"dimensions and 2**{MAX_ELEMENTS.bit_length() - 1} elements)")
    return tuple(shape)


# ----------------------------------------------------------------------------------- raw bytes
def array_from_bytes(name: str, datatype: Any, shape: Any, buf: bytes | memoryview) -> np.ndarray:
    npdt, shape = _numpy_dtype(name, datatype), _shape(name, shape)
    n = math.prod(shape)
    if datatype == "BYTES":
        items = _split_bytes(name, buf)
        if len(items) != n:
            raise BadRequestError(f"input {name!r}: BYTES{list(shape)} needs {n} elements, got {len(items)}")
        arr = np.empty(n, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    need = n * npdt.itemsize
    if len(buf) != need:
        raise BadRequestError(f"input {name!r}: {datatype}{list(shape)} needs {need} bytes, got {len(buf)}")
    return np.frombuffer(buf, dtype=npdt).reshape(shape)


def _split_bytes(name: str, buf: bytes | memoryview) -> list[bytes]:
    items, i, mv = [], 0, memoryview(buf)
    while i < len(mv):
        if i + 4 > len(mv):
            raise BadRequestError(f"input {name!r}: BYTES data ends inside an element's 4-byte length")
        (k,) = struct.unpack_from("<I", mv, i)
        if i + 4 + k > len(mv):
            raise BadRequestError(f"input {name!r}: a BYTES element of {k} bytes runs past the end of the data")
        items.append(bytes(mv[i + 4:i + 4 + k]))
        i += 4 + k
    return items


def array_to_bytes(a: np.ndarray) -> bytes:
    if a.dtype.kind in "OSU":
        out = bytearray()
        for x in a.ravel():
            b = x if isinstance(x, bytes) else str(x).encode()
            out += struct.pack("<I", len(b)) + b
        return bytes(out)
    return np.ascontiguousarray(a).tobytes()


# ----------------------------------------------------------------------------------- JSON data
def array_from_json(name: str, datatype: Any, shape: Any, data: Any) -> np.ndarray:
    npdt, shape = _numpy_dtype(name, datatype), _shape(name, shape)
    if not isinstance(data, list):
        raise BadRequestError(f"input {name!r}: 'data' must be a (nested or flat) list, got {type(data).__name__}")
    flat = _flatten(data)
    n = math.prod(shape)
    if len(flat) != n:
        raise BadRequestError(f"input {name!r}: {datatype}{list(shape)} needs {n} elements, got {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise BadRequestError(f"input {name!r}: BYTES data must be strings")
        arr = np.empty(n, dtype=object)
        arr[:] = [x.encode() for x in flat]
        return arr.reshape(shape)
    want = bool if datatype == "BOOL" else float if npdt.kind == "f" or datatype == "BF16" else int
    bad = next((x for x in flat if not _is(x, want)), _NONE)
    if bad is not _NONE:
        raise BadRequestError(f"input {name!r}: {datatype} data must be {want.__name__} values, got {bad!r}")
    try:
        if datatype == "BF16":
            return np.asarray(flat, dtype=np.float32).astype(npdt).reshape(shape)
        return np.asarray(flat, dtype=npdt).reshape(shape)
    except (OverflowError, ValueError, TypeError) as e:
        raise BadRequestError(f"input {name!r}: data does not fit {datatype}: {e}") from None


_NONE = object()


def _is(x: Any, want: type) -> bool:
    if want is bool:
        return isinstance(x, bool)
    if want is int:
        return isinstance(x, int) and not isinstance(x, bool)
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _flatten(data: list) -> list:
    if not any(isinstance(x, list) for x in data):
        return data
    out: list = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def array_to_json(a: np.ndarray) -> list:
    if a.dtype.kind in "OSU":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in a.ravel()]
    if _BF16 is not None and a.dtype == _BF16:
        a = a.astype(np.float32)
    return a.ravel().tolist()


# ----------------------------------------------------------------------------------- requests
@dataclass(slots=True)
class InferRequest:
    """A decoded request, whatever the transport: feeds in the order given, requested outputs (None:
    every output), which outputs the client wants as binary (HTTP)."""
    feeds: dict[str, np.ndarray]
    outputs: list[str] | None = None
    id: str = ""
    binary_outputs: set[str] = field(default_factory=set)
    binary_default: bool = False
    placements: dict[str, Placement] = field(default_factory=dict)    # outputs written to shared memory
    classes: dict[str, int] = field(default_factory=dict)             # outputs asked as their top k


def _dict(x: Any, what: str) -> dict:
    if x is None:
        return {}
    if not isinstance(x, dict):
        raise BadRequestError(f"{what} must be a JSON object, got {type(x).__name__}")
    return x


def _shm(what: str, p: Placement, shm: SharedMemoryRegions | None) -> SharedMemoryRegions:
    if shm is None:
        raise BadRequestError(f"{what}: this server takes no shared memory placements")
    shm.check(what, p)
    return shm


def decode_http(body: bytes, header_length: int | None, shm: SharedMemoryRegions | None = None) -> InferRequest:
    """An HTTP infer body: JSON, or (binary extension) ``header_length`` bytes of JSON then the inputs'
    binary data in input order; an input may instead name its place in a shared memory region of ``shm``."""
    head = body if header_length is None else body[:header_length]
    if header_length is not None and not 0 <= header_length <= len(body):
        raise BadRequestError(f"Inference-Header-Content-Length is {header_length} but the body has "
                              f"{len(body)} bytes")
    try:
        doc = json.loads(head)
    except (ValueError, RecursionError) as e:      # bad JSON or UTF-8, an integer of 4,300+ digits, deep nesting
        raise BadRequestError(f"the request body is not valid JSON: {e}") from None
    doc = _dict(doc, "the request")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequestError(f"the request's 'inputs' must be a non-empty list of tensors, got {inputs!r:.80}")
    tail = memoryview(body)[len(head):]
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for t in inputs:
        t = _dict(t, "each input")
        name = t.get("name")
        if not isinstance(name, str):
            raise BadRequestError(f"an input has no 'name' string: {json.dumps(t)[:120]}")
        if name in feeds:
            raise BadRequestError(f"input {name!r} is given twice")
        params = _dict(t.get("parameters"), f"input {name!r}: 'parameters'")
        size = params.get("binary_data_size")
        where = placement(f"input {name!r}", params)
        if where is not None:
            if size is not None or "data" in t:
                raise BadRequestError(f"input {name!r}: its data is in shared memory; it may not also have "
                                      "'data' or binary_data_size")
            feeds[name] = _shm(f"input {name!r}", where, shm).read(name, t.get("datatype"), t.get("shape"), where)
        elif size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(tail):
                raise BadRequestError(f"input {name!r}: binary_data_size {size!r} but only "
                                      f"{len(tail) - offset} bytes of binary data are left")
            feeds[name] = array_from_bytes(name, t.get("datatype"), t.get("shape"), tail[offset:offset + size])
            offset += size
        else:
            feeds[name] = array_from_json(name, t.get("datatype"), t.get("shape"), t.get("data"))
    if offset != len(tail):
        raise BadRequestError(f"the inputs' binary_data_size add up to {offset} bytes but {len(tail)} "
                              "bytes follow the JSON header")
    params = _dict(doc.get("parameters"), "the request's 'parameters'")
    req = InferRequest(feeds, id=str(doc.get("id", "")), binary_default=bool(params.get("binary_data_output")))
    outs = doc.get("outputs")
    if outs is not None:
        if not isinstance(outs, list):
            raise BadRequestError(f"the request's 'outputs' must be a list, got {type(outs).__name__}")
        req.outputs = []
        for o in outs:
            o = _dict(o, "each requested output")
            name = o.get("name")
            if not isinstance(name, str):
                raise BadRequestError(f"a requested output has no 'name' string: {json.dumps(o)[:120]}")
            req.outputs.append(name)
            oparams = _dict(o.get("parameters"), f"output {name!r}: 'parameters'")
            _classification(req, name, oparams)
            where = placement(f"output {name!r}", oparams)
            if where is not None:
                _shm(f"output {name!r}", where, shm)
                req.placements[name] = where
                continue
            binary = oparams.get("binary_data")
            if binary if binary is not None else req.binary_default:
                req.binary_outputs.add(name)
    return req


def _classification(req: InferRequest, name: str, params: dict[str, Any]) -> None:
    k = params.get("classification")
    if k is None:
        return
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise BadRequestError(f"output {name!r}: classification must be a positive integer (the top k), got {k!r}")
    req.classes[name] = k


def classify(req: InferRequest, outputs: dict[str, np.ndarray], batched: bool) -> dict[str, np.ndarray]:
    """Triton's classification extension: each output asked with ``classification: k`` becomes its k largest
    values (per batch row when the model batches), as BYTES "value:index", largest first."""
    if not req.classes:
        return outputs
    out = dict(outputs)
    for name, k in req.classes.items():
        a = outputs[name]
        if a.dtype.kind not in "biuf" and not (_BF16 is not None and a.dtype == _BF16):
            raise BadRequestError(f"output {name!r}: classification needs numbers, the output is "
                                  f"{datatype_of_array(a)}")
        rows = a.reshape(a.shape[0], -1) if batched and a.ndim else a.reshape(1, -1)
        rows = rows.astype(np.float64)
        k = min(k, rows.shape[1])
        top = np.argsort(-rows, axis=1, kind="stable")[:, :k]
        cells = np.empty(top.shape, dtype=object)
        for r in range(top.shape[0]):
            cells[r] = [f"{rows[r, i]:f}:{i}".encode() for i in top[r]]
        out[name] = cells if batched and a.ndim else cells.reshape(k)
    return out


def place_outputs(req: InferRequest, outputs: dict[str, np.ndarray], shm: SharedMemoryRegions | None
                  ) -> dict[str, int]:
    """The outputs ``req`` places in shared memory, written there: {name: bytes written}."""
    if not req.placements:
        return {}
    assert shm is not None          # decode checked the placements against it
    return {name: shm.write(name, _raw(outputs[name]), p) for name, p in req.placements.items()}


def encode_http(model: str, version: str, req: InferRequest, outputs: dict[str, np.ndarray],
                placed: dict[str, int] | None = None) -> tuple[bytes, int | None]:
    """(body, JSON header length or None when nothing is binary). ``placed``: the outputs written to shared
    memory ({name: bytes}; the response gives their region and size, not their data)."""
    tensors, blobs = [], []
    for name, a in outputs.items():
        t: dict[str, Any] = {"name": name, "datatype": datatype_of_array(a), "shape": list(a.shape)}
        if placed and name in placed:
            t["parameters"] = {"shared_memory_region": req.placements[name].region,
                               "shared_memory_byte_size": placed[name]}
        elif name in req.binary_outputs or (req.outputs is None and req.binary_default):
            b = array_to_bytes(a)
            t["parameters"] = {"binary_data_size": len(b)}
            blobs.append(b)
        else:
            t["data"] = array_to_json(a)
        tensors.append(t)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": tensors}
    if req.id:
        doc["id"] = req.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


def grpc_parameters(params: Any) -> dict[str, Any]:
    """A protobuf ``map<string, InferParameter>`` (or ``ModelRepositoryParameter``; absent on a ``wire``
    view) as {key: value}."""
    if not params:
        return {}
    return {k: getattr(v, v.WhichOneof("parameter_choice")) if v.WhichOneof("parameter_choice") else None
            for k, v in params.items()}


def decode_grpc(msg: Any, shm: SharedMemoryRegions | None = None) -> InferRequest:
    """A ``ModelInferRequest`` (upb's message or ``wire.InferRequestView``): typed ``contents`` per input, or
    ``raw_input_contents`` for all of them (arrays over the message's memory: nothing is copied); an input
    may instead name its place in a shared memory region of ``shm`` (then it has no raw entry)."""
    if not msg.inputs:
        raise BadRequestError("the request has no inputs")
    places = [placement(f"input {t.name!r}", grpc_parameters(getattr(t, "parameters", None))) for t in msg.inputs]
    raw = msg.raw_input_contents
    inline = sum(p is None for p in places)
    if raw and len(raw) != inline:
        raise BadRequestError(f"raw_input_contents has {len(raw)} entries for {inline} inputs not in shared "
                              "memory (one per such input, in order)")
    feeds: dict[str, np.ndarray] = {}
    k = 0
    for t, where in zip(msg.inputs, places):
        if t.name in feeds:
            raise BadRequestError(f"input {t.name!r} is given twice")
        if where is not None:
            feeds[t.name] = _shm(f"input {t.name!r}", where, shm).read(t.name, t.datatype, list(t.shape), where)
            continue
        if raw:
            feeds[t.name] = array_from_bytes(t.name, t.datatype, list(t.shape), raw[k])
            k += 1
            continue
        npdt = _numpy_dtype(t.name, t.datatype)
        fname = DATATYPES[t.datatype][2]
        if fname is None:
            raise BadRequestError(f"input {t.name!r}: {t.datatype} must come in raw_input_contents")
        values = getattr(t.contents, fname)
        shape = _shape(t.name, list(t.shape))
        if len(values) != math.prod(shape):
            raise BadRequestError(f"input {t.name!r}: {t.datatype}{list(shape)} needs {math.prod(shape)} "
                                  f"elements, got {len(values)} in contents.{fname}")
        if t.datatype == "BYTES":
            arr = np.empty(len(values), dtype=object)
            arr[:] = list(values)
            feeds[t.name] = arr.reshape(shape)
        else:
            try:
                feeds[t.name] = np.asarray(values, dtype=npdt).reshape(shape)
            except OverflowError as e:
                raise BadRequestError(f"input {t.name!r}: contents do not fit {t.datatype}: {e}") from None
    req = InferRequest(feeds, outputs=[o.name for o in msg.outputs] or None, id=msg.id)
    for o in msg.outputs:
        oparams = grpc_parameters(getattr(o, "parameters", None))
        _classification(req, o.name, oparams)
        where = placement(f"output {o.name!r}", oparams)
        if where is not None:
            _shm(f"output {o.name!r}", where, shm)
            req.placements[o.name] = where
    return req


def encode_grpc(model: str, version: str, req: InferRequest, outputs: dict[str, np.ndarray], *,
                stream: bool = False, placed: dict[str, int] | None = None) -> bytes:
    """A serialized ``ModelInferResponse`` (``stream``: a ``ModelStreamInferResponse`` holding it): raw
    contents, one per output, as Triton sends them (the arrays are written in place, not copied first).
    ``placed``: outputs written to shared memory; they carry their region and byte size as parameters and
    no contents (an empty ``raw_output_contents`` entry keeps the others' positions)."""
    if placed:
        return _encode_grpc_placed(model, version, req, outputs, stream, placed)
    return wire.infer_response(model, version, req.id, [(name, datatype_of_array(a), a.shape, _raw(a))
                                                        for name, a in outputs.items()], stream=stream)


def _encode_grpc_placed(model: str, version: str, req: InferRequest, outputs: dict[str, np.ndarray],
                        stream: bool, placed: dict[str, int]) -> bytes:
    from shapeplan.serve.kserve import proto as pb
    msg = pb.ModelInferResponse(model_name=model, model_version=version, id=req.id)
    inline = len(placed) < len(outputs)
    for name, a in outputs.items():
        t = msg.outputs.add(name=name, datatype=datatype_of_array(a), shape=list(a.shape))
        if name in placed:
            t.parameters["shared_memory_region"].string_param = req.placements[name].region
            t.parameters["shared_memory_byte_size"].int64_param = placed[name]
            if inline:
                msg.raw_output_contents.append(b"")
        else:
            msg.raw_output_contents.append(array_to_bytes(a))
    if stream:
        return pb.ModelStreamInferResponse(infer_response=msg).SerializeToString()
    return msg.SerializeToString()


def _raw(a: np.ndarray) -> Any:
    return array_to_bytes(a) if a.dtype.kind in "OSU" else np.ascontiguousarray(a)


# ----------------------------------------------------------------------------------- model repository
def load_parameters(name: str, params: dict[str, Any]) -> tuple[str | None, dict[str, bytes]]:
    """A load request's parameters: ``config`` (a JSON string) and ``file:<path>`` entries (bytes; over
    HTTP base64 text), as (config, {key: bytes})."""
    config, files = None, {}
    for key, value in params.items():
        if key == "config":
            if not isinstance(value, str):
                raise BadRequestError(f"load {name!r}: parameter 'config' must be a JSON string, got "
                                      f"{type(value).__name__}")
            config = value
        elif key.startswith("file:"):
            if isinstance(value, str):
                try:
                    value = base64.b64decode(value, validate=True)
                except (ValueError, binascii.Error) as e:
                    raise BadRequestError(f"load {name!r}: parameter {key!r} is not base64: {e}") from None
            if not isinstance(value, bytes):
                raise BadRequestError(f"load {name!r}: parameter {key!r} must be the file's bytes (base64 over "
                                      f"HTTP), got {type(value).__name__}")
            files[key] = value
        else:
            raise BadRequestError(f"load {name!r}: unknown parameter {key!r}; expected 'config' or "
                                  "'file:<path>'")
    return config, files
