"""Candidate processes started ahead: interpreter up, torch imported, CUDA's context created, the profiler's first
session done, inside the sandbox and the cgroup the evaluation would give them, waiting for a submission.

Each process runs one submission only and is then ended like any other (a process that ran candidate code is never
used again), so isolation is what it is for a process started on demand: same confinement, same folder rules, same
environment. What is saved is the start-up (seconds per evaluation: docs/performance.md). A pool per device, GPU
worker environment and config keeps `config.warm_candidates` processes started; taking one starts its replacement.
The GPU part of a start-up never overlaps a timed block: a process reports IMPORTED and creates its CUDA context
only when no timing runs (spawn.START_GATE; a timing waits for one already under way). On the CPU device processes
still starting are also stopped while something is timed (spawn.builds_paused).
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.core import protocol
from harness.core.config import Config
from harness.isolation import handover, policy
from harness.isolation.spawn import START_GATE, Child, ShuttingDown
from harness.isolation.specs import CANDIDATE_MODULE, CandidateSpec

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0   # a process started ahead that is not IDLE by then is ended (a cold start takes over)


@dataclass
class Started:
    """A process started ahead, IDLE: its folder (the only one it may write) and its child handle."""
    child: Child
    workdir: Path
    log_path: Path         # its output so far (a temp file); moved to the submission's log when taken


class _Slot:
    """One process being started in the background; `ready` is set once it is IDLE or has failed."""

    def __init__(self, config: Config, device: str, env: dict[str, str]):
        """Starts the process here, in the caller's thread (forks come from the threads that always started
        children); a background thread only waits for its IDLE."""
        self.ready = threading.Event()
        self.imported = threading.Event()   # it reported IMPORTED: what is left of its start needs START_GATE
        self.gate_wait_s = 0.0              # how long it then waited for timings to end
        self.started: Optional[Started] = None
        self._workdir = Path(tempfile.mkdtemp(prefix="candidate-"))
        self._log = Path(tempfile.mkstemp(prefix="candidate-ahead-", suffix=".log")[1])
        try:
            confinement = policy.for_candidate(config, self._workdir, env, device)
            child = Child(CANDIDATE_MODULE, CandidateSpec.started_ahead(config, self._workdir, device), self._workdir,
                          self._log, with_commands=True, handover=handover.candidate_files(config.fresh_inputs),
                          **confinement.options())
        except (ShuttingDown, OSError) as exc:
            self._failed(None, str(exc))
            return
        child.settled = self.ready
        threading.Thread(target=self._wait, args=(child,), daemon=True, name="candidate-ahead").start()

    def _wait(self, child: Child) -> None:
        """Its imports, then (never beside a timing: spawn.START_GATE) its CUDA context and profiler session."""
        began = time.perf_counter()
        event = child.next_event(START_TIMEOUT_S)
        imported = time.perf_counter()
        if event is not None and event["event"] == protocol.IMPORTED:
            self.imported.set()
            with START_GATE.start_up():
                gated = time.perf_counter()
                self.gate_wait_s = gated - imported
                child.send(protocol.CMD_WARM)
                event = child.next_event(START_TIMEOUT_S)
            log.info("candidate process started ahead: imports %.2f s, waited %.2f s for timings, CUDA and profiler "
                     "%.2f s", imported - began, gated - imported, time.perf_counter() - gated)
        if event is None or event["event"] != protocol.IDLE:
            why = child.ended.detail if child.ended is not None else f"it sent {event and event['event']}"
            self._failed(child, f"the candidate process started ahead did not come up: {why} (log: {self._log})")
            return
        self.started = Started(child, self._workdir, self._log)
        self.ready.set()

    def _failed(self, child: Optional[Child], why: str) -> None:
        if child is not None:
            child.finish()
        shutil.rmtree(self._workdir, ignore_errors=True)
        log.warning("%s", why)
        self.ready.set()

    def discard(self) -> None:
        """End the process without running anything in it."""
        self.ready.wait()
        if self.started is not None:
            self.started.child.finish()   # closing its command pipe tells it to exit
            shutil.rmtree(self.started.workdir, ignore_errors=True)
            self.started.log_path.unlink(missing_ok=True)
            self.started = None


class Pool:
    """`size` candidate processes kept started for one device, environment and config."""

    def __init__(self, config: Config, device: str, env: dict[str, str], size: int):
        self.config, self.device, self.env, self.size = config, device, dict(env), size
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._closed = False

    def fill(self) -> None:
        """Start processes until `size` are started or starting."""
        with self._lock:
            while not self._closed and len(self._slots) < self.size:
                self._slots.append(_Slot(self.config, self.device, self.env))

    def take(self) -> Optional[Started]:
        """The oldest process started ahead once it is IDLE (its replacement is started now), or None when it
        could not be started (the caller starts one on demand)."""
        self.fill()
        with self._lock:
            if not self._slots:
                return None
            slot = self._slots.pop(0)
        self.fill()
        slot.ready.wait()
        if slot.started is not None and slot.started.child.process.poll() is not None:
            slot.discard()   # ended while it waited (stop_all of an interrupted batch): start one on demand
        return slot.started

    def close(self) -> None:
        with self._lock:
            self._closed = True
            slots, self._slots = self._slots, []
        for slot in slots:
            slot.discard()


_POOLS: dict[tuple, Pool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(config: Config, device: str, env: Optional[dict[str, str]]) -> Optional[Pool]:
    """The pool of this device, GPU worker environment and config (None when config.warm_candidates is 0)."""
    if config.warm_candidates <= 0:
        return None
    key = (device, tuple(sorted((env or {}).items())), config)   # every field: the confinement reads several
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = Pool(config, device, env or {}, config.warm_candidates)
    return pool


def close_all(env: Optional[dict[str, str]] = None) -> None:
    """End the processes started ahead for one GPU worker's environment (a worker is done), or (None) all."""
    wanted = tuple(sorted(env.items())) if env is not None else None
    with _POOLS_LOCK:
        keys = [key for key in _POOLS if wanted is None or key[1] == wanted]
        pools = [_POOLS.pop(key) for key in keys]
    for pool in pools:
        pool.close()
