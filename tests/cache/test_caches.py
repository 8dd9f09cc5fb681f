"""In-memory plan cache (LRU, pinning, count cap, byte budget) and the disk cache."""
from __future__ import annotations

import os

import numpy as np
import pytest

import shapeplan as sp
from shapeplan.cache.disk import DiskCache
from shapeplan.cache.memory import PlanCache
from shapeplan.errors import CacheError
from tests.runtime.graphs import mlp, rand


class Blob:
    def __init__(self, n):
        self.nbytes = n
        self.released = False


def test_lru_count_cap_and_pinning():
    evicted = []
    c = PlanCache(max_entries=2, max_bytes=None, on_evict=lambda k, v: evicted.append(k))
    c.put("a", Blob(1)); c.put("b", Blob(1))
    c.get("a")                               # b is now least recently used
    with c.pinned("b"):
        c.put("c", Blob(1))                  # b pinned: a goes instead
        assert "b" in c and "a" not in c
    assert evicted == ["a"]
    c.put("d", Blob(1))
    assert "b" not in c and len(c) == 2


def test_byte_budget(diag):
    c = PlanCache(max_entries=10, max_bytes=100)
    c.put("a", Blob(60)); c.put("b", Blob(60))
    assert "a" not in c and "b" in c
    assert any(e.fields.get("reason") == "byte budget" for e in diag.events("CACHE"))


def test_engine_evicts_plans_beyond_cap(diag):
    e = sp.Engine(mlp(), mode="emulated_replay", max_plans=2)
    for b in (1, 2, 3, 4):
        e.run({"x": rand(b, 8)})
    assert len(e.cache) == 2 and e.cache.evictions == 2
    assert len([ev for ev in diag.events("CACHE") if ev.message == "plan evicted"]) == 2


def _compile(tmp_path, **kw):
    return sp.compile(mlp(), optimize=False, disk_cache=True, cache_dir=str(tmp_path), **kw)


def test_warm_start_from_disk_skips_compilation(tmp_path):
    cold = _compile(tmp_path)
    warm = _compile(tmp_path)
    assert cold.compile_info["source"] == "compiled" and warm.compile_info["source"] == "disk"
    x = rand(3, 8)
    for _ in range(5):
        a, b = cold.run({"x": x}), warm.run({"x": x})
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]      # atomic writes left nothing


