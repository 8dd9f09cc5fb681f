"""Dynamic batching: 32 concurrent gRPC clients each get their own answer; a request that fails in a
batched engine call fails alone; batching off and several instances; the batcher's pure parts."""
from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future

import numpy as np
import pytest

import shapeplan as sp
from shapeplan.serve.kserve.batching import Costs, Work, bucket_ladder, fit, groups_of, split, stack
from tests.serve.conftest import mlp_onnx, mlp_ref


def test_bucket_ladder() -> None:
    assert bucket_ladder(32) == (1, 2, 4, 8, 16, 32)
    assert bucket_ladder(24) == (1, 2, 4, 8, 16, 24)
    assert bucket_ladder(1) == (1,) and bucket_ladder(0) == ()


def _w(rows: int, key=((8,),)) -> Work:
    return Work({"x": np.full((rows, 8), rows, np.float32)}, None, rows, key, Future(), 0)


def test_groups_keep_arrival_order_and_the_row_limit() -> None:
    a, b, c, d, e = _w(3), _w(2, key=((9,),)), _w(4), _w(2), _w(1, key=((9,),))
    groups = groups_of([a, b, c, d, e], limit=8)
    assert groups == [[a, c], [b, e], [d]]         # a+c = 7 rows; d would make 9 > 8: a new group


def test_fit_splits_only_when_that_serves_more_rows_per_second() -> None:
    ladder = bucket_ladder(32)
    group = [_w(1) for _ in range(20)]
    key = group[0].key
    gpu, cpu = Costs(), Costs()
    for b in ladder:
        gpu.add(key, b, 1.5e-3 + 0.5e-3 * b)      # time grows with the batch: 16 rows now, 4 next time
        cpu.add(key, b, 0.2e-3)                    # the same at any size: pad 20 up to 32
    now, later = fit(group, ladder, gpu)
    assert now == group[:16] and later == group[16:]
    assert fit(group, ladder, cpu) == (group, [])
    assert fit(group, ladder, Costs()) == (group, [])                  # nothing measured: pad
    assert fit(group[:16], ladder, gpu) == (group[:16], [])            # a bucket exactly
    multi = [_w(3), _w(3), _w(3), _w(3), _w(3), _w(3)]                 # 18 rows: the head holds 15 (5 requests)
    now, later = fit(multi, ladder, gpu)
    assert len(now) == 5 and later == multi[5:]


def test_stack_pads_with_the_last_row_and_split_drops_it() -> None:
    x1, x2 = np.arange(8, dtype=np.float32).reshape(1, 8), np.ones((2, 8), np.float32) * 5
    s = stack([x1, x2], 4)
    assert s.shape == (4, 8) and (s[3] == x2[-1]).all()
    assert stack([x2], 2) is x2                   # nothing to copy
    parts = split({"y": s * 2}, [1, 2])
    np.testing.assert_array_equal(parts[0]["y"], x1 * 2)
    np.testing.assert_array_equal(parts[1]["y"], x2 * 2)


