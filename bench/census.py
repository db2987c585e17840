"""A process census of a bench's run, for where a batch's time goes when its records only say that a worker waited.

Every CENSUS_EVERY_S seconds, one JSON line: the seconds since the census began, the host's load average and free
memory, and each process below `root` as [pid, parent pid, kind, state, CPU s, major faults, nice, resident MB]
(kind: oracle, candidate, build (a candidate-module process with no GPU: harness/isolation/policy.py's for_build),
compiler, judge (a run_eval.py command), other; state as /proc says it: R running, S sleeping, D in I/O, T stopped).
Every STACKS_EVERY_S seconds the judge's commands below `root` get SIGUSR1: they write every thread's stack to their
stderr, the run's logs (harness/cli.py).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Optional

CENSUS_EVERY_S = 5.0
STACKS_EVERY_S = 60.0
COMPILERS = {"nvcc", "cicc", "ptxas", "cc1plus", "cc1", "g++", "gcc", "c++", "g++-real", "cudafe++", "fatbinary",
             "nvlink", "ld", "as", "ninja", "collect2"}
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except OSError:
        return None


def kind_of(pid: int, argv: list[str]) -> str:
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        if module.endswith("oracle.main"):
            return "oracle"
        if module.endswith("candidate.main"):
            environ = _read(f"/proc/{pid}/environ") or b""
            return "build" if b"\0CUDA_VISIBLE_DEVICES=\0" in b"\0" + environ else "candidate"
        return module.rsplit(".", 2)[-2] if module.startswith("harness.") else "other"
    if any(arg.endswith("run_eval.py") for arg in argv[:2]):
        return "judge"
    return "compiler" if os.path.basename(argv[0]) in COMPILERS else "other"


def sample(root: int) -> list[list]:
    """[pid, ppid, kind, state, cpu_s, major_faults, nice, rss_mb] of every process below `root`."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            raw = _read(f"/proc/{entry}/stat")
            if raw is not None:
                stats[int(entry)] = raw.decode(errors="replace").rsplit(")", 1)[1].split()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    rows, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            fields = stats[pid]
            argv = (_read(f"/proc/{pid}/cmdline") or b"").decode(errors="replace").split("\0")
            rows.append([pid, int(fields[1]), kind_of(pid, argv), fields[0],
                         round((int(fields[11]) + int(fields[12])) / _TICK, 1), int(fields[9]), int(fields[16]),
                         round(int(fields[21]) * _PAGE_MB)])
    return rows


def _available_gb() -> Optional[float]:
    for line in (_read("/proc/meminfo") or b"").decode().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


class Census:
    """Samples in a thread of its own until stop(), which returns a summary: samples, and per kind its most
    processes at once and its process-samples in each state."""

    def __init__(self, path: Path, root: Optional[int] = None):
        self.path, self.root = path, root if root is not None else os.getpid()
        self.peak: Counter = Counter()
        self.states: dict[str, Counter] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="census")
        self._thread.start()

    def _run(self) -> None:
        began, stacks_at = time.monotonic(), time.monotonic() + STACKS_EVERY_S
        with open(self.path, "w") as sink:
            while not self._stop.is_set():
                rows = sample(self.root)
                now = time.monotonic()
                sink.write(json.dumps({"t": round(now - began, 1), "load": os.getloadavg()[0],
                                       "available_gb": _available_gb(), "procs": rows}) + "\n")
                sink.flush()
                self.samples += 1
                counts = Counter(row[2] for row in rows)
                for kind, count in counts.items():
                    self.peak[kind] = max(self.peak[kind], count)
                for row in rows:
                    self.states.setdefault(row[2], Counter())[row[3]] += 1
                if now >= stacks_at:
                    stacks_at = now + STACKS_EVERY_S
                    for row in rows:
                        if row[2] == "judge":
                            try:
                                os.kill(row[0], signal.SIGUSR1)
                            except OSError:
                                pass
                self._stop.wait(CENSUS_EVERY_S)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=30)
        return {"log": str(self.path), "samples": self.samples, "peak": dict(self.peak),
                "states": {kind: dict(states) for kind, states in self.states.items()}}
