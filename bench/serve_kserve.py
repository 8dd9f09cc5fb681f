"""KServe v2 serving: N concurrent batch-1 gRPC clients against ``shapeplan serve``, with dynamic batching
on and off (throughput, p50/p99 latency), next to in-process ``engine.run`` at the largest bucket; and
the per-request protocol overhead (one client, one request at a time: gRPC (``ModelInfer``, and
``ModelStreamInfer`` on one stream) and HTTP round trip minus in-process ``engine.run``) for a 1x768
float input, beside grpcio's own floor: the round trip of the same request bytes through a bare grpcio
server (its own process) whose rpcs return their requests, unary and on a stream.

The server runs in its own process (``python -m shapeplan serve --model-repository TMP``) serving the
model twice, "batched" (dynamic batching, max_batch_size, window, ``--instances``) and "unbatched"
(dynamic_batching false), plus "mlp768" (768 -> 768 MatMul + Relu, batching off) for the overhead rows.
Clients are plain grpcio / http.client with pre-serialized requests (the lightest clients, so the
figures are the server's and the transport's), spread over ``--client-procs`` processes so the clients'
own GIL is not the limit. Next to each load row: the mean request rows per engine call, the server
process's CPU time per request (Linux /proc; the whole test, warm-up included) and how busy the
busiest client process was (its share of one core: near 100 % the clients are the limit). A model
whose inputs have a fixed batch of 1 (the ONNX "light" ResNet-50) is rewritten with a dynamic first
dimension (inputs, outputs, constant Reshape targets [1, ...] -> [-1, ...]).

    python bench/serve_kserve.py                                   # CPU: a 768-wide MLP made here
    python bench/serve_kserve.py --model io224                     # CPU: ResNet-50's request and response
                                                                   # sizes at almost no compute: the server's
                                                                   # own cost per request
    python bench/serve_kserve.py --model resnet50 --device cuda    # onnx/backend/test/data/light ResNet-50
    python bench/serve_kserve.py --grpc HOST:PORT --http HOST:PORT # a running server (its models
                                                                   # "batched", "unbatched", "mlp768")
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
NP_TO_KSERVE = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32"}


# ------------------------------------------------------------------------------------- models
def mlp768(path: str, width: int = 768) -> None:
    w = np.random.RandomState(0).rand(width, width).astype(np.float32) / width
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                          "mlp768", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)   # IR 8: opset 17 needs no more, older onnxruntimes read it


def dynamic_batch(src: str, dst: str) -> bool:
    """Copy ``src`` to ``dst``; when every real input has a fixed first dimension of 1, make it "batch"
    (inputs, outputs, constant Reshape targets). Returns whether it rewrote."""
    m = onnx.load(src)
    inits = {t.name: t for t in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in inits]
    if not all(i.type.tensor_type.shape.dim and i.type.tensor_type.shape.dim[0].dim_value == 1 for i in inputs):
        onnx.save(m, dst)
        return False
    for vi in list(inputs) + list(m.graph.output):
        d = vi.type.tensor_type.shape.dim[0]
        d.Clear()
        d.dim_param = "batch"
    del m.graph.value_info[:]
    for n in m.graph.node:
        if n.op_type == "Reshape" and n.input[1] in inits:
            t = inits[n.input[1]]
            shape = numpy_helper.to_array(t)
            if shape.ndim == 1 and len(shape) and shape[0] == 1 and -1 not in shape:
                t.CopyFrom(numpy_helper.from_array(np.concatenate([[-1], shape[1:]]).astype(shape.dtype), t.name))
    onnx.save(m, dst)
    return True


def io224(path: str) -> None:
    """ResNet-50's input and output sizes (x: [N, 3, 224, 224] float, 602 KB a row; y: [N, 1000]) at almost
    no compute (GlobalAveragePool, 1x1 Conv 3 -> 1000, Flatten): what is left is the server's own cost."""
    w = np.random.RandomState(0).rand(1000, 3, 1, 1).astype(np.float32) - 0.5
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Conv", ["p", "w"], ["c"]),
             helper.make_node("Flatten", ["c"], ["y"])]
    g = helper.make_graph(nodes, "io224",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 224, 224])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1000])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