def test_32_concurrent_grpc_clients_each_get_their_own_answer(server, repo_dir) -> None:
    import tritonclient.grpc as tg
    model = server.repo.models["mlp"]
    before = model.stats.snapshot()
    engine = sp.compile(os.path.join(repo_dir, "mlp.onnx"), disk_cache=False)
    n_clients, per_client = 32, 6
    barrier = threading.Barrier(n_clients)
    errors: list[str] = []

    def client(k: int) -> None:
        rng = np.random.RandomState(100 + k)
        c = tg.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            barrier.wait()
            for j in range(per_client):
                rows = 1 if j % 3 else 1 + (k % 3)          # mostly batch-1, some 2 and 3 rows
                x = rng.rand(rows, 8).astype(np.float32)
                i = tg.InferInput("x", [rows, 8], "FP32")
                i.set_data_from_numpy(x)
                got = c.infer("mlp", [i], request_id=f"{k}.{j}")
                if got.get_response().id != f"{k}.{j}":
                    errors.append(f"client {k}: response id {got.get_response().id}")
                y = got.as_numpy("y")
                if y.shape != (rows, 4) or not np.allclose(y, mlp_ref(x), rtol=1e-5, atol=1e-6):
                    errors.append(f"client {k} request {j}: wrong rows")
                alone = engine.run({"x": x})["y"]           # its own single-request answer
                if not np.allclose(y, alone, rtol=1e-6, atol=1e-7):
                    errors.append(f"client {k} request {j}: differs from its single-request answer")
        except Exception as e:  # noqa: BLE001
            errors.append(f"client {k}: {type(e).__name__}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    after = model.stats.snapshot()
    requests = n_clients * per_client
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == requests
    calls = after["execution_count"] - before["execution_count"]
    assert calls < requests, f"{calls} engine calls for {requests} requests: nothing was batched"
    sizes = {b["batch_size"] for b in after["batch_stats"]}
    assert sizes <= {1, 2, 4, 8, 16, 32} and max(sizes) > 1
    plans = model.plan_stats()
    assert len(plans) == 6 and all(p["pinned"] for p in plans)    # still only the bucket plans


def test_a_failing_request_in_a_batch_fails_alone(server) -> None:
    """gather's window is 300 ms: three requests submitted together share one engine call, which fails
    on the out-of-range index; each is re-run alone and only that one gets the error."""
    from shapeplan.errors import ExecutionError
    from shapeplan.serve.kserve.protocol import InferRequest
    model = server.repo.models["gather"]
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = [np.array([[1]]), np.array([[10]]), np.array([[3]])]
    futures = [model.submit(InferRequest({"data": data[i:i + 1], "idx": idx[i]})) for i in range(3)]
    assert futures[0].result(timeout=30)["out"].tolist() == [[1.0]]
    with pytest.raises(ExecutionError, match="index 10 is out of bounds"):
        futures[1].result(timeout=30)
    assert futures[2].result(timeout=30)["out"].tolist() == [[11.0]]
    # and over HTTP: the error is a 500 with the node named, the model keeps serving
    import urllib.request
    body = json.dumps({"inputs": [{"name": "data", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                                  {"name": "idx", "datatype": "INT64", "shape": [1, 1], "data": [7]}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v2/models/gather/infer", body)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 500 and "GatherElements" in json.loads(e.value.read())["error"]
    assert model.submit(InferRequest({"data": data[:1], "idx": idx[0]})).result(timeout=30)["out"].tolist() == [[1.0]]


def test_batching_off_and_two_instances(tmp_path) -> None:
    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    from shapeplan.serve.kserve.protocol import InferRequest
    os.makedirs(tmp_path / "solo")
    mlp_onnx(str(tmp_path / "solo" / "model.onnx"))
    (tmp_path / "solo" / "config.json").write_text(json.dumps({"dynamic_batching": False, "instance_count": 2}))
    with KServeServer(ModelRepository(discover(str(tmp_path))), http_port=None, grpc_port=None) as s:
        m = s.repo.models["solo"]
        assert m.spec.max_batch_size == 32 and not m.spec.batching and m.spec.buckets == ()
        xs = [np.random.RandomState(i).rand(1 + i % 2, 8).astype(np.float32) for i in range(12)]
        futs = [m.submit(InferRequest({"x": x})) for x in xs]
        for x, f in zip(xs, futs):
            np.testing.assert_allclose(f.result(timeout=30)["y"], mlp_ref(x), rtol=1e-5, atol=1e-6)
        st = m.stats.snapshot()
        assert st["execution_count"] == 12 and st["inference_count"] == sum(len(x) for x in xs)
        assert {p["instance"] for p in m.plan_stats()} == {0, 1}
    assert not [t for t in threading.enumerate() if t.name.startswith("shapeplan-serve-solo")]


def test_outputs_that_pass_an_input_through_survive_the_next_batch(tmp_path) -> None:
    """Batches are copied into staging buffers that the next batch overwrites; an output that is the input
    (Identity, run slot by slot: the engine returns its register) must not change under an earlier caller."""
    import onnx
    from onnx import TensorProto, helper

    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    from shapeplan.serve.kserve.protocol import InferRequest
    os.makedirs(tmp_path / "ident")
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "ident",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "ident" / "model.onnx"))
    (tmp_path / "ident" / "config.json").write_text(json.dumps({"mode": "slot_by_slot", "max_batch_size": 4}))
    with KServeServer(ModelRepository(discover(str(tmp_path))), http_port=None, grpc_port=None) as s:
        m = s.repo.models["ident"]
        a, b = np.ones((3, 4), np.float32), np.full((3, 4), 2, np.float32)
        ya = m.submit(InferRequest({"x": a})).result(timeout=30)["y"]
        yb = m.submit(InferRequest({"x": b})).result(timeout=30)["y"]
        np.testing.assert_array_equal(ya, a)
        np.testing.assert_array_equal(yb, b)


def test_servers_start_and_stop_in_any_order(tmp_path) -> None:
    """gRPC servers share one event loop (grpcio binds its asyncio completion queue to the first loop):
    stopping the first of two must leave the second serving. While any server runs the GIL switch
    interval is lowered; the last one to stop restores it."""
    import sys

    import grpc

    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    from shapeplan.serve.kserve.server import GIL_SWITCH_INTERVAL_S
    mlp_onnx(str(tmp_path / "m.onnx"))
    before = sys.getswitchinterval()
    a = KServeServer(ModelRepository(discover(str(tmp_path))), http_port=None, grpc_port=0).start()
    b = KServeServer(ModelRepository(discover(str(tmp_path))), http_port=None, grpc_port=0).start()
    assert sys.getswitchinterval() <= GIL_SWITCH_INTERVAL_S
    a.stop()
    with grpc.insecure_channel(f"127.0.0.1:{b.grpc_port}") as ch:
        live = ch.unary_unary("/inference.GRPCInferenceService/ServerLive")
        assert live(b"", timeout=30) == b"\x08\x01"           # ServerLiveResponse(live=True)
    b.stop()
    assert sys.getswitchinterval() == before
