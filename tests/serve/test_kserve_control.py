"""The model repository extension (Triton's): index, load, reload and unload while the server runs,
driven by the official clients (tritonclient.http and tritonclient.grpc)."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from tests.serve.conftest import B, W, export_pt2, mlp_onnx, mlp_ref

tc_http = pytest.importorskip("tritonclient.http")
tc_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture
def explicit(tmp_path, monkeypatch):
    """A server in explicit model control over a repository of mlp (loaded at start), export and broken
    (not loaded); yields (server, repository directory)."""
    from shapeplan.serve.kserve import KServeServer, ModelRepository
    from shapeplan.serve.kserve.repository import find
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / "plans"))
    d = tmp_path / "repo"
    d.mkdir()
    mlp_onnx(str(d / "mlp.onnx"))
    (d / "export").mkdir()
    export_pt2(str(d / "export" / "model.pt2"))
    (d / "broken.onnx").write_bytes(b"not an onnx file")
    repo = ModelRepository([find(str(d), "mlp")], root=str(d), control="explicit")
    s = KServeServer(repo, "127.0.0.1", 0, 0).start()
    yield s, d
    s.stop()


def _x(rows: int = 3) -> np.ndarray:
    return np.random.RandomState(rows).rand(rows, 8).astype(np.float32) - 0.5


def _infer_grpc(c, model: str, x: np.ndarray) -> np.ndarray:
    i = tc_grpc.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return c.infer(model, [i]).as_numpy("y")


def _infer_http(c, model: str, x: np.ndarray) -> np.ndarray:
    i = tc_http.InferInput("x", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return c.infer(model, [i]).as_numpy("y")


def _index(c) -> dict:
    return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in c.get_model_repository_index()}


def test_index_load_unload_with_the_official_clients(explicit) -> None:
    s, d = explicit
    h = tc_http.InferenceServerClient(f"127.0.0.1:{s.http_port}")
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    try:
        assert "model_repository" in h.get_server_metadata()["extensions"]
        assert _index(h) == {"mlp": ("READY", ""), "export": ("", ""), "broken": ("", "")}
        grpc_index = g.get_model_repository_index(as_json=True)["models"]
        assert {m["name"]: m.get("state", "") for m in grpc_index} == {"mlp": "READY", "export": "", "broken": ""}
        assert [m["name"] for m in h.get_model_repository_index(query_params=None)] == ["broken", "export", "mlp"]
        assert not h.is_model_ready("export")

        g.load_model("export")                                  # gRPC load: compiled and warmed up
        assert h.is_model_ready("export") and g.is_model_ready("export")
        import torch
        from tests.serve.conftest import TorchMLP
        x = _x()
        want = TorchMLP().eval()(torch.from_numpy(x)).detach().numpy()
        meta = h.get_model_metadata("export")
        (inp,), (out,) = meta["inputs"], meta["outputs"]
        i = tc_http.InferInput(inp["name"], list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        np.testing.assert_allclose(h.infer("export", [i]).as_numpy(out["name"]), want, rtol=1e-5, atol=1e-6)
        assert _index(h)["export"] == ("READY", "")

        h.unload_model("mlp")                                   # HTTP unload
        assert not h.is_model_ready("mlp") and not g.is_model_ready("mlp")
        assert _index(h)["mlp"] == ("UNAVAILABLE", "unloaded")
        with pytest.raises(InferenceServerException, match="model 'mlp' is not loaded .unavailable: unloaded."):
            _infer_grpc(g, "mlp", x)
        with pytest.raises(InferenceServerException, match="not loaded"):
            _infer_http(h, "mlp", x)
        h.unload_model("mlp")                                   # again: nothing to do, no error
        ready = [m["name"] for m in h.get_model_repository_index() if m.get("state") == "READY"]
        assert ready == ["export"]
        h.load_model("mlp")                                     # back
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), mlp_ref(x), rtol=1e-5, atol=1e-6)
    finally:
        h.close()
        g.close()


def test_ready_filter_over_http(explicit) -> None:
    import httpx
    s, _ = explicit
    r = httpx.post(f"http://127.0.0.1:{s.http_port}/v2/repository/index", json={"ready": True})
    assert r.status_code == 200 and r.json() == [{"name": "mlp", "version": "1", "state": "READY", "reason": ""}]
    r = httpx.post(f"http://127.0.0.1:{s.http_port}/v2/repository/index", json={"ready": "yes"})
    assert r.status_code == 400 and "'ready' must be true or false" in r.json()["error"]


def test_reload_reads_the_new_file_and_a_config_override(explicit) -> None:
    s, d = explicit
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    try:
        x = _x()
        w2, b2 = (W * -2.0).astype(np.float32), (B + 0.25).astype(np.float32)
        mlp_onnx(str(d / "mlp.onnx"), w2, b2)          # a new version of the file
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), mlp_ref(x), rtol=1e-5, atol=1e-6)  # old one serves
        g.load_model("mlp")
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), np.maximum(x @ w2 + b2, 0), rtol=1e-5, atol=1e-6)
        g.load_model("mlp", config=json.dumps({"max_batch_size": 4, "max_queue_delay_us": 0}))
        cfg = s.repo.get("mlp").config
        assert cfg.max_batch_size == 4 and cfg.max_queue_delay_us == 0
        with pytest.raises(InferenceServerException, match="takes 1 to 4 rows per request"):
            _infer_grpc(g, "mlp", _x(5))
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), np.maximum(x @ w2 + b2, 0), rtol=1e-5, atol=1e-6)
        # Triton's JSON form of config.pbtxt, as tritonclient users send it to Triton
        g.load_model("mlp", config=json.dumps({"name": "mlp", "backend": "onnxruntime", "max_batch_size": 8,
                                               "dynamic_batching": {"max_queue_delay_microseconds": 50},
                                               "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
                                               "optimization": {"input_pinned_memory": {"enable": True}}}))
        cfg = s.repo.get("mlp").config
        assert (cfg.max_batch_size, cfg.dynamic_batching, cfg.max_queue_delay_us, cfg.instance_count, cfg.device) \
            == (8, True, 50, 2, "cpu")
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), np.maximum(x @ w2 + b2, 0), rtol=1e-5, atol=1e-6)
        with pytest.raises(InferenceServerException, match="platform 'tensorrt_plan' is not one shapeplan runs"):
            g.load_model("mlp", config=json.dumps({"platform": "tensorrt_plan"}))
        with pytest.raises(InferenceServerException, match="not a Triton model config"):
            g.load_model("mlp", config=json.dumps({"max_batch_size": "many", "instance_group": []}))
    finally:
        g.close()


def test_upload_files(explicit, tmp_path) -> None:
    import httpx
    s, _ = explicit
    src = tmp_path / "upload.onnx"
    w3 = (W + 0.5).astype(np.float32)
    mlp_onnx(str(src), w3, B)
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    try:
        g.load_model("uploaded", config="{}", files={"file:1/model.onnx": src.read_bytes()})
        x = _x()
        np.testing.assert_allclose(_infer_grpc(g, "uploaded", x), np.maximum(x @ w3 + B, 0), rtol=1e-5, atol=1e-6)
        assert _index_grpc(g)["uploaded"] == ("READY", "")
        folder = s.repo._uploads["uploaded"]
        assert os.path.isdir(folder)
        # over HTTP: base64 text, as the protocol says (tritonclient.http 2.41 cannot send files: it puts bytes
        # in its JSON), here with httpx; it replaces the upload above
        body = {"parameters": {"file:model.onnx": base64.b64encode(src.read_bytes()).decode()}}
        r = httpx.post(f"http://127.0.0.1:{s.http_port}/v2/repository/models/uploaded/load", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert not os.path.exists(folder) and os.path.isdir(s.repo._uploads["uploaded"])
        folder = s.repo._uploads["uploaded"]
        g.unload_model("uploaded")
        assert not os.path.exists(folder)
    finally:
        g.close()


@pytest.mark.parametrize("how,params,status,words", [
    ("http", None, 404, ["no model 'nope' in the model repository", "'mlp'"]),
    ("http", {"config": "{not json"}, 400, ["parameter 'config' is not JSON"]),
    ("http", {"config": json.dumps({"max_batch_sizes": 2})}, 400, ["unknown key(s) ['max_batch_sizes']"]),
    ("http", {"config": 3}, 400, ["parameter 'config' must be a JSON string, got int"]),
    ("http", {"file:../evil.onnx": base64.b64encode(b"x").decode()}, 400, ["expected 'file:<relative path>'"]),
    ("http", {"file:model.onnx": "***"}, 400, ["is not base64"]),
    ("http", {"file:a.txt": base64.b64encode(b"x").decode()}, 400, ["hold 0 model files"]),
    ("http", {"colour": "red"}, 400, ["unknown parameter 'colour'"]),
])
def test_bad_loads_name_what_is_wrong_and_nothing_stops(explicit, how, params, status, words) -> None:
    import httpx
    s, _ = explicit
    name = "nope" if params is None else "mlp"
    body = {} if params is None else {"parameters": params}
    r = httpx.post(f"http://127.0.0.1:{s.http_port}/v2/repository/models/{name}/load", json=body, timeout=60)
    assert r.status_code == status, r.text
    for w in words:
        assert w in r.json()["error"]
    x = _x()
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    try:
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), mlp_ref(x), rtol=1e-5, atol=1e-6)
    finally:
        g.close()


def test_a_failed_load_is_reported_and_the_old_model_keeps_serving(explicit) -> None:
    s, d = explicit
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    try:
        with pytest.raises(InferenceServerException, match="failed to load 'broken'") as e:
            g.load_model("broken")
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        state, reason = _index_grpc(g)["broken"]
        assert state == "UNAVAILABLE" and reason.startswith("failed to load")
        with pytest.raises(InferenceServerException, match="is not loaded .unavailable: failed to load"):
            _infer_grpc(g, "broken", _x())
        shutil.copy(d / "broken.onnx", d / "mlp.onnx")          # mlp's file is now broken too: its reload fails
        with pytest.raises(InferenceServerException, match="failed to load 'mlp'"):
            g.load_model("mlp")
        x = _x()
        np.testing.assert_allclose(_infer_grpc(g, "mlp", x), mlp_ref(x), rtol=1e-5, atol=1e-6)
        assert _index_grpc(g)["mlp"] == ("READY", "")
    finally:
        g.close()


def _index_grpc(c) -> dict:
    return {m.name: (m.state, m.reason) for m in c.get_model_repository_index().models}


def test_reload_under_load_loses_no_request(explicit) -> None:
    """Eight clients infer without pause while the model is reloaded three times: every request is
    answered, by the old model or the new one (the same weights here), none fails."""
    s, _ = explicit
    stop, errors, counts = threading.Event(), [], [0] * 8
    x = _x(2)
    want = mlp_ref(x)

    def client(k: int) -> None:
        c = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        try:
            while not stop.is_set():
                try:
                    np.testing.assert_allclose(_infer_grpc(c, "mlp", x), want, rtol=1e-5, atol=1e-6)
                    counts[k] += 1
                except Exception as e:  # noqa: BLE001 - collected and asserted on below
                    errors.append(repr(e))
        finally:
            c.close()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
    try:
        for delay in (0, 4, 0):
            g.load_model("mlp", config=json.dumps({"max_queue_delay_us": delay}))
        deadline = time.monotonic() + 30                     # a loaded machine: let every client get one in
        while min(counts) == 0 and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
        g.close()
    assert not errors, errors[:3]
    assert all(n > 0 for n in counts)


def test_a_request_that_found_the_old_model_is_served_by_the_new_one(explicit) -> None:
    """The moment a reload leaves open, made to happen: a request holding the replaced model is queued
    on its successor, and one holding an unloaded model gets UNAVAILABLE, not silence."""
    from shapeplan.serve.errors import UnavailableError
    from shapeplan.serve.kserve.protocol import InferRequest
    s, d = explicit
    old = s.repo.get("mlp")
    w2 = (W * 3.0).astype(np.float32)
    mlp_onnx(str(d / "mlp.onnx"), w2, B)
    s.repo.load("mlp")
    x = _x()
    got = old.submit(InferRequest({"x": x})).result(timeout=60)["y"]
    np.testing.assert_allclose(got, np.maximum(x @ w2 + B, 0), rtol=1e-5, atol=1e-6)
    new = s.repo.get("mlp")
    s.repo.unload("mlp")
    with pytest.raises(UnavailableError, match="model 'mlp' (is not ready|stopped before it could queue)"):
        new.submit(InferRequest({"x": x}))


def test_fixed_models_refuse_control(server, http_client, grpc_client) -> None:
    index = {m["name"]: m["state"] for m in http_client.get_model_repository_index()}
    assert index == {"mlp": "READY", "export": "READY", "fixed": "READY", "gather": "READY"}
    for c in (http_client, grpc_client):
        with pytest.raises(InferenceServerException, match="model control mode 'none'.*--model-control-mode explicit"):
            c.load_model("mlp")
        with pytest.raises(InferenceServerException, match="model control mode 'none'"):
            c.unload_model("mlp")
    assert http_client.is_model_ready("mlp")


def test_cli_explicit_mode_arguments(tmp_path, capsys) -> None:
    from shapeplan.cli import main
    mlp_onnx(str(tmp_path / "m.onnx"))
    assert main(["serve", str(tmp_path / "m.onnx"), "--model-control-mode", "explicit"]) == 2
    assert "--model-control-mode explicit needs --model-repository DIR" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--load-model", "m"]) == 2
    assert "--load-model needs --model-control-mode explicit" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--model-control-mode", "explicit",
                 "--load-model", "zz", "--port", "0", "--grpc-port", "0"]) == 1
    assert "no model 'zz' in the model repository" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "m.onnx"), "--model-control-mode", "poll"]) == 2
    assert "--model-control-mode poll needs --model-repository DIR" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--model-control-mode", "poll",
                 "--repository-poll-secs", "0"]) == 2
    assert "--repository-poll-secs must be > 0, got 0.0" in capsys.readouterr().err


def test_stop_waits_for_a_load_and_refuses_later_ones(tmp_path, monkeypatch) -> None:
    """A load in progress when the server stops finishes and is stopped with the rest (no worker thread is
    left behind); a load after the stop is UNAVAILABLE."""
    from shapeplan.serve.errors import UnavailableError
    from shapeplan.serve.kserve import ModelRepository
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / "plans"))
    mlp_onnx(str(tmp_path / "a.onnx"))
    mlp_onnx(str(tmp_path / "b.onnx"))
    repo = ModelRepository([], root=str(tmp_path), control="explicit")
    repo.start()
    def load() -> None:
        with contextlib.suppress(UnavailableError):          # the stop came first: refused, as it should be
            repo.load("a")
    loading = threading.Thread(target=load)
    loading.start()
    repo.stop()
    loading.join()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("shapeplan-serve-a-")]
    with pytest.raises(UnavailableError, match="load 'b': the server is stopping"):
        repo.load("b")


def test_poll_mode_follows_the_directory(tmp_path, monkeypatch) -> None:
    """--model-control-mode poll: a model that appears is loaded, a changed file is reloaded, a removed one
    unloaded, a broken one reported in the index; the repository API is refused; the scans run on their own."""
    from shapeplan.serve.kserve import KServeServer, ModelRepository, discover
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / "plans"))
    root = tmp_path / "repo"
    root.mkdir()
    mlp_onnx(str(root / "a.onnx"))
    repo = ModelRepository(discover(str(root)), root=str(root), control="poll", poll_secs=3600)   # scans by hand
    with KServeServer(repo, "127.0.0.1", None, 0) as s:
        g = tc_grpc.InferenceServerClient(f"127.0.0.1:{s.grpc_port}")
        try:
            x = _x()
            assert repo.poll_once() == {}
            mlp_onnx(str(root / "b.onnx"))
            (root / "c.onnx").write_bytes(b"broken")
            assert repo.poll_once() == {"b": "loaded", "c": "failed"}
            np.testing.assert_allclose(_infer_grpc(g, "b", x), mlp_ref(x), rtol=1e-5, atol=1e-6)
            assert _index_grpc(g)["c"][0] == "UNAVAILABLE" and "failed to load" in _index_grpc(g)["c"][1]
            w2 = (W * 2).astype(np.float32)
            time.sleep(0.01)
            mlp_onnx(str(root / "a.onnx"), w2)
            os.remove(root / "b.onnx")
            os.remove(root / "c.onnx")
            assert repo.poll_once() == {"a": "reloaded", "b": "unloaded"}
            np.testing.assert_allclose(_infer_grpc(g, "a", x), np.maximum(x @ w2 + B, 0), rtol=1e-5, atol=1e-6)
            assert _index_grpc(g) == {"a": ("READY", ""), "b": ("UNAVAILABLE", "removed from the model repository")}
            with pytest.raises(InferenceServerException, match="model control mode 'poll'"):
                g.load_model("a")
        finally:
            g.close()
    # the scans run on their own
    repo = ModelRepository([], root=str(root), control="poll", poll_secs=0.05)
    with KServeServer(repo, "127.0.0.1", None, None):
        mlp_onnx(str(root / "d.onnx"))
        deadline = time.monotonic() + 60
        while "d" not in repo.models and time.monotonic() < deadline:
            time.sleep(0.05)
        assert repo.models["d"].ready
    assert not [t.name for t in threading.enumerate() if t.name == "shapeplan-serve-poll"]
