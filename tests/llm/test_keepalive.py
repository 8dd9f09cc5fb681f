"""`shapeplan generate --keep-alive` (shapeplan/commands/_keepalive.py): the client streams what the in-process
command prints, imports no torch, and a server per model and options answers bad requests, clients that go away,
`shapeplan ps` / `stop`, and ends when its keep-alive runs out. Real processes and a real Unix socket."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from shapeplan.env import duration
from shapeplan._light import light_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--max-prefill-length", "32", "--max-kv-cache-length", "64"]
OTHER = ["--max-prefill-length", "32", "--max-kv-cache-length", "72"]        # another server (each test its own)


@pytest.fixture(scope="module")
def rundir(tmp_path_factory):
    """A runtime directory of this module's servers (XDG_RUNTIME_DIR), and their plan cache; every server
    still running is stopped at the end."""
    base = tmp_path_factory.mktemp("keepalive")
    run = tempfile.mkdtemp(prefix="sp-ka-", dir="/tmp")        # short: a socket's path has at most 108 bytes
    env = dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=run, SHAPEPLAN_CACHE_DIR=str(base / "cache"))
    env.pop("SHAPEPLAN_KEEP_ALIVE", None)
    yield env
    subprocess.run([sys.executable, "-m", "shapeplan", "stop"], env=env, cwd=ROOT, capture_output=True, timeout=60)
    shutil.rmtree(run, ignore_errors=True)


def _sp(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shapeplan", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _servers(env: dict) -> list[dict]:
    p = _sp(env, "ps", "--json")
    assert p.returncode == 0, p.stderr
    return [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]


def _gone(pid: int, within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_durations_and_which_processes_stay_light(monkeypatch):
    assert [duration(v) for v in ("0", "300", "2.5s", "5m", "1.5h", " 10 ")] == [0, 300, 2.5, 300, 5400, 10]
    for bad in ("", "-1", "5x", "m", "inf"):
        with pytest.raises(ValueError, match="seconds, or a number with s, m or h"):
            duration(bad)
    monkeypatch.delenv("SHAPEPLAN_KEEP_ALIVE", raising=False)
    assert light_command(["ps"]) and light_command(["stop", "--model", "x"])
    assert light_command(["generate", "--model", "m", "--keep-alive", "5m"])
    assert light_command(["generate", "--keep-alive=30", "--model", "m"])
    assert not light_command(["generate", "--model", "m"])                       # in-process: the engine
    assert not light_command(["generate", "--model", "m", "--keep-alive", "0"])
    assert not light_command(["generate", "--model", "m", "--keep-alive", "5m", "--tp", "2"])
    assert not light_command(["bench", "--keep-alive", "5"]) and not light_command([])
    monkeypatch.setenv("SHAPEPLAN_KEEP_ALIVE", "1h")
    assert light_command(["generate", "--model", "m"])
    assert not light_command(["generate", "--model", "m", "--keep-alive", "0"])  # the flag wins


def test_the_server_streams_what_the_command_prints(checkpoints, rundir):
    """First run (starts the server), second (reuses it), greedy and seeded sampling, --chat: stdout byte for
    byte the in-process command's; one server for the key, its requests counted; the client imports no torch."""
    path = checkpoints("llama")
    runs = [["--prompt", "Hello world", "--max-new-tokens", "12"],
            ["--prompt", "Hello world", "--max-new-tokens", "12", "--temperature", "0.8", "--seed", "7"],
            ["--prompt", "Hi there", "--max-new-tokens", "6", "--chat"]]
    for args in runs:
        want = _sp(rundir, "generate", "--model", path, *args, *SMALL)
        assert want.returncode == 0, want.stderr[-2000:]
        for _ in range(2):
            got = _sp(rundir, "generate", "--model", path, *args, *SMALL, "--keep-alive", "120")
            assert got.returncode == 0, got.stderr[-2000:]
            assert got.stdout == want.stdout
    recs = [r for r in _servers(rundir) if r["max_kv_cache_length"] == 64]
    assert len(recs) == 1 and recs[0]["requests"] == 6 and recs[0]["model"] == os.path.realpath(path)
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "shapeplan", "generate", "--model", path,
                        "--prompt", "Hi", "--max-new-tokens", "2", *SMALL, "--keep-alive", "120", "--timings",
                        "--metrics"],
                       env=rundir, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    assert "shapeplan.commands._keepalive" in imported
    heavy = sorted(m for m in imported if m.split(".")[0] in ("torch", "numpy", "triton", "tokenizers", "safetensors"))
    assert not heavy, heavy[:10]
    t = json.loads(next(ln for ln in p.stderr.splitlines() if ln.startswith("timings {"))[len("timings "):])
    assert "keep-alive server: already running" in p.stderr and t["server: find or start"] >= 0
    assert "[2 tokens, finish=length, TTFT" in p.stderr and "late_steady" in p.stderr         # --metrics
    assert sum(v for k, v in t.items() if k != "in process") <= t["in process"] + 0.05


