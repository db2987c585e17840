"""Whose doing a drifted reference was: pure verdicts over what the parent measured (harness/judge/evaluate.py times
the reference again and records what these return; docs/timing.md says why each step is there).

A reference that ran slower beside its candidate than its clean time, or (CPU device) whose candidate used CPU
outside its own timed commands, is timed alone again once the candidate's processes are killed (worth_timing_alone).
Back within the clean time's margin alone, the candidate slowed it (timing_interference) when the interleaved time is
beyond the alone time's margin too and `blame` finds it could have; otherwise the drift is put down to the machine
(the reference_drift finding). Still slow alone, the machine changed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

# On the CPU device a reference that ran slow beside its candidate and at its clean time alone again is put down to
# the candidate only if the candidate could have slowed it: CPU used outside its own timed commands (threads that
# work while it waits) beyond OUTSIDE_MS_PER_FREEZE per stop (an honest candidate sleeps on its pipe; what it uses
# is the stop and resume of its threads, measured at 0.07-0.4 ms per stop, against 3.5-7 ms for the saboteur
# fixtures), or more than OWN_CORES_MAX cores in its own commands (its torch runs one thread: honest 0.78-0.99,
# the saboteurs 1.37-1.98). Below both, a VM whose speed wanders did it (docs/timing.md).
OUTSIDE_MS_PER_FREEZE = 1.0
OWN_CORES_MAX = 1.2


class CpuUse(Protocol):
    """The candidate's CPU use over its timing, as its holder accounted it (harness/timing/interleave.py CpuUse)."""
    outside_ms: float   # CPU used outside its own timed commands
    freezes: int        # times it was stopped meanwhile

    @property
    def own_cores(self) -> float: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Pace:
    """The GPU's pace for a fixed workload with the host ahead, in the reference's process
    (harness/children/oracle/pace.py): clean (no candidate alive) and with the drifted reference's candidate stopped.
    None: not measured (the CPU device) or not told."""
    clean_ms: Optional[float]
    stopped_ms: Optional[float]

    @property
    def ratio(self) -> Optional[float]:
        if self.clean_ms is None or self.stopped_ms is None or self.clean_ms <= 0:
            return None
        return self.stopped_ms / self.clean_ms

    def describe(self) -> str:
        if self.ratio is None:
            return "the GPU's pace could not be measured"
        return (f"with the candidate stopped the GPU ran a fixed workload at {self.ratio:.2f}x its clean time "
                f"({self.stopped_ms:.4g} ms a copy, clean {self.clean_ms:.4g} ms, the host ahead of the GPU)")


class Outcome(enum.Enum):
    INTERFERENCE = enum.auto()      # the candidate slowed its reference: timing_interference
    DRIFT = enum.auto()             # the machine slowed it for a while (reference_drift): the faster time counts
    MACHINE_CHANGED = enum.auto()   # as slow alone: the alone time becomes the reference's clean time


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    evidence: Optional[str]   # INTERFERENCE: the record's error; DRIFT: the finding's evidence; MACHINE_CHANGED: None


def worth_timing_alone(beyond: bool, stragglers: Sequence[str], suspect: bool = False) -> bool:
    """Whether the reference is timed alone again: its interleaved time beyond the clean time's margin after the
    re-measurements, a freeze of the candidate that did not hold (its stragglers), or a `suspect` candidate
    (could_have_slowed)."""
    return beyond or bool(stragglers) or suspect


def could_have_slowed(device: str, cpu: Optional[CpuUse]) -> bool:
    """On the CPU device: a candidate whose own CPU use says it could have slowed its reference (blame). Its reference
    is timed alone again whatever the interleaved time read against the clean one: the clean time is no fixed point on
    a VM (a memory-bound reference's clean median read 1.2 ms and 2.7 ms in two runs on the CPU machine) and the CPU
    margin is wide (+50%): a saboteur's reference read 1.2-1.3x its honest twin's, or 2.3x a noisy clean median,
    unseen; timed alone, the faster of the two counts. An honest candidate (no CPU use outside its commands) never pays
    for the timing alone this adds."""
    return device == "cpu" and cpu is not None and blame(device, (), cpu) is not None


def blame(device: str, stragglers: Sequence[str], cpu: Optional[CpuUse], pace: Optional[Pace] = None,
          margin: float = 0.0) -> Optional[str]:
    """Why a drifted reference is put down to its candidate, or None where it cannot have been. On a GPU the
    candidate's CPU use does not tell (work queued from a thread slows the reference at almost no CPU cost); what a
    stopped candidate can still do there is hold the GPU, which the GPU's pace shows: at its clean pace, the
    reference was slowed on the host, where the candidate's threads were stopped."""
    if stragglers:
        return ", ".join(stragglers)
    if device != "cpu":
        ratio = pace.ratio if pace is not None else None
        if ratio is None:
            return "on a GPU the candidate's CPU use does not tell, and the GPU's pace could not be measured"
        if ratio > 1 + margin:
            return f"{pace.describe()}: other work held the GPU"
        return None
    if cpu is None:
        return "its CPU use is not known here (no cgroup, or a process outside it)"
    if cpu.outside_ms > OUTSIDE_MS_PER_FREEZE * (cpu.freezes + 1) or cpu.own_cores > OWN_CORES_MAX:
        return cpu.describe()
    return None


def after_alone(drift_evidence: str, margin: float, clean_ci_high_ms: float, interleaved_ms: float, alone_ms: float,
                device: str, stragglers: Sequence[str], cpu: Optional[CpuUse], pace: Pace) -> Verdict:
    """The verdict once the reference was timed alone again (`alone_ms`) after the candidate was killed.
    `drift_evidence`: the interleaved time against the clean one (interleave.Drift.evidence); `pace`: the GPU's pace
    clean and with the candidate stopped (Pace(None, None) on the CPU device)."""
    if alone_ms > clean_ci_high_ms * (1 + margin):
        return Verdict(Outcome.MACHINE_CHANGED, None)
    evidence = drift_evidence + (f"; alone again after the candidate was killed (idle between its blocks as "
                                 f"interleaved): {alone_ms:.4g} ms")
    slowed = interleaved_ms > alone_ms * (1 + margin)
    why = blame(device, stragglers, cpu, pace, margin)
    if why is not None and (slowed or bool(stragglers)):
        return Verdict(Outcome.INTERFERENCE, f"timing interference: {evidence}; {why}")
    if why is not None:
        return Verdict(Outcome.DRIFT, f"{evidence}; the interleaved time is within +{margin:.0%} of it")
    return Verdict(Outcome.DRIFT, f"{evidence}; {cpu.describe() if device == 'cpu' else pace.describe()}")
