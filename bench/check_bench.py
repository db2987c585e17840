#!/usr/bin/env python3
"""How fast the parent compares outputs (harness/shared/check.py `compare`): seconds for one float32 output of
--elements elements, per torch thread count and chunk size. The judge compares every trial, the repeat, the
gradients, the spot checks and the fresh-input outputs this way, on the GPU worker's host.

  python bench/check_bench.py [--elements 8388608] [--threads 1,4,16] [--chunks 18,20,24] [--busy-thread]

`--busy-thread`: with another Python thread of the process running meanwhile (as a judge's threads may), which
holds the GIL each time a torch call gives it up.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _spin() -> None:
    count = 0
    while True:
        count += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 23)
    parser.add_argument("--threads", default=f"1,4,{os.cpu_count()}")
    parser.add_argument("--chunks", default="18,20,22,24", help="log2 of COMPARE_CHUNK values")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy-thread", action="store_true")
    args = parser.parse_args()
    if args.busy_thread:
        threading.Thread(target=_spin, daemon=True).start()

    import torch

    from harness.shared import check

    reference = torch.randn(args.elements)
    candidate = reference + 1e-6 * torch.randn(args.elements)
    tolerance = check.Tolerance.for_outputs()
    print(f"cores {os.cpu_count()}, torch {torch.__version__}, default threads {torch.get_num_threads()}, "
          f"{args.elements} float32 elements ({args.elements * 4 / 2**20:.0f} MB)")
    print(f"{'threads':>7} {'chunk':>6} {'median s':>9} {'GB/s (both sides)':>18}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for log2 in (int(c) for c in args.chunks.split(",")):
            check.COMPARE_CHUNK = 1 << log2
            times = []
            for _ in range(args.repeats):
                began = time.perf_counter()
                check.compare(candidate, reference, tolerance)
                times.append(time.perf_counter() - began)
            median = statistics.median(times)
            print(f"{threads:7d} {'2^' + str(log2):>6} {median:9.4f} {2 * args.elements * 4 / median / 1e9:18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