@pytest.mark.parametrize("damage", ["truncate", "tamper", "version", "foreign", "fingerprint"])
def test_bad_entry_is_reported_and_recompiled(tmp_path, diag, damage):
    _compile(tmp_path)
    (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "tamper":
        data[-10] ^= 0xFF
    elif damage == "version":
        data[8] = 99
    elif damage == "foreign":
        data[:8] = b"PK\x03\x04xxxx"
    open(path, "wb").write(bytes(data))
    kw = {}
    if damage == "fingerprint":
        from shapeplan.cache import fingerprint as fpm
        orig = fpm.fingerprint
        kw = {}
        import unittest.mock as um
        with um.patch.object(fpm, "fingerprint", lambda d="cpu": {**orig(d), "torch": "0.0"}):
            e = _compile(tmp_path)
            assert e.compile_info["source"] == "compiled"
            return
    e = _compile(tmp_path, **kw)
    assert e.compile_info["source"] == "compiled"
    assert any("rejected" in ev.message for ev in diag.events("CACHE"))
    assert _compile(tmp_path).compile_info["source"] == "disk"      # rewritten good entry


def test_plans_of_other_sources_are_not_reused(tmp_path, monkeypatch):
    """The fingerprint holds a digest of shapeplan's sources: a plan compiled by other code (an edited
    checkout, another commit of the same version) is compiled again, not loaded."""
    from shapeplan.cache import fingerprint as fpm
    assert _compile(tmp_path).compile_info["source"] == "compiled"
    assert _compile(tmp_path).compile_info["source"] == "disk"
    monkeypatch.setattr(fpm, "sources_digest", lambda: "0" * 16)
    assert _compile(tmp_path).compile_info["source"] == "compiled"
    monkeypatch.undo()
    assert fpm.sources_digest() == fpm.sources_digest.__wrapped__()      # recomputed: the same contents


def test_override_dir_has_priority_and_force_recompile(tmp_path, monkeypatch):
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    _compile(ro)
    monkeypatch.setenv("SHAPEPLAN_CACHE_OVERRIDE_DIR", str(ro))
    e = _compile(rw)
    assert e.compile_info["source"] == "disk" and not rw.exists()
    monkeypatch.setenv("SHAPEPLAN_CACHE_FORCE_RECOMPILE", "1")
    assert _compile(rw).compile_info["source"] == "compiled"


def test_unpack_rejects_garbage():
    from shapeplan.plan.serialize import unpack
    for data in (b"", b"SHPPLAN\0", os.urandom(200)):
        with pytest.raises(CacheError):
            unpack(data)


def test_cli_cache_ls_and_clear(tmp_path, capsys):
    from shapeplan.cli import main
    _compile(tmp_path)
    assert main(["cache", "ls", "--dir", str(tmp_path)]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert DiskCache(str(tmp_path)).entries() == []


def test_cli_cache_clear_all_removes_kernel_caches(tmp_path, monkeypatch, capsys):
    """``cache clear --all`` also removes the Triton cache (under ours), generated sources, verdicts and
    frozen-plan records;
    ``ls`` counts them; a TRITON_CACHE_DIR outside our cache directory is never deleted."""
    from shapeplan.cli import main
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    k = tmp_path / "triton" / "ABC"
    k.mkdir(parents=True)
    (k / "kern.cubin").write_bytes(b"x")
    (tmp_path / "triton_src").mkdir()
    (tmp_path / "triton_src" / "fused_1.py").write_text("# k")
    (tmp_path / "triton_verified.txt").write_text("a\nb\n")
    (tmp_path / "frozen").mkdir()
    (tmp_path / "frozen" / "abc.json").write_text("{}")
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "1 compiled Triton kernel(s), 1 generated source(s), 2 verified step(s), 1 frozen-plan record(s)" in out
    assert main(["cache", "clear"]) == 0                      # plans only
    assert (tmp_path / "triton").exists()
    assert main(["cache", "clear", "--all"]) == 0
    assert not (tmp_path / "triton").exists() and not (tmp_path / "triton_src").exists()
    assert not (tmp_path / "triton_verified.txt").exists() and not (tmp_path / "frozen").exists()
    outside = tmp_path.parent / (tmp_path.name + "_user_triton")
    outside.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(outside))
    assert main(["cache", "clear", "--all"]) == 0
    assert outside.exists()


def test_one_cache_root_for_plans_and_triton(tmp_path, monkeypatch):
    """``SHAPEPLAN_CACHE_DIR`` moves every cache: the plans, Triton's compile cache, generated kernel
    sources, capture-check verdicts and frozen-plan records all land under it."""
    from shapeplan.cache.paths import cache_root
    from shapeplan.runtime import frozen_records
    from shapeplan.runtime.backends.triton import paths as triton_paths
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    assert cache_root() == tmp_path
    e = sp.compile(mlp(), optimize=False, disk_cache=True)
    assert e.compile_info["source"] == "compiled"
    assert DiskCache().directory == str(tmp_path / "plans")
    assert [f for f in os.listdir(tmp_path / "plans") if f.endswith(".plan")]
    assert sp.compile(mlp(), optimize=False, disk_cache=True).compile_info["source"] == "disk"
    paths = triton_paths.kernel_cache_paths()
    assert all(tmp_path in p.parents for p in paths.values()), paths
    assert triton_paths.source_dir().parent == tmp_path
    assert os.path.dirname(frozen_records.directory()) == str(tmp_path)
    monkeypatch.delenv("SHAPEPLAN_CACHE_DIR")
    assert cache_root() != tmp_path and DiskCache().directory == str(cache_root() / "plans")
