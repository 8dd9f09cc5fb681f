"""``ModelInferRequest`` / ``ModelInferResponse`` (also wrapped as a ``ModelStreamInferResponse``) in the
protobuf wire format, by hand, for the infer rpcs.

Why not upb: parsing a request copies each ``raw_input_contents`` entry into upb's arena and again into a
Python ``bytes`` when it is read (two copies of 602 KB for one ResNet-50 input), and building a response
copies each output twice more, all on the thread that holds the GIL. Here the inputs stay zero-copy
``memoryview`` slices of the received message (``np.frombuffer`` reads them in place) and a response is
one ``bytes.join``.

``read_infer_request`` reads only what an infer request usually carries: ``model_name``,
``model_version``, ``id``, the inputs' ``name`` / ``datatype`` / ``shape``, the requested outputs'
``name`` and ``raw_input_contents``. For anything else (``parameters``, typed ``contents``, a field this
reader does not know, a malformed message) it returns None and the caller parses with upb, so protobuf's
semantics and error messages are kept. The view has the attribute names of upb's message, so
``protocol.decode_grpc`` takes either.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

_VARINT, _LEN = 0, 2            # wire types this reader accepts (fixed32/64 and groups: upb's job)
_INT64 = 1 << 63


class _Unsupported(Exception):
    """Not in the subset read here: the caller parses the message with upb."""


@dataclass(slots=True)
class InputView:
    name: str = ""
    datatype: str = ""
    shape: list[int] = field(default_factory=list)


@dataclass(slots=True)
class OutputView:
    name: str = ""


@dataclass(slots=True)
class InferRequestView:
    """A ``ModelInferRequest`` as far as ``protocol.decode_grpc`` reads it; ``raw_input_contents`` are
    views of the received message."""
    model_name: str = ""
    model_version: str = ""
    id: str = ""
    inputs: list[InputView] = field(default_factory=list)
    outputs: list[OutputView] = field(default_factory=list)
    raw_input_contents: list[memoryview] = field(default_factory=list)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    x = b[i]
    if x < 0x80:
        return x, i + 1
    x &= 0x7F
    shift = 7
    while True:
        i += 1
        c = b[i]                                   # IndexError past the end: malformed
        x |= (c & 0x7F) << shift
        if c < 0x80:
            if x >> 64:
                raise _Unsupported
            return x, i + 1
        shift += 7
        if shift > 63:
            raise _Unsupported


def _fields(b: bytes, i: int, end: int) -> Any:
    """(field number, wire type, value or (start, stop) of a length-delimited value) over b[i:end]."""
    while i < end:
        tag, i = _varint(b, i)
        num, wt = tag >> 3, tag & 7
        if wt == _LEN:
            n, i = _varint(b, i)
            if i + n > end:
                raise _Unsupported
            yield num, wt, (i, i + n)
            i += n
        elif wt == _VARINT:
            v, i = _varint(b, i)
            yield num, wt, v
        else:
            raise _Unsupported
    if i != end:
        raise _Unsupported


def _str(b: bytes, span: tuple[int, int]) -> str:
    return str(b[span[0]:span[1]], "utf-8")       # proto3 strings are UTF-8 (upb rejects the rest); b: any buffer


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= _INT64 else v


def _input(b: bytes, i: int, end: int) -> InputView:
    t = InputView()
    for num, wt, v in _fields(b, i, end):
        if num == 1 and wt == _LEN:
            t.name = _str(b, v)
        elif num == 2 and wt == _LEN:
            t.datatype = _str(b, v)
        elif num == 3 and wt == _LEN:              # packed (what every encoder writes)
            j, stop = v
            while j < stop:
                d, j = _varint(b, j)
                t.shape.append(_int64(d))
            if j != stop:
                raise _Unsupported
        elif num == 3 and wt == _VARINT:           # unpacked: legal too
            t.shape.append(_int64(v))
        else:
            raise _Unsupported                      # parameters, typed contents, unknown fields
    return t


def read_infer_request(buf: bytes) -> InferRequestView | None:
    """The request in ``buf``, or None when it holds more than this reader reads (or is malformed)."""
    try:
        return _read(buf)
    except (_Unsupported, IndexError, UnicodeDecodeError):
        return None


def _read(b: bytes) -> InferRequestView:
    r = InferRequestView()
    mv = memoryview(b)
    for num, wt, v in _fields(b, 0, len(b)):
        if wt != _LEN:
            raise _Unsupported
        if num == 7:
            r.raw_input_contents.append(mv[v[0]:v[1]])
        elif num == 5:
            r.inputs.append(_input(b, *v))
        elif num == 6:
            o = OutputView()
            for onum, owt, ov in _fields(b, *v):
                if onum != 1 or owt != _LEN:
                    raise _Unsupported
                o.name = _str(b, ov)
            r.outputs.append(o)
        elif num == 1:
            r.model_name = _str(b, v)
        elif num == 2:
            r.model_version = _str(b, v)
        elif num == 3:
            r.id = _str(b, v)
        else:
            raise _Unsupported                      # parameters (4), unknown fields
    if r.inputs and not r.raw_input_contents:
        raise _Unsupported                          # typed contents: upb reads them
    return r


# ----------------------------------------------------------------------------------- writing
def _put_varint(out: bytearray, x: int) -> None:
    while x > 0x7F:
        out.append((x & 0x7F) | 0x80)
        x >>= 7
    out.append(x)


def _put_str(out: bytearray, num: int, s: str) -> None:
    if s:                                           # proto3: a default value is not written
        data = s.encode("utf-8")
        out.append(num << 3 | _LEN)
        _put_varint(out, len(data))
        out += data


def infer_response(model_name: str, model_version: str, id: str,
                   outputs: Sequence[tuple[str, str, Sequence[int], Any]], *, stream: bool = False) -> bytes:
    """A ``ModelInferResponse``: ``outputs`` are (name, datatype, shape, raw contents as any buffer), each
    output's contents in ``raw_output_contents`` in the same order (as Triton sends them). With ``stream``
    it is wrapped as a ``ModelStreamInferResponse``'s ``infer_response`` (in the same join, no second
    copy). The bytes are the ones upb writes for the same message."""
    head = bytearray()
    _put_str(head, 1, model_name)
    _put_str(head, 2, model_version)
    _put_str(head, 3, id)
    for name, datatype, shape, _ in outputs:
        t = bytearray()
        _put_str(t, 1, name)
        _put_str(t, 2, datatype)
        if len(shape):
            dims = bytearray()
            for d in shape:
                _put_varint(dims, int(d) + (1 << 64) if d < 0 else int(d))
            t.append(3 << 3 | _LEN)
            _put_varint(t, len(dims))
            t += dims
        head.append(5 << 3 | _LEN)
        _put_varint(head, len(t))
        head += t
    parts: list[Any] = [head]
    for *_, data in outputs:
        n = memoryview(data).nbytes
        tag = bytearray([6 << 3 | _LEN])
        _put_varint(tag, n)
        parts += [tag, data] if n else [tag]
    if stream:
        envelope = bytearray([2 << 3 | _LEN])
        _put_varint(envelope, sum(memoryview(p).nbytes for p in parts))
        parts.insert(0, envelope)
    return b"".join(parts)

