#!/usr/bin/env python3
"""The host's round trip in a CUDA span, and the host's launch cost, process by process.

  python bench/round_trip.py [--spans N] [--processes K] [--out FILE]

Each row is one fresh process that times N spans of 8 small kernels (`torch.relu` on 64K floats, launch-bound):
`span` is the stream's span from a start event to an end event (the host's launch cost, the kernels being short), and
`gap` is the round trip the `events-sync` timing carries: from the end event to an event recorded after a device-wide
synchronize (the host waking from the synchronize and its next launch reaching the GPU). The processes differ in:

  flag       CUDA's schedule flag, set before the context starts (auto, spin, yield, blocking)
  confined   the judge's candidate confinement: the sandbox, a uid of its own and a cgroup, where the machine has them
  core       pinned to one core (taskset), each of the usable cores in turn
  plain      K processes as they come, nothing set

Prints a row per process (median span and gap in us, the gap's 90th percentile, the core it ended on) and, per kind,
the median and range of the processes' medians; `--out` writes the rows as JSON. GPU only.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCHEDULE_FLAGS = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}   # cudaDeviceSchedule*
WARMUP_SPANS = 50
KERNELS_PER_SPAN = 8


def _set_schedule(flag: int) -> None:
    """cudaSetDeviceFlags through the CUDA runtime torch loaded, before its context exists."""
    with open("/proc/self/maps") as maps:
        runtimes = sorted({line.split()[-1] for line in maps if "libcudart" in line})
    if not runtimes:
        raise RuntimeError("no libcudart loaded in this process")
    result = ctypes.CDLL(runtimes[0]).cudaSetDeviceFlags(ctypes.c_uint(flag))
    if result != 0:
        raise RuntimeError(f"cudaSetDeviceFlags({flag}) returned {result}")


def _current_core() -> int:
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[36])   # field 39, processor


def measure(flag: str, spans: int) -> dict:
    """This process's spans (in us): the median span and gap, the gap's 90th percentile and largest."""
    import torch
    if flag != "auto":
        _set_schedule(SCHEDULE_FLAGS[flag])
    x = torch.randn(64, 1024, device="cuda")
    gaps, widths = [], []
    for index in range(spans + WARMUP_SPANS):
        start, end, after = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        for _ in range(KERNELS_PER_SPAN):
            torch.relu(x)
        end.record()
        torch.cuda.synchronize()
        after.record()
        torch.cuda.synchronize()
        if index >= WARMUP_SPANS:
            widths.append(start.elapsed_time(end) * 1e3)
            gaps.append(end.elapsed_time(after) * 1e3)
    gaps.sort()
    return {"span_us": round(statistics.median(widths), 1), "gap_us": round(statistics.median(gaps), 1),
            "gap_p90_us": round(gaps[int(0.9 * len(gaps))], 1), "gap_max_us": round(gaps[-1], 1),
            "core": _current_core()}


def _confined_start(workdir: str):
    """The preexec of a candidate's start: sandbox, its own uid and a cage where the machine has them."""
    from harness.isolation import sandbox, spawn
    from harness.isolation.freeze import Cage
    cage, _ = Cage.create(64)
    user = sandbox.pick_user()
    policy = sandbox.Policy(writable=(workdir,), limits=sandbox.Limits(600, 2**30, 512, 4096))
    return spawn._preexec(policy, 0, cage, None, user), user


def run_one(kind: str, label: str, spans: int, flag: str = "auto", core: Optional[int] = None,
            confined: bool = False) -> dict:
    """One fresh process timing `spans` spans (pinned to `core`, confined as a candidate): its row, printed."""
    command = [sys.executable, str(Path(__file__).resolve()), "--one", flag, "--spans", str(spans)]
    if core is not None:
        command = ["taskset", "-c", str(core)] + command
    preexec, user, workdir = None, None, None
    if confined:
        workdir = tempfile.mkdtemp(prefix="round-trip-")
        os.chmod(workdir, 0o777)
        preexec, user = _confined_start(workdir)
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=preexec, cwd=workdir,
                          env={**os.environ, **({"HOME": workdir} if workdir else {})})
    row = {"kind": kind, "label": label}
    try:
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        row["error"] = (done.stderr or done.stdout)[-300:]
    if confined:
        row["uid"] = user.uid if user is not None else None
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--out")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.spans)))
        return
    rows = []
    for flag in SCHEDULE_FLAGS:
        rows.append(run_one("flag", flag, args.spans, flag=flag))
    for index in range(3):
        rows.append(run_one("confined", str(index), args.spans, confined=True))
    for core in sorted(os.sched_getaffinity(0)):
        rows.append(run_one("core", str(core), args.spans, core=core))
    for index in range(args.processes):
        rows.append(run_one("plain", str(index), args.spans))
    print(f"\n{'kind':10} {'processes':>9} {'span us median (range)':>26} {'gap us median (range)':>24}")
    for kind in ("flag", "confined", "core", "plain"):
        good = [row for row in rows if row["kind"] == kind and "gap_us" in row]
        if not good:
            continue
        spans = [row["span_us"] for row in good]
        gaps = [row["gap_us"] for row in good]
        print(f"{kind:10} {len(good):9d} {statistics.median(spans):10.1f} ({min(spans):.1f}-{max(spans):.1f})"
              f"{'':6} {statistics.median(gaps):8.1f} ({min(gaps):.1f}-{max(gaps):.1f})")
    if args.out:
        Path(args.out).write_text(json.dumps({"spans": args.spans, "kernels_per_span": KERNELS_PER_SPAN,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
