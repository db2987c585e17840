"""Candidate processes started ahead: interpreter up, torch imported, CUDA's context created, the profiler's first
session done, inside the sandbox and the cgroup the evaluation would give them, waiting for a submission.

Each process runs one submission only and is then ended like any other (a process that ran candidate code is never
used again), so isolation is what it is for a process started on demand: same confinement, same folder rules, same
environment. What is saved is the start-up (seconds per evaluation: docs/performance.md). A pool per device, GPU
worker environment and config keeps `config.warm_candidates` processes started (None: one; a judge kept between calls,
`run_eval.py serve` or harness.api.Judge, makes it two: a call that comes right after another then finds a process
up even where imports take longer than an evaluation); taking one starts its replacement.
The GPU part of a start-up never overlaps a timed block on its GPU: a process reports IMPORTED and creates its CUDA
context only when no timing runs there (spawn.start_gate; a timing waits for one already under way). On the CPU
device processes still starting are also stopped while something is timed (spawn.builds_paused).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Optional

from harness.isolation import policy, started_ahead
from harness.isolation.spawn import Child, start_gate
from harness.isolation.started_ahead import START_TIMEOUT_S, unexpected
from harness.shared import commands, handover, protocol
from harness.shared.config import Config
from harness.shared.settings import SandboxSettings
from harness.shared.specs import CANDIDATE_MODULE, CandidateSpec

log = logging.getLogger(__name__)


class _Slot(started_ahead.Slot):
    """One candidate process being started: confined as an evaluation's, up once IDLE."""
    kind = "candidate"

    def __init__(self, config: Config, device: str, env: dict[str, str]):
        self.imported = threading.Event()   # it reported IMPORTED: the rest of its start needs its place's gate
        self.gate_wait_s = 0.0              # how long it then waited for timings to end
        self.gate = start_gate(device, env)
        super().__init__(config, device, env)

    def _spawn(self, config: Config, device: str, env: dict[str, str], workdir: Path, log_path: Path) -> Child:
        confinement = policy.for_candidate(SandboxSettings.from_config(config), workdir, env, device)
        return Child(CANDIDATE_MODULE, CandidateSpec.started_ahead(config, workdir, device), workdir, log_path,
                     with_commands=True, handover=handover.candidate_files(config.fresh_inputs), lend=True,
                     **confinement.options())

    def _come_up(self, child: Child) -> Optional[str]:
        """Its imports, then (never beside a timing on its GPU: spawn.start_gate) its CUDA context and profiler
        session."""
        began = time.perf_counter()
        event = child.next_event(START_TIMEOUT_S)
        imported = time.perf_counter()
        if event is not None and event["event"] == protocol.IMPORTED:
            self.imported.set()
            with self.gate.start_up():
                gated = time.perf_counter()
                self.gate_wait_s = gated - imported
                child.send(commands.WARM_UP)
                event = child.next_event(START_TIMEOUT_S)
            log.info("candidate process started ahead: imports %.2f s, waited %.2f s for timings, CUDA and profiler "
                     "%.2f s", imported - began, gated - imported, time.perf_counter() - gated)
        return unexpected(child, event, protocol.IDLE)


class Pool(started_ahead.Pool):
    """`size` candidate processes kept started for one device, environment and config."""
    slot = _Slot


# `warm_candidates` None: BATCH_SIZE; a judge kept between calls (harness.api.Judge, and `serve` through it) makes it
# KEPT_SIZE before its first call
BATCH_SIZE, KEPT_SIZE = 1, 2
_POOLS = started_ahead.Pools(Pool, lambda config: BATCH_SIZE if config.warm_candidates is None
                             else config.warm_candidates)


def pool_for(config: Config, device: str, env: Optional[dict[str, str]]) -> Optional[Pool]:
    """The pool of this device, GPU worker environment and config (None when config.warm_candidates is 0)."""
    return _POOLS.pool_for(config, device, env)


def stop_refilling(env: Optional[dict[str, str]] = None) -> None:
    """One GPU worker takes its last candidate process: nothing starts to replace it (started_ahead.Pools)."""
    _POOLS.stop_refilling(env)


def close_all(env: Optional[dict[str, str]] = None) -> None:
    """End the candidate processes started ahead for one GPU worker's environment (a worker is done), or (None) all."""
    _POOLS.close_all(env)
