"""A judge that stays up between `submit`s: `run_eval.py serve` keeps one `Judge` (harness/api.py: its build pool,
worker, warm candidate processes and each problem's reference) running behind a Unix socket, and `run_eval.py
submit` hands its submission to it when one serves the same results folder, config and device. The record is the
one a `submit` without a server writes (the same pipeline stages and functions, the same records.jsonl), but the
start of the reference, of torch and of the worker is paid once per server instead of once per command.

Protocol: one connection per submission, one JSON line each way. The request names the problem file, the submission
file (both absolute paths, read by the server), the run, the model and the client's config hash and device; the
reply is {"record": {...}} or {"refused": why} (another config or device: the client judges by itself) or
{"error": why} (a bad request or a failure of the reference); a reply that judged says which server did
("server": its pid, whether a submit started it in the background, its idle timeout). A connection closed without
a request is a probe (is anyone answering?) and gets no reply.

In the background: a `submit` that finds no server starts one (`start_background`: detached in a session of its
own, logging to `<results>/judge-server.log`, under a lock file so that two first submits start one server) and
hands its submission to it; that server stops after `idle_timeout_s` without a submission to judge. So a cached
submit after the first costs what a served one costs, and nothing stays behind for long.

Who may ask: the socket is a file in the temporary folder, mode 0600, whose name is keyed by the results folder;
the client connects only to a socket owned by its own user. Candidates run as the same user in the sandbox
(harness/isolation/sandbox.py) and can read files and reach path-bound sockets, so the server refuses a peer
(SO_PEERCRED) that lives in another network namespace than its own or that has no_new_privs set where the server
has not: both mark a sandboxed child. A candidate could otherwise make the server judge code of its choosing (in
the same sandbox, so no verdict of its own would change, but the machine's time would be spent).

Runs in: the parent (the server process and the submitting command); it never imports candidate code.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 16
CONNECT_TIMEOUT_S = 2.0
DEFAULT_IDLE_TIMEOUT_S = 900.0   # a background judge's wait for the next submission before it stops
START_TIMEOUT_S = 600.0          # a background judge's start (torch, the worker, CUDA) before its submit gives up
LOG_FILE = "judge-server.log"    # a background judge's log, in the results folder it serves


def socket_path(results_dir: Path) -> Path:
    """The socket of the server for `results_dir` (a short path: Unix socket names are limited to 107 bytes)."""
    key = hashlib.sha256(str(Path(results_dir).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"kernel-judge-{os.getuid()}-{key}.sock"


def log_path(results_dir: Path) -> Path:
    return Path(results_dir) / LOG_FILE


def config_key(config) -> str:
    """The config's hash with the device left out: the device is compared apart, since a submit that names none
    takes the server's."""
    return dataclasses.replace(config, device=None).hash()


# ---------------------------------------------------------------- client (the submit command)

class ServerGone(RuntimeError):
    """A server took the connection but it ended without a reply (the server was stopped meanwhile)."""


def ask(results_dir: Path, request: dict, timeout_s: Optional[float] = None) -> Optional[dict]:
    """The server's reply to `request`, or None when no server of this user serves `results_dir` (no socket, a
    stale one, or one owned by someone else). `timeout_s`: for the reply (None: as long as judging takes)."""
    path = socket_path(results_dir)
    if not _mine(path):
        if os.path.lexists(path):
            log.warning("ignoring %s: not owned by this user", path)
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.settimeout(CONNECT_TIMEOUT_S)
        try:
            connection.connect(str(path))
        except OSError:   # a socket left by a server that was killed
            return None
        connection.settimeout(timeout_s)
        try:
            connection.sendall(json.dumps(request).encode() + b"\n")
            reply = _read_line(connection, limit=None)
        except (BrokenPipeError, ConnectionResetError):   # it stopped (idle, or killed) with this request queued
            reply = b""
    finally:
        connection.close()
    if not reply:
        raise ServerGone(f"the judge server at {path} closed the connection without a reply")
    return json.loads(reply)


