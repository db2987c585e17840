"""The timer, shared by the oracle (reference) and the candidate's process so both sides are measured alike.

Every timed call gets fresh inputs: a clone of one of several input sets, chosen at random (seeded by the parent),
made outside the timed span.
On CUDA each call is bracketed by CUDA events with a device-wide synchronize before the end event, so work left on
side streams is counted; the L2 flush (twice the device's L2, zeroed) runs after the clone and before the start
event, outside the timed span. On CPU, time.perf_counter brackets each call.

The functions this module times with are bound when it is imported, before any submission code runs, so a
submission that replaces torch.cuda.Event.elapsed_time or time.perf_counter does not change these numbers (and
harness/integrity.py reports the replacement). Some timed calls are spot-checked: their outputs are copied to the
CPU right after the end event and later compared with the reference by the parent.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import torch

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_device_sync = torch.cuda.synchronize


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    reps: int
    calls: int             # timed calls including warmup
    events_ms: float       # sum of the timed spans of all calls, warmup included
    outside_ms: float      # host time spent on clones, flushes and spot-check copies (outside the timed spans)
    host_ms: float         # host wall time of the whole measurement

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SpotCheck:
    """Which timed calls to keep the outputs of, and what they were."""
    seed: int
    count: int
    kept: list[dict] = field(default_factory=list)   # {"call", "input_set", "outputs", "inputs_changed"}


def summarize(samples_ms: list[float], calls: int, events_ms: float, outside_ms: float,
              host_ms: float) -> TimingStats:
    ordered = sorted(samples_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return TimingStats(median_ms=statistics.median(ordered), iqr_ms=q3 - q1, min_ms=ordered[0],
                       max_ms=ordered[-1], mean_ms=statistics.fmean(ordered), reps=len(ordered), calls=calls,
                       events_ms=events_ms, outside_ms=outside_ms, host_ms=host_ms)


def _reps_for(per_call_ms: float, timing_ms: float, min_reps: int, max_reps: int) -> int:
    return int(min(max_reps, max(min_reps, timing_ms / max(per_call_ms, 1e-6))))


class _Timer:
    """One timed call at a time: fresh inputs, flush, time, optionally keep the outputs."""

    def __init__(self, call: Callable[[list], Any], input_sets: list[list], device: str, l2_flush: bool,
                 keep: Callable[[Any], Any], order_seed: int):
        self._last: Any = None
        self.order = random.Random(order_seed)
        self.call, self.input_sets, self.device, self.keep = call, input_sets, device, keep
        self.calls = 0
        self.events_ms = 0.0
        self.outside_ms = 0.0
        self.flush_buffer: Optional[torch.Tensor] = None
        if device == "cuda" and l2_flush:
            l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
            self.flush_buffer = torch.empty(max(2 * l2_bytes // 4, 1 << 20), dtype=torch.int32, device="cuda")

    def __call__(self, spot: Optional[SpotCheck] = None) -> float:
        index = self.order.randrange(len(self.input_sets))   # unpredictable: a replay by call count fails
        before = _clock()
        inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in self.input_sets[index]]
        if self.flush_buffer is not None:
            self.flush_buffer.zero_()
        self.outside_ms += (_clock() - before) * 1e3
        elapsed = self._timed(inputs)
        self.events_ms += elapsed
        if spot is not None:
            before = _clock()
            spot.kept.append({"call": self.calls, "input_set": index, "outputs": self.keep(self._last),
                              "inputs_changed": _changed(inputs, self.input_sets[index])})
            self.outside_ms += (_clock() - before) * 1e3
        self._last = None
        self.calls += 1
        return elapsed

    def _timed(self, inputs: list) -> float:
        if self.device != "cuda":
            start = _clock()
            self._last = self.call(inputs)
            return (_clock() - start) * 1e3
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _record(start)
        self._last = self.call(inputs)
        _device_sync()  # device-wide: side-stream work ends before the end event
        _record(end)
        _device_sync()
        return _elapsed(start, end)


def _changed(handed: list, original: list) -> bool:
    return any(isinstance(a, torch.Tensor) and not same_bits(a, b) for a, b in zip(handed, original))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN, -0.0 differs from 0.0): what a caller would notice."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() and a.is_contiguous() and b.is_contiguous():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
        if bits is not None:
            return torch.equal(a.view(bits), b.view(bits))
    return torch.equal(a, b)


def bench(call: Callable[[list], Any], input_sets: list[list], device: str, warmup_ms: float, timing_ms: float,
          min_reps: int, max_reps: int, l2_flush: bool = True, spot: Optional[SpotCheck] = None,
          keep: Callable[[Any], Any] = lambda outputs: None) -> TimingStats:
    """Time `call(inputs)` on device-resident `input_sets` in rotation: warmup by time, then reps by budget."""
    host_start = _clock()
    timer = _Timer(call, input_sets, device, l2_flush, keep, spot.seed if spot is not None else 0)
    if device == "cuda":
        _device_sync()
    first_ms = timer()
    deadline = _clock() + warmup_ms / 1e3
    while _clock() < deadline:
        timer()
    reps = _reps_for(first_ms, timing_ms, min_reps, max_reps)
    chosen: set[int] = set()
    if spot is not None and spot.count > 0:
        chosen = set(random.Random(spot.seed).sample(range(reps), min(spot.count - 1, reps))) | {reps - 1}
    samples = [timer(spot if i in chosen else None) for i in range(reps)]
    return summarize(samples, timer.calls, timer.events_ms, timer.outside_ms, (_clock() - host_start) * 1e3)