BUILT = {"mlp768": mlp768, "io224": io224}       # models made here (--model NAME)


def resolve_model(name: str | None, tmp: str) -> str:
    if name is None or name in BUILT:
        path = os.path.join(tmp, f"{name or 'mlp768'}.onnx")
        BUILT[name or "mlp768"](path)
        return path
    if not os.path.exists(name) and os.path.exists(os.path.join(LIGHT, f"light_{name}.onnx")):
        return os.path.join(LIGHT, f"light_{name}.onnx")
    return name


def input_spec(path: str) -> list[tuple[str, str, tuple]]:
    """(name, numpy dtype, shape without the batch) of each input of the served (rewritten) model."""
    import shapeplan as sp
    g = sp.load(path)
    out = []
    for v in g.inputs:
        rest = tuple(v.shape[1:])
        if not all(isinstance(d, int) for d in rest):
            raise SystemExit(f"input {v.name} has a varying non-batch dimension {list(v.shape)}: not supported here")
        out.append((v.name, v.dtype.numpy.name, rest))
    return out


# ------------------------------------------------------------------------------------- server
def write_repository(model: str, root: str, args: argparse.Namespace) -> None:
    common = {"device": args.device, "mode": args.mode}
    for name, cfg in (("batched", {"max_batch_size": args.max_batch_size, "max_queue_delay_us": args.delay_us,
                                   "instance_count": args.instances}),
                      ("unbatched", {"max_batch_size": args.max_batch_size, "dynamic_batching": False})):
        os.makedirs(os.path.join(root, name))
        os.symlink(os.path.abspath(model), os.path.join(root, name, "model.onnx"))
        with open(os.path.join(root, name, "config.json"), "w") as f:
            json.dump({**cfg, **common}, f)
    os.makedirs(os.path.join(root, "mlp768"))
    mlp768(os.path.join(root, "mlp768", "model.onnx"))
    with open(os.path.join(root, "mlp768", "config.json"), "w") as f:
        json.dump({"dynamic_batching": False, **common}, f)


def start_server(root: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str, str]:
    cmd = [sys.executable, "-m", "shapeplan", "serve", "--model-repository", root, "--port", "0", "--grpc-port", "0",
           "--log-level", "warning", "--max-request-bytes", str(256 << 20), "--grpc-procs", str(args.grpc_procs)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    text = ""
    while "ready:" not in text:
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"the server exited (rc {p.wait()}) before it was ready:\n{text}")
        text += line
    http_port, grpc_port = re.search(r"http://[^:]+:(\d+), gRPC on [^:]+:(\d+)", text).groups()
    return p, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"


# ------------------------------------------------------------------------------------- clients
def grpc_request(model: str, spec: list, rows: int, seed: int) -> bytes:
    from shapeplan.serve.kserve import proto as pb
    rng = np.random.RandomState(seed)
    req = pb.ModelInferRequest(model_name=model)
    for name, dt, rest in spec:
        req.inputs.add(name=name, datatype=NP_TO_KSERVE[dt], shape=[rows, *rest])
        req.raw_input_contents.append(rng.rand(rows, *rest).astype(dt).tobytes())
    return req.SerializeToString()


SHM_OUT_BYTES = 4 << 20                 # --shm: room for a request's outputs in its client's region


def shm_request(channel: Any, model: str, spec: list, outputs: list[str], seed: int, tag: str) -> tuple[bytes, Any]:
    """--shm: a client's region (a shared memory object of its own, registered with the server) holding its
    inputs, with room for its outputs, and the request that names them; (request, the object)."""
    from multiprocessing import shared_memory

    from shapeplan.serve.kserve import proto as pb
    rng = np.random.RandomState(seed)
    data = [rng.rand(1, *rest).astype(dt).tobytes() for _, dt, rest in spec]
    size = sum(map(len, data)) + SHM_OUT_BYTES * len(outputs)
    m = shared_memory.SharedMemory(create=True, size=size)
    channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryRegister")(
        pb.SystemSharedMemoryRegisterRequest(name=tag, key="/" + m.name, offset=0, byte_size=size).SerializeToString())
    req = pb.ModelInferRequest(model_name=model)
    at = 0
    for (name, dt, rest), b in zip(spec, data):
        m.buf[at:at + len(b)] = b
        t = req.inputs.add(name=name, datatype=NP_TO_KSERVE[dt], shape=[1, *rest])
        t.parameters["shared_memory_region"].string_param = tag
        t.parameters["shared_memory_byte_size"].int64_param = len(b)
        t.parameters["shared_memory_offset"].int64_param = at
        at += len(b)
    for name in outputs:
        o = req.outputs.add(name=name)
        o.parameters["shared_memory_region"].string_param = tag
        o.parameters["shared_memory_byte_size"].int64_param = SHM_OUT_BYTES
        o.parameters["shared_memory_offset"].int64_param = at
        at += SHM_OUT_BYTES
    return req.SerializeToString(), m


