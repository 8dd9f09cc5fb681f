"""Triton's system shared memory extension: tensors that travel through POSIX shared memory, not the socket.

A client on the same machine creates a shared memory object (``shm_open``; in Python
``multiprocessing.shared_memory`` or ``tritonclient.utils.shared_memory``), registers a region of it
under a name (``register``: key, offset, byte size), and then names the region in an infer request:
an input's ``parameters`` ``shared_memory_region`` / ``shared_memory_byte_size`` /
``shared_memory_offset`` say where its bytes are (the request carries no data for it); a requested
output's say where to write the result (the response carries its shape and byte size, no data).

The server maps each registered object once. An input is read in place (``np.frombuffer`` over the
mapping; the client must not change it until the response comes, as with Triton). An output is
copied into the region after the run. Bytes are laid out as on the wire (``protocol``'s raw layout).
Linux only: an object named ``key`` lives at ``/dev/shm/<key>``.
"""
from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapeplan.serve.errors import BadRequestError, ModelNotFoundError

SHM_DIR = "/dev/shm"
#: the tensor parameters that place a tensor in a region
REGION, BYTE_SIZE, OFFSET = "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"


@dataclass(slots=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    map: mmap.mmap

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


@dataclass(slots=True)
class Placement:
    """Where a tensor of a request lives: ``byte_size`` bytes at ``offset`` in region ``region``."""
    region: str
    byte_size: int
    offset: int = 0


def placement(what: str, params: dict[str, Any]) -> Placement | None:
    """The shared-memory placement a tensor's parameters give, None when they give none."""
    region = params.get(REGION)
    if region is None:
        if BYTE_SIZE in params or OFFSET in params:
            raise BadRequestError(f"{what}: {BYTE_SIZE} / {OFFSET} given without {REGION}")
        return None
    size, offset = params.get(BYTE_SIZE), params.get(OFFSET, 0)
    if not isinstance(region, str) or not region:
        raise BadRequestError(f"{what}: {REGION} must be a region's name, got {region!r}")
    for key, v in ((BYTE_SIZE, size), (OFFSET, offset)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise BadRequestError(f"{what}: {key} must be a non-negative integer, got {v!r}")
    return Placement(region, size, offset)


class SharedMemoryRegions:
    """The registered regions by name (one table per server, shared by HTTP and gRPC)."""

    def __init__(self) -> None:
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise BadRequestError("register: a region needs a name")
        bare = key[1:] if key.startswith("/") else key
        if not bare or "/" in bare or bare in (".", ".."):
            raise BadRequestError(f"register {name!r}: key {key!r} is not a shared memory object's name "
                                  "(as given to shm_open: '/name')")
        for what, v in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise BadRequestError(f"register {name!r}: {what} must be a non-negative integer, got {v!r}")
        with self._lock:
            if name in self._regions:
                r = self._regions[name]
                raise BadRequestError(f"register {name!r}: a region of that name is registered already "
                                      f"(key {r.key!r}); unregister it first")
            path = os.path.join(SHM_DIR, bare)
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as e:
                raise BadRequestError(f"register {name!r}: cannot open shared memory object {key!r} "
                                      f"({path}): {e.strerror}") from None
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size or byte_size == 0:
                    raise BadRequestError(f"register {name!r}: bytes [{offset}, {offset + byte_size}) do not "
                                          f"lie inside shared memory object {key!r} of {size} bytes")
                m = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._regions[name] = Region(name, key, offset, byte_size, m)

    def unregister(self, name: str = "") -> None:
        """Forget region ``name`` (every region when empty); an unknown name is not an error (as Triton).
        Arrays of requests still running keep their mapping alive until they go."""
        with self._lock:
            gone = list(self._regions.values()) if not name else \
                [self._regions[name]] if name in self._regions else []
            for r in gone:
                del self._regions[r.name]
                try:
                    r.map.close()
                except BufferError:             # a request's array still views it: the GC unmaps it
                    pass

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if name and name not in self._regions:
                raise ModelNotFoundError(f"no shared memory region {name!r} is registered; there are "
                                         f"{sorted(self._regions)}")
            return [r.status() for r in self._regions.values() if not name or r.name == name]

    def close(self) -> None:
        self.unregister()

    def _bytes(self, what: str, p: Placement) -> memoryview:
        r = self._regions.get(p.region)
        if r is None:
            raise BadRequestError(f"{what}: shared memory region {p.region!r} is not registered (registered: "
                                  f"{sorted(self._regions)})")
        if p.offset + p.byte_size > r.byte_size:
            raise BadRequestError(f"{what}: bytes [{p.offset}, {p.offset + p.byte_size}) of shared memory "
                                  f"region {p.region!r} run past its {r.byte_size} bytes")
        start = r.offset + p.offset
        try:
            return memoryview(r.map)[start:start + p.byte_size]
        except ValueError:                      # unregistered (and unmapped) since the lookup
            raise BadRequestError(f"{what}: shared memory region {p.region!r} was unregistered") from None

    def check(self, what: str, p: Placement) -> None:
        """BadRequestError unless ``p`` lies inside a registered region."""
        self._bytes(what, p)

    def read(self, name: str, datatype: Any, shape: Any, p: Placement) -> np.ndarray:
        """Input ``name``'s array, read in place from its region."""
        from shapeplan.serve.kserve.protocol import array_from_bytes
        return array_from_bytes(name, datatype, shape, self._bytes(f"input {name!r}", p))

    def write(self, name: str, data: Any, p: Placement) -> int:
        """Output ``name``'s raw bytes (any buffer) copied into its region; their length."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            src = memoryview(data).cast("B")
        else:                                   # an array (bfloat16 has no buffer format: viewed as bytes)
            src = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        if src.nbytes > p.byte_size:
            raise BadRequestError(f"output {name!r}: the result has {src.nbytes} bytes but its shared memory "
                                  f"placement in region {p.region!r} holds {p.byte_size} "
                                  f"({BYTE_SIZE})")
        self._bytes(f"output {name!r}", p)[:src.nbytes] = src
        return src.nbytes
