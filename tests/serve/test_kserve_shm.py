"""The system shared memory extension (Triton's), driven by the official clients: inputs read from and
outputs written to POSIX shared memory the client made (``multiprocessing.shared_memory``)."""
from __future__ import annotations

import uuid
from multiprocessing import shared_memory

import numpy as np
import pytest

from tests.serve.conftest import in_threads, mlp_ref

tc_http = pytest.importorskip("tritonclient.http")
tc_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.skipif(not __import__("os").path.isdir("/dev/shm"), reason="POSIX shared memory (Linux)")


@pytest.fixture
def shm(server):
    """Make shared memory objects (each a (name, SharedMemory)); unregistered and unlinked afterwards."""
    made: list = []

    def make(size: int):
        m = shared_memory.SharedMemory(name=f"sp-test-{uuid.uuid4().hex[:12]}", create=True, size=size)
        made.append(m)
        return m
    yield make
    server.repo.shared_memory.unregister()
    for m in made:
        m.close()
        m.unlink()


def _clients(server):
    return (tc_http, tc_http.InferenceServerClient(f"127.0.0.1:{server.http_port}")), \
           (tc_grpc, tc_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"))


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_input_and_output_in_shared_memory(server, shm, transport) -> None:
    (th, h), (tg, g) = _clients(server)
    mod, c = (th, h) if transport == "http" else (tg, g)
    try:
        x = np.random.RandomState(1).rand(5, 8).astype(np.float32) - 0.5
        m = shm(4096)
        m.buf[128:128 + x.nbytes] = x.tobytes()                  # x at offset 128 of the object
        c.register_system_shared_memory("in", "/" + m.name, 1024, offset=0)
        c.register_system_shared_memory("out", "/" + m.name, 1024, offset=2048)
        status = c.get_system_shared_memory_status()
        regions = {r["name"]: r for r in status} if transport == "http" else \
            {k: {"key": v.key, "offset": v.offset, "byte_size": v.byte_size} for k, v in status.regions.items()}
        assert regions["in"]["key"] == "/" + m.name and int(regions["out"]["offset"]) == 2048
        assert int(regions["in"]["byte_size"]) == 1024
        i = mod.InferInput("x", [5, 8], "FP32")
        i.set_shared_memory("in", x.nbytes, offset=128)
        o = mod.InferRequestedOutput("y")
        o.set_shared_memory("out", 512, offset=64)
        r = c.infer("mlp", [i], outputs=[o])
        out = r.get_output("y")
        params = out["parameters"] if transport == "http" else \
            {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in out.parameters.items()}
        assert params == {"shared_memory_region": "out", "shared_memory_byte_size": 5 * 4 * 4}
        shape = out["shape"] if transport == "http" else list(out.shape)
        assert shape == [5, 4]
        got = np.frombuffer(bytes(m.buf[2048 + 64:2048 + 64 + 80]), np.float32).reshape(5, 4)
        np.testing.assert_allclose(got, mlp_ref(x), rtol=1e-5, atol=1e-6)
        # the same input region, the output inline
        r = c.infer("mlp", [i])
        np.testing.assert_allclose(r.as_numpy("y"), mlp_ref(x), rtol=1e-5, atol=1e-6)
        c.unregister_system_shared_memory("in")
        left = c.get_system_shared_memory_status()
        assert (len(left) if transport == "http" else len(left.regions)) == 1
        c.unregister_system_shared_memory()
        left = c.get_system_shared_memory_status()
        assert (len(left) if transport == "http" else len(left.regions)) == 0
    finally:
        h.close()
        g.close()


def test_grpc_shared_memory_input_beside_a_raw_one(server, shm) -> None:
    """gather's data from shared memory, its idx inline: raw_input_contents holds idx only."""
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        idx = np.array([[3], [0], [2]], np.int64)
        m = shm(data.nbytes)
        m.buf[:data.nbytes] = data.tobytes()
        g.register_system_shared_memory("data", "/" + m.name, data.nbytes)
        a = tc_grpc.InferInput("data", [3, 4], "FP32")
        a.set_shared_memory("data", data.nbytes)
        b = tc_grpc.InferInput("idx", [3, 1], "INT64")
        b.set_data_from_numpy(idx)
        got = g.infer("gather", [a, b]).as_numpy("out")
        np.testing.assert_array_equal(got, np.take_along_axis(data, idx, axis=1))
    finally:
        g.close()


def test_concurrent_clients_each_with_their_region_get_their_own_answer(server, shm) -> None:
    """16 clients at once, each its own region for x and y: batched together, each answer its own."""
    m = shm(16 * 1024)

    def client(k: int) -> None:
        c = tc_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            rows = 1 + k % 3
            x = np.random.RandomState(100 + k).rand(rows, 8).astype(np.float32)
            base = k * 1024
            m.buf[base:base + x.nbytes] = x.tobytes()
            c.register_system_shared_memory(f"c{k}", "/" + m.name, 1024, offset=base)
            for _ in range(5):
                i = tc_grpc.InferInput("x", [rows, 8], "FP32")
                i.set_shared_memory(f"c{k}", x.nbytes)
                o = tc_grpc.InferRequestedOutput("y")
                o.set_shared_memory(f"c{k}", 512, offset=512)
                c.infer("mlp", [i], outputs=[o])
                got = np.frombuffer(bytes(m.buf[base + 512:base + 512 + rows * 16]), np.float32).reshape(rows, 4)
                np.testing.assert_allclose(got, mlp_ref(x), rtol=1e-5, atol=1e-6)
        finally:
            c.close()
    errors = in_threads(client, 16)
    assert not errors, errors[:3]


def test_bad_shared_memory_requests_name_what_is_wrong(server, shm) -> None:
    (th, h), (tg, g) = _clients(server)
    try:
        m = shm(256)
        x = np.ones((2, 8), np.float32)
        for c in (h, g):
            with pytest.raises(InferenceServerException, match="cannot open shared memory object '/sp-nope-1'"):
                c.register_system_shared_memory("r", "/sp-nope-1", 16)
            with pytest.raises(InferenceServerException, match=r"bytes \[200, 300\) do not lie inside .* of 256 bytes"):
                c.register_system_shared_memory("r", "/" + m.name, 100, offset=200)
        h.register_system_shared_memory("r", "/" + m.name, 128)
        for c in (h, g):
            with pytest.raises(InferenceServerException, match="'r': a region of that name is registered already"):
                c.register_system_shared_memory("r", "/" + m.name, 64)
        for mod, c in ((th, h), (tg, g)):
            i = mod.InferInput("x", [2, 8], "FP32")
            i.set_shared_memory("nope", 64)
            with pytest.raises(InferenceServerException, match="input 'x': shared memory region 'nope' is not registered"):
                c.infer("mlp", [i])
            i.set_shared_memory("r", 64, offset=100)
            with pytest.raises(InferenceServerException, match=r"input 'x': bytes \[100, 164\) of shared memory region 'r' run past its 128 bytes"):
                c.infer("mlp", [i])
            i = mod.InferInput("x", [2, 8], "FP32")             # (the clients keep an old offset: a new input)
            i.set_shared_memory("r", 60)
            with pytest.raises(InferenceServerException, match=r"input 'x': FP32\[2, 8\] needs 64 bytes, got 60"):
                c.infer("mlp", [i])
            i.set_data_from_numpy(x)
            o = mod.InferRequestedOutput("y")
            o.set_shared_memory("r", 16)
            with pytest.raises(InferenceServerException, match="output 'y': the result has 32 bytes but its shared memory placement in region 'r' holds 16"):
                c.infer("mlp", [i], outputs=[o])
            with pytest.raises(InferenceServerException, match="no shared memory region 'zz' is registered"):
                c.get_system_shared_memory_status("zz")
            np.testing.assert_allclose(c.infer("mlp", [i]).as_numpy("y"), mlp_ref(x), rtol=1e-5, atol=1e-6)
        h.unregister_system_shared_memory("never-registered")        # not an error, as with Triton
    finally:
        h.close()
        g.close()


def test_http_register_body_is_checked(server) -> None:
    import httpx
    url = f"http://127.0.0.1:{server.http_port}/v2/systemsharedmemory/region/q/register"
    for body, words in (({"key": 3, "byte_size": 4}, "expected {\"key\": str"),
                        ({"key": "/k", "byte_size": -1}, "byte_size must be a non-negative integer"),
                        ({"key": "/a/b", "byte_size": 4}, "is not a shared memory object's name"),
                        ({"key": "/k", "byte_size": 4, "colour": 1}, "expected {\"key\": str")):
        r = httpx.post(url, json=body)
        assert r.status_code == 400 and words in r.json()["error"], r.text
