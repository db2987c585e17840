#!/usr/bin/env python3
"""The judge's Timer beside a plain probe, for a ladder of kernel sizes, on one GPU.

  python bench/timing_ladder.py [--out F.json] [--syncs checked,device,kernelbench]

Each rung is an elementwise kernel (x * 2 on N floats, N from 2^10 to 2^28), the last rungs a chain of them on 2^28
floats (8 and 32 kernels a call): a few microseconds to tens of milliseconds. The probe: CUDA events on the current
stream around one call, the L2 flushed before it, the host ahead (a spin queued before the start event), the median
of 20 calls. The judge's reading: its Timer (the one the candidate's and the oracle's processes use) with each sync,
warmed up, with the head start the judge would give (twice the enqueue time the warmup measured, within its
bounds), the median of its blocks' calls. Prints per rung the probe, each reading, its difference from the probe
(us) and ratio, and marks a reading outside the target (within 5% from 0.1 ms, within 5 us below). Trusted code.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from harness.shared.timer import Timer, head_start_ms  # noqa: E402

RUNGS = [(1 << k, 1) for k in range(10, 29, 2)] + [(1 << 28, 8), (1 << 28, 32)]   # (floats, kernels a call)


def probe_ms(call, x: torch.Tensor, flush: torch.Tensor, calls: int = 20) -> float:
    spans = []
    for _ in range(calls):
        torch.cuda.synchronize()
        flush.zero_()
        torch.cuda._sleep(1_000_000)   # the host ahead of the GPU while it enqueues the call
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call([x])
        end.record()
        torch.cuda.synchronize()
        spans.append(start.elapsed_time(end))
    return statistics.median(spans)


def judged_ms(call, x: torch.Tensor, sync: str, blocks: int = 10, reps: int = 20) -> float:
    timer = Timer(call, [[x]], "cuda", sync=sync)
    timer.warmup(20.0)
    timer.ahead_ms = 0.0 if sync == "kernelbench" else head_start_ms(timer.launch_ms)
    samples = [s for _ in range(blocks) for s in timer.block(reps).samples]
    return statistics.median(samples)


def chained(kernels: int):
    def call(inputs):
        y = inputs[0]
        for _ in range(kernels):
            y = y * 2
        return y
    return call


def meets(ms: float, probe: float) -> bool:
    """The target: a rung of 0.1 ms or more within 5% of the probe, a shorter one within 5 us."""
    return abs(ms - probe) <= (0.05 * probe if probe >= 0.1 else 0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--syncs", default="checked,device,kernelbench")
    args = parser.parse_args()
    syncs = args.syncs.split(",")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(max(2 * l2 // 4, 1 << 20), dtype=torch.int32, device="cuda")
    rows = []
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'floats':>13} {'probe ms':>10} " + " ".join(f"{s + ' ms':>14} {'diff us':>8} {'ratio':>6}"
                                                       for s in syncs))
    for n, chain in RUNGS:
        x = torch.randn(n, device="cuda")
        call = chained(chain)
        probe = probe_ms(call, x, flush)
        row = {"floats": n, "kernels": chain, "probe_ms": probe}
        line = f"{n:>10}x{chain:<2} {probe:>10.4f} "
        for sync in syncs:
            ms = judged_ms(call, x, sync)
            row[sync] = ms
            row[f"{sync}_meets"] = meets(ms, probe)
            line += f"{ms:>14.4f} {(ms - probe) * 1e3:>8.1f} {ms / probe:>6.3f}{'' if row[f'{sync}_meets'] else '*'}"
        print(line, flush=True)
        rows.append(row)
    print("* outside the target: within 5% of the probe from 0.1 ms, within 5 us below")
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
