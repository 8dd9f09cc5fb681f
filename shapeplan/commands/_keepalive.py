"""``shapeplan generate --keep-alive DURATION``: the model stays loaded in a background server after the
command ends, and the next ``generate`` of the same model with the same engine options streams from it
instead of starting a process's worth of torch, weights and warm-up again (ollama's ``keep_alive``).

Without it (the default, ``--keep-alive 0``) nothing here runs: the command loads the model in its own
process and ends with it. With it:

- The command is a client of a server for its key: the model's files (path, sizes, modification times),
  the engine options (``--device``, ``--mode``, ``--dtype``, the two lengths, ``--chat-template``), every
  ``SHAPEPLAN_*`` switch set, the Python and shapeplan's own source files. A change to any of them is
  another key, so a server never answers with a stale model or engine.
- The client imports the standard library only (``shapeplan/__init__`` skips its eager imports in this
  process: ``shapeplan/_light.py``), connects to the server's Unix socket, sends the request as one JSON line
  and writes the text deltas to stdout as they come, exactly what the in-process command writes.
- No server for the key: the client starts one (``python -m shapeplan _keepalive-server SPEC``, a new
  session, its output in ``KEY.log``) under a lock, so that two clients never start two. The server binds
  its socket before it imports torch, so the client connects at once and its request waits while the
  model loads; a load that fails answers that request with the error, as the in-process command reports
  it, and the server ends.
- The server answers one request at a time (a second client waits; ``shapeplan serve`` is the server for
  many at once), keeps serving after a request's error or a client that went away, and ends DURATION after
  its last request (each request sets DURATION anew), on ``shapeplan stop``, or on SIGTERM / SIGINT.
- Its files live in a directory only this user may use (``$XDG_RUNTIME_DIR/shapeplan``, else, or where that
  path is too long for a socket's address, ``/tmp/shapeplan-UID``; mode 0700, refused when another user owns
  it): ``KEY.sock``, ``KEY.json`` (pid,
  model, options, deadline: what ``shapeplan ps`` lists), ``KEY.log`` and ``KEY.lock``.

Protocol (newline-delimited JSON over the socket). Request: ``{"prompt", "max_new_tokens", "sampling":
{...}, "chat", "keep_alive"}`` or ``{"stop": true}``. Answer: ``{"start": true}`` when the server takes the
request, ``{"text": delta}`` per delta, then ``{"done": {"tokens", "finish", "metrics"}}`` or ``{"error":
{"type", "message"}}``; ``{"stopped": true}`` for a stop.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from shapeplan._light import SERVER_COMMAND


#: the longest directory whose sockets' paths (``/KEY.sock.PID``) fit a Unix socket address (108 bytes on Linux)
SOCKET_DIR_MAX = 64
#: seconds a client waits for a server it started to bind its socket (the server binds before torch imports)
BIND_WAIT_S = 60.0
_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "seed")
_ENGINE = ("device", "mode", "dtype", "max_prefill_length", "max_kv_cache_length", "chat_template")


# ---------------------------------------------------------------- where a server's files live, its key

def runtime_dir(create: bool = True) -> str:
    """This user's directory for the servers' sockets and records (module doc); ``PermissionError`` when
    another user owns it or others may write to it."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    path = os.path.join(base, "shapeplan")
    if not (base and os.path.isdir(base)) or len(path) > SOCKET_DIR_MAX:
        path = os.path.join("/tmp", f"shapeplan-{os.getuid()}")
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    if os.path.isdir(path):
        st = os.lstat(path)
        if st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022:
            raise PermissionError(f"keep-alive: {path} must be a directory of this user that no one else may "
                                  f"write to (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    return path


def refused(e: PermissionError) -> int:
    """A command's answer to an insecure runtime directory (``runtime_dir``): an error line, exit status 1."""
    print(f"error: PermissionError: {e}", file=sys.stderr)
    return 1


def _stamp(path: str | None) -> tuple | str | None:
    """What changes when ``path`` does: a file's size and modification time, a directory's ``tree_stamp`` (every
    file under it); None where there is nothing."""
    from shapeplan.cache.fingerprint import tree_stamp
    if path and os.path.isdir(path):
        return tree_stamp(path, lambda d, n: True)[0]
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if st else None


def server_key(spec: dict) -> str:
    """The key of a server for ``spec`` (the model and the engine options; module doc)."""
    from shapeplan import __version__
    from shapeplan.cache.fingerprint import tree_stamp
    model = os.path.realpath(spec["model"])
    template = spec.get("chat_template")
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    what = {"model": model, "files": _stamp(model), **{k: spec.get(k) for k in _ENGINE},
            "template_file": _stamp(template) if template and os.path.isfile(template) else None,
            "switches": sorted((k, v) for k, v in os.environ.items()
                               if k.startswith("SHAPEPLAN_") and k != "SHAPEPLAN_KEEP_ALIVE"),
            "python": sys.executable, "shapeplan": __version__,
            "source": tree_stamp(package, lambda d, n: n.endswith(".py"))[0]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


# ---------------------------------------------------------------- the client (``generate`` with a keep-alive)

def run_client(args: Any, keep_alive: float, t0: float, before: float | None) -> int:
    """``generate``'s whole run through a server (module doc); the exit code."""
    from shapeplan.commands.generate import print_metric_values, print_timings
    spec = {"model": args.model, **{k: getattr(args, k, None) for k in _ENGINE}}
    request = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens, "chat": bool(args.chat),
               "sampling": {k: getattr(args, k) for k in _SAMPLING}, "keep_alive": keep_alive}
    t_imports = time.perf_counter()
    try:
        folder = runtime_dir()
    except PermissionError as e:
        return refused(e)
    key = server_key(spec)
    for attempt in (0, 1):            # a server that ended between our connect and its answer: start another
        conn, started = _connect_or_start(folder, key, spec, keep_alive)
        if conn is None:
            return 1
        t_sent = time.perf_counter()
        try:
            outcome = _stream(conn, request)
        finally:
            conn.close()
        if outcome is not None or attempt:
            break
    if outcome is None:
        return _failed(folder, key, "the keep-alive server closed the connection without an answer")
    kind, body, t_start = outcome
    if kind == "error":
        print(f"error: {body['type']}: {body['message']}", file=sys.stderr)
        return 1
    t_end = time.perf_counter()
    m = body.get("metrics") or {}
    if args.metrics and m:
        print_metric_values(body["tokens"], body["finish"], m)
    if args.timings:
        phases = {"interpreter + imports": (before or 0.0) + t_imports - t0,
                  "server: find or start": t_sent - t_imports,      # (start: this client started it)
                  "server: load or wait": t_start - t_sent}         # (till the server took the request)
        total = m.get("total_s", 0.0)
        phases["prefill"] = m.get("ttft_s", 0.0)
        phases["decode"] = total - m.get("ttft_s", 0.0)
        phases["output + close"] = max(0.0, t_end - t_start - total)
        phases["in process"] = (before or 0.0) + t_end - t0
        print("keep-alive server: " + ("started by this run" if started else "already running"), file=sys.stderr)
        print_timings(phases)
    return 0


def _connect(path: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return s
    except OSError:
        s.close()
        return None


def _connect_or_start(folder: str, key: str, spec: dict, keep_alive: float) -> tuple[socket.socket | None, bool]:
    """A connection to the key's server, started first where none answers (under ``KEY.lock``), and whether
    this client started it; (None, True) when the server it started ended or did not bind in time (said on
    stderr, with the end of its log)."""
    import fcntl
    sock_path = os.path.join(folder, key + ".sock")
    conn = _connect(sock_path)
    if conn is not None:
        return conn, False
    with open(os.path.join(folder, key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(sock_path)                  # another client started it while we waited for the lock
        if conn is not None:
            return conn, False
        for stale in (".sock", ".json"):
            Path(os.path.join(folder, key + stale)).unlink(missing_ok=True)
        with open(os.path.join(folder, key + ".log"), "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "shapeplan", SERVER_COMMAND,
                 json.dumps({**spec, "key": key, "folder": folder, "keep_alive": keep_alive})],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                close_fds=True)
        deadline = time.monotonic() + BIND_WAIT_S
        while True:
            conn = _connect(sock_path)
            if conn is not None:
                return conn, True
            if proc.poll() is not None or time.monotonic() > deadline:
                _failed(folder, key, f"the keep-alive server did not start (exit status {proc.poll()})")
                return None, True
            time.sleep(0.005)


def _stream(conn: socket.socket, request: dict) -> tuple[str, dict, float] | None:
    """Send ``request``, write the text deltas to stdout; ("done" | "error", body, time the server took it),
    or None when the server closed the connection before it answered at all."""
    conn.sendall((json.dumps(request) + "\n").encode())
    t_start = time.perf_counter()
    answered = False
    for msg in _lines(conn):
        answered = True
        if "text" in msg:
            sys.stdout.write(msg["text"])
            sys.stdout.flush()
        elif "start" in msg:
            t_start = time.perf_counter()
        elif "done" in msg:
            sys.stdout.write("\n")
            sys.stdout.flush()
            return "done", msg["done"], t_start
        elif "error" in msg:
            return "error", msg["error"], t_start
    if not answered:
        return None
    return "error", {"type": "ConnectionError", "message": "the keep-alive server closed the connection "
                                                          "in the middle of its answer (its log: "
                                                          "`shapeplan ps`)"}, t_start


def _lines(conn: socket.socket) -> Iterator[dict]:
    buf = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


def _failed(folder: str, key: str, what: str) -> int:
    log = os.path.join(folder, key + ".log")
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-2000:].strip()
    except OSError:
        tail = ""
    print(f"error: {what}" + (f"; the end of its log ({log}):\n{tail}" if tail else ""), file=sys.stderr)
    return 1


# ---------------------------------------------------------------- ps and stop

def servers(folder: str | None = None) -> list[dict]:
    """The records of this user's running servers (stale ones, whose process is gone, are removed)."""
    folder = folder or runtime_dir(create=False)
    out = []
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
            os.kill(int(rec["pid"]), 0)
        except (OSError, ValueError, KeyError):
            key = name[:-len(".json")]
            for ext in (".json", ".sock"):
                Path(os.path.join(folder, key + ext)).unlink(missing_ok=True)
            continue
        out.append(rec)
    return out


def stop(model: str | None) -> list[dict]:
    """Stop this user's servers (of ``model`` only, where given); the records of those stopped."""
    want = os.path.realpath(model) if model else None
    done = []
    for rec in servers():
        if want is not None and rec.get("model") != want:
            continue
        conn = _connect(rec["socket"])
        if conn is not None:
            try:
                conn.sendall(b'{"stop": true}\n')
                for msg in _lines(conn):
                    if msg.get("stopped"):
                        break
            finally:
                conn.close()
        else:
            import signal
            try:
                os.kill(int(rec["pid"]), signal.SIGTERM)
            except OSError:
                pass
        done.append(rec)
    return done


# ---------------------------------------------------------------- the server

def serve(spec_json: str) -> int:
    """The server's process (module doc): bind, load, answer requests until its keep-alive runs out."""
    import signal
    spec = json.loads(spec_json)
    folder, key = spec["folder"], spec["key"]
    sock_path = os.path.join(folder, key + ".sock")
    record_path = os.path.join(folder, key + ".json")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = sock_path + f".{os.getpid()}"
    Path(tmp).unlink(missing_ok=True)
    srv.bind(tmp)
    os.chmod(tmp, 0o600)
    srv.listen(64)
    os.replace(tmp, sock_path)                       # clients see the socket only once it listens
    ident = os.stat(sock_path).st_ino

    def on_signal(signum, frame):                    # noqa: ARG001 - end through the finally below
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    keep_alive = float(spec["keep_alive"])
    record = {"pid": os.getpid(), "model": os.path.realpath(spec["model"]), "socket": sock_path,
              "log": os.path.join(folder, key + ".log"), "started": time.time(), "requests": 0,
              **{k: spec.get(k) for k in _ENGINE}}
    pipe, load_error = None, None
    try:
        try:
            pipe = _load(spec)
        except Exception as e:  # noqa: BLE001 - answered to the waiting client, then the server ends
            load_error = _error(e)
        deadline = time.monotonic() + keep_alive
        _write_record(record_path, record, keep_alive)
        while True:
            srv.settimeout(max(0.0, deadline - time.monotonic()) or 1e-3)
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                break
            with conn:
                conn.settimeout(None)
                try:
                    request = _request(conn)
                    if request is None:
                        continue
                    if request.get("stop"):
                        _send(conn, {"stopped": True})
                        break
                    if load_error is not None:
                        _send(conn, {"error": load_error})
                        break
                    keep_alive = request["keep_alive"]
                    _answer(conn, pipe, request)
                except OSError:                      # the client went away: the next one
                    pass
                except ValueError as e:              # not a request: said to its client, the next one
                    _send_quietly(conn, {"error": {"type": "InputError", "message": f"keep-alive request: {e}"}})
                    continue
                record["requests"] += 1
                deadline = time.monotonic() + keep_alive
                _write_record(record_path, record, keep_alive)
    finally:
        try:                                         # only our own socket: a newer server may have taken the name
            if os.stat(sock_path).st_ino == ident:
                Path(sock_path).unlink(missing_ok=True)
                Path(record_path).unlink(missing_ok=True)
        except OSError:
            pass
        srv.close()
        if pipe is not None:
            pipe.close()
    return 0


def _load(spec: dict):
    """The pipeline as the in-process command builds it (``generate.load_pipeline``, the tokenizer's helper
    process and the CUDA context's thread started first)."""
    import argparse

    from shapeplan import _gc
    from shapeplan.commands.generate import begin_load, load_pipeline
    cuda_init = begin_load(spec["model"], spec["device"])   # as the in-process command overlaps them with its imports
    with _gc.startup():               # torch's import too (the package imported none of it: shapeplan/_light.py)
        return load_pipeline(argparse.Namespace(**{k: spec.get(k) for k in ("model", *_ENGINE)}), cuda_init)


def _request(conn: socket.socket) -> dict | None:
    """The connection's request, checked (``ValueError`` says what is wrong), or None where it sent nothing."""
    try:
        request = next(_lines(conn), None)
    except ValueError as e:
        raise ValueError(f"not a JSON line ({e})") from None
    if request is None or (isinstance(request, dict) and request.get("stop") is True):
        return request
    if not isinstance(request, dict):
        raise ValueError(f"expected a JSON object, got {type(request).__name__}")
    want = {"prompt": str, "max_new_tokens": int, "keep_alive": (int, float)}
    for k, t in want.items():
        if not isinstance(request.get(k), t) or isinstance(request.get(k), bool):
            raise ValueError(f"{k!r} must be {getattr(t, '__name__', 'a number')}, got {request.get(k)!r}")
    if not 0 <= request["keep_alive"] < float("inf"):
        raise ValueError(f"'keep_alive' must be seconds >= 0, got {request['keep_alive']!r}")
    if not isinstance(request.get("sampling", {}), dict):
        raise ValueError(f"'sampling' must be an object, got {request['sampling']!r}")
    return request


def _answer(conn: socket.socket, pipe, request: dict) -> None:
    """One request: its deltas, then done (or its error). A client that went away ends the request."""
    from shapeplan.commands.generate import metric_values
    from shapeplan.llm import Sampling
    _send(conn, {"start": True})
    try:
        s = request.get("sampling") or {}
        sampling = Sampling(**{k: s[k] for k in _SAMPLING if k in s})
        stream = pipe.stream(request["prompt"], max_new_tokens=request["max_new_tokens"], sampling=sampling,
                             chat=bool(request.get("chat")))
        deltas = iter(stream)
        try:
            for delta in deltas:
                _send(conn, {"text": delta})
        finally:
            deltas.close()
        res = stream.result
        _send(conn, {"done": {"tokens": len(res.token_ids), "finish": res.finish_reason,
                              "metrics": metric_values(res)}})
    except OSError:                                  # the client went away (its request ended with the stream)
        return
    except Exception as e:  # noqa: BLE001 - the request's error goes to its client; the server goes on
        _send_quietly(conn, {"error": _error(e)})


def _error(e: BaseException) -> dict:
    return {"type": type(e).__name__, "message": str(e)}


def _send(conn: socket.socket, msg: dict) -> None:
    conn.sendall((json.dumps(msg) + "\n").encode())


def _send_quietly(conn: socket.socket, msg: dict) -> None:
    try:
        _send(conn, msg)
    except OSError:
        pass


def _write_record(path: str, record: dict, keep_alive: float) -> None:
    rec = {**record, "keep_alive": keep_alive, "until": time.time() + keep_alive}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rec, f)
    os.replace(tmp, path)
