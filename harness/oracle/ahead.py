"""Oracle processes started ahead: the interpreter up and torch and the harness imported before a problem needs one.

Starting a reference spent 3-5 s in its process's imports, once per problem, on the GPU worker's path: a batch of 17
kernels over 13 problems spent 47 s there. With the config's `warm_oracles` (default 1), each GPU worker keeps that
many oracle processes imported and waiting (a pool per device, worker environment and config:
harness/isolation/started_ahead.py); a reference start takes one, sends it the problem's spec (`CMD_RUN`) and waits
for READY as for a process started on demand, and another starts its imports meanwhile (the record's `ref_take`: the
wait for the one taken to be up). An oracle is trusted code (the problem's reference) under the trusted policy, so
nothing about isolation changes; a process started ahead does no GPU work before its spec comes (its CUDA context is
made after), and on the CPU device it is stopped during timings while it imports, like a candidate process started
ahead.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from harness.isolation import policy, started_ahead
from harness.isolation.spawn import Child
from harness.isolation.started_ahead import START_TIMEOUT_S, Started, unexpected
from harness.shared import commands, protocol
from harness.shared.config import Config
from harness.shared.handover import oracle_files
from harness.shared.settings import SandboxSettings
from harness.shared.specs import ORACLE_MODULE, OracleSpec


class _Slot(started_ahead.Slot):
    """One oracle process being started: up once it has imported (IMPORTED)."""
    kind = "oracle"

    def _spawn(self, config: Config, device: str, env: dict[str, str], workdir: Path, log_path: Path) -> Child:
        confinement = policy.for_trusted(SandboxSettings.from_config(config), env, device)
        return Child(ORACLE_MODULE, OracleSpec.started_ahead(config, workdir, device), workdir, log_path,
                     with_commands=True, handover=oracle_files(), **confinement.options())

    def _come_up(self, child: Child) -> Optional[str]:
        return unexpected(child, child.next_event(START_TIMEOUT_S), protocol.IMPORTED)


class _Pool(started_ahead.Pool):
    slot = _Slot


_POOLS = started_ahead.Pools(_Pool, lambda config: config.warm_oracles)


def take(config: Config, device: str, env: Optional[dict]) -> Optional[Started]:
    """An imported oracle process for this worker (waiting for its imports if it is still importing: a start on
    demand would import too), or None (`warm_oracles` 0, or it failed). Its replacement, for the next reference,
    is started by `run` once this one has its problem."""
    pool = _POOLS.pool_for(config, device, env)
    return pool.take(refill_later=True) if pool is not None else None


def fill(config: Config, device: str, env: Optional[dict]) -> None:
    """Start oracle processes until `warm_oracles` are started ahead for this worker."""
    pool = _POOLS.pool_for(config, device, env)
    if pool is not None:
        pool.fill()


def run(started: Started, spec: OracleSpec, log_path: Path, config: Config, device: str,
        env: Optional[dict]) -> None:
    """Hand a process started ahead its problem (its log moves to `log_path`, its spec goes down the command pipe),
    then start its replacement while it works."""
    started.child.output.move_to(log_path)
    started.child.send(commands.Run(dataclasses.asdict(spec)))
    fill(config, device, env)


def expect_takes(takes: Optional[int]) -> None:
    """At most `takes` reference starts per worker from now on (a batch: its problems), None: no bound."""
    _POOLS.expect_takes(takes)


def close_all(env: Optional[dict] = None) -> None:
    """End the oracle processes started ahead for a worker's environment (the worker is closing), or (None) all."""
    _POOLS.close_all(env)
