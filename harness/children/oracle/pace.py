"""The GPU's pace without the host in it: trusted code only (the oracle's process).

A launch-bound reference's timed calls measure mostly the host: how fast its thread dispatches each call. The host
has spells of running such a thread at half speed for seconds (a level0/5 reference has read
0.022 ms a call, then 0.041 ms for a whole interleaved timing with its candidate stopped, then 0.023 ms again after
the candidate was killed), and nothing a stopped candidate does reaches the host: its threads are stopped. What a
stopped candidate can still do is on the GPU: work it queued, or a kernel that never ends, holds the GPU, and
without MPS the GPU time-slices between the contexts that have work. `gpu_pace_ms` tells the two apart: a fixed
workload (device copies) queued behind a spin kernel, so that the host has queued all of it before the GPU reaches
the first copy, timed by events around it. That is the GPU's time for the work, whatever the host's speed; another
context's work lengthens it, once the window spans several of the GPU's time slices (a window of the reference's
own launch-bound calls, 0.14 ms of GPU work, fitted inside one slice and read the same beside another process's
endless kernel).
"""
from __future__ import annotations

import statistics
from typing import Optional

import torch

PACE_ELEMENTS = 8 << 20    # float32 elements per copy (32 MB read, 32 MB written)
PACE_COPIES = 400          # per round: about 10 ms of GPU work at 3 TB/s, longer on slower GPUs
PACE_ROUNDS = 3
SPIN_CYCLES = 20_000_000   # the first spin (about 10 ms at GPU clocks); grown fourfold until the host is ahead
SPIN_GROWTH_MAX = 4


def gpu_pace_ms(rounds: int = PACE_ROUNDS) -> Optional[float]:
    """Median over `rounds` of the GPU's time per copy of the fixed workload, queued behind a spin kernel (ms);
    None where it cannot be told: no CUDA, no spin kernel in this torch, or a host that never got ahead."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_sleep"):
        return None
    source = torch.ones(PACE_ELEMENTS, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    cycles, seen = SPIN_CYCLES, []
    try:
        for _ in range(rounds):
            for _ in range(SPIN_GROWTH_MAX):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(cycles)
                start.record()
                for _ in range(PACE_COPIES):
                    target.copy_(source)
                end.record()
                ahead = not start.query()   # the GPU was still spinning when the last copy had been queued
                torch.cuda.synchronize()
                if ahead:
                    seen.append(start.elapsed_time(end) / PACE_COPIES)
                    break
                cycles *= 4
            else:
                return None
    finally:
        del source, target
    return statistics.median(seen)
