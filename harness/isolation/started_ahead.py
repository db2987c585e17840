"""Child processes started ahead of need: a pool per device, worker environment and config keeps some started, and
taking one starts its replacement. What a process does to come up is its kind's (`Slot._spawn`, `Slot._come_up`):
candidate processes (harness/judge/warm.py) and oracle processes (harness/oracle/ahead.py). The config is theirs and
opaque here: part of a pool's key, and handed to `Slot._spawn`, which builds the process's spec and confinement.

Runs in the parent. A slot starts its process in the caller's thread (forks come from the threads that always
started children); a background thread only waits for it to come up. Until then the child's `settled` is unset,
so on the CPU device it is stopped while anything is timed (spawn.builds_paused).
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Optional

from harness.isolation import spawn
from harness.isolation.spawn import Child, ShuttingDown

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0   # a process started ahead that is not up by then is ended (a start on demand takes over)
LOG_TAIL_BYTES = 2000   # of a failed start's output, in its warning


@dataclass
class Started:
    """A process started ahead, up: its folder (the only one it may write) and its child handle."""
    child: Child
    workdir: Path
    log_path: Path         # its output so far (a temp file); moved to the log of what it runs when taken


class Slot:
    """One process being started in the background; `ready` is set once it is up or has failed."""
    kind = "process"   # in its folder's and log's names and in warnings

    def __init__(self, config: Hashable, device: str, env: dict[str, str]):
        self.ready = threading.Event()
        self.started: Optional[Started] = None
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{self.kind}-"))
        self._log = Path(tempfile.mkstemp(prefix=f"{self.kind}-ahead-", suffix=".log")[1])
        try:
            child = self._spawn(config, device, env, self._workdir, self._log)
        except (ShuttingDown, OSError) as exc:
            self._failed(None, str(exc))
            return
        child.mark_starting(self.ready)
        threading.Thread(target=self._wait, args=(child,), daemon=True, name=f"{self.kind}-ahead").start()

    def _spawn(self, config: Hashable, device: str, env: dict[str, str], workdir: Path, log_path: Path) -> Child:
        raise NotImplementedError

    def _come_up(self, child: Child) -> Optional[str]:
        """Wait until the process is up: None, or why it is not."""
        raise NotImplementedError

    def _wait(self, child: Child) -> None:
        why = self._come_up(child)
        if why is not None:
            self._failed(child, f"the {self.kind} process started ahead did not come up: {why}")
            return
        self.started = Started(child, self._workdir, self._log)
        self.ready.set()

    def _failed(self, child: Optional[Child], why: str) -> None:
        """Nothing of the slot is left: its process, folder and log (the log's end goes into the warning). A start
        ended by an interrupted batch (spawn.stop_all) failed for no reason of its own: no warning then."""
        if child is not None:
            child.finish()
        shutil.rmtree(self._workdir, ignore_errors=True)
        if not spawn.stopping():
            output = spawn.log_tail(self._log, LOG_TAIL_BYTES)
            log.warning("%s%s", why, f"; its output ended:\n{output}" if output else "")
        self._log.unlink(missing_ok=True)
        self.ready.set()

    def discard(self) -> None:
        """End the process without running anything in it."""
        self.ready.wait()
        if self.started is not None:
            self.started.child.finish()   # closing its command pipe tells it to exit
            shutil.rmtree(self.started.workdir, ignore_errors=True)
            self.started.log_path.unlink(missing_ok=True)
            self.started = None


def unexpected(child: Child, event: Optional[dict], wanted: str) -> Optional[str]:
    """None when `event` is `wanted`, else why not: how the child ended, the error its FAILED carries, or what it
    sent instead (for `Slot._come_up` and a gated reference's stages, harness/oracle/reference.py)."""
    if event is not None and event["event"] == wanted:
        return None
    if event is None:   # next_event says how it ended
        return child.ended.detail
    return str(event.get("error") or f"it sent {event['event']}")


class Pool:
    """`size` processes of the `slot` kind kept started for one device, environment and config."""
    slot: type[Slot] = Slot

    def __init__(self, config: Hashable, device: str, env: dict[str, str], size: int, takes: Optional[int] = None):
        self.config, self.device, self.env, self.size = config, device, dict(env), size
        # at most this many takes to come beyond what the slots started already serve (`Pools.expect_takes`,
        # `Pools.stop_refilling`); None: no bound
        self.takes_left = takes
        self._slots: list[Slot] = []
        self._lock = threading.Lock()
        self._closed = False

    def fill(self) -> None:
        """Start processes until `size` are started or starting (fewer when fewer takes are to come)."""
        with self._lock:
            wanted = self.size if self.takes_left is None else min(self.size, self.takes_left)
            while not self._closed and len(self._slots) < wanted:
                self._slots.append(self.slot(self.config, self.device, self.env))

    def take(self, refill_later: bool = False) -> Optional[Started]:
        """The oldest process started ahead once it is up (its replacement is started now, unless no more takes are
        to come), or None when it could not be started or none is left (the caller starts one on demand).
        `refill_later`: where the one taken is up already, the caller starts the replacement itself (`fill`, from
        the same thread) once it has handed the process its work, which then need not wait for that start. One
        still importing is waited for anyway: its replacement starts now."""
        self.fill()
        with self._lock:
            if not self._slots:
                return None
            slot = self._slots.pop(0)
            if self.takes_left is not None:
                self.takes_left = max(self.takes_left - 1, 0)
        if not refill_later or not slot.ready.is_set():
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


class Pools:
    """The pools of one kind, one per device, worker environment and config, each `size(config)` large."""

    def __init__(self, pool: type[Pool], size: Callable[[Hashable], int]):
        self._pool, self._size = pool, size
        self._pools: dict[tuple, Pool] = {}
        self._lock = threading.Lock()
        self._takes: Optional[int] = None   # `expect_takes`

    def expect_takes(self, takes: Optional[int]) -> None:
        """At most `takes` takes will come from each pool, those made from now on included (a batch's references:
        one per problem and worker); None: no bound (a judge kept between calls). A pool never starts a process
        beyond that: a one-shot submit's oracle process started ahead had a replacement importing for nothing."""
        with self._lock:
            self._takes = takes
            for pool in self._pools.values():
                pool.takes_left = takes

    def pool_for(self, config: Hashable, device: str, env: Optional[dict[str, str]]) -> Optional[Pool]:
        """The pool of this device, GPU worker environment and config (None when its size is 0)."""
        if self._size(config) <= 0:
            return None
        key = (device, tuple(sorted((env or {}).items())), config)   # every field: the confinement reads several
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = self._pool(config, device, env or {}, self._size(config), self._takes)
        return pool

    def stop_refilling(self, env: Optional[dict[str, str]] = None) -> None:
        """No replacement for the next takes from one GPU worker's pools (its last evaluation is under way): the
        process it would start imports for 3-5 CPU s beside that evaluation only to be ended unused."""
        wanted = tuple(sorted((env or {}).items()))
        with self._lock:
            pools = [pool for key, pool in self._pools.items() if key[1] == wanted]
        for pool in pools:
            pool.takes_left = 0

    def close_all(self, env: Optional[dict[str, str]] = None) -> None:
        """End the processes started ahead for one GPU worker's environment (a worker is done), or (None) all."""
        wanted = tuple(sorted(env.items())) if env is not None else None
        with self._lock:
            keys = [key for key in self._pools if wanted is None or key[1] == wanted]
            pools = [self._pools.pop(key) for key in keys]
        for pool in pools:
            pool.close()
