"""Typed commands from the parent to a child process: what a command line may carry, with its defaults.

The parent builds one of the dataclasses below and sends it (`spawn.Child.send`, which writes `to_command()`); the
child reads the line with `parse`, the one place where a command's fields are checked and their defaults applied.
The parent is trusted and both sides are the same checkout, so a field of the wrong type is a bug: `Malformed`, which
ends the child's stage as any exception there does. A command name the child does not know reads as `Stop`: a child
answers only the commands it expects at that point of the dialogue and stops at anything else.
The wire names are in harness/shared/protocol.py; events the other way are in harness/shared/messages.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Union

from harness.shared import protocol
from harness.shared.messages import FreshTimed, Malformed

AHEAD_MAX_MS = 1e3   # a head start asked for at or beyond this is none (a second of launches ahead is no head start)
FRESH_NEAR = 3       # timed calls on a seen input set right before each fresh one, unless the parent asks for more
FRESH_NEAR_MAX = 256  # the most the parent may ask for
FRESH_SPAN_CALLS_MAX = FreshTimed.CALLS_MAX   # calls in a fresh call's span at most


def _flag(raw: dict, name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise Malformed(f"malformed {name} in a command: {str(value)[:40]}")
    return value


def _real(raw: dict, name: str, default: float) -> float:
    value = raw.get(name, default)
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        raise Malformed(f"malformed {name} in a command: {str(value)[:40]}")
    return float(value)


def _whole(raw: dict, name: str, default: int) -> int:
    value = raw.get(name, default)
    if not (isinstance(value, int) and not isinstance(value, bool)):
        raise Malformed(f"malformed {name} in a command: {str(value)[:40]}")
    return value


def _word(raw: dict, name: str, default: str) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str):
        raise Malformed(f"malformed {name} in a command: {str(value)[:40]}")
    return value


def _ahead(raw: dict) -> float:
    """The head start a BLOCK or FRESH command asks for (ms): a number, none (0) unless within [0, AHEAD_MAX_MS)."""
    value = _real(raw, "ahead_ms", 0.0)
    return value if 0 <= value < AHEAD_MAX_MS else 0.0


@dataclass(frozen=True)
class TimeStart:
    """TIME_START: a fresh timer, warmed up for `warmup_ms` (answered by WARM). `placements` above 1: the timed
    calls rotate among that many copies of the weights (config `timing_placements`); anything but a whole number
    above 1 means the model itself."""
    CMD: ClassVar[str] = protocol.CMD_TIME_START
    warmup_ms: float = 50.0
    l2_flush: bool = True
    sync: str = "checked"         # the Timer's sync (harness/shared/timer.py SYNC_MODES)
    graph: bool = False           # capture the calls in a CUDA graph where it can
    order_seed: int = 0           # the order in which the timer rotates the input sets
    placements: int = 1

    def to_command(self) -> dict:
        return {"cmd": self.CMD, "warmup_ms": self.warmup_ms, "l2_flush": self.l2_flush, "sync": self.sync,
                "graph": self.graph, "order_seed": self.order_seed, "placements": self.placements}

    @classmethod
    def from_command(cls, raw: dict) -> "TimeStart":
        placements = raw.get("placements", 1)
        return cls(_real(raw, "warmup_ms", 50.0), _flag(raw, "l2_flush", True), _word(raw, "sync", "checked"),
                   _flag(raw, "graph", False), _whole(raw, "order_seed", 0),
                   placements if isinstance(placements, int) and not isinstance(placements, bool)
                   and placements > 1 else 1)


@dataclass(frozen=True)
class TimeBlock:
    """BLOCK: `reps` timed calls (answered by a BLOCK event); the outputs of the calls at `keep` are kept for the spot
    check; each call gets `ahead_ms` of head start (Timer._head_start). `sets`, one per counted span (or none: the
    timer's seeded order chooses): the input set of that span's last call, the one whose outputs a spot check keeps,
    chosen by the parent, which checks them against that set's truth."""
    CMD: ClassVar[str] = protocol.CMD_BLOCK
    reps: int = 1
    keep: tuple[int, ...] = ()
    ahead_ms: float = 0.0
    sets: tuple[int, ...] = ()

    def to_command(self) -> dict:
        return {"cmd": self.CMD, "reps": self.reps, "keep": list(self.keep), "ahead_ms": self.ahead_ms,
                **({"sets": list(self.sets)} if self.sets else {})}

    @classmethod
    def from_command(cls, raw: dict) -> "TimeBlock":
        return cls(_whole(raw, "reps", 1), _positions(raw, "keep"), _ahead(raw), _positions(raw, "sets"))


def _positions(raw: dict, name: str) -> tuple[int, ...]:
    """A list of whole numbers, none negative (a negative index would count from a list's end)."""
    value = raw.get(name, [])
    if not (isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                            for v in value)):
        raise Malformed(f"malformed {name} in a command: {str(value)[:40]}")
    return tuple(value)