def test_bad_requests_and_clients_that_go_away_leave_the_server_serving(checkpoints, rundir):
    path = checkpoints("llama")
    ok = ["generate", "--model", path, "--prompt", "Hello world", "--max-new-tokens", "8", *OTHER,
          "--keep-alive", "120"]
    first = _sp(rundir, *ok)
    assert first.returncode == 0, first.stderr[-2000:]
    bad = _sp(rundir, "generate", "--model", path, "--prompt", "Hi", "--presence-penalty", "3", *OTHER,
              "--keep-alive", "120")
    assert bad.returncode == 1 and "error: InputError: presence_penalty must be in [-2, 2], got 3.0" in bad.stderr
    rec = next(r for r in _servers(rundir) if r["max_kv_cache_length"] == 72)
    for raw, says in [(b"{not json\n", "not a JSON line"), (b"[1, 2]\n", "expected a JSON object, got list"),
                      (b'{"prompt": "Hi"}\n', "'max_new_tokens' must be int, got None"),
                      (b'{"prompt": "Hi", "max_new_tokens": 2, "keep_alive": -1}\n', "'keep_alive' must be seconds")]:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(rec["socket"])
            s.sendall(raw)
            answer = json.loads(b"".join(iter(lambda: s.recv(65536), b"")))
        assert answer["error"]["type"] == "InputError" and says in answer["error"]["message"], answer
    with socket.socket(socket.AF_UNIX) as s:                              # a client gone after its first delta
        s.connect(rec["socket"])
        s.sendall(json.dumps({"prompt": "Hello world", "max_new_tokens": 40, "keep_alive": 120}).encode() + b"\n")
        got = b""
        while got.count(b"\n") < 2:
            got += s.recv(4096)
        assert b'"start"' in got
    again = _sp(rundir, *ok)
    assert again.returncode == 0 and again.stdout == first.stdout
    assert [r["pid"] for r in _servers(rundir) if r["max_kv_cache_length"] == 72] == [rec["pid"]]


def test_a_load_error_reaches_the_client_and_ends_the_server(tmp_path, rundir):
    p = _sp(rundir, "generate", "--model", str(tmp_path / "missing"), "--prompt", "Hi", "--keep-alive", "60")
    assert p.returncode == 1
    assert "error: ModelError:" in p.stderr and "missing" in p.stderr
    assert not [r for r in _servers(rundir) if r["model"] == os.path.realpath(tmp_path / "missing")]
    args = _sp(rundir, "generate", "--model", "x", "--prompt", "Hi", "--keep-alive", "60", "--tp", "2")
    assert args.returncode == 1 and "not with --tp 2" in args.stderr
    flag = _sp(rundir, "generate", "--model", "x", "--prompt", "Hi", "--keep-alive", "5x")
    assert flag.returncode == 2 and "--keep-alive: '5x': expected seconds" in flag.stderr


