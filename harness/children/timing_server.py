"""The child's side of the timing dialogue (harness/shared/protocol.py): runs in the process that owns the code being
timed (the oracle for the reference, the candidate's process for the submission) and answers the parent's commands
with a `Timer` (harness/shared/timer.py). The parent's side is harness/timing/interleave.py."""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from harness.shared import commands, protocol
from harness.shared.config import MAX_PLACEMENTS
from harness.shared.messages import BlockReport, Warm
from harness.shared.timer import Timer, make_timer

_clock = time.perf_counter   # bound before any submission code runs, as the timer's


def serve_timing(channel: protocol.ChildChannel, call: Callable[[list], Any], input_sets: list[list], device: str,
                 keep: Callable[[Any], Any] = lambda outputs: None,
                 flags: Callable[[], dict] = dict,
                 other: Callable[[commands.Command], bool] = lambda command: False,
                 placed: Optional[Callable[[int], list[Callable[[list], Any]]]] = None) -> Optional[Timer]:
    """Answer the parent's timing commands (TIME_START, BLOCK...) until TIME_END, then return the timer (its kept
    outputs are the caller's to save); None when the parent said stop or closed the pipe instead. `other` answers
    any other command between timings, True when it did (the oracle's CMD_PACE). `placed(n)`: up to n calls, each
    on its own copy of the model's weights (the first is `call`'s); a TIME_START asking for `placements` above 1 has
    the timed calls rotate among them (config `timing_placements`), and its method says how many there were. The
    timer decides in its warmup how many calls each timed span holds (Timer.calls_per_span: several where one call is
    too short to time alone); its method says so, and each BLOCK carries the count."""
    timer: Optional[Timer] = None
    while True:
        command = commands.parse(channel.receive())
        if isinstance(command, commands.TimeStart):
            asked = command.placements
            calls = placed(asked) if placed is not None and asked > 1 else [call]
            timer, graph_error = make_timer(rotating(calls), input_sets, device, graph=command.graph,
                                            l2_flush=command.l2_flush, sync=command.sync, keep=keep,
                                            order_seed=command.order_seed)
            per_call_ms = timer.warmup(command.warmup_ms)
            # a CUDA graph replays the one instance it captured: no rotation to tell of
            method = timer.method + (f", {len(calls)} placements" if len(calls) > 1 and timer.graph is None else "")
            channel.send(Warm(per_call_ms, method, graph_error, timer.launch_ms, flags()))
        elif isinstance(command, commands.TimeBlock) and timer is not None:
            timer.ahead_ms = command.ahead_ms
            block = timer.block(command.reps, list(command.keep), list(command.sets))
            # the integrity snapshot the report carries is the harness's work inside the parent's wall time too (a
            # look over every module of the judge's: milliseconds on a busy host, beside blocks of a few)
            began = _clock()
            found = flags()
            outside_ms = block.outside_ms + (_clock() - began) * 1e3
            channel.send(BlockReport(tuple(block.samples), block.events_ms, outside_ms, block.launch_ms,
                                     found, tuple(block.synced), block.calls_per_span, tuple(block.null_gaps)))
        elif command == commands.TIME_END and timer is not None:
            return timer
        elif timer is None and other(command):
            continue
        else:
            return None


def rotating(calls: list[Callable[[list], Any]]) -> Callable[[list], Any]:
    """One call for the timer: each timed call goes to the next of `calls` in turn (the only one when there is one)."""
    if len(calls) == 1:
        return calls[0]
    turn = [0]

    def call(values: list) -> Any:
        index = turn[0] % len(calls)
        turn[0] += 1
        return calls[index](values)
    return call


# The copies of one side's weights that `timing_placements` asks for: at most MAX_PLACEMENTS, and only while all of
# them together stay within PLACEMENT_BYTES (parameters and buffers); fewer otherwise, at least the model itself.
PLACEMENT_BYTES = 4 << 30


def placements_within(count: int, model_bytes: int) -> int:
    """How many of `count` copies of a model of `model_bytes` there may be (at least 1)."""
    return max(1, min(count, MAX_PLACEMENTS, PLACEMENT_BYTES // max(model_bytes, 1)))


def placed_copies(model: Any, make: Callable[[], Any]) -> Callable[[int], list[Callable[[list], Any]]]:
    """serve_timing's `placed` for one side: calls on up to n copies of `model` (itself first, then those `make`
    gives, made once and kept for the next timing), as many as placements_within allows."""
    copies = [model]

    def placed(count: int) -> list[Callable[[list], Any]]:
        count = placements_within(count, weight_bytes(model))
        while len(copies) < count:
            copies.append(make())
        return [lambda inputs, each=each: each(*inputs) for each in copies[:count]]
    return placed


def weight_bytes(model: Any) -> int:
    """Bytes of a module's parameters and buffers (0 for anything else)."""
    tensors = list(model.parameters()) + list(model.buffers()) if hasattr(model, "parameters") else []
    return sum(t.numel() * t.element_size() for t in tensors)
