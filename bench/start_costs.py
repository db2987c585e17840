#!/usr/bin/env python3
"""What starting a confined child costs on this host, one confinement step at a time, alone and several at once.

  python bench/start_costs.py [--starts N] [--threads 1,8] [--busy K] [--out FILE]

Starts N children that exit at once (`true`: the child's own program costs nothing, and every namespace made is torn
down meanwhile, as a batch's children come and go) from T threads, through the fork lock as spawn.Child does, with
the steps a start takes between fork and exec added one by one:

  fork       nothing (the fork itself: copying this process's page tables)
  cage       its cgroup made and joined (freeze.Cage)
  netns      a network namespace of its own (unshare), nothing else
  sandbox    every sandbox layer (rlimits, network namespace, Landlock, capabilities dropped)
  candidate  what a candidate's start does: cage, sandbox and a uid of its own (where the machine has one)

`--hold` keeps the lock until the child execs (the fork lock's former hold, for comparison). `--busy K` keeps K
processes spinning meanwhile (a build pool's compilers). Prints, per step and thread count, the
wall time of the N starts, the starts per second, and a start's lock wait, fork and fork-to-exec (median, 95th
percentile, slowest); `--out` writes the rows as JSON. A step the machine cannot apply is left out and said so.
"""
from __future__ import annotations

import _imp
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.isolation import sandbox, spawn  # noqa: E402
from harness.isolation.freeze import Cage  # noqa: E402
from harness.isolation.policy import CAGE_TASKS, SandboxSettings, submission_limits  # noqa: E402
from harness.shared.config import Config  # noqa: E402

TRUE = shutil.which("true") or "/bin/true"


def steps(folder: str) -> dict[str, Optional[Callable[[], tuple[Callable[[], None], Callable[[], None]]]]]:
    """step -> a maker of (preexec, cleanup) for one start, or None where this machine lacks the step."""
    caps = sandbox.capabilities()
    policy = sandbox.Policy(writable=(folder,), limits=submission_limits(SandboxSettings.from_config(Config())))

    def fork():
        return (lambda: None), (lambda: None)

    def cage():
        made, _ = Cage.create(CAGE_TASKS)
        return spawn._preexec(None, 0, made, None, None), made.remove

    def netns():
        libc = sandbox._libc()
        return (lambda: sandbox._enter_netns(libc, sandbox.CLONE_NEWNET, ())), (lambda: None)

    def confined():
        return sandbox.preexec(policy), (lambda: None)

    def candidate():
        made, _ = Cage.create(CAGE_TASKS)
        return spawn._preexec(policy, 0, made, None, sandbox.pick_user()), made.remove

    has_cage = Cage.create(1)[0]
    if has_cage is not None:
        has_cage.remove()
    return {"fork": fork, "cage": cage if has_cage is not None else None,
            "netns": netns if caps.netns and not caps.netns_via_userns else None,
            "sandbox": confined, "candidate": candidate if has_cage is not None else None}


def run(make, starts: int, threads: int, hold: bool) -> dict:
    waits, forks, execs = [], [], []
    lock = threading.Lock()
    children = []

    def starter(count: int) -> None:
        for _ in range(count):
            preexec, cleanup = make()
            asked = time.perf_counter()
            with sandbox.fork_guard():
                locked = time.perf_counter()
                if hold:
                    _imp.acquire_lock()   # a second hold the fork does not give back: held until exec
                try:
                    child = subprocess.Popen([TRUE], preexec_fn=preexec, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
                finally:
                    if hold:
                        _imp.release_lock()
            returned = time.perf_counter()
            forked = sandbox.forked_at() or returned
            with lock:
                waits.append(locked - asked)
                forks.append(forked - locked)
                execs.append(returned - locked)
                children.append((child, cleanup))

    began = time.perf_counter()
    workers = [threading.Thread(target=starter, args=(starts // threads + (i < starts % threads),))
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - began
    for child, cleanup in children:
        child.wait()
        cleanup()

    def spread(values: list[float]) -> list[float]:
        ordered = sorted(values)
        return [round(statistics.median(ordered) * 1e3, 2), round(ordered[int(0.95 * (len(ordered) - 1))] * 1e3, 2),
                round(ordered[-1] * 1e3, 2)]

    return {"starts": len(execs), "threads": threads, "wall_s": round(wall, 3),
            "per_s": round(len(execs) / wall, 1), "lock_wait_ms": spread(waits), "fork_ms": spread(forks),
            "fork_to_exec_ms": spread(execs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=64)
    parser.add_argument("--threads", default="1,8")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    parser.add_argument("--hold", action="store_true",
                        help="hold the fork lock until the child execs, not through the fork only (for comparison)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    folder = tempfile.mkdtemp(prefix="start-costs-")
    os.chmod(folder, 0o777)
    rows = []
    try:
        for name, make in steps(folder).items():
            if make is None:
                print(f"{name}: not applied on this machine, left out")
                continue
            for threads in (int(t) for t in args.threads.split(",")):
                row = {"step": name, **run(make, args.starts, threads, args.hold)}
                rows.append(row)
                print(f"{name:9} threads {threads:2}: {row['starts']} starts in {row['wall_s']:7.3f} s "
                      f"({row['per_s']:6.1f}/s); lock wait {row['lock_wait_ms']} ms, fork {row['fork_ms']} ms, "
                      f"fork to exec {row['fork_to_exec_ms']} ms (median, p95, slowest)", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        shutil.rmtree(folder, ignore_errors=True)
    if args.out:
        summary = {"busy": args.busy, "hold": args.hold, "cpus": os.cpu_count(), "rows": rows}
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
