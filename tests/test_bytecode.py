"""shapeplan/_bytecode.py: a command's process keeps Python's bytecode under the cache root where the
installed torch ships none; a program importing shapeplan and a prefix the user set are left alone."""
from __future__ import annotations

import importlib
import importlib.util
import os
import py_compile
import subprocess
import sys

import pytest

from shapeplan import _bytecode


@pytest.fixture
def clean_prefix(monkeypatch, tmp_path):
    """No prefix set, writing off (as under PYTHONDONTWRITEBYTECODE), the cache root in tmp_path; sys and
    os.environ are restored after the test."""
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "pycache"


def test_ships_bytecode_looks_beside_the_source(tmp_path, monkeypatch):
    pkg = tmp_path / "sp_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert not _bytecode.ships_bytecode("sp_probe_pkg")
    py_compile.compile(str(pkg / "__init__.py"), cfile=importlib.util.cache_from_source(str(pkg / "__init__.py")))
    assert _bytecode.ships_bytecode("sp_probe_pkg")
    assert _bytecode.ships_bytecode("sp_no_such_module_at_all")        # not found: nothing to do
    assert _bytecode.ships_bytecode("sys")                               # built in: no source


def test_a_library_import_is_left_alone(clean_prefix, monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_PYCACHE", "on")
    assert _bytecode.setup(command=False) is None
    assert sys.pycache_prefix is None and sys.dont_write_bytecode and not clean_prefix.exists()


@pytest.mark.parametrize("mode,ships,want", [("on", True, True), ("on", False, True), ("auto", False, True),
                                             ("auto", True, False), ("off", False, False)])
def test_the_switch_in_a_command(clean_prefix, monkeypatch, mode, ships, want):
    monkeypatch.setenv("SHAPEPLAN_PYCACHE", mode)
    monkeypatch.setattr(_bytecode, "ships_bytecode", lambda module="torch": ships)
    got = _bytecode.setup(command=True)
    if want:
        assert got == str(clean_prefix) and clean_prefix.is_dir()
        assert sys.pycache_prefix == got and not sys.dont_write_bytecode
        assert os.environ["PYTHONPYCACHEPREFIX"] == got                  # child processes read the same tree
    else:
        assert got is None and sys.pycache_prefix is None and sys.dont_write_bytecode
        assert "PYTHONPYCACHEPREFIX" not in os.environ


def test_a_prefix_the_user_set_is_kept(clean_prefix, monkeypatch, tmp_path):
    monkeypatch.setenv("SHAPEPLAN_PYCACHE", "on")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "mine"))
    assert _bytecode.setup(command=True) is None
    assert sys.pycache_prefix == str(tmp_path / "mine")


def test_an_unwritable_cache_root_leaves_python_as_it_was(clean_prefix, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", str(blocker / "cache"))    # below a file: cannot be made
    monkeypatch.setenv("SHAPEPLAN_PYCACHE", "on")
    assert _bytecode.setup(command=True) is None
    assert sys.pycache_prefix is None and sys.dont_write_bytecode


def test_a_relative_cache_dir_gives_an_absolute_prefix(clean_prefix, monkeypatch, tmp_path):
    monkeypatch.setenv("SHAPEPLAN_PYCACHE", "on")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHAPEPLAN_CACHE_DIR", "rel")
    assert _bytecode.setup(command=True) == str(tmp_path / "rel" / "pycache")


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_a_folder_others_may_write_is_not_used(clean_prefix, monkeypatch):
    monkeypatch.setenv("SHAPEPLAN_PYCACHE", "on")
    clean_prefix.mkdir(parents=True)
    clean_prefix.chmod(0o777)
    assert _bytecode.setup(command=True) is None
    assert sys.pycache_prefix is None and sys.dont_write_bytecode
    clean_prefix.chmod(0o700)
    assert _bytecode.setup(command=True) == str(clean_prefix)


def test_a_command_writes_then_reads_torchs_bytecode(tmp_path):
    """Two real `python -m shapeplan` processes under PYTHONDONTWRITEBYTECODE: the first writes torch's
    bytecode into the cache root's mirror tree, the second reads it (the files are not written again)."""
    import torch
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SHAPEPLAN_CACHE_DIR": str(tmp_path / "cache"),
           "SHAPEPLAN_PYCACHE": "on"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    prefix = tmp_path / "cache" / "pycache"
    src = os.path.abspath(torch.__file__)
    pyc = prefix / os.path.relpath(os.path.dirname(src), os.path.sep) / os.path.basename(
        importlib.util.cache_from_source(src))
    cmd = [sys.executable, "-m", "shapeplan", "env"]
    subprocess.run(cmd, env=env, capture_output=True, check=True, timeout=300)
    assert pyc.is_file()
    assert len(list(prefix.rglob("*.pyc"))) > 500                       # torch's modules, ours, the stdlib's
    before = pyc.stat().st_mtime_ns
    subprocess.run(cmd, env=env, capture_output=True, check=True, timeout=300)
    assert pyc.stat().st_mtime_ns == before
    code = "import sys, torch; print(sys.pycache_prefix)"                # a library process: no prefix
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"