def _client_proc(addr: str, requests: list[Any], warmup: float, seconds: float, barrier: Any, q: Any) -> None:
    """``requests``: one per client thread, its serialized request, or for --shm (model, spec, output
    names, seed) from which the thread's region and request are made here."""
    import grpc
    threads = len(requests)
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0]
    chans = [grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", -1)]) for _ in requests]
    for ch in chans:
        grpc.channel_ready_future(ch).result(timeout=60)
    regions = []
    for k, r in enumerate(requests):
        if isinstance(r, tuple):
            requests[k], m = shm_request(chans[k], *r, tag=f"bench-{os.getpid()}-{k}")
            regions.append(m)
    barrier.wait()                       # every process starts together
    start = time.monotonic() + warmup
    stop = start + seconds
    cpu0 = time.process_time()

    def run(k: int) -> None:
        call, raw = chans[k].unary_unary(INFER), requests[k]
        while True:
            t0 = time.monotonic()
            if t0 >= stop:
                return
            try:
                call(raw)
            except grpc.RpcError:
                errors[0] += 1
                continue
            if t0 >= start:
                lat[k].append(time.monotonic() - t0)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # this process's CPU time over the test, as a share of one core: near 1, its GIL is the limit
    busy = (time.process_time() - cpu0) / (warmup + seconds)
    if regions:
        from shapeplan.serve.kserve import proto as pb
        unregister = chans[0].unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryUnregister")
        for k in range(len(regions)):
            unregister(pb.SystemSharedMemoryUnregisterRequest(name=f"bench-{os.getpid()}-{k}").SerializeToString())
    for ch in chans:
        ch.close()
    for m in regions:
        m.close()
        m.unlink()
    q.put(([x for ls in lat for x in ls], errors[0], busy))


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServerCpu(NamedTuple):
    model_proc: float       # CPU seconds of the server process
    total: float            # and of its children (the --grpc-procs front ends) added


def server_cpu_s(pid: int | None) -> ServerCpu | None:
    """CPU seconds (user + system) the server process has used so far, and with its children (the
    ``--grpc-procs`` front ends) added (Linux), else None."""
    try:
        own = _proc_cpu_s(pid)
        kids = 0.0
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            for child in f.read().split():
                try:
                    kids += _proc_cpu_s(int(child))
                except OSError:
                    pass
        return ServerCpu(own, own + kids)
    except (OSError, TypeError, ValueError, IndexError):
        return None


PHASES = ("compute_input", "compute_infer", "compute_output")


class Counters(NamedTuple):
    success: int            # requests succeeded
    calls: int              # engine calls
    phase_ns: list[int]     # ns in each of PHASES, summed over the calls
    at: float               # time.monotonic() when read


def model_counters(http_addr: str | None, model: str) -> Counters | None:
    """``model``'s counters from the server's statistics endpoint."""
    if not http_addr:
        return None
    host, port = http_addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", f"/v2/models/{model}/stats")
        s = json.loads(conn.getresponse().read())["model_stats"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    finally:
        conn.close()
    i = s["inference_stats"]
    return Counters(i["success"]["count"], s["execution_count"], [int(i[k]["ns"]) for k in PHASES], time.monotonic())


def load_test(addr: str, model: str, spec: list, args: argparse.Namespace, http_addr: str | None = None,
              server_pid: int | None = None) -> dict[str, float]:
    """Throughput and latency of ``args.clients`` clients; with the server's pid and HTTP address also its CPU
    time per request and the mean rows per engine call (over the whole test, warm-up included)."""
    cpu0, n0 = server_cpu_s(server_pid), model_counters(http_addr, model)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = max(1, min(args.client_procs, args.clients))
    if args.shm:
        reqs: list[Any] = [(model, spec, args.output_names, k) for k in range(args.clients)]
    else:
        reqs = [grpc_request(model, spec, 1, k) for k in range(args.clients)]
    parts = [reqs[i::procs] for i in range(procs)]
    barrier = ctx.Barrier(procs)
    ps = [ctx.Process(target=_client_proc, args=(addr, part, args.warmup, args.seconds, barrier, q))
          for part in parts]
    for p in ps:
        p.start()
    lat, errors, busy = [], 0, []
    for _ in ps:
        ls, e, b = q.get()
        lat += ls
        errors += e
        busy.append(b)
    for p in ps:
        p.join()
    lat_ms = np.array(lat) * 1e3
    res = {"req_s": len(lat) / args.seconds, "p50_ms": float(np.percentile(lat_ms, 50)) if len(lat) else 0.0,
           "p99_ms": float(np.percentile(lat_ms, 99)) if len(lat) else 0.0, "errors": errors,
           "client_busy": max(busy)}
    cpu1, n1 = server_cpu_s(server_pid), model_counters(http_addr, model)
    if n0 and n1 and n1.success > n0.success:
        served = n1.success - n0.success
        res["rows_per_call"] = served / max(n1.calls - n0.calls, 1)
        # the model's workers' time in each phase of a call (staging in, the engine, results out), as a share
        # of the test's wall time summed over the instances: near 1 per instance, the workers are the limit
        res["worker_share"] = {k: (b - a) * 1e-9 / (n1.at - n0.at) for k, a, b in zip(PHASES, n0.phase_ns, n1.phase_ns)}
        if cpu0 is not None and cpu1 is not None:         # front ends that exit mid-test would skew it: none do
            res["server_cpu_ms"] = (cpu1.total - cpu0.total) * 1e3 / served
            res["model_proc_cpu_ms"] = (cpu1.model_proc - cpu0.model_proc) * 1e3 / served
    return res


def sequential(fn: Any, n: int, idle_s: float = 0.0) -> float:
    """Median seconds of ``fn()`` over ``n`` calls (after n/10 unmeasured), each after ``idle_s`` asleep."""
    for _ in range(max(3, n // 10)):
        fn()
    ts = []
    for _ in range(n):
        if idle_s:
            time.sleep(idle_s)
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


#: a bare grpcio server in its own process whose one rpc returns its request: the round trip of the same bytes
#: with nothing of ours in it (grpcio's own floor for the overhead rows)
ECHO_SERVER = """
import grpc
from concurrent import futures
same = lambda b: b
s = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    "echo.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req, same, same),
                  "Stream": grpc.stream_stream_rpc_method_handler(lambda reqs, ctx: reqs, same, same)}),))
port = s.add_insecure_port("127.0.0.1:0")
s.start()
print(port, flush=True)
s.wait_for_termination()
"""
#: the same on grpcio's asyncio server (as ``shapeplan serve``'s): the floor of our own server's kind
ECHO_SERVER_AIO = """
import asyncio, grpc
same = lambda b: b
async def echo(req, ctx):
    return req
async def stream(reqs, ctx):
    async for r in reqs:
        yield r
async def main():
    s = grpc.aio.server()
    s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "echo.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo, same, same),
                      "Stream": grpc.stream_stream_rpc_method_handler(stream, same, same)}),))
    port = s.add_insecure_port("127.0.0.1:0")
    await s.start()
    print(port, flush=True)
    await s.wait_for_termination()
asyncio.run(main())
"""


class _Stream:
    """One bidirectional stream driven a message at a time from this thread: ``send(raw)`` writes a
    message and returns the response (each response is read before the next message is written)."""

    def __init__(self, channel: Any, method: str) -> None:
        self._q: queue.Queue = queue.Queue()
        self._responses = channel.stream_stream(method)(iter(self._q.get, None))

    def send(self, raw: bytes) -> bytes:
        self._q.put(raw)
        return next(self._responses)

    def close(self) -> None:
        self._q.put(None)
        for _ in self._responses:
            pass


def echo_floor(raw: bytes, n: int) -> dict[str, float]:
    """Median ms of a round trip of ``raw`` through ``ECHO_SERVER`` and ``ECHO_SERVER_AIO``, each as a unary
    call and on a stream (a server that did not start gives no keys)."""
    return {**_echo(ECHO_SERVER, "grpc", raw, n), **_echo(ECHO_SERVER_AIO, "grpc_aio", raw, n)}


def _echo(server: str, key: str, raw: bytes, n: int) -> dict[str, float]:
    import grpc
    p = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()
        if not line.isdigit():
            print(f"grpcio echo server ({key}) did not start (it printed {line!r}): no echo row", file=sys.stderr)
            return {}
        port = int(line)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            echo = ch.unary_unary("/echo.Echo/Echo")
            res = {f"{key}_echo_ms": sequential(lambda: echo(raw), n) * 1e3}
            stream = _Stream(ch, "/echo.Echo/Stream")
            res[f"{key}_stream_echo_ms"] = sequential(lambda: stream.send(raw), n) * 1e3
            stream.close()
            return res
    finally:
        p.terminate()
        p.wait(timeout=30)


def overhead(grpc_addr: str, http_addr: str, n: int, device: str, mode: str) -> dict[str, float]:
    import grpc

    import shapeplan as sp
    with tempfile.TemporaryDirectory() as d:
        mlp768(os.path.join(d, "m.onnx"))
        engine = sp.compile(os.path.join(d, "m.onnx"), device=device, mode=mode, disk_cache=False)
    x = np.random.RandomState(0).rand(1, 768).astype(np.float32)
    res = {"engine_main_ms": sequential(lambda: engine.run({"x": x}), n) * 1e3}
    # the server runs its engines on worker threads; on the CPU a small op called from a thread other than
    # the main one can be slower (OpenMP thread teams), so the overhead is taken over that figure
    t = threading.Thread(target=lambda: res.update(engine_ms=sequential(lambda: engine.run({"x": x}), n) * 1e3))
    t.start()
    t.join()
    # the same with the thread asleep before each call, as a server's worker is between requests: on a shared
    # VM the weights (2.4 MB) and the OpenMP team go cold meanwhile, and the engine takes 2-4x longer
    run_idle = lambda: res.update(engine_idle_ms=sequential(lambda: engine.run({"x": x}), n, 1e-3) * 1e3)
    t = threading.Thread(target=run_idle)
    t.start()
    t.join()
    raw = grpc_request("mlp768", [("x", "float32", (768,))], 1, 0)
    with grpc.insecure_channel(grpc_addr) as ch:
        call = ch.unary_unary(INFER)
        live = ch.unary_unary("/inference.GRPCInferenceService/ServerLive")
        res["grpc_live_ms"] = sequential(lambda: live(b""), n) * 1e3       # the transport alone
        res["grpc_ms"] = sequential(lambda: call(raw), n) * 1e3
        stream = _Stream(ch, STREAM_INFER)
        res["grpc_stream_ms"] = sequential(lambda: stream.send(raw), n) * 1e3
        stream.close()
    res.update(echo_floor(raw, n))
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 768],
                                   "parameters": {"binary_data_size": 768 * 4}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    body, host, port = head + x.tobytes(), *http_addr.split(":")
    conn = http.client.HTTPConnection(host, int(port))
    hdrs = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}

    def post() -> None:
        conn.request("POST", "/v2/models/mlp768/infer", body, hdrs)
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
    res["http_ms"] = sequential(post, n) * 1e3

    def get_live() -> None:
        conn.request("GET", "/v2/health/live")
        conn.getresponse().read()
    res["http_live_ms"] = sequential(get_live, n) * 1e3
    conn.close()
    try:
        import tritonclient.grpc as tg
        c = tg.InferenceServerClient(grpc_addr)
        i = tg.InferInput("x", [1, 768], "FP32")
        i.set_data_from_numpy(x)
        res["tritonclient_grpc_ms"] = sequential(lambda: c.infer("mlp768", [i]), n) * 1e3
        answered = threading.Event()
        c.start_stream(callback=lambda result, error: answered.set())

        def stream_infer() -> None:
            answered.clear()
            c.async_stream_infer("mlp768", [i])
            answered.wait()
        res["tritonclient_stream_ms"] = sequential(stream_infer, n) * 1e3
        c.stop_stream()
        c.close()
    except ImportError:
        pass
    return res


def in_process(model: str, spec: list, batch: int, args: argparse.Namespace) -> float:
    """rows/s of engine.run at ``batch`` rows, in this process (same device and mode; main thread)."""
    import shapeplan as sp
    engine = sp.compile(model, device=args.device, mode=args.mode, disk_cache=False)
    rng = np.random.RandomState(0)
    feeds = {name: rng.rand(batch, *rest).astype(dt) for name, dt, rest in spec}
    # numpy in, numpy out (host <-> device copies included), as a user calls it; the server copies a batch into
    # pinned staging buffers and passes torch views, which is not slower
    return batch / sequential(lambda: engine.run(feeds), args.engine_iters)


# ------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="an ONNX file, or a light model name (resnet50); "
                                                  "default: a 768-wide MLP made here")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--clients", type=int, default=32, help="concurrent batch-1 gRPC clients (default 32)")
    ap.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over (default 2)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per load test (default 5)")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each (default 1)")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--delay-us", type=int, default=100, help="batching window of the batched model (default 100)")
    ap.add_argument("--instances", type=int, default=1,
                    help="engines (worker threads) of the batched model (default 1)")
    ap.add_argument("--grpc-procs", type=int, default=0, metavar="N",
                    help="the server's gRPC front-end processes (shapeplan serve --grpc-procs; default 0: none)")
    ap.add_argument("--shm", action="store_true",
                    help="the load tests' clients pass inputs and outputs through system shared memory (each "
                         "client a region of its own), not in the gRPC messages")
    ap.add_argument("--overhead-iters", type=int, default=2000, help="sequential requests per overhead row")
    ap.add_argument("--engine-iters", type=int, default=50, help="in-process engine.run calls at max batch")
    ap.add_argument("--grpc", default=None, metavar="HOST:PORT", help="a running server (with --http)")
    ap.add_argument("--http", default=None, metavar="HOST:PORT")
    ap.add_argument("--skip-load", action="store_true", help="only the overhead rows")
    ap.add_argument("--skip-overhead", action="store_true", help="only the load test rows")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="sp-serve-bench-")
    src = resolve_model(args.model, tmp)
    model = os.path.join(tmp, "model.onnx")
    rewrote = dynamic_batch(src, model)
    spec = input_spec(model)
    import shapeplan as sp
    args.output_names = [v.name for v in sp.load(model).outputs]
    server = None
    if args.grpc:
        grpc_addr, http_addr = args.grpc, args.http
    else:
        root = os.path.join(tmp, "repo")
        write_repository(model, root, args)
        t0 = time.perf_counter()
        server, grpc_addr, http_addr = start_server(root, args)
        print(f"server ready in {time.perf_counter() - t0:.1f} s (gRPC {grpc_addr}, HTTP {http_addr})", flush=True)
    results: dict[str, Any] = {"model": os.path.basename(src), "device": args.device, "mode": args.mode,
                               "clients": args.clients, "instances": args.instances, "delay_us": args.delay_us,
                               "grpc_procs": args.grpc_procs, "shm": args.shm,
                               "dynamic_batch_rewrite": rewrote}
    try:
        if not args.skip_load:
            for name in ("batched", "unbatched"):
                results[name] = load_test(grpc_addr, name, spec, args, http_addr, server.pid if server else None)
            results["engine_rows_s"] = in_process(model, spec, args.max_batch_size, args)
        if not args.skip_overhead:
            results["overhead"] = overhead(grpc_addr, http_addr, args.overhead_iters, args.device, args.mode)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
    report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    note = " (first dimension made dynamic)" if r["dynamic_batch_rewrite"] else ""
    print(f"\nmodel {r['model']}{note}, device {r['device']}, mode {r['mode']}")
    if "batched" in r:
        b, u, e = r["batched"], r["unbatched"], r["engine_rows_s"]
        how = ", tensors in system shared memory" if args.shm else ""
        print(f"\n{r['clients']} concurrent batch-1 gRPC clients{how}, {args.seconds:g} s each")
        print(f"{'server':<34}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}{'rows/call':>11}"
              f"{'server CPU ms/req':>19}{'client proc busy':>18}")
        inst = (f", {args.instances} inst." if args.instances > 1 else "") + \
            (f", {args.grpc_procs} gRPC procs" if args.grpc_procs else "") + (", shm" if args.shm else "")
        for label, x in ((f"dynamic batching (<= {args.max_batch_size}, {args.delay_us} us{inst})", b),
                         ("batching off", u)):
            extra = (f"{x['rows_per_call']:>11.1f}" if "rows_per_call" in x else f"{'':>11}") + \
                (f"{x['server_cpu_ms']:>19.3f}" if "server_cpu_ms" in x else f"{'':>19}") + f"{x['client_busy']:>17.0%}"
            print(f"{label:<{max(34, len(label) + 1)}}{x['req_s']:>10.1f}{x['p50_ms']:>10.2f}{x['p99_ms']:>10.2f}{x['errors']:>8}{extra}")
        print(f"{f'in-process engine.run, batch {args.max_batch_size}':<34}{e:>10.1f}")
        print(f"batching on / off: {b['req_s'] / max(u['req_s'], 1e-9):.2f}x; "
              f"on / in-process: {100 * b['req_s'] / e:.0f} %")
        print("(client proc busy: the busiest client process's CPU time as a share of one core; near 100 % its GIL "
              "limits the load: use more --client-procs)")
        for label, x in (("batching on", b), ("batching off", u)):
            if "worker_share" in x:
                w = x["worker_share"]
                print(f"({label}: the workers' time, share of the test: staging in {w['compute_input']:.0%}, engine "
                      f"{w['compute_infer']:.0%}, results out {w['compute_output']:.0%}, over {args.instances if label == 'batching on' else 1} "
                      "instance(s))")
        if args.grpc_procs and "model_proc_cpu_ms" in b:
            print(f"(server CPU: the model process and its {args.grpc_procs} gRPC front ends; the model process alone: "
                  f"{b['model_proc_cpu_ms']:.3f} / {u.get('model_proc_cpu_ms', float('nan')):.3f} ms a request, "
                  "batching on / off)")
    if "overhead" in r:
        o = r["overhead"]
        print("\none client, one request at a time, 1x768 float32 in and out (median)")
        print(f"{'path':<34}{'ms':>10}{'over engine.run (thread)':>26}")
        print(f"{'in-process engine.run, main thread':<34}{o['engine_main_ms']:>10.3f}")
        print(f"{'in-process engine.run, a thread':<34}{o['engine_ms']:>10.3f}")
        if "engine_idle_ms" in o:
            print(f"{'  same, 1 ms asleep before each':<34}{o['engine_idle_ms']:>10.3f}")
        for key, label in (("grpc_ms", "gRPC (grpcio, raw bytes)"), ("http_ms", "HTTP (binary extension)"),
                           ("tritonclient_grpc_ms", "gRPC (tritonclient.grpc)"),
                           ("grpc_stream_ms", "gRPC stream (ModelStreamInfer)"),
                           ("tritonclient_stream_ms", "gRPC stream (tritonclient)"),
                           ("grpc_live_ms", "  transport alone: gRPC ServerLive"),
                           ("grpc_echo_ms", "  grpcio echo of the same bytes"),
                           ("grpc_stream_echo_ms", "  same, on a stream"),
                           ("grpc_aio_echo_ms", "  the same, asyncio server"),
                           ("grpc_aio_stream_echo_ms", "  asyncio server, on a stream"),
                           ("http_live_ms", "  transport alone: HTTP health/live")):
            if key in o:
                over = "" if "live" in key or "echo" in key else f"{o[key] - o['engine_ms']:.3f}"
                print(f"{label:<34}{o[key]:>10.3f}{over:>26}")


if __name__ == "__main__":
    sys.exit(main())
