"""Models and a running KServe server (HTTP + gRPC on free loopback ports) shared by tests/serve/.

The repository holds:
  mlp       ONNX, x: FP32[-1, 8] -> y: FP32[-1, 4] (MatMul + Add + Relu), batched (max 32, buckets)
  export    torch.export .pt2 of the same kind of MLP (nn.Linear + ReLU), batched
  fixed     ONNX with a fixed shape FP32[2, 3] (no batch dimension: max_batch_size 0)
  gather    ONNX GatherElements(data FP32[-1, 4], idx INT64[-1, 1]): an out-of-range index fails in the
            kernel, so one request of a batch can fail; config.json: a long batching window
"""
from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("grpc")
pytest.importorskip("prometheus_client")

import onnx  # noqa: E402
import torch  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.RandomState(0)
W = RNG.rand(8, 4).astype(np.float32) - 0.5
B = RNG.rand(4).astype(np.float32) - 0.5


def mlp_onnx(path: str, w: np.ndarray = W, b: np.ndarray = B) -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def fixed_onnx(path: str) -> None:
    g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "fixed",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def gather_onnx(path: str) -> None:
    g = helper.make_graph([helper.make_node("GatherElements", ["data", "idx"], ["out"], axis=1)], "gather",
                          [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["n", 4]),
                           helper.make_tensor_value_info("idx", TensorProto.INT64, ["n", 1])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n", 1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


class TorchMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def export_pt2(path: str) -> TorchMLP:
    m = TorchMLP().eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(m, (torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(ep, path)
    return m


@pytest.fixture(scope="session")
def repo_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("repo")
    mlp_onnx(str(d / "mlp.onnx"))
    os.makedirs(d / "export")
    export_pt2(str(d / "export" / "model.pt2"))
    os.makedirs(d / "fixed")
    fixed_onnx(str(d / "fixed" / "model.onnx"))
    os.makedirs(d / "gather")
    gather_onnx(str(d / "gather" / "model.onnx"))
    (d / "gather" / "config.json").write_text(json.dumps({"max_batch_size": 8, "max_queue_delay_us": 300_000}))
    os.makedirs(d / "llm")                                         # an HF checkpoint: skipped
    (d / "llm" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "notes.txt").write_text("not a model")
    return str(d)


@pytest.fixture(scope="session")
def server(repo_dir, tmp_path_factory):
    """One server for the session (compiling and warming its models once)."""
    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        s = KServeServer(ModelRepository(discover(repo_dir)), "127.0.0.1", 0, 0).start()
    yield s
    s.stop()
    ours = ("shapeplan-serve-", "shapeplan-http", "shapeplan-grpc")      # the server's threads
    kept = "shapeplan-grpc-loop"            # the process's one gRPC event loop (grpc_server._Loop) stays, idle
    left = [t.name for t in threading.enumerate() if t.name.startswith(ours) and t.name != kept]
    assert not left, f"threads left after stop: {left}"


@pytest.fixture(scope="session")
def http_client(server):
    """Session-wide: tritonclient.http's client is gevent-based and its __del__ fails when the garbage
    collector runs it on another thread (a server thread), so it is made and dropped once."""
    tc = pytest.importorskip("tritonclient.http")
    c = tc.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    yield c
    c.close()


@pytest.fixture
def grpc_client(server):
    tc = pytest.importorskip("tritonclient.grpc")
    c = tc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    yield c
    c.close()


def mlp_ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


def in_threads(fn, n: int) -> list[str]:
    """``fn(k)`` on n threads at once, k = 0..n-1; what they raised, as ``repr`` strings."""
    errors: list[str] = []

    def run(k: int) -> None:
        try:
            fn(k)
        except Exception as e:  # noqa: BLE001 - returned to the test, which asserts on it
            errors.append(f"thread {k}: {e!r}")
    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
