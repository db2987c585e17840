"""The timer and the adaptive, interleaved measurement built on it.

`Timer` runs in the process that owns the code being timed (the oracle for the reference, the candidate's child for
the submission). Every timed call gets fresh inputs: a clone of one of several input sets, chosen at random (seeded
by the parent), made outside the timed span. On CUDA each call is bracketed by CUDA events, the end event by `sync`:
  - "checked" (the default): on the current stream right after the call, so the span ends when the call's GPU work
    on that stream ends; then a device-wide synchronize and a second end event (`Block.synced`), whose span also
    holds work left on other streams and the host's round trip. The parent compares the two sides' gaps between
    them (harness/timing/interleave.py `escaped_work`): a candidate whose work outlives its stream is timed by the
    second spans, both sides alike;
  - "device": a device-wide synchronize before the end event: side-stream work counted, and the host's round trip
    from the synchronize to the end event too (tens of microseconds: what a sub-millisecond kernel reads too slow);
  - "stream": the end event on the current stream, unchecked (side-stream work escapes the events; only the
    parent's wall-clock cross-check sees it);
  - "kernelbench": KernelBench's `cuda_event` timing: a device-wide synchronize before each call's preparation,
    the end event on the current stream, no head start (the config's `timing: kernelbench` turns it off); its
    records report means. The L2 flush (a buffer twice the
device's L2, zeroed) runs after the clone and before the start event. With a head start (`ahead_ms`, set by the
driver from the sides' enqueue times: `measure`'s ahead_from) a spin kernel follows the flush, so the start
event fires once the host has had that long to enqueue the forward: its dispatch stays out of the span. With
`graph`, the forward is captured once into a CUDA graph and each timed call is one replay on inputs copied into
the captured buffers.

**Spans of several calls.** A call too short to time alone (its timed span in the warmup below MIN_SPAN_MS on CUDA,
the fastest of a few with the host ahead; its median below MIN_SPAN_MS_CPU on the CPU) is timed `calls_per_span`
times back to back in one span, and each counted sample is that span divided by the count (`span_calls` says how
many). Each call of the span gets its own clone of an input set drawn in the seeded order, all made before the start
event; the L2 is flushed once before the span and not between its calls; the head start runs once per span, as long
as its calls need together. Only sync "checked" and "stream" (and the CPU's clock): "device" and "kernelbench" keep
one call a span, as the numbers they reproduce were taken.

`measure` drives one or more sides (a local Timer, or a process behind pipes) in blocks: warmup by time, then blocks
of about `block_ms` each, alternating A B B A A B ... when interleaved, until the 95% confidence interval of every
side's median is within `target_ci` of it (and at least `min_blocks` blocks ran), or the time cap is reached.
The speedup comes from paired blocks (`paired_ratio`), so clock and thermal drift that moves both sides cancels.

The functions this module times with are bound when it is imported, before any submission code runs, and the
Timer's methods that run around a submission's calls hold them in their default arguments (a tuple, which Python
audits replacing and nobody can change in place), never reading a name at call time: a submission that replaces
torch.cuda.Event.record, torch.cuda.current_stream, time.perf_counter or this module's `_clock` does not change these
numbers, whether the replacement lasts (harness/children/candidate/watch.py reports it) or is made inside one timed
call and undone before anything looks. What torch runs beneath them (torch.cuda.synchronize's and
torch.cuda.current_stream's own Python) still reads torch's names (docs/threat-model.md).
"""
from __future__ import annotations

import gc
import math
import os
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional, Protocol, Sequence

import torch

from harness.shared.rule import Rule
from harness.shared.sizes import fitting

_clock = time.perf_counter
_Event = torch.cuda.Event
_record = torch.cuda.Event.record   # given the stream: Event.record would look torch.cuda.current_stream up itself
_current_stream = torch.cuda.current_stream
_elapsed = torch.cuda.Event.elapsed_time
_device_sync = torch.cuda.synchronize
_replay = torch.cuda.CUDAGraph.replay
_spin = getattr(torch.cuda, "_sleep", None)   # a kernel that spins for a number of GPU clock cycles
_gc_enabled, _gc_disable, _gc_enable = gc.isenabled, gc.disable, gc.enable

CONFIDENCE = 0.95
SYNC_MODES = ("checked", "device", "stream", "kernelbench")
METHOD_NAMES = {"checked": "stream end, checked", "device": "device sync", "stream": "stream end",
                "kernelbench": "kernelbench cuda_event"}
# The head start the host gets on CUDA (`head_start_ms`): this many times the trusted side's median host time per
# call in its warmup (the time its forward takes to enqueue), within these bounds
HEAD_FACTOR = 2.0
HEAD_MIN_MS, HEAD_MAX_MS = 0.02, 2.0
SPIN_CALIBRATION_CYCLES = 1_000_000   # ~0.5 ms at 2 GHz, each timed behind a lead spin (~2 ms) that keeps the
SPIN_LEAD_CYCLES = 4_000_000          #   GPU busy while the host queues the timed one
SPIN_CALIBRATIONS = 3                 # at least this many timed spins, and more while the best still rises
SPIN_CALIBRATIONS_MAX = 16            #   (a clock coming up from idle): until SPIN_SETTLED in a row add under 1%
SPIN_SETTLED = 2
_cycles_per_ms: list[float] = []   # this process's figure, once measured (spin_cycles_per_ms)

