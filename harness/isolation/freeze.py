"""Stopping a child's processes while the other side is timed, and the cgroup that holds them (parent side).

A `Cage` is a cgroup v2 made for one child before it starts; the child joins it between fork and exec (so every
process it ever starts is born inside), and the parent freezes, thaws and finally kills it through cgroup.freeze and
cgroup.kill. Where a pids controller is available (v2 in the cage, else a v1 `pids` hierarchy) the cage also caps
the number of processes (root ignores RLIMIT_NPROC, so this is what stops a fork bomb early), and where the v2
memory controller is enabled, memory.max. A machine that lets no cgroup be made gets no cage: the `Freezer` then
sends SIGSTOP / SIGCONT to every process of the child (its group, descendants, setsid escapees carrying its mark).
Either way the freezer then checks that every related process is really stopped, and stops stragglers by signal
(a process that left the cage). What held, and what was unavailable, is `describe()`d into the record.
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

SETTLE_S = 2.0          # how long a freeze may take to settle before the stragglers are reported
CAGE_PREFIX = "kernel-judge"
DISABLE_VARIABLE = "JUDGE_CGROUPS"   # JUDGE_CGROUPS=off: no cages, signals only
_counter = itertools.count()


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of the cgroup file systems."""
    found = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                    found.append((parts[1].replace("\\040", " "), parts[2], set(parts[3].split(","))))
    except OSError:
        pass
    return found