@dataclass(frozen=True)
class FreshCall:
    """FRESH: one timed span of `span_calls` calls whose last is on the input set in the file at `path` (empty:
    FRESH_FILE in the candidate's folder), the others on a set the candidate has seen, as its timed spans held
    (answered by FRESH); after `near` such spans all on the seen set (at most FRESH_NEAR_MAX; a negative number is
    none), with the head start its timed calls had."""
    CMD: ClassVar[str] = protocol.CMD_FRESH
    l2_flush: bool = True
    sync: str = "checked"
    ahead_ms: float = 0.0
    near: int = FRESH_NEAR
    span_calls: int = 1
    path: str = ""

    def to_command(self) -> dict:
        return {"cmd": self.CMD, "l2_flush": self.l2_flush, "sync": self.sync, "ahead_ms": self.ahead_ms,
                "near": self.near, "span_calls": self.span_calls, "path": self.path}

    @classmethod
    def from_command(cls, raw: dict) -> "FreshCall":
        near = _whole(raw, "near", FRESH_NEAR)
        span_calls = _whole(raw, "span_calls", 1)
        return cls(_flag(raw, "l2_flush", True), _word(raw, "sync", "checked"), _ahead(raw),
                   min(max(near, 0), FRESH_NEAR_MAX), min(max(span_calls, 1), FRESH_SPAN_CALLS_MAX),
                   _word(raw, "path", ""))


@dataclass(frozen=True)
class Run:
    """RUN: to a process started ahead, the spec it is to run (its fields, as `specs.from_fields` reads them)."""
    CMD: ClassVar[str] = protocol.CMD_RUN
    spec: dict

    def to_command(self) -> dict:
        return {"cmd": self.CMD, "spec": self.spec}

    @classmethod
    def from_command(cls, raw: dict) -> "Run":
        spec = raw.get("spec")
        if not (isinstance(spec, dict) and all(isinstance(k, str) for k in spec)):
            raise Malformed("a RUN command without its spec")
        return cls(spec)


def handed_rates(given: Any) -> Optional[dict]:
    """Rates the parent handed over, when they are two positive numbers; None otherwise (the oracle measures them)."""
    if not isinstance(given, dict):
        return None
    values = {name: given.get(name) for name in ("bandwidth_gbps", "fp32_tflops")}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf") for v in values.values()):
        return {name: float(v) for name, v in values.items()}
    return None


@dataclass(frozen=True)
class GpuGo:
    """GPU: a gated oracle's next stage of GPU work may start; with `rates` (after its truth), the device's rates the
    parent already measured for its size class, so that it need not measure them; with `keep` (its truth), whether
    its truth may wait on the GPU for its save (no evaluation runs on its GPU meanwhile) rather than on the host."""
    CMD: ClassVar[str] = protocol.CMD_GPU
    rates: Optional[dict] = None   # {"bandwidth_gbps", "fp32_tflops"}
    keep: bool = False

    def to_command(self) -> dict:
        return {"cmd": self.CMD, **({"rates": self.rates} if self.rates is not None else {}),
                **({"keep": True} if self.keep else {})}

    @classmethod
    def from_command(cls, raw: dict) -> "GpuGo":
        return cls(handed_rates(raw.get("rates")), _flag(raw, "keep", False))


@dataclass(frozen=True)
class Bare:
    """A command that carries nothing but its name: TIME_END, WARM (a candidate started ahead: warm up), PACE (the
    oracle: measure the GPU's pace), GRADIENTS (the oracle: the reference's gradients), FRESH_SETS (the oracle: the
    fresh input sets and its outputs on them), STOP."""
    cmd: str

    def to_command(self) -> dict:
        return {"cmd": self.cmd}


TIME_END = Bare(protocol.CMD_TIME_END)
WARM_UP = Bare(protocol.CMD_WARM)
PACE = Bare(protocol.CMD_PACE)
GRADIENTS = Bare(protocol.CMD_GRADIENTS)
FRESH_SETS = Bare(protocol.CMD_FRESH_SETS)
STOP = Bare(protocol.CMD_STOP)

Command = Union[TimeStart, TimeBlock, FreshCall, Run, GpuGo, Bare]
_TYPED = {kind.CMD: kind for kind in (TimeStart, TimeBlock, FreshCall, Run, GpuGo)}
_BARE = {bare.cmd: bare for bare in (TIME_END, WARM_UP, PACE, GRADIENTS, FRESH_SETS, STOP)}


def parse(raw: Any) -> Command:
    """A command line as the child reads it (ChildChannel.receive): its dataclass; STOP for a name it does not know."""
    name = raw.get("cmd") if isinstance(raw, dict) else None
    if name in _TYPED:
        return _TYPED[name].from_command(raw)
    return _BARE.get(name, STOP)
