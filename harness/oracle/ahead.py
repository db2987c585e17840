"""Oracle processes started ahead: the interpreter up and torch and the harness imported before a problem needs one.

Starting a reference spent 3-5 s in its process's imports (`ref_process`), once per problem, on the GPU worker's
path: a batch of 17 kernels over 13 problems spent 47 s there. With the config's `warm_oracles` (default 1), each
GPU worker keeps that many oracle processes imported and waiting (one per worker environment and device); a
reference start takes one, sends it the problem's spec (`CMD_RUN`) and waits for READY as for a process started on
demand, and another starts its imports meanwhile. An oracle is trusted code (the problem's reference) under the
trusted policy, so nothing about isolation changes; a process started ahead does no GPU work before its spec
comes (its CUDA context is made after), and on the CPU device it is stopped during timings while it imports, like
a candidate process started ahead (harness/isolation/spawn.py `builds_paused`).
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.core import protocol
from harness.core.config import Config
from harness.isolation import policy
from harness.isolation.spawn import Child, ShuttingDown
from harness.isolation.specs import ORACLE_MODULE, OracleSpec

log = logging.getLogger(__name__)

IMPORT_TIMEOUT_S = 300.0   # an oracle started ahead that has not imported by then is ended (a cold start takes over)


@dataclass
class Ahead:
    """An oracle process started ahead, once imported: its child handle, its folder and its log so far."""
    child: Child
    workdir: Path
    log_path: Path


class _Slot:
    """One oracle process being started; `ready` is set once it reported IMPORTED or failed."""

    def __init__(self, config: Config, device: str, env: Optional[dict]):
        self.ready = threading.Event()
        self.ahead: Optional[Ahead] = None
        self.workdir = Path(tempfile.mkdtemp(prefix="oracle-"))
        self.log_path = Path(tempfile.mkstemp(prefix="oracle-ahead-", suffix=".log")[1])
        try:
            child = Child(ORACLE_MODULE, OracleSpec.started_ahead(config, device, self.workdir), self.workdir,
                          self.log_path, with_commands=True, **policy.for_trusted(config, env, device).options())
        except (ShuttingDown, OSError) as exc:
            self._failed(None, str(exc))
            return
        child.settled = threading.Event()   # on the CPU device it is stopped during timings until it has imported
        threading.Thread(target=self._wait, args=(child,), daemon=True, name="oracle-ahead").start()

    def _wait(self, child: Child) -> None:
        event = child.next_event(IMPORT_TIMEOUT_S)
        child.settled.set()
        if event is None or event["event"] != protocol.IMPORTED:
            why = child.ended.detail if child.ended is not None else f"it sent {event and event['event']}"
            self._failed(child, f"an oracle process started ahead did not come up: {why} (log: {self.log_path})")
            return
        self.ahead = Ahead(child, self.workdir, self.log_path)
        self.ready.set()

    def _failed(self, child: Optional[Child], why: str) -> None:
        if child is not None:
            child.finish()
        shutil.rmtree(self.workdir, ignore_errors=True)
        log.warning("%s", why)
        self.ready.set()

    def discard(self) -> None:
        self.ready.wait()
        if self.ahead is not None:
            self.ahead.child.finish()   # closing its command pipe tells it to exit
            shutil.rmtree(self.ahead.workdir, ignore_errors=True)
            self.ahead.log_path.unlink(missing_ok=True)
            self.ahead = None


_LOCK = threading.Lock()
_SLOTS: dict[tuple, list[_Slot]] = {}   # (device, worker environment) -> oracle processes started ahead


def _key(device: str, env: Optional[dict]) -> tuple:
    return device, _env_key(env)


def _env_key(env: Optional[dict]) -> tuple:
    return tuple(sorted((env or {}).items()))


def take(config: Config, device: str, env: Optional[dict]) -> Optional[Ahead]:
    """An imported oracle process for this worker, if one was started ahead (waiting for its imports if it is still
    importing: a cold start would import too); then another starts, to be ready for the next reference."""
    with _LOCK:
        slots = _SLOTS.setdefault(_key(device, env), [])
        slot = slots.pop(0) if slots else None
    fill(config, device, env)
    if slot is None:
        return None
    slot.ready.wait()
    return slot.ahead


def fill(config: Config, device: str, env: Optional[dict]) -> None:
    """Start oracle processes until `warm_oracles` are started ahead for this worker."""
    with _LOCK:
        slots = _SLOTS.setdefault(_key(device, env), [])
        while len(slots) < config.warm_oracles:
            slots.append(_Slot(config, device, env))


def run(ahead: Ahead, spec: OracleSpec, log_path: Path) -> None:
    """Hand `ahead` its problem: its log moves to `log_path`, its spec goes down the command pipe."""
    ahead.child.output.move_to(log_path)
    ahead.child.send(protocol.CMD_RUN, spec=dataclasses.asdict(spec))


def close_all(env: Optional[dict]) -> None:
    """End the oracle processes started ahead for a worker's environment, on any device (the worker is closing)."""
    with _LOCK:
        keys = [key for key in _SLOTS if key[1] == _env_key(env)]
        slots = [slot for key in keys for slot in _SLOTS.pop(key)]
    for slot in slots:
        slot.discard()
