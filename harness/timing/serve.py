"""The child's side of the timing dialogue (harness/core/protocol.py): runs in the process that owns the code being
timed (the oracle for the reference, the candidate's process for the submission) and answers the parent's commands
with a `Timer` (harness/timing/timer.py). The parent's side is harness/timing/interleave.py."""
from __future__ import annotations

from typing import Any, Callable, Optional

from harness.core import protocol
from harness.timing.timer import Timer, make_timer


def serve_timing(channel: protocol.ChildChannel, call: Callable[[list], Any], input_sets: list[list], device: str,
                 keep: Callable[[Any], Any] = lambda outputs: None,
                 flags: Callable[[], dict] = dict,
                 other: Callable[[dict], bool] = lambda command: False) -> Optional[Timer]:
    """Answer the parent's timing commands (TIME_START, BLOCK...) until TIME_END, then return the timer (its kept
    outputs are the caller's to save); None when the parent said stop or closed the pipe instead. `other` answers
    any other command between timings, True when it did (the oracle's CMD_PACE)."""
    timer: Optional[Timer] = None
    while True:
        command = channel.receive()
        name = command.get("cmd")
        if name == protocol.CMD_TIME_START:
            timer, graph_error = make_timer(call, input_sets, device, graph=bool(command.get("graph")),
                                            l2_flush=bool(command.get("l2_flush", True)),
                                            sync=str(command.get("sync", "device")), keep=keep,
                                            order_seed=int(command.get("order_seed", 0)))
            per_call_ms = timer.warmup(float(command.get("warmup_ms", 50.0)))
            channel.send(protocol.WARM, per_call_ms=per_call_ms, method=timer.method, graph_error=graph_error,
                         flags=flags())
        elif name == protocol.CMD_BLOCK and timer is not None:
            block = timer.block(int(command.get("reps", 1)), [int(k) for k in command.get("keep", [])])
            channel.send(protocol.BLOCK, samples=block.samples, events_ms=block.events_ms,
                         outside_ms=block.outside_ms, flags=flags())
        elif name == protocol.CMD_TIME_END and timer is not None:
            return timer
        elif timer is None and other(command):
            continue
        else:
            return None
