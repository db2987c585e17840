"""A process census of a bench's run, for where a batch's time goes when its records only say that a worker waited.

Every CENSUS_EVERY_S seconds, one JSON line: the seconds since the census began, the host's load average and free
memory, and each process below `root` as [pid, parent pid, kind, state, CPU s, major faults, nice, resident MB]
(kind: oracle, candidate, build (a candidate-module process with no GPU: harness/isolation/policy.py's for_build),
compiler, judge (a run_eval.py command), other; state as /proc says it: R running, S sleeping, D in I/O, T stopped).
Every STACKS_EVERY_S seconds the judge's commands below `root` get SIGUSR1: they write every thread's stack to their
stderr, the run's logs (harness/cli.py).

  python bench/census.py LOG [--every S]    a table of a census: per S seconds (default 30) and kind, the processes
                                            seen (most at once), their states and the CPU seconds they used
"""
from __future__ import annotations

import argparse
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


def windows(lines: list[dict], every: float) -> list[tuple[float, dict[str, dict]]]:
    """Per `every` seconds: kind -> {"most": processes at once, "states": Counter, "cpu_s": CPU seconds used}."""
    out: list[tuple[float, dict[str, dict]]] = []
    last_cpu: dict[int, float] = {}
    for line in lines:
        start = line["t"] // every * every
        if not out or out[-1][0] != start:
            out.append((start, {}))
        kinds = out[-1][1]
        counts = Counter(row[2] for row in line["procs"])
        for row in line["procs"]:
            pid, kind, state, cpu = row[0], row[2], row[3], row[4]
            entry = kinds.setdefault(kind, {"most": 0, "states": Counter(), "cpu_s": 0.0})
            entry["states"][state] += 1
            entry["cpu_s"] += max(cpu - last_cpu.get(pid, 0.0), 0.0)
            last_cpu[pid] = cpu
        for kind, count in counts.items():
            kinds[kind]["most"] = max(kinds[kind]["most"], count)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="a census's table (bench/census.py)")
    parser.add_argument("log", type=Path)
    parser.add_argument("--every", type=float, default=30.0)
    args = parser.parse_args(argv)
    lines = [json.loads(text) for text in args.log.read_text().splitlines() if text.strip()]
    for start, kinds in windows(lines, args.every):
        cells = [f"{kind} {v['most']} [{' '.join(f'{s}{n}' for s, n in sorted(v['states'].items()))}] "
                 f"{v['cpu_s']:.0f}cpu" for kind, v in sorted(kinds.items())]
        print(f"{start:6.0f}s  " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