def answering(results_dir: Path) -> bool:
    """Whether a server of this user answers for `results_dir` now (a connection without a request: no reply)."""
    path = socket_path(results_dir)
    if not _mine(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(CONNECT_TIMEOUT_S)
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _mine(path: Path) -> bool:
    """Whether `path` exists and belongs to this user: another user's socket is never spoken to."""
    try:
        return path.lstat().st_uid == os.getuid()
    except OSError:
        return False


class StartFailed(RuntimeError):
    """A background judge could not be started, or exited before it answered."""


def start_background(results_dir: Path, serve_args: list[str],
                     start_timeout_s: float = START_TIMEOUT_S) -> Optional[int]:
    """Start `run_eval.py serve *serve_args` for `results_dir` in the background, unless a server answers for it
    already; the started server's pid once it answers, or None when one was there (or another submit started one
    meanwhile). Two submits starting at once start one server: the start is made under a lock file beside the
    socket. Raises StartFailed (the server exited, or did not answer within `start_timeout_s`: it is stopped)."""
    import fcntl

    lock = os.open(socket_path(results_dir).with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if answering(results_dir):
            return None
        log = log_path(results_dir)
        code = "import sys; from harness.cli import main; sys.exit(main())"
        # the server imports the harness this submit runs, wherever the submit was started from
        package_root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root,
                                                                          os.environ.get("PYTHONPATH")]))}
        with open(log, "ab") as output, open(os.devnull, "rb") as nothing:
            process = subprocess.Popen([sys.executable, "-c", code, *serve_args], stdin=nothing, stdout=output,
                                       stderr=output, env=env, start_new_session=True, close_fds=True)
        deadline = time.monotonic() + start_timeout_s
        while not answering(results_dir):
            if process.poll() is not None:
                raise StartFailed(f"the background judge exited ({process.returncode}) before it answered; "
                                  f"its log: {log}")
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise StartFailed(f"the background judge did not answer within {start_timeout_s:.0f} s; its log: "
                                  f"{log}")
            time.sleep(0.05)
        return process.pid
    finally:
        os.close(lock)   # and with it the lock


def _read_line(connection: socket.socket, limit: Optional[int]) -> bytes:
    chunks, size = [], 0
    while True:
        chunk = connection.recv(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or (limit is not None and size > limit):
            break
    return b"".join(chunks)


# ---------------------------------------------------------------- server

class _Activity:
    """When the server last judged, and whether it judges now: what its idle timeout is measured against."""

    def __init__(self):
        self._lock = threading.Lock()
        self._busy = 0
        self._since = time.monotonic()

    def begin(self) -> None:
        with self._lock:
            self._busy += 1

    def end(self, judged: bool) -> None:
        """A connection is done; `judged`: it had a submission judged (a refused or bad one is not activity: it
        does not keep the server up)."""
        with self._lock:
            self._busy -= 1
            if judged:
                self._since = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the last judging ended (0 while a connection is answered)."""
        with self._lock:
            return 0.0 if self._busy else time.monotonic() - self._since


def serve(judge, results_dir: Path, on_ready=None, idle_timeout_s: Optional[float] = None,
          background: bool = False) -> None:
    """Answer requests with `judge` (a harness.api.Judge) until SIGINT or SIGTERM, or until `idle_timeout_s` pass
    without a submission being judged (None: no timeout); then remove the socket and close the judge (every child
    stops). `on_ready(path)` is called once the socket accepts connections. `background`: started by a submit
    (said in each reply)."""
    path = socket_path(results_dir)
    listener = _listen(path)
    bound = path.lstat().st_ino
    stop = threading.Event()
    activity = _Activity()
    identity = {"pid": os.getpid(), "background": background, "idle_timeout_s": idle_timeout_s}

    def stopping(signum, frame):
        stop.set()
        listener.close()   # unblocks accept()

    previous = {sig: signal.signal(sig, stopping) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if on_ready is not None:
            on_ready(path)
        while not stop.is_set():
            if idle_timeout_s is not None:
                idle = activity.idle_s()
                if idle >= idle_timeout_s:
                    log.warning("stopping: no submission for %.0f s (idle timeout %.0f s)", idle, idle_timeout_s)
                    break
                listener.settimeout(min(1.0, idle_timeout_s - idle))   # wakes to look at the clock again
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            connection.settimeout(None)
            activity.begin()   # counted from the accept: the loop must not stop under a request it took
            threading.Thread(target=_answer, args=(judge, results_dir, connection, activity, identity),
                             daemon=True).start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        listener.close()
        # Removed before the judge closes (which takes seconds) and only if it is still this server's: a submit that
        # found this server gone may have started the next one, whose socket is not ours to remove.
        try:
            if path.lstat().st_ino == bound:
                path.unlink()
        except FileNotFoundError:
            pass
        judge.close()


def _listen(path: Path) -> socket.socket:
    """A listening socket at `path`, refusing to take over one that another server still answers on."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(CONNECT_TIMEOUT_S)
        probe.connect(str(path))
        raise RuntimeError(f"a judge server already serves this results folder ({path})")
    except (FileNotFoundError, ConnectionRefusedError):
        try:
            path.unlink()   # stale: its server was killed
        except FileNotFoundError:
            pass
    finally:
        probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)   # created 0600: only this user may connect
    try:
        listener.bind(str(path))
    finally:
        os.umask(umask)
    listener.listen(16)
    return listener