# Spans of several calls (`span_calls`). A CUDA event pair resolves about 0.5 us, and each span carries the start
# event's and the end event's placement around the first and last kernel: on an H200 a 3 us ReLU read 5.6 us timed
# one a span and 3.2 us four a span, so about 2.4 us a span, and not the same in every process: the same ReLU's
# reference, ten calls a span, read 2.95 to 3.22 us a call in five processes, each process's blocks within 2% of
# its own median. Over 100 us of span the placement is within 2.5% of it, its variation a part of that, and a count
# read a little off moves the per-call time by less. On the CPU, perf_counter resolves well below a
# microsecond, but each span also holds its two clock reads and the timer's Python around the call (about 0.3 us)
# and whatever interrupt or scheduler tick lands in it (microseconds, now and then): over 50 us both are within about
# 1% of the span, where a torch operator on a few elements takes 2-5 us of which they would be a tenth.
MIN_SPAN_MS = 0.1
MIN_SPAN_MS_CPU = 0.05
SPAN_CALLS_CAP = 64              # calls in one span at most (a 0.3 us CPU call needs no more than 64 for 20 us)
SPAN_COUNT_SPANS = 7             # CUDA: spans with the host ahead in one round of the count's reading
SPAN_COUNT_ROUNDS = 4            # rounds at most: more while a round's fastest beats the best before it by a fifth
# the fed input sets timed calls rotate among: as many as fit in this (timing_sets; KERNEL_JUDGE_TIMING_SET_BYTES sets
# another for a process and its children, both sides of a timing alike)
TIMING_SET_BYTES = int(os.environ.get("KERNEL_JUDGE_TIMING_SET_BYTES") or 2**30)
TIMING_SETS_MIN = 2              # ... and never fewer sets than this
SPAN_CLONE_BYTES = 512 << 20     # a span's input clones together stay within this (a large input read in part)
SPAN_SYNCS = ("checked", "stream")   # the sync modes that time several calls a span; the others reproduce numbers
SPAN_WARMUP_SPANS = 5            # spans of the chosen count timed in the warmup, to size blocks by their wall time
# Null spans (sync "checked" on CUDA): in every block, spans of the harness's own spin kernel alone, timed to the
# stream's end event and to one after a device-wide synchronize like a call's span. Their gap is this process's own
# round trip from a synchronize that waited on the GPU (processes alike differ in it: a candidate's read 67 us a span
# where its reference's read 33 us, both honest), which harness/timing/interleave.py escaped_work weighs a call's
# gap against. They fall among the counted spans at places the timer's seeded order picks. The spin lasts as long as
# the GPU is busy after the host has queued a span (its head start and the span, as the warmup read them): the round
# trip grows with the synchronize's wait (on an H200 an honest 2.8 ms kernel's spans read 30-44 us where 50 us null
# spans in the same process read 15 us), so a null span waits as a call's span does.
NULL_SPANS = 3
NULL_SPIN_MS = 0.05              # the shortest null span's spin
NULL_SPIN_MAX_MS = 5.0           # the longest (a span beyond it waits long enough for any wake-up)


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    ci_low_ms: float       # 95% confidence interval of the median (order statistics, distribution-free)
    ci_high_ms: float
    iqr_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    reps: int              # samples counted in the statistics (one per timed span: its time per call)
    blocks: int
    calls: int             # timed spans including warmup and each block's first (uncounted) span
    events_ms: float       # sum of the timed spans in the blocks (each block's uncounted first span included)
    outside_ms: float      # the side's own report of its host time on clones, flushes and spot-check copies
    wall_ms: float         # host wall time around the blocks, measured by whoever drove them
    converged: bool        # the CI target was met (False: the cap ended the measurement)
    method: str            # "events, device sync", "events, stream", "cuda_graph, device sync", ...
    held_ms: float = 0.0   # wall time the driver saw that neither side's work explains (Block.held_ms), summed
    calls_per_span: int = 1   # back-to-back calls each timed span held, as the side reported it (`span_calls`);
                              # each sample is its span over this count. Evidence: the parent reads its own
                              # (harness/timing/interleave.py read_calls_per_span) for what it decides

    @property
    def ci_half_width(self) -> float:
        """Half the CI's width as a share of the median."""
        return (self.ci_high_ms - self.ci_low_ms) / 2 / self.median_ms if self.median_ms > 0 else math.inf

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Block:
    samples: list[float]   # ms per call, one per counted span (the span over its calls_per_span)
    events_ms: float       # every timed span in the block, whole, its uncounted first span included
    outside_ms: float      # the harness's work around those calls: clones and flushes (GPU time on CUDA), copies
    wall_ms: float = 0.0   # set by the driver: the side cannot be trusted with its own wall clock
    held_ms: float = 0.0   # set by the driver: time in wall_ms spent waiting for a CPU (the side's timing thread
                           # and the driver's, from the kernel's run-queue accounting) and stopping the other side
    began_s: float = 0.0   # set by the driver: when it began (time.time()), to line blocks up with readings taken
                           # beside them (a GPU's clocks and power, say)
    launch_ms: float = 0.0  # the side's report: host time from each start event to its call's return (the
                            # enqueueing of a forward on CUDA, inside the timed span), summed like events_ms
    synced: list[float] = field(default_factory=list)   # sync "checked": per counted span, the span to an end event
                                                        # after a device-wide synchronize (side streams included),
                                                        # over its calls_per_span as the samples are
    calls_per_span: int = 1   # the side's report: back-to-back calls in each of its spans (`span_calls`)
    null_gaps: list[float] = field(default_factory=list)   # sync "checked": the round trip of this process alone
                                                           # (Timer._null_gap), one per null span, whole (ms)


