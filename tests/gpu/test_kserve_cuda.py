"""The KServe server with its model on the GPU: a Triton-layout repository (config.pbtxt, KIND_GPU), 16
concurrent tritonclient clients, half of them passing tensors through system shared memory, each checked
against its own answer; batches formed and replayed (CUDA graphs) on the device."""
from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
for _mod in ("fastapi", "uvicorn", "grpc", "prometheus_client", "tritonclient.grpc"):
    try:                    # tritonclient's generated messages refuse an older protobuf runtime (not an ImportError)
        __import__(_mod)
    except Exception as _e:  # noqa: BLE001
        pytest.skip(f"{_mod}: {_e}", allow_module_level=True)

from tests.serve.conftest import in_threads, mlp_onnx, mlp_ref  # noqa: E402

CONFIG = """
name: "mlp"
backend: "onnxruntime"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
"""


def test_cuda_model_shared_memory_and_batching(tmp_path, monkeypatch) -> None:
    import tritonclient.grpc as tg
    from multiprocessing import shared_memory

    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / "plans"))
    (tmp_path / "repo" / "mlp" / "1").mkdir(parents=True)
    mlp_onnx(str(tmp_path / "repo" / "mlp" / "1" / "model.onnx"))
    (tmp_path / "repo" / "mlp" / "config.pbtxt").write_text(CONFIG)
    (source,) = discover(str(tmp_path / "repo"))
    assert source.config.device == "cuda:0" and source.config.max_batch_size == 16
    with KServeServer(ModelRepository([source]), "127.0.0.1", None, 0) as s:
        barrier = threading.Barrier(16)

        def client(k: int) -> None:
            c = tg.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
            m = None
            try:
                rows = 1 + k % 4
                x = np.random.RandomState(k).rand(rows, 8).astype(np.float32) - 0.5
                i = tg.InferInput("x", [rows, 8], "FP32")
                o = tg.InferRequestedOutput("y")
                if k % 2:
                    m = shared_memory.SharedMemory(name=f"sp-gpu-{uuid.uuid4().hex[:10]}", create=True, size=1024)
                    m.buf[:x.nbytes] = x.tobytes()
                    c.register_system_shared_memory(f"r{k}", "/" + m.name, 1024)
                    i.set_shared_memory(f"r{k}", x.nbytes)
                    o.set_shared_memory(f"r{k}", 512, offset=512)
                else:
                    i.set_data_from_numpy(x)
                barrier.wait(timeout=120)
                for _ in range(8):
                    r = c.infer("mlp", [i], outputs=[o])
                    got = np.frombuffer(bytes(m.buf[512:512 + rows * 16]), np.float32).reshape(rows, 4) \
                        if m is not None else r.as_numpy("y")
                    np.testing.assert_allclose(got, mlp_ref(x), rtol=1e-4, atol=1e-4)
            finally:
                if m is not None:
                    c.unregister_system_shared_memory(f"r{k}")
                    m.close()
                    m.unlink()
                c.close()
        errors = in_threads(client, 16)
        stats = s.repo.get("mlp").statistics()
    assert not errors, errors[:3]
    assert stats["inference_count"] == sum(1 + k % 4 for k in range(16)) * 8
    assert stats["execution_count"] < 128, "no two requests were batched together"
    assert any(p["replays"] > 0 for p in stats["plan_stats"]), stats["plan_stats"]