def _answer(judge, results_dir: Path, connection: socket.socket, activity: _Activity, identity: dict) -> None:
    judged = False
    with connection:
        try:
            # The request is read even from a peer that is refused: closing on a client still sending its request
            # broke its pipe before it could read the refusal (seen in CI).
            connection.settimeout(CONNECT_TIMEOUT_S)   # a client sends its request as soon as it is connected
            request = _read_line(connection, MAX_REQUEST_BYTES)
            if not request.strip():
                return   # a probe (`answering`, or another server's `_listen`)
            connection.settimeout(None)   # the reply comes when the judging is done
            why = _peer_refused(connection)
            if why is not None:
                log.warning("refused a connection: %s", why)
                reply = {"refused": why}
            else:
                reply = _judge(judge, results_dir, json.loads(request))
                if "record" in reply:
                    judged = True
                    reply["server"] = identity
        except Exception as exc:   # one bad request never stops the server
            log.exception("request failed")
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            activity.end(judged)
        try:
            connection.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass   # the client went away (Ctrl-C); its record is in records.jsonl all the same


def _judge(judge, results_dir: Path, request: dict) -> dict:
    from harness.report import scoring
    from harness.shared.record import RESULTS_CSV, phases_total

    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    if request.get("config_hash") != config_key(judge.config):
        return {"refused": f"the server judges under config {config_key(judge.config)}, this submit asks for "
                           f"{request.get('config_hash')} (device apart)"}
    if request.get("device") not in (None, judge.device):
        return {"refused": f"the server judges on {judge.device}, this submit asks for {request.get('device')}"}
    for key in ("problem", "submission"):
        if not isinstance(request.get(key), str) or not Path(request[key]).is_absolute():
            raise ValueError(f"{key} must be an absolute path")
    began = time.perf_counter()
    record = judge.evaluate(Path(request["problem"]), Path(request["submission"]), model=request.get("model"),
                            run=request.get("run") or judge.run)
    evaluated = time.perf_counter()
    # as a submit without a server leaves them: the record appended to records.jsonl (by the judge), results.csv
    scoring.records_table([record]).to_csv(results_dir / record.run / RESULTS_CSV, index=False)
    log.info("%s: %s in %.2f s (the record's phases %.2f s), results.csv %.2f s", record.problem,
             record.status.value, evaluated - began, phases_total(record.phases), time.perf_counter() - evaluated)
    return {"record": json.loads(record.to_json())}


def _peer_refused(connection: socket.socket) -> Optional[str]:
    """Why the connecting process may not ask (it looks like a sandboxed child), or None."""
    pid, _, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    try:
        if os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"):
            return f"process {pid} is in another network namespace (a sandboxed child)"
        if _no_new_privs(pid) and not _no_new_privs(os.getpid()):
            return f"process {pid} has no_new_privs set (a sandboxed child)"
    except OSError as exc:
        return f"process {pid} cannot be checked: {exc}"
    return None


def _no_new_privs(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("NoNewPrivs:"):
                return line.split()[1] == "1"
    return False
