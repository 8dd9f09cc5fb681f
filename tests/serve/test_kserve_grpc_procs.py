"""``shapeplan serve --grpc-procs N``: gRPC served by front-end processes (``relay.py``) that hand each
request to the model process. The gRPC tests of the other modules run again here against such a server
(this module's ``server`` fixture), plus what only the front ends have: their arena, a request too big
for it, a port already taken, and a clean stop."""
from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from tests.serve.conftest import mlp_ref
from tests.serve.test_kserve_batching import (  # noqa: F401 - collected again with this module's server
    test_32_concurrent_grpc_clients_each_get_their_own_answer, test_a_failing_request_in_a_batch_fails_alone)
from tests.serve.test_kserve_errors import (  # noqa: F401
    test_grpc_bad_request, test_grpc_oversized_request, test_grpc_raw_contents_count, test_grpc_unknown_model_metadata)
from tests.serve.test_kserve_server import test_grpc_typed_contents  # noqa: F401
from tests.serve.test_kserve_shm import (  # noqa: F401 - shm: that module's fixture
    shm, test_concurrent_clients_each_with_their_region_get_their_own_answer, test_grpc_shared_memory_input_beside_a_raw_one)
from tests.serve.test_kserve_stream import (  # noqa: F401
    test_a_client_that_leaves_mid_stream_costs_nobody_else, test_bad_requests_get_their_own_error_and_the_stream_goes_on,
    test_error_responses_carry_the_request_id_and_garbage_does_not_end_the_stream,
    test_an_oversized_message_ends_its_stream_only, test_pipelined_requests_match_engine_and_batch_together)

from shapeplan.serve.kserve import relay  # noqa: E402


def _start(repo_dir, tmp_path_factory, **kw):
    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        return KServeServer(ModelRepository(discover(repo_dir)), "127.0.0.1", kw.pop("http_port", 0), 0,
                            grpc_procs=kw.pop("grpc_procs", 2), **kw).start()


@pytest.fixture(scope="module")
def server(repo_dir, tmp_path_factory):
    s = _start(repo_dir, tmp_path_factory)
    yield s
    children = list(s.grpc._children)
    s.stop()
    assert all(c.poll() is not None for c in children), "a front-end process outlived the server"
# conftest's grpc_client (function-scoped) connects to this module's server


def _infer(port: int, x: np.ndarray, model: str = "mlp") -> np.ndarray:
    import tritonclient.grpc as tg
    c = tg.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        i = tg.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return c.infer(model, [i]).as_numpy("y")
    finally:
        c.close()


def test_front_ends_serve_metadata_and_statistics(server, grpc_client) -> None:
    assert server.grpc.procs == 2 and all(c.poll() is None for c in server.grpc._children)
    assert grpc_client.is_server_live() and grpc_client.is_server_ready() and grpc_client.is_model_ready("mlp")
    assert grpc_client.get_server_metadata().name == "shapeplan"
    meta = grpc_client.get_model_metadata("mlp")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 8])]
    before = grpc_client.get_inference_statistics("mlp").model_stats[0].inference_stats.success.count
    x = np.random.RandomState(1).rand(3, 8).astype(np.float32)
    np.testing.assert_allclose(_infer(server.grpc_port, x), mlp_ref(x), rtol=1e-5, atol=1e-6)
    after = grpc_client.get_inference_statistics("mlp").model_stats[0].inference_stats.success.count
    assert after == before + 1                       # counted by the model process, as in-process gRPC


def test_a_request_too_big_for_the_arena_goes_inline(repo_dir, tmp_path_factory) -> None:
    """An arena of 512 bytes: a 32-row request (1 KB of x) is sent on the Unix socket instead; small ones
    beside it take the arena, regions freed out of order as their replies come."""
    s = _start(repo_dir, tmp_path_factory, http_port=None, grpc_procs=1, grpc_arena_bytes=512)
    try:
        rng = np.random.RandomState(2)
        errors: list[str] = []

        def client(rows: int) -> None:
            try:
                for _ in range(5):
                    x = rng.rand(rows, 8).astype(np.float32)
                    if not np.allclose(_infer(s.grpc_port, x), mlp_ref(x), rtol=1e-5, atol=1e-6):
                        errors.append(f"{rows} rows: wrong answer")
            except Exception as e:  # noqa: BLE001
                errors.append(f"{rows} rows: {type(e).__name__}: {e}")
        threads = [threading.Thread(target=client, args=(rows,)) for rows in (1, 2, 32, 3, 32, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
    finally:
        s.stop()


def test_a_taken_port_is_an_error_and_nothing_is_left(repo_dir, tmp_path_factory) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    s = KServeServer(ModelRepository(discover(repo_dir)), "127.0.0.1", None, port, grpc_procs=2)
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            s.start()
    finally:
        taken.close()
    assert s.grpc is None


def test_stop_ends_the_front_ends_and_frees_the_port(repo_dir, tmp_path_factory) -> None:
    s = _start(repo_dir, tmp_path_factory, http_port=None, grpc_procs=2)
    port, children, folder = s.grpc_port, list(s.grpc._children), s.grpc._dir
    x = np.ones((1, 8), np.float32)
    np.testing.assert_allclose(_infer(port, x), mlp_ref(x), rtol=1e-5, atol=1e-6)
    s.stop()
    assert all(c.poll() is not None for c in children)
    assert not os.path.exists(folder)
    # The port is free: nothing listens there any more. SO_REUSEADDR lets the bind pass a connection
    # the killed front end left in TIME_WAIT (as any server's bind does), but never a live listener.
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


def test_arena_first_fit_and_merging() -> None:
    a = relay.Arena(1024)
    try:
        x, y, z = a.alloc(100), a.alloc(64), a.alloc(300)       # rounded up to 64 bytes each
        assert (x, y, z) == (0, 128, 192) and a.free == [(512, 1024)]
        assert a.alloc(600) is None                              # 512 left
        a.release(y, 64)
        assert a.alloc(64) == 128                                # first fit: the hole
        a.release(128, 64)
        a.release(x, 100)                                        # merges with the hole after it
        assert a.free == [(0, 192), (512, 1024)]
        a.release(z, 300)                                        # and everything becomes one region again
        assert a.free == [(0, 1024)]
    finally:
        a.mm.close()
        os.unlink(a.path)