def test_options_make_another_server_and_servers_end_on_their_own_or_on_stop(checkpoints, rundir):
    """Two clients at once start one server; other engine options are another server; a server ends when its
    keep-alive runs out, and `shapeplan stop --model` ends the model's servers (their files go with them)."""
    path = checkpoints("llama")
    base = ["generate", "--model", path, "--prompt", "Hello", "--max-new-tokens", "4", "--max-prefill-length", "32"]
    cmd = [sys.executable, "-m", "shapeplan", *base, "--max-kv-cache-length", "96", "--keep-alive", "120"]
    both = [subprocess.Popen(cmd, env=rundir, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in both]
    assert [p.returncode for p in both] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    short = _sp(rundir, *base, "--max-kv-cache-length", "80", "--keep-alive", "1")
    assert short.returncode == 0, short.stderr[-2000:]
    recs = {r["max_kv_cache_length"]: r for r in _servers(rundir)}
    assert recs[96]["requests"] == 2 and 80 in recs
    assert _gone(recs[80]["pid"], within=30)                              # 1 s after its request
    assert 80 not in {r["max_kv_cache_length"] for r in _servers(rundir)}
    stopped = _sp(rundir, "stop", "--model", path)
    assert stopped.returncode == 0 and f"stopped {recs[96]['pid']}" in stopped.stdout
    assert _gone(recs[96]["pid"], within=30)
    assert not [r for r in _servers(rundir) if r["model"] == os.path.realpath(path)]
    assert not os.path.exists(recs[96]["socket"])
    assert "no keep-alive server running" in _sp(rundir, "stop", "--model", path).stdout


def test_bench_startup_times_the_kept_alive_command(tmp_path, monkeypatch, capsys):
    """bench/startup.py --generate-cmd --keep-alive: the first run starts the server, the second streams from
    it (its breakdown says so), and no server is left after the benchmark."""
    from bench import startup
    run = tempfile.mkdtemp(prefix="sp-ka-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", run)
    rc = startup.main(["--generate-cmd", "--preset", "llama-tiny", "--dtype", "float32", "--device", "cpu",
                       "--runs", "2", "--new-tokens", "8", "--keep-alive", "120", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    first, second = json.loads((tmp_path / "r.json").read_text())
    assert first["server: load or wait"] > second["server: load or wait"] >= 0
    assert second["wall"] + 0.02 >= second["in process"] > 0 and second["decode"] > 0   # (/proc: 10 ms ticks)
    assert "the first run starts the server" in out
    assert not [n for n in os.listdir(os.path.join(run, "shapeplan")) if n.endswith((".sock", ".json"))]
    shutil.rmtree(run, ignore_errors=True)


def test_the_runtime_directory_is_private_and_short(tmp_path, monkeypatch):
    from shapeplan.commands import _keepalive as ka
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / ("x" * 80)))              # missing: /tmp/shapeplan-UID
    assert ka.runtime_dir() == f"/tmp/shapeplan-{os.getuid()}"
    (tmp_path / ("x" * 80)).mkdir()                                               # too long for a socket's path
    assert ka.runtime_dir() == f"/tmp/shapeplan-{os.getuid()}"
    short = tempfile.mkdtemp(prefix="sp-ka-", dir="/tmp")
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", short)
        path = ka.runtime_dir()
        assert path == os.path.join(short, "shapeplan") and os.stat(path).st_mode & 0o777 == 0o700
        os.chmod(path, 0o777)                                                     # others may write: refused
        with pytest.raises(PermissionError, match="no one else may write"):
            ka.runtime_dir()
        p = _sp(dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=short), "generate", "--model", "m", "--prompt",
                "Hi", "--keep-alive", "60")
        assert p.returncode == 1 and "error: PermissionError: keep-alive:" in p.stderr and "mode 777" in p.stderr
        for cmd in ("ps", "stop"):
            p = _sp(dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=short), cmd)
            assert p.returncode == 1 and "error: PermissionError: keep-alive:" in p.stderr
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_a_light_process_imports_the_engine_on_first_use():
    """In a light command's process `import shapeplan` imports no torch; its names then import on first use, and
    `shapeplan.optimize` is the function again after them (importing the optimizer package had bound its name)."""
    script = ("import sys, types\n"
              "sys.argv = ['shapeplan', 'ps']\n"          # a `shapeplan ps` process (the console script's argv)
              "import shapeplan as sp\n"
              "light = 'torch' not in sys.modules\n"
              "import shapeplan.optimize.manager\n"
              "print(light, sp.Graph.__name__, sp.Engine.__name__, 'torch' in sys.modules,\n"
              "      isinstance(sp.optimize, types.FunctionType))\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["True", "Graph", "Engine", "True", "True"]