def _own_cgroup(version: str, controller: str = "") -> Optional[str]:
    """This process's cgroup path in the v2 hierarchy ("0::/x") or in the v1 hierarchy of `controller`."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                number, controllers, path = line.rstrip("\n").split(":", 2)
                if version == "cgroup2" and number == "0" and controllers == "":
                    return path
                if version == "cgroup" and controller in controllers.split(","):
                    return path
    except (OSError, ValueError):
        pass
    return None


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass
class Cage:
    """A cgroup v2 (and, for the process cap, perhaps a v1 pids cgroup) made for one child."""
    path: Path
    pids_path: Optional[Path] = None
    held: list[str] = field(default_factory=list)      # what the cage does, one phrase each
    missing: list[str] = field(default_factory=list)   # what it could not do here

    @classmethod
    def create(cls, max_processes: Optional[int] = None, max_memory_bytes: Optional[int] = None,
               cpus: Optional[tuple[int, ...]] = None) -> tuple[Optional["Cage"], str]:
        """A new cage under this process's own cgroup, or (None, why not)."""
        if os.environ.get(DISABLE_VARIABLE, "").lower() == "off":
            return None, f"cgroups disabled by {DISABLE_VARIABLE}=off"
        mounts = _mounts()
        unified = next((point for point, kind, _ in mounts if kind == "cgroup2"), None)
        own = _own_cgroup("cgroup2")
        if unified is None or own is None:
            return None, "no cgroup v2 hierarchy mounted"
        name = f"{CAGE_PREFIX}-{os.getpid()}-{next(_counter)}"
        path = Path(unified) / own.lstrip("/") / name
        try:
            path.mkdir()
        except OSError as exc:
            return None, f"cannot create a cgroup v2 ({exc.strerror or exc})"
        if not (path / "cgroup.freeze").exists():
            path.rmdir()
            return None, "cgroup v2 without cgroup.freeze (kernel older than 5.2)"
        cage = cls(path, held=["cgroup v2 freezer"])
        cage._limit_processes(max_processes, mounts, name)
        cage._limit_memory(max_memory_bytes)
        cage._limit_cpus(cpus)
        return cage, ""

    def _limit_processes(self, count: Optional[int], mounts: list, name: str) -> None:
        if count is None:
            return
        if (self.path / "pids.max").exists():
            _write(self.path / "pids.max", str(count))
            self.held.append(f"pids.max {count}")
            return
        v1 = next((point for point, kind, options in mounts if kind == "cgroup" and "pids" in options), None)
        own = _own_cgroup("cgroup", "pids")
        if v1 is not None and own is not None:
            try:
                pids_path = Path(v1) / own.lstrip("/") / name
                pids_path.mkdir()
                _write(pids_path / "pids.max", str(count))
                self.pids_path = pids_path
                self.held.append(f"pids.max {count} (cgroup v1)")
                return
            except OSError as exc:
                self.missing.append(f"pids.max ({exc.strerror or exc})")
                return
        self.missing.append("pids.max (no pids controller)")

    def _limit_memory(self, limit: Optional[int]) -> None:
        if limit is None:
            return
        if (self.path / "memory.max").exists():
            _write(self.path / "memory.max", str(limit))
            self.held.append(f"memory.max {limit / 2**30:g} GB")
        else:
            self.missing.append("memory.max (memory controller not enabled for cgroup v2; the watchdog polls instead)")

    def _limit_cpus(self, cpus: Optional[tuple[int, ...]]) -> None:
        if not cpus:
            return
        listed = ",".join(str(cpu) for cpu in cpus)
        try:
            _write(self.path / "cpuset.cpus", listed)
            self.held.append(f"cpuset.cpus {listed}")
        except OSError:
            self.missing.append("cpuset.cpus (cpuset controller not enabled for cgroup v2; affinity only)")

    def join_paths(self) -> tuple[str, ...]:
        """The cgroup.procs files a starting child writes its pid to (between fork and exec)."""
        return tuple(str(p / "cgroup.procs") for p in (self.path, self.pids_path) if p is not None)

    def members(self) -> set[int]:
        try:
            return {int(pid) for pid in (self.path / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            return set()

    def freeze(self, frozen: bool) -> None:
        try:
            _write(self.path / "cgroup.freeze", "1" if frozen else "0")
        except OSError:   # the child ended and its cage is gone: nothing left to stop
            pass

    def settled(self) -> bool:
        try:
            return "frozen 1" in (self.path / "cgroup.events").read_text()
        except OSError:
            return not self.path.exists()   # gone with its processes: nothing runs

    def cpu_ms(self) -> Optional[float]:
        """CPU time used by every process that was ever in the cage (cpu.stat usage_usec, kept without the cpu
        controller), in ms; None where the file cannot be read."""
        try:
            for line in (self.path / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "usage_usec":
                    return int(value) / 1e3
        except (OSError, ValueError):
            pass
        return None

    def kill(self) -> None:
        try:
            _write(self.path / "cgroup.kill", "1")
        except OSError:   # kernels before 5.14 have no cgroup.kill: the signal path kills instead
            pass

    def remove(self) -> None:
        """Remove the cgroups once empty (a few tries: killed processes take a moment to leave)."""
        for path in (self.path, self.pids_path):
            if path is None:
                continue
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)

    def describe(self) -> str:
        return ", ".join(self.held) + (f"; unavailable: {', '.join(self.missing)}" if self.missing else "")


def join_in_child(paths: tuple[str, ...]) -> None:
    """Between fork and exec: move this process into the cage (system calls only)."""
    pid = str(os.getpid()).encode()
    for path in paths:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T) or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return True
    return stat[stat.rfind(")") + 2:stat.rfind(")") + 3] in ("T", "t", "Z", "X")


class Freezer:
    """Stops and resumes every process of one child. `processes()` lists them (pid, name): a scan of /proc, a few
    ms, so it runs at `audit()` (before the first freeze and after timing), not at every freeze: a freeze is the
    cage's cgroup.freeze, or SIGSTOP to the child's process group plus the escapees the last audit found."""

    def __init__(self, root: int, processes: Callable[[], list[tuple[int, str]]], cage: Optional[Cage] = None):
        self.root, self.processes, self.cage = root, processes, cage
        self.outside: list[int] = []       # related processes neither in the cage nor in the process group
        self.escaped: list[str] = []       # evidence: "pid name" of each process found outside
        self.stragglers: list[str] = []    # evidence: a freeze that did not settle
        self.costs_ms: list[float] = []    # freeze + thaw, per freeze
        self._freeze_ms = 0.0
        self._audited = False   # audited before its own first freeze
        self._scanned = False   # looked for processes outside at least once

    @property
    def mechanism(self) -> str:
        return "cgroup v2 freezer" if self.cage is not None else "SIGSTOP/SIGCONT of the process group"

    def audit(self) -> None:
        """Find the child's processes that the freeze would miss (left the cage, or the process group when there
        is no cage); later freezes stop them by signal."""
        self._find_outside()
        self._audited = True

    def _find_outside(self) -> None:
        self._scanned = True
        members = self.cage.members() if self.cage is not None else None
        self.outside = []
        for pid, name in self.processes():
            inside = pid in members if members is not None else _group_of(pid) == self.root
            if not inside:
                self.outside.append(pid)
                if f"{pid} {name}" not in self.escaped:
                    self.escaped.append(f"{pid} {name}")

    def freeze(self, hold: bool = False) -> None:
        """Stop every process of the child. `hold`: beside another's timing (harness/isolation/spawn.py `_stopped`),
        while the child may still be starting: the first such freeze looks for processes outside too, but does not
        count as the audit before the child's own first freeze, so that what it starts later is still found then."""
        if hold:
            if not self._scanned:
                self._find_outside()
        elif not self._audited:
            self.audit()
        start = time.perf_counter()
        if self.cage is not None:
            self.cage.freeze(True)
        else:
            _signal_group(self.root, signal.SIGSTOP)
        for pid in self.outside:
            _signal(pid, signal.SIGSTOP)
        deadline = time.monotonic() + SETTLE_S
        while not self._settled() and time.monotonic() < deadline:
            time.sleep(0.0001)
        if not self._settled() and "freeze did not settle" not in self.stragglers:
            self.stragglers.append("freeze did not settle")
        self._freeze_ms = (time.perf_counter() - start) * 1e3

    @property
    def freezes(self) -> int:
        return len(self.costs_ms)

    def cpu_ms(self) -> Optional[float]:
        """CPU time the child's processes have used so far (ms), from its cage; None without one (or a process
        outside it, whose use the cage does not count)."""
        if self.cage is None or self.escaped:
            return None
        return self.cage.cpu_ms()

    def _settled(self) -> bool:
        if self.cage is not None and not self.cage.settled():
            return False
        watched = self.outside + ([] if self.cage is not None else [self.root])
        return all(stopped(pid) for pid in watched)

    def thaw(self) -> None:
        start = time.perf_counter()
        for pid in self.outside:
            _signal(pid, signal.SIGCONT)
        if self.cage is not None:
            self.cage.freeze(False)
        else:
            _signal_group(self.root, signal.SIGCONT)
        self.costs_ms.append(self._freeze_ms + (time.perf_counter() - start) * 1e3)


def _group_of(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal(pid: int, which: int) -> None:
    try:
        os.kill(pid, which)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(group: int, which: int) -> None:
    try:
        os.killpg(group, which)
    except (ProcessLookupError, PermissionError):
        pass
