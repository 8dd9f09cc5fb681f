"""A gRPC front-end process for ``shapeplan serve --grpc-procs N``: it takes the KServe gRPC
connections off the model process.

Why. A 602 KB ResNet-50 request costs grpcio ~0.6 ms of CPU to receive (HTTP/2 frames, its copies,
its asyncio machinery), much of it under the model process's one GIL, beside that process's event
loop and model workers (docs/serve.md, "Performance"). With N front ends the kernel spreads the
clients' connections over N processes listening on one port (``SO_REUSEPORT``); each receives its
requests, writes each request's bytes into a shared-memory arena of its own and sends the model
process a 32-byte descriptor over a Unix socket. The model process reads the request in place (the
inputs stay views of the arena until the batch is staged), runs it exactly as it runs a request of
its own gRPC server and sends back the response bytes, or a gRPC status code and message, which the
front end returns to its client. Every check, error, statistic and batch is the model process's, so
a request gets the same answer either way.

This file runs as a script (``LAUNCH``: by path, with neither this folder nor the working directory on
``sys.path``, so that this folder's ``http.py`` does not hide the standard library's), started by
``grpc_server.GrpcRelays``: it imports only the standard library and grpcio (no torch, no shapeplan
package), so a front end starts in a fraction of a second and costs ~40 MB.

Frames on the Unix socket (little endian):
  hello, front end -> model process: u32 length + JSON {"pid", "port", "arena", "arena_bytes"}
  request, front end -> model process: ``REQUEST`` (id, method index, kind, arena offset, length);
      offset ``INLINE``: ``length`` bytes of request follow (a request the arena has no room for)
  reply, model process -> front end: ``REPLY`` (id, status, length) + ``length`` bytes: the response
      (status 0) or the error message (UTF-8; status: a gRPC status code's number)
The arena's region of a request is freed when its reply comes, never before (a client that leaves
mid-request does not free bytes the model process may still be reading).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import signal
import struct
import sys
import tempfile
from typing import Any, Awaitable, Callable

import grpc

REQUEST = struct.Struct("<QIB3xQQ")      # id, method index, kind (UNARY / STREAM), arena offset, length
REPLY = struct.Struct("<QiI")            # id, status (0 = OK, else a grpc.StatusCode number), length
HELLO = struct.Struct("<I")
UNARY, STREAM = 0, 1
INLINE = (1 << 64) - 1
ALIGN = 64
STREAM_MAX_IN_FLIGHT = 256               # requests of one stream served at once (stream_handler)
LAUNCH = "import sys, runpy; del sys.path[0]; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
"""``python -c LAUNCH relay.py ARGS``"""
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def stream_handler(answer: Callable[[bytes, Any], Awaitable[bytes]]) -> grpc.RpcMethodHandler:
    """A bidirectional stream whose messages are requests served concurrently, ``answer(request,
    context)`` each, the responses written as they finish (one write at a time); at most
    ``STREAM_MAX_IN_FLIGHT`` at once, so one stream cannot queue without bound (its next message is read
    when one finishes; HTTP/2 flow control then holds the client back). Used by both gRPC servers."""
    async def handle(_requests: Any, context: Any) -> None:      # read with context.read()
        slots = asyncio.Semaphore(STREAM_MAX_IN_FLIGHT)
        writing = asyncio.Lock()
        tasks: set[asyncio.Task] = set()

        async def serve(raw: bytes) -> None:
            try:
                response = await answer(raw, context)
                async with writing:
                    await context.write(response)
            except (grpc.aio.UsageError, grpc.aio.AbortError, asyncio.InvalidStateError):
                pass                                    # the call ended (client gone): nobody to answer
            finally:
                slots.release()

        try:
            while (raw := await context.read()) is not grpc.aio.EOF:
                await slots.acquire()
                task = asyncio.ensure_future(serve(raw))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:                                # the client closed its side: finish what it sent
                await asyncio.wait(set(tasks))
        finally:
            for task in tasks:
                task.cancel()
    return grpc.stream_stream_rpc_method_handler(handle)


class Arena:
    """First-fit allocator over a shared-memory file: regions are freed in any order and merged with
    their free neighbours. ``alloc`` returns None when no free region is large enough."""

    def __init__(self, size: int) -> None:
        d = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.path = tempfile.mkstemp(prefix="shapeplan-grpc-arena-", dir=d)
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size = size
        self.free = [(0, size)]            # sorted, disjoint (start, stop)

    def alloc(self, n: int) -> int | None:
        n = max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)
        for i, (a, b) in enumerate(self.free):
            if b - a >= n:
                if b - a == n:
                    del self.free[i]
                else:
                    self.free[i] = (a + n, b)
                return a
        return None

    def release(self, start: int, n: int) -> None:
        n = max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)
        stop = start + n
        i = 0
        while i < len(self.free) and self.free[i][0] < start:
            i += 1
        if i > 0 and self.free[i - 1][1] == start:              # merge with the region before
            start = self.free[i - 1][0]
            i -= 1
            del self.free[i]
        if i < len(self.free) and self.free[i][0] == stop:      # and with the one after
            stop = self.free[i][1]
            del self.free[i]
        self.free.insert(i, (start, stop))


class Relay:
    """One front end: its gRPC server, its arena and its connection to the model process."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.methods = args.unary.split(",") + args.stream.split(",")
        self.index = {m: i for i, m in enumerate(self.methods)}
        self.arena = Arena(args.arena_bytes)
        self.pending: dict[int, tuple[asyncio.Future, int, int]] = {}   # id -> (reply, offset, length)
        self.next_id = 0
        self.writer: Any = None
        self.closed = asyncio.Event()

    async def call(self, method: str, kind: int, raw: bytes) -> tuple[int, bytes]:
        """Send one request to the model process; its (status, bytes)."""
        if self.closed.is_set():
            return _UNAVAILABLE, b"the model process is gone"
        rid = self.next_id = self.next_id + 1
        n = len(raw)
        off = self.arena.alloc(n) if n else None
        reply = asyncio.get_running_loop().create_future()
        if off is None:
            self.pending[rid] = (reply, INLINE, n)
            self.writer.writelines([REQUEST.pack(rid, self.index[method], kind, INLINE, n), raw])
        else:
            self.arena.mm[off:off + n] = raw
            self.pending[rid] = (reply, off, n)
            self.writer.write(REQUEST.pack(rid, self.index[method], kind, off, n))
        return await reply

    async def read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                rid, status, n = REPLY.unpack(await reader.readexactly(REPLY.size))
                body = await reader.readexactly(n) if n else b""
                reply, off, length = self.pending.pop(rid)
                if off != INLINE:
                    self.arena.release(off, length)
                if not reply.done():
                    reply.set_result((status, body))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass                                        # the model process closed the hub: stop
        finally:
            self.closed.set()
            for reply, _, _ in self.pending.values():
                if not reply.done():
                    reply.set_result((_UNAVAILABLE, b"the model process is gone"))
            self.pending.clear()

    def unary(self, method: str) -> Any:
        async def handle(raw: bytes, context: Any) -> bytes:
            status, body = await self.call(method, UNARY, raw)
            if status:
                await context.abort(_CODES[status], body.decode("utf-8", "replace"))
            return body
        return grpc.unary_unary_rpc_method_handler(handle)

    def streaming(self, method: str) -> Any:
        async def answer(raw: bytes, context: Any) -> bytes:
            status, body = await self.call(method, STREAM, raw)
            if status:                                  # the model process answers errors in band: it is gone
                await context.abort(_CODES[status], body.decode("utf-8", "replace"))
            return body
        return stream_handler(answer)

    async def run(self) -> None:
        a = self.args
        handlers = {m: self.unary(m) for m in a.unary.split(",")}
        handlers.update({m: self.streaming(m) for m in a.stream.split(",")})
        server = grpc.aio.server(
            handlers=[grpc.method_handlers_generic_handler(a.service, handlers)],
            options=[("grpc.max_receive_message_length", a.max_request_bytes),
                     ("grpc.max_send_message_length", -1),
                     ("grpc.so_reuseport", 1)])
        host = f"[{a.host}]" if ":" in a.host else a.host
        try:
            port = server.add_insecure_port(f"{host}:{a.port}")
        except RuntimeError:                             # grpcio: "Failed to bind to address"
            port = 0
        reader, self.writer = await asyncio.open_unix_connection(a.hub)
        hello = json.dumps({"pid": os.getpid(), "port": port, "arena": self.arena.path,
                            "arena_bytes": self.arena.size}).encode()
        self.writer.writelines([HELLO.pack(len(hello)), hello])
        if not port:
            return
        replies = asyncio.ensure_future(self.read_replies(reader))
        await server.start()
        await self.closed.wait()                          # until the model process closes the hub
        await server.stop(0.5)
        await replies


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hub", required=True, help="the model process's Unix socket")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--service", required=True, help="the gRPC service's full name")
    p.add_argument("--unary", required=True, help="its unary methods, comma-separated")
    p.add_argument("--stream", required=True, help="its bidirectional-stream methods, comma-separated")
    p.add_argument("--max-request-bytes", type=int, required=True)
    p.add_argument("--arena-bytes", type=int, required=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the whole process group: the model
    relay = Relay(p.parse_args(argv))               # process stops us (the hub closes), in its own order
    try:
        asyncio.run(relay.run())
    finally:
        try:
            os.unlink(relay.arena.path)                 # the model process unlinks it on hello; if it never came
        except FileNotFoundError:
            pass


if __name__ == "__main__":
    main(sys.argv[1:])
