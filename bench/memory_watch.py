#!/usr/bin/env python3
"""What watching children's memory costs the judge's own process, with many children waiting at once.

  python bench/memory_watch.py [--processes P] [--children K] [--steps N]

Starts P sleeping processes (the host's process table: a cold 4-GPU batch has hundreds, builds and their
compilers), K of them standing for children that wait for their events with a memory limit, each waking every
POLL_S as harness/isolation/spawn.py's waits do. Two ways, each alone: `per-child` (each waiting thread reads its
child's memory itself, group_rss_bytes: a pass over /proc per child) and `watch` (one pass for all, spawn's memory
watch, which the waits read). Meanwhile another thread makes N short steps that each give up the interpreter (a pipe
round trip and a little Python), as a reference start's or a build hand-off's parent side does. Prints the steps'
wall time and the process's CPU use for each way.
"""
from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.isolation import spawn  # noqa: E402


def measure(way: str, roots: list[int], steps: int) -> tuple[float, float]:
    stop = threading.Event()
    watch = spawn._MemoryWatch()

    def wait(root: int) -> None:
        r, _ = os.pipe()
        while not stop.is_set():
            select.select([r], [], [], spawn.POLL_S)
            spawn.group_rss_bytes(root) if way == "per-child" else watch.rss_bytes(root)

    if way == "watch":
        for root in roots:
            watch.watch(root)
    threads = [threading.Thread(target=wait, args=(root,), daemon=True) for root in roots]
    for thread in threads:
        thread.start()
    time.sleep(2 * spawn.POLL_S)
    r, w = os.pipe()
    cpu, began = time.process_time(), time.perf_counter()
    for _ in range(steps):
        os.write(w, b"x")
        os.read(r, 1)
        sum(range(200))
    wall = time.perf_counter() - began
    time.sleep(2.0)
    share = (time.process_time() - cpu) / (time.perf_counter() - began)
    stop.set()
    for thread in threads:
        thread.join()
    for root in roots:
        watch.forget(root)
    return wall, share


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=600)
    parser.add_argument("--children", type=int, default=56)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    sleepers = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(args.processes)]
    try:
        roots = [p.pid for p in sleepers[:args.children]]
        print(f"{args.processes} processes, {args.children} children waiting, {args.steps} steps, "
              f"{os.cpu_count()} cores")
        for way in ("per-child", "watch"):
            wall, share = measure(way, roots, args.steps)
            print(f"  {way:9}  steps {wall:7.3f} s  judge process CPU {share:.2f} cores")
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
