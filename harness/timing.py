"""The timer, in the style of triton's do_bench: a zero-argument closure and budgets in milliseconds.

Imported by both child processes (the oracle times the reference, the candidate's process times the candidate) so
the two sides are measured by the same code. On CUDA every timed call is bracketed by CUDA events on the current
stream with a device-wide synchronize before the end event, so work left on side streams is counted; the L2
flush runs before the start event, outside the timed span. On CPU, time.perf_counter brackets each call.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    reps: int

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return TimingStats(median_ms=statistics.median(ordered), iqr_ms=q3 - q1, min_ms=ordered[0],
                       max_ms=ordered[-1], mean_ms=statistics.fmean(ordered), reps=len(ordered))


def bench(fn: Callable[[], object], device: str, warmup_ms: float, timing_ms: float, min_reps: int,
          max_reps: int, l2_flush: bool = True) -> TimingStats:
    if device == "cuda":
        return _bench_cuda(fn, warmup_ms, timing_ms, min_reps, max_reps, l2_flush)
    return _bench_cpu(fn, warmup_ms, timing_ms, min_reps, max_reps)


def _reps_for(per_call_ms: float, timing_ms: float, min_reps: int, max_reps: int) -> int:
    return int(min(max_reps, max(min_reps, timing_ms / max(per_call_ms, 1e-6))))


def _bench_cpu(fn, warmup_ms, timing_ms, min_reps, max_reps) -> TimingStats:
    start = time.perf_counter()
    fn()
    first_ms = (time.perf_counter() - start) * 1e3
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        fn()
    samples = []
    for _ in range(_reps_for(first_ms, timing_ms, min_reps, max_reps)):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return summarize(samples)


def _bench_cuda(fn, warmup_ms, timing_ms, min_reps, max_reps, l2_flush) -> TimingStats:
    import torch

    flush_buffer: Optional[torch.Tensor] = None
    if l2_flush:
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        # Twice the L2 in int32 words: writing it evicts everything the previous call left cached.
        flush_buffer = torch.empty(max(2 * l2_bytes // 4, 1 << 20), dtype=torch.int32, device="cuda")

    def timed_call() -> float:
        if flush_buffer is not None:
            flush_buffer.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        torch.cuda.synchronize()  # device-wide: side-stream work ends before the end event
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    torch.cuda.synchronize()
    first_ms = timed_call()
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        timed_call()
    samples = [timed_call() for _ in range(_reps_for(first_ms, timing_ms, min_reps, max_reps))]
    return summarize(samples)
