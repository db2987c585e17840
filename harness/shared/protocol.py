"""What crosses between the parent and its child processes: event lines, commands, exchange files.

Children write one JSON object per line to an event pipe and read one command per line from a command pipe: each
a dataclass on both sides, events in harness/shared/messages.py, commands in harness/shared/commands.py.
Timing is a dialogue: the parent sends TIME_START (the child warms up and answers WARM), then BLOCK commands (each
answered by a BLOCK event as soon as its calls end, so the parent's wall clock brackets them), then TIME_END. Every
event carries the run's token, which the child reads from its spec file and then deletes: a line without it (a
submission writing to the inherited descriptor) is ignored and reported as forged.
Bulk data (CPU tensors) goes through torch.save files that the parent reads with weights_only=True, so nothing but
tensors, numbers, strings and containers of them can come back.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

# Events, child -> parent
COMPILED = "compiled"   # candidate: module executed, extensions built
FIRST = "first"         # candidate: trial 0's outputs saved to FIRST_FILE, before the other trials run
CHECKED = "checked"     # candidate: outputs and gradients saved to RESULT_FILE
WARM = "warm"           # either side: timer ready and warmed up; carries per_call_ms, method, graph_error, launch_ms
BLOCK = "block"         # either side: one block of timed calls; carries samples, events_ms, outside_ms, launch_ms
SPOTS = "spots"         # either side: timing over (candidate: SPOT_FILE written)
READY = "ready"         # oracle: FEED_FILE and TRUTH_FILE written, metadata attached; it then serves timing (and
                        # CMD_PACE, CMD_GRADIENTS, CMD_FRESH_SETS)
FAILED = "failed"       # either: a stage raised; carries "status" and "error"
JUDGE_SHORT = "judge_error"   # an oracle's FAILED status when the machine ran short (harness/shared/resources.py)
AUDIT = "audit"         # candidate: the sandbox blocked an operation (any time; the parent collects them)
FRESH = "fresh"         # candidate: one timed call on a never-seen input set; carries ms (outputs in FRESH_OUT_FILE)
IMPORTED = "imported"   # candidate started ahead: sandboxed, torch imported; it waits for CMD_WARM (an oracle
                        # started ahead: it waits for CMD_RUN)
IDLE = "idle"           # candidate started ahead: CUDA up, the profiler's first session done; it waits for CMD_RUN
STAGED = "staged"       # gated oracle: model made and inputs drawn on the CPU; it waits for CMD_GPU before GPU work
PACE = "pace"           # oracle: the GPU's pace, the host ahead (timing/pace.py); carries ms (None: untold)
GPU_DONE = "gpu_done"   # gated oracle: a stage of GPU work is over (the truth: it waits for CMD_GPU to measure the
                        # device's rates; the rates: it writes its files, then READY)
GRADIENTS = "gradients"  # oracle: the reference's gradients written to GRADIENTS_FILE (after CMD_GRADIENTS)
FRESH_SETS = "fresh_sets"  # oracle: the fresh input sets and its outputs written to FRESH_SETS_FILE (after
                           # CMD_FRESH_SETS)

# Commands, parent -> child: one JSON object per line, {"cmd": ..., **arguments} (harness/shared/commands.py)
CMD_TIME_START = "time_start"   # arguments: warmup_ms, l2_flush, sync, graph, order_seed
CMD_BLOCK = "block"             # arguments: reps, keep (positions whose outputs are kept for the spot check), ahead_ms,
                                #   sets (the input set of each counted span's last call, chosen by the parent)
CMD_TIME_END = "time_end"
CMD_FRESH = "fresh"             # after SPOTS: time one call on the input set in FRESH_FILE; arguments: l2_flush,
                                #   sync, ahead_ms (the head start the timed calls had)
CMD_STOP = "stop"
CMD_WARM = "warm"               # to a candidate started ahead, after IMPORTED: create CUDA's context and so on
CMD_RUN = "run"                 # to a candidate or oracle started ahead: arguments: spec (its spec's fields)
CMD_GPU = "gpu"                 # to a gated oracle after STAGED or its first GPU_DONE: its next stage may start
CMD_PACE = "pace"               # to an oracle between timings: the GPU's pace now (harness/children/oracle/pace.py)
CMD_GRADIENTS = "gradients"     # to an oracle between timings: run the reference's backward (once: the parent keeps
                                #   what it answers) and write its gradients to GRADIENTS_FILE
CMD_FRESH_SETS = "fresh_sets"   # to an oracle between timings: draw the fresh input sets, run the reference on them
                                #   (once: the parent keeps what it answers) and write both to FRESH_SETS_FILE

FEED_FILE = "feed.pt"      # oracle -> candidate: init inputs, reference weights, trial inputs, grad_outputs' shapes
TRUTH_FILE = "truth.pt"    # oracle -> parent only: reference outputs (and whether they have an autograd graph)
GRADIENTS_FILE = "gradients.pt"   # oracle -> parent only, when asked: the reference's input and parameter gradients
FRESH_SETS_FILE = "fresh_sets.pt"   # oracle -> parent only, when asked: input sets never fed, the reference's outputs
# candidate -> parent, each in a memfd the parent made (harness/shared/handover.py) or else a file in its folder:
FIRST_FILE = "first.pt"    # candidate -> parent: trial 0's outputs as CPU tensors (checked while the rest run)
RESULT_FILE = "result.pt"  # candidate -> parent: outputs and gradients as CPU tensors
SPOT_FILE = "spot.pt"      # candidate -> parent: outputs of spot-checked timed calls
FRESH_FILE = "fresh.pt"    # parent -> candidate: one input set it has never been given (written just before asking)
FRESH_OUT_FILE = "fresh_out.pt"   # candidate -> parent: that call's outputs (per call: handover.fresh_out_file)
SPEC_FILE = "spec.json"    # parent -> child: what to run


class ChildChannel:
    """The child's end of the pipes."""

    def __init__(self, event_fd: int, command_fd: Optional[int] = None, token: Optional[str] = None):
        self._events = os.fdopen(event_fd, "w", buffering=1)
        self._commands = os.fdopen(command_fd, "r") if command_fd is not None else None
        self._token = token

    def send(self, message: Any) -> None:
        """One event line: a message of harness/shared/messages.py (its `to_event()`), and the run's token."""
        self._events.write(json.dumps({**message.to_event(), "token": self._token}) + "\n")
        self._events.flush()

    def receive(self) -> dict[str, Any]:
        if self._commands is None:
            return {"cmd": CMD_STOP}
        line = self._commands.readline()
        if not line.strip():
            return {"cmd": CMD_STOP}  # EOF: the parent is gone or done with us
        return json.loads(line)

    def close(self) -> None:
        self._events.close()
        if self._commands is not None:
            self._commands.close()