def median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics x(j) .. x(n+1-j), with j the largest rank whose
    binomial coverage is still at least `confidence` (fewer than 6 samples: min .. max, below 95%)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    alpha = 1 - confidence
    if n > 300:   # normal approximation of the binomial ranks
        j = max(1, int(math.floor(n / 2 - 1.959963984540054 * math.sqrt(n) / 2)))
    else:
        j, tail = 1, 0.0
        for rank in range(1, n // 2 + 1):   # P(B <= rank - 1), B ~ Binomial(n, 1/2)
            tail += math.comb(n, rank - 1) / 2 ** n
            if 2 * tail > alpha:
                break
            j = rank
    return ordered[j - 1], ordered[n - j]


def summarize(blocks: Sequence[Block], calls: int, converged: bool, method: str) -> TimingStats:
    """The statistics of a side's counted samples; its calls a span as its blocks report them (the most of any)."""
    samples = [s for block in blocks for s in block.samples]
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    low, high = median_ci(ordered)
    return TimingStats(median_ms=statistics.median(ordered), ci_low_ms=low, ci_high_ms=high, iqr_ms=q3 - q1,
                       min_ms=ordered[0], max_ms=ordered[-1], mean_ms=statistics.fmean(ordered), reps=len(ordered),
                       blocks=len(blocks), calls=calls, events_ms=sum(b.events_ms for b in blocks),
                       outside_ms=sum(b.outside_ms for b in blocks), wall_ms=sum(b.wall_ms for b in blocks),
                       converged=converged, method=method, held_ms=sum(b.held_ms for b in blocks),
                       calls_per_span=max((b.calls_per_span for b in blocks), default=1))


def paired_ratio(numerator: Sequence[Block], denominator: Sequence[Block]) -> tuple[float, float, float]:
    """(median, ci_low, ci_high) of median(numerator block i) / median(denominator block i) over the pairs."""
    ratios = [statistics.median(a.samples) / statistics.median(b.samples)
              for a, b in zip(numerator, denominator) if a.samples and b.samples and statistics.median(b.samples) > 0]
    if not ratios:
        raise ValueError("no paired blocks")
    low, high = median_ci(ratios)
    return statistics.median(ratios), low, high


class GraphUnavailable(RuntimeError):
    """The forward could not be captured into a CUDA graph; the caller falls back to eager timing."""


def span_calls(per_call_ms: float, device: str, sync: str, input_bytes: int = 0) -> int:
    """How many back-to-back calls one timed span holds, for a call whose timed span alone reads `per_call_ms` (its
    median in the warmup): 1 at or above the device's minimum span (MIN_SPAN_MS, MIN_SPAN_MS_CPU) or for a sync that
    reproduces others' numbers; else enough calls to fill that minimum, at most SPAN_CALLS_CAP, and no more input
    clones (of `input_bytes` each) than SPAN_CLONE_BYTES hold."""
    floor = MIN_SPAN_MS if device == "cuda" else MIN_SPAN_MS_CPU
    if sync not in SPAN_SYNCS or per_call_ms >= floor:
        return 1
    calls = min(SPAN_CALLS_CAP, math.ceil(floor / max(per_call_ms, 1e-6) - 1e-9))   # 0.02 / 0.001 is 20, not 21
    if input_bytes > 0:
        calls = min(calls, SPAN_CLONE_BYTES // input_bytes)
    return max(1, calls)


def settled_fastest(round_fastest: Callable[[], float]) -> float:
    """The fastest span over rounds of them (`round_fastest` times one round and gives its fastest): a second round
    always, more while the newest beats the best before it by more than a fifth, SPAN_COUNT_ROUNDS at most."""
    best = round_fastest()
    for _ in range(SPAN_COUNT_ROUNDS - 1):
        fastest = round_fastest()
        improved = fastest < 0.8 * best
        best = min(best, fastest)
        if not improved:
            break
    return best


def span_text(calls_per_span: int) -> str:
    """What a method string adds for spans of several calls ("events, stream end, checked, 8 calls a span")."""
    return f", {calls_per_span} calls a span" if calls_per_span > 1 else ""


class Timer:
    """One side's timed spans: fresh inputs, flush, time, optionally keep the outputs for a spot check. A span holds
    one call, or `calls_per_span` back-to-back calls where one is too short to time alone (set by `warmup`)."""

    def __init__(self, call: Callable[[list], Any], input_sets: list[list], device: str, l2_flush: bool = True,
                 sync: str = "checked", graph: bool = False, keep: Callable[[Any], Any] = lambda outputs: None,
                 order_seed: int = 0):
        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {sync!r}")
        self.order = random.Random(order_seed)
        self._nulls = random.Random(order_seed + 1)   # where null spans fall (_null_places), apart from the sets
        self.call, self.input_sets, self.device, self.keep, self.sync = call, input_sets, device, keep, sync
        self.calls = 0          # timed spans so far
        self.calls_per_span = 1
        self._launch_ms = 0.0   # host time inside the timed spans since the block began (Block.launch_ms)
        self.span_ms = 0.0      # the warmup's median timed span of `calls_per_span` calls (what a null span spins)
        self.launch_ms = 0.0    # its median per call in the warmup, with no head start
        self.ahead_ms = 0.0     # the head start of each timed span (set by the driver, `head_start_ms`)
        self.kept: list[dict] = []   # {"call", "input_set", "outputs", "inputs_changed"}: a span's last call's
        self._last: Any = None
        self._synced: Optional[float] = None   # the last span's time to its after-synchronize end event (checked)
        self.flush_buffer: Optional[torch.Tensor] = None
        if device == "cuda" and l2_flush:
            l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
            self.flush_buffer = torch.empty(max(2 * l2_bytes // 4, 1 << 20), dtype=torch.int32, device="cuda")
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        if graph:
            self._capture()
        kind = "cuda_graph" if self.graph is not None else ("events" if device == "cuda" else "perf_counter")
        self._method = f"{kind}, {METHOD_NAMES[sync]}" if device == "cuda" else kind
        self.method = self._method

    def _capture(self) -> None:
        if self.device != "cuda":
            raise GraphUnavailable("CUDA graphs need the cuda device")
        self.static_inputs = [v.clone() if isinstance(v, torch.Tensor) else v for v in self.input_sets[0]]
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    self.call(self.static_inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.static_outputs = self.call(self.static_inputs)
            _device_sync()
        except Exception as exc:  # any failure to capture: time eagerly instead, and say why
            raise GraphUnavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        self.graph = graph

    def warmup(self, budget_ms: float, _clock=_clock, _spin=_spin) -> float:
        """Untimed-for-the-statistics calls, one a span, for `budget_ms`; then `calls_per_span` from their median
        timed span (`span_calls`; on CUDA from the fastest of rounds of SPAN_COUNT_SPANS more with the host ahead,
        `settled_fastest`: the GPU's time alone), and with several a span SPAN_WARMUP_SPANS spans of that many; the
        median span of the count chosen is `span_ms`. Returns the median wall time of one span with its preparation
        (ms): what sizes a block, so that a block of a launch-bound call (a 0.03 ms kernel behind its clone, flush and
        synchronizes) lasts about `block_ms` too, not several times longer."""
        seen, launched, spans = [], [], []
        self.calls_per_span = 1
        deadline = _clock() + budget_ms / 1e3
        while not seen or _clock() < deadline:
            began = _clock()
            self._launch_ms = 0.0
            spans.append(self._one(None)[0])
            seen.append((_clock() - began) * 1e3)
            launched.append(self._launch_ms)
        self.launch_ms = statistics.median(launched)
        span_ms = statistics.median(spans)
        if self.device == "cuda" and _spin is not None and self.sync in SPAN_SYNCS:
            # the count from the GPU's time: spans with the host ahead by twice this side's own enqueue time, as the
            # timed spans will be, and the fastest of them. The host's time in the spans above would put a kernel
            # near the threshold on either side of it from one process to the next (a 5 us reference timed one call
            # a span in one submit, four in the next, its time moving by a third); so would a median taken while
            # the GPU was still settling (a 3 us ReLU read 22 us in its first spans, was timed one a span and read
            # 5.6 us where four a span read 3.2). Noise only lengthens a span: the fastest is the GPU's time.
            # Rounds go on while one beats the best before it by a fifth: a GPU still settling reads every span of
            # a round slow (a ReLU's first round read 67 us a span where the GPU's time was 3 us).
            kept, self.ahead_ms = self.ahead_ms, head_start_ms(self.launch_ms)
            try:
                span_ms = settled_fastest(lambda: min(self._one(None)[0] for _ in range(SPAN_COUNT_SPANS)))
            finally:
                self.ahead_ms = kept
        self.calls_per_span = span_calls(span_ms, self.device, self.sync,
                                         0 if self.graph is not None else _bytes(self.input_sets))
        self.method = self._method + span_text(self.calls_per_span)
        if self.calls_per_span == 1:
            self.span_ms = statistics.median(spans)
            return statistics.median(seen)
        seen, spans = [], []
        for _ in range(SPAN_WARMUP_SPANS):
            began = _clock()
            spans.append(self._one(None)[0])
            seen.append((_clock() - began) * 1e3)
        self.span_ms = statistics.median(spans)
        return statistics.median(seen)

    def once(self, input_set: Optional[list] = None, keep: bool = True, calls: int = 1) -> float:
        """One timed span of `calls` calls (whatever `calls_per_span`), its last call's outputs kept (`kept`) unless
        `keep` is False; that last call on `input_set` when given (the first call on an input set never seen before,
        which no cache of earlier outputs can answer), the others, and all without it, on the timer's own sets.
        Returns the whole span's time (ms). Python's garbage collector is off for the span, as for a block's (the
        fresh-input check holds this span against the blocks' median: a collection that the input set's loading
        made due lands in it otherwise, in no block's)."""
        collecting = _gc_enabled()
        _gc_disable()
        try:
            return self._one(keep, input_set, calls=calls)[0]
        finally:
            if collecting:
                _gc_enable()

    def block(self, reps: int, keep: Sequence[int] = (), sets: Sequence[int] = ()) -> Block:
        """One uncounted span (the GPU may have run the other side just before), then `reps` counted spans, a sample
        each; the outputs of the spans at positions `keep` (their last call's) are saved for the parent's spot
        check. `sets` (one per counted span, or none): the input set of each span's last call, the parent's choice,
        so that the set a spot check compares against is never this process's word. Python's garbage collector is
        off for the block (as `timeit` does), back on after it: a full collection lands anywhere, in a timed span or
        between two, and a forward that makes many Python objects (a Triton launcher) would pay for it in some
        blocks and not others."""
        if sets and (len(sets) != reps or not all(0 <= index < len(self.input_sets) for index in sets)):
            raise ValueError(f"{len(sets)} input sets chosen for {reps} spans of {len(self.input_sets)} sets")
        nulls = self._null_places(reps)
        collecting = _gc_enabled()
        _gc_disable()
        try:
            self._launch_ms = 0.0
            events, outside = self._one(None)
            samples, synced, null_gaps = [], [], []
            for position in range(reps):
                for _ in range(nulls.count(position)):
                    gap, harness_ms = self._null_gap()
                    null_gaps.append(gap)
                    outside += harness_ms
                span, harness_ms = self._one(position in keep, chosen=sets[position] if sets else None)
                samples.append(span / self.calls_per_span)
                if self._synced is not None:
                    synced.append(self._synced / self.calls_per_span)
                events += span
                outside += harness_ms
        finally:
            if collecting:
                _gc_enable()
        return Block(samples, events, outside, launch_ms=self._launch_ms,
                     synced=synced if len(synced) == len(samples) else [], calls_per_span=self.calls_per_span,
                     null_gaps=null_gaps)

    def _null_places(self, reps: int) -> list[int]:
        """Before which counted spans of a block the null spans come (sync "checked" on CUDA; none otherwise)."""
        if self.device != "cuda" or self.sync != "checked" or _spin is None or reps < 1:
            return []
        return sorted(self._nulls.randrange(reps) for _ in range(NULL_SPANS))

    def _null_gap(self, _clock=_clock, _Event=_Event, _record=_record, _elapsed=_elapsed, _device_sync=_device_sync,
                  _stream=_current_stream, _spin=_spin) -> tuple[float, float]:
        """(this process's round trip, the host time it took) of one null span: the harness's spin alone between a
        start and an end event on the current stream, then the device-wide synchronize and the second end event a
        call's span gets. No submission code runs in it, and the synchronize before it left nothing queued. The spin
        lasts `null_spin_ms`."""
        before = _clock()
        start, end, after = _Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True)
        _record(start, _stream())
        _spin(int(self.null_spin_ms() * spin_cycles_per_ms()))
        _record(end, _stream())
        _device_sync()
        _record(after, _stream())
        _device_sync()
        gap = _elapsed(end, after)
        return gap, (_clock() - before) * 1e3

    def null_spin_ms(self) -> float:
        """How long a null span's spin lasts: as long as the GPU is busy after the host has queued a timed span (its
        head start and the warmup's median span), within NULL_SPIN_MS..NULL_SPIN_MAX_MS."""
        busy = self.ahead_ms * self.calls_per_span + self.span_ms
        return min(NULL_SPIN_MAX_MS, max(NULL_SPIN_MS, busy))

    def _one(self, spot: Optional[bool], input_set: Optional[list] = None, calls: Optional[int] = None,
             chosen: Optional[int] = None, _clock=_clock, _Event=_Event, _record=_record, _elapsed=_elapsed,
             _device_sync=_device_sync, _stream=_current_stream) -> tuple[float, float]:
        """(timed ms, the harness's own time around it) of one span of `calls` back-to-back calls (`calls_per_span`
        unless given), the whole span. The harness's time is the preparation (the clones and the flush, on the GPU
        from an event before them to the start event, since the GPU is idle after the previous span's synchronize)
        plus the host time of a spot-check copy. Each call gets its own clone of an input set drawn in the seeded
        order, all made before the start event; one flush before the span, none between its calls; the last call on
        input set `chosen` where given (the parent's choice), or on `input_set` (a set never seen before). A CUDA
        graph replays `calls` times on the last drawn set, copied into its captured buffers. The kept outputs are the
        last call's, with its input set."""
        calls = self.calls_per_span if calls is None else calls
        # unpredictable: a replay by call count fails
        indices = [self.order.randrange(len(self.input_sets)) for _ in range(calls)]
        if chosen is not None:
            indices[-1] = chosen
        sources = [self.input_sets[index] for index in indices]
        if input_set is not None:
            sources[-1] = input_set
        if self.sync == "kernelbench" and self.device == "cuda":
            _device_sync()   # as KernelBench before each trial: every stream idle
        before = _clock()
        self._prepared = None
        if self.device == "cuda":
            self._prepared = _Event(enable_timing=True)
            _record(self._prepared, _stream())
        if self.graph is not None:
            for target, value in zip(self.static_inputs, sources[-1]):
                if isinstance(target, torch.Tensor):
                    target.copy_(value)
            inputs = [self.static_inputs] * len(sources)
        else:
            inputs = [[v.clone() if isinstance(v, torch.Tensor) else v for v in source] for source in sources]
        if self.flush_buffer is not None:
            self.flush_buffer.zero_()
        self._head_start(len(inputs))
        harness_ms = (_clock() - before) * 1e3
        elapsed = self._timed(inputs)
        if self._prepared is not None:
            harness_ms = max(harness_ms, _elapsed(self._prepared, self._start))
        if spot:
            before = _clock()
            self.kept.append({"call": self.calls, "input_set": indices[-1] if input_set is None else None,
                              "outputs": self.keep(self._last),
                              "inputs_changed": self.graph is None and _changed(inputs[-1], sources[-1])})
            harness_ms += (_clock() - before) * 1e3
        self._last = None
        self.calls += 1
        return elapsed, harness_ms

    def _head_start(self, calls: int = 1, _spin=_spin) -> None:
        """On CUDA with `ahead_ms` set: a spin kernel of that length for each of the span's `calls`, queued before the
        start event, so that the timed span begins when the GPU gets there, the host having had that long to enqueue
        the span's forwards behind it (a span of several calls of a kernel shorter than its enqueue would otherwise
        run at the host's pace). Host time beyond the head start still lands in the span; the spin itself counts as
        the harness's (outside)."""
        if self.device != "cuda" or self.ahead_ms <= 0 or _spin is None:
            return
        _spin(int(self.ahead_ms * calls * spin_cycles_per_ms()))

    def _timed(self, inputs: list[list], _clock=_clock, _Event=_Event, _record=_record, _elapsed=_elapsed,
               _device_sync=_device_sync, _stream=_current_stream, _replay=_replay) -> float:
        """The whole span of one call per input list, back to back (ms). Every event is made before the span (making
        one looks its class's methods up), and every function called after the submission's calls is a default
        argument (module docstring)."""
        if self.device != "cuda":
            start = _clock()
            for each in inputs:
                self._last = self.call(each)
            return (_clock() - start) * 1e3
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        after = _Event(enable_timing=True) if self.sync == "checked" else None
        self._start = start
        _record(start, _stream())
        launched = _clock()
        if self.graph is not None:
            for _ in inputs:
                _replay(self.graph)
            self._last = self.static_outputs
        else:
            for each in inputs:
                self._last = self.call(each)
        self._launch_ms += (_clock() - launched) * 1e3
        self._synced = None
        if self.sync == "device":
            _device_sync()  # device-wide: side-stream work ends before the end event
            _record(end, _stream())
            _device_sync()
            return _elapsed(start, end)
        _record(end, _stream())   # on the current stream: the span ends with the calls' work there, not with the host
        if after is not None:
            _device_sync()   # every stream's work, and the host's round trip, before this one
            _record(after, _stream())
            _device_sync()
            self._synced = _elapsed(start, after)
        else:
            _device_sync()
        return _elapsed(start, end)


def _bytes(input_sets: list[list]) -> int:
    """The largest input set's tensor bytes: what one clone of it takes."""
    return max((sum(v.numel() * v.element_size() for v in inputs if isinstance(v, torch.Tensor))
                for inputs in input_sets), default=0)


def spin_cycles_per_ms() -> float:
    """The GPU clock the head start's spin counts (cycles per ms), measured once per process (a candidate's, before its
    submission runs: harness/children/candidate/main.py warm_up; a change after is `patched_runtime`): the highest of a
    few spins of known cycles timed by events, each queued behind a lead spin. Timed alone, a spin reads slow when the
    host is late to queue it after the start event (a busy host, a batch's compilers beside it) or the clock is still
    rising from idle; a figure read low shortens every head start after it, and with one figure per timer a
    candidate's fresh-input calls could hide less of the host's time than its blocks did (an honest
    launch-bound kernel's fresh calls could then read as `input_replay`). The highest errs the other way: a head
    start at least as long as asked, and spins are timed until the best stops rising (a clock still coming up from idle
    reads low on the first ones). 0 where torch has no spin kernel (no head start then)."""
    if _spin is None:
        return 0.0
    if not _cycles_per_ms:
        best, settled = 0.0, 0
        for spins in range(1, SPIN_CALIBRATIONS_MAX + 1):
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _spin(SPIN_LEAD_CYCLES)
            _record(start)
            _spin(SPIN_CALIBRATION_CYCLES)
            _record(end)
            _device_sync()
            figure = SPIN_CALIBRATION_CYCLES / max(_elapsed(start, end), 1e-3)
            settled = settled + 1 if figure <= best * 1.01 else 0
            best = max(best, figure)
            if spins >= SPIN_CALIBRATIONS and settled >= SPIN_SETTLED:
                break
        _cycles_per_ms.append(best)
    return _cycles_per_ms[0]


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


class Side(Protocol):
    """What `measure` drives: a Timer in this process, or a process that runs one (harness/judge/evaluate.py)."""
    method: str
    calls: int
    launch_ms: float   # after warmup: its median host time per call to enqueue the forward (CUDA; 0 elsewhere)
    ahead_ms: float    # set by `measure`: the head start of its timed calls

    def warmup(self, budget_ms: float) -> float: ...

    def block(self, reps: int, keep: Sequence[int] = ()) -> Block: ...


@dataclass
class Measurement:
    stats: list[TimingStats]
    blocks: list[list[Block]]
    interleaved: bool
    remeasured: list[int] = field(default_factory=list)   # per side: blocks timed again because `accept` refused
    refused: list[int] = field(default_factory=list)      # per side: blocks still refused after the retries (kept)
    escaped: Optional[str] = None   # set when the candidate's work outlived its stream: the stats and blocks are
    stream_stats: Optional[list[TimingStats]] = None   # then the synced spans', these the stream spans' (drift)
    retimed: Optional[str] = None   # an earlier measurement's wall-clock disagreement, where it was timed again

    def ratio(self, numerator: int, denominator: int) -> tuple[float, float, float]:
        """Speedup-like ratio of side `numerator`'s time over side `denominator`'s, with its 95% CI: from the
        paired blocks when interleaved, else the ratio of medians with the conservative ends of both CIs."""
        if self.interleaved:
            return paired_ratio(self.blocks[numerator], self.blocks[denominator])
        a, b = self.stats[numerator], self.stats[denominator]
        return a.median_ms / b.median_ms, a.ci_low_ms / b.ci_high_ms, a.ci_high_ms / b.ci_low_ms


def synced_measurement(measurement: Measurement, why: str) -> Measurement:
    """The same measurement timed the conservative way: every side's blocks by their spans to an end event after a
    device-wide synchronize (`Block.synced`), their statistics again; the stream spans' statistics kept for the
    reference's drift check, whose clean time was taken on them."""
    blocks = [[replace(block, samples=list(block.synced), events_ms=_synced_events(block)) for block in side]
              for side in measurement.blocks]
    stats = [summarize(side, old.calls, old.converged, f"{old.method.split(',')[0]}, device sync (work outlived "
                       f"its stream){span_text(old.calls_per_span)}") for side, old in zip(blocks, measurement.stats)]
    return replace(measurement, stats=stats, blocks=blocks, escaped=why, stream_stats=list(measurement.stats))


def _synced_events(block: Block) -> float:
    """A block's timed spans, whole, taken to their after-synchronize end events: its stream spans scaled by the
    synced spans' share of them (the samples of both are per call, the spans whole, the first one uncounted)."""
    counted = sum(block.samples)
    return block.events_ms * sum(block.synced) / counted if counted > 0 else sum(block.synced)


def head_start_ms(launch_ms: float) -> float:
    """The host's head start on CUDA, from the trusted side's median host time per call to enqueue its forward."""
    return min(HEAD_MAX_MS, max(HEAD_MIN_MS, HEAD_FACTOR * launch_ms))


def ahead_in(method: str) -> float:
    """The head start a timing's method names (`measure`: "..., host 0.62 ms ahead"); 0 when it names none."""
    found = re.search(r"host ([0-9.]+) ms ahead", method or "")
    return float(found.group(1)) if found else 0.0


def timing_sets(count: int, set_bytes: int) -> int:
    """How many of a problem's `count` fed input sets (`set_bytes` each) the timed calls rotate among, the first ones,
    on both sides alike: all where they fit in TIMING_SET_BYTES, else as many as fit and never fewer than
    TIMING_SETS_MIN. Each side holds those on its device through its timing, and the reference for its whole life:
    five of a level-1 problem's 6.4 GB sets held 32 GB of the GPU on each side."""
    return fitting(count, set_bytes, TIMING_SET_BYTES, TIMING_SETS_MIN)


def measure(sides: Sequence[Side], rule: Rule, interleave: bool = True, spot_side: Optional[int] = None,
            spot_count: int = 0, spot_seed: int = 0, accept: Optional[Callable[[int, Block], bool]] = None,
            retries: int = 0, settle: Optional[Callable[[int, float], None]] = None,
            idle_ms: float = 0.0, ahead_from: Optional[int] = None, ahead_ms: float = 0.0) -> Measurement:
    """Warm every side, then time blocks until each side's median CI meets the target or the cap is reached.

    Interleaved, round r runs the sides in order when r is even and reversed when odd (A B B A A B ...), so
    neither side always follows the other. Not interleaved, each side runs all its blocks in turn with an equal
    share of the cap. `spot_count` calls of side `spot_side`, at random positions spread over its first
    `min_blocks` blocks (more blocks when those are too short to hold them; the side is not done before), keep
    their outputs for the spot check. A block that `accept(side, block)` refuses is timed again, up to `retries`
    times, and replaced by the new one; one still refused after that is kept and counted in `refused`. Before each
    such retry, `settle(side, ms)` is called with the wall time of the last block of the other sides (the side
    waits that long with them stopped, so what they left behind has passed). `idle_ms` (interleaved only): a pause
    after every second round, which gives one side timed alone the idle gaps an interleaved side has while the other
    runs its two blocks of A B B A.

    `ahead_from`: on CUDA, every side's timed calls get the same head start (`head_start_ms`, Timer._head_start), set
    from the longest host time per call in the sides' warmups (side `ahead_from` is a trusted one: the reference's
    process). The host's time to enqueue a forward otherwise lands in the span before its first kernel, and that
    time moves between processes and moments (docs/timing.md); a head start shorter than one side's enqueue time
    puts the rest into that side's spans (a launch-bound candidate whose forward took twice the reference's to
    enqueue read 3 to 18 times its kernel). A side that reports a long enqueue time gets no more than HEAD_MAX_MS,
    for both sides alike. The method says how long (`ahead_in` reads it back). Without `ahead_from`, `ahead_ms` is
    the head start (a stored reference's, timed without this side).
    """
    per_call = [side.warmup(rule.warmup_ms) for side in sides]
    ahead = head_start_ms(max(side.launch_ms for side in sides)) if ahead_from is not None else ahead_ms
    for side in sides:
        side.ahead_ms = ahead
    reps = [int(min(rule.max_block_reps, max(1, math.ceil(rule.block_ms / max(ms + ahead, 1e-4)))))
            for ms in per_call]
    chooser = random.Random(spot_seed)
    blocks: list[list[Block]] = [[] for _ in sides]
    remaining = [spot_count]
    remeasured, refused = [0] * len(sides), [0] * len(sides)

    def timed(index: int, keep: list[int]) -> Block:
        began, start = time.time(), _clock()
        block = sides[index].block(reps[index], keep)
        block.wall_ms, block.began_s = (_clock() - start) * 1e3, began
        return block

    def run(index: int) -> None:
        keep: list[int] = []
        done = len(blocks[index])
        if index == spot_side and remaining[0] > 0:
            count = min(reps[index], math.ceil(remaining[0] / max(rule.min_blocks - done, 1)))
            keep = sorted(chooser.sample(range(reps[index]), count))
            remaining[0] -= count
        block = timed(index, keep)
        if accept is not None and index != spot_side:   # a spot-checked side's kept outputs are never re-timed
            tries = 0
            while not accept(index, block) and tries < retries:
                tries += 1
                remeasured[index] += 1
                if settle is not None:
                    settle(index, max((b[-1].wall_ms for i, b in enumerate(blocks) if i != index and b), default=0.0))
                block = timed(index, [])
            if not accept(index, block):
                refused[index] += 1
        blocks[index].append(block)

    def converged(indices: Sequence[int]) -> bool:
        if spot_side in indices and remaining[0] > 0:
            return False
        return all(len(blocks[i]) >= rule.min_blocks and summarize(blocks[i], 0, True, "").ci_half_width
                   <= rule.target_ci for i in indices)

    done_in_time = []
    if interleave:
        start = _clock()
        rounds = 0
        while True:
            for index in (range(len(sides)) if rounds % 2 == 0 else reversed(range(len(sides)))):
                run(index)
            rounds += 1
            if idle_ms > 0 and rounds % 2 == 0:
                time.sleep(idle_ms / 1e3)
            if converged(range(len(sides))):
                done_in_time = [True] * len(sides)
                break
            if _clock() - start > rule.cap_s:
                done_in_time = [converged([i]) for i in range(len(sides))]
                break
    else:
        for index in range(len(sides)):
            start = _clock()
            while True:
                run(index)
                if converged([index]):
                    done_in_time.append(True)
                    break
                if _clock() - start > rule.cap_s / len(sides):
                    done_in_time.append(False)
                    break
    method = [side.method + (f", host {ahead:.2f} ms ahead" if ahead else "") for side in sides]
    stats = [summarize(blocks[i], sides[i].calls, done_in_time[i], method[i]) for i in range(len(sides))]
    return Measurement(stats, blocks, interleave, remeasured, refused)


def make_timer(call: Callable[[list], Any], input_sets: list[list], device: str, graph: bool = False,
               **settings: Any) -> tuple[Timer, Optional[str]]:
    """A Timer, with a CUDA graph when asked and possible; (timer, why there is no graph, or None)."""
    if graph:
        try:
            return Timer(call, input_sets, device, graph=True, **settings), None
        except GraphUnavailable as exc:
            return Timer(call, input_sets, device, **settings), str(exc)
    return Timer(call, input_sets, device, **settings), None


def bench(call: Callable[[list], Any], input_sets: list[list], device: str, rule: Rule, l2_flush: bool = True,
          sync: str = "checked", graph: bool = False, host_ahead: bool = False) -> TimingStats:
    """Time `call(inputs)` alone in this process (trusted code only: the oracle, baselines, problem checks);
    `host_ahead`: on CUDA with its own head start (`measure`'s ahead_from)."""
    timer, _ = make_timer(call, input_sets, device, graph=graph, l2_flush=l2_flush, sync=sync)
    return measure([timer], rule, ahead_from=0 if host_ahead and device == "cuda" else None).stats[0]
