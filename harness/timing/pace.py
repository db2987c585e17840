"""The reference's pace on the GPU alone, without the host in it: trusted code only (the oracle's process).

A launch-bound reference's timed calls measure mostly the host: how fast its thread dispatches each call. The host
has spells of running such a thread at half speed for seconds (measured on an H200: a level0/5 reference read
0.022 ms a call, then 0.041 ms for a whole interleaved timing with its candidate stopped, then 0.023 ms again after
the candidate was killed), and nothing a stopped candidate does reaches the host: its threads are stopped. What a
stopped candidate can still do is on the GPU: work it queued, or a kernel that never ends, takes the GPU from the
reference's context. `gpu_pace_ms` tells the two apart: the reference's own calls queued behind a spin kernel, so
the host has queued all of them before the GPU reaches the first, timed by events around them. That is the GPU's
time for the reference's work, whatever the host's speed; another context's work on the GPU lengthens it.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Optional

import torch

PACE_GPU_MS = 5.0          # GPU work per round, about (at the reference's per-call time)
PACE_CALLS_MAX = 64
PACE_ROUNDS = 3
SPIN_CYCLES = 10_000_000   # the first spin (a few ms at GPU clocks); grown fourfold until the host is ahead
SPIN_GROWTH_MAX = 4


def pace_calls(per_call_ms: float) -> int:
    """Calls per round: about PACE_GPU_MS of the reference's work, 1 to PACE_CALLS_MAX."""
    return max(1, min(PACE_CALLS_MAX, round(PACE_GPU_MS / max(per_call_ms, 1e-3))))


def gpu_pace_ms(call: Callable[[], Any], calls: int, rounds: int = PACE_ROUNDS) -> Optional[float]:
    """Median over `rounds` of the GPU's time per call of `call()`, the calls queued behind a spin kernel (ms);
    None where it cannot be told: no CUDA, no spin kernel in this torch, or a host that never got ahead."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_sleep"):
        return None
    cycles, seen = SPIN_CYCLES, []
    for _ in range(rounds):
        for _ in range(SPIN_GROWTH_MAX):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            start.record()
            for _ in range(calls):
                call()
            end.record()
            ahead = not start.query()   # the GPU was still spinning when the last call had been queued
            torch.cuda.synchronize()
            if ahead:
                seen.append(start.elapsed_time(end) / calls)
                break
            cycles *= 4
        else:
            return None
    return statistics.median(seen)
