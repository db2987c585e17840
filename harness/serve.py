"""A judge that stays up between `submit`s: `run_eval.py serve` keeps one `Judge` (harness/api.py: its build pool,
worker, warm candidate processes and each problem's reference) running behind a Unix socket, and `run_eval.py
submit` hands its submission to it when one serves the same results folder, config and device. The record is the
one a `submit` without a server writes (the same pipeline stages and functions, the same records.jsonl), but the
start of the reference, of torch and of the worker is paid once per server instead of once per command.

Protocol: one connection per submission, one JSON line each way. The request names the problem file, the submission
file (both absolute paths, read by the server), the run, the model and the client's config hash and device; the
reply is {"record": {...}} or {"refused": why} (another config or device: the client judges by itself) or
{"error": why} (a bad request or a failure of the reference).

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
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 16
CONNECT_TIMEOUT_S = 2.0


def socket_path(results_dir: Path) -> Path:
    """The socket of the server for `results_dir` (a short path: Unix socket names are limited to 107 bytes)."""
    key = hashlib.sha256(str(Path(results_dir).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"kernel-judge-{os.getuid()}-{key}.sock"


def config_key(config) -> str:
    """The config's hash with the device left out: the device is compared apart, since a submit that names none
    takes the server's."""
    return dataclasses.replace(config, device=None).hash()


# ---------------------------------------------------------------- client (the submit command)

class ServerGone(RuntimeError):
    """A server took the request but its connection ended without a reply (it was stopped meanwhile)."""


def ask(results_dir: Path, request: dict, timeout_s: Optional[float] = None) -> Optional[dict]:
    """The server's reply to `request`, or None when no server of this user serves `results_dir` (no socket, a
    stale one, or one owned by someone else). `timeout_s`: for the reply (None: as long as judging takes)."""
    path = socket_path(results_dir)
    try:
        if path.lstat().st_uid != os.getuid():
            log.warning("ignoring %s: not owned by this user", path)
            return None
    except OSError:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.settimeout(CONNECT_TIMEOUT_S)
        try:
            connection.connect(str(path))
        except OSError:   # a socket left by a server that was killed
            return None
        connection.settimeout(timeout_s)
        connection.sendall(json.dumps(request).encode() + b"\n")
        reply = _read_line(connection, limit=None)
    finally:
        connection.close()
    if not reply:
        raise ServerGone(f"the judge server at {path} closed the connection without a reply")
    return json.loads(reply)


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

def serve(judge, results_dir: Path, on_ready=None) -> None:
    """Answer requests with `judge` (a harness.api.Judge) until SIGINT or SIGTERM; then close the judge (every child
    stops) and remove the socket. `on_ready(path)` is called once the socket accepts connections."""
    path = socket_path(results_dir)
    listener = _listen(path)
    stop = threading.Event()

    def stopping(signum, frame):
        stop.set()
        listener.close()   # unblocks accept()

    previous = {sig: signal.signal(sig, stopping) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if on_ready is not None:
            on_ready(path)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                break
            threading.Thread(target=_answer, args=(judge, results_dir, connection), daemon=True).start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        listener.close()
        try:
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


def _answer(judge, results_dir: Path, connection: socket.socket) -> None:
    with connection:
        try:
            # The request is read even from a peer that is refused: closing on a client still sending its request
            # broke its pipe before it could read the refusal (seen in CI).
            connection.settimeout(CONNECT_TIMEOUT_S)   # a client sends its request as soon as it is connected
            request = _read_line(connection, MAX_REQUEST_BYTES)
            connection.settimeout(None)   # the reply comes when the judging is done
            why = _peer_refused(connection)
            if why is not None:
                log.warning("refused a connection: %s", why)
                reply = {"refused": why}
            else:
                reply = _judge(judge, results_dir, json.loads(request))
        except Exception as exc:   # one bad request never stops the server
            log.exception("request failed")
            reply = {"error": f"{type(exc).__name__}: {exc}"}
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
