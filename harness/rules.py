"""Rule profiles: which findings turn a measured pass into rule_violation, and whether gradients must be right.

A record keeps what was measured (`check_status`: the first failing check, ignoring rules) and every finding (`flags`
with evidence). The status under a profile is derived from those alone, so one set of records gives a leaderboard
per profile (`run_eval.py leaderboard --profile strict`). Profiles live in configs/<name>.yaml as the keys `profile`,
`forbid`, `grad_failure_fails` and, for looser tolerances, `atol`/`rtol`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional

from harness.record import Status
from harness.static_checks import FLAGS as STATIC_FLAGS

if TYPE_CHECKING:
    from harness.config import Config
    from harness.record import Record

# Findings measured while the candidate runs (the static ones come from harness/static_checks.py).
DYNAMIC_FLAGS = {
    "no_custom_kernel": "no kernel of the submission's own extensions ran in the profiled forward",
    "library_kernels": "library or ATen kernels did part of the forward's work",
    "no_fusion": "no custom kernel replaces two or more of the reference's operators",
    "side_stream_kernels": "kernels ran on a stream other than the one the harness called forward on",
    "mutates_inputs": "an input tensor differed after the forward call",
    "output_subclass": "an output is not a plain torch.Tensor (e.g. a lazy subclass)",
    "patched_runtime": "a watched torch, time, builtins or harness attribute changed while the submission ran",
    "precision_changed": "TF32, matmul precision, autocast or the default dtype changed while the submission ran",
    "background_thread": "Python threads started by the submission were alive after forward returned",
    "sandbox_blocked": "the sandbox blocked an operation (network, process, ctypes, introspection, file write)",
    "spawned_processes": "processes started by the submission were alive at the end of its run",
    "forged_events": "lines on the event pipe without the run's token (written by the submission)",
    "output_flood": "more output than the log keeps (max_log_bytes)",
    "timed_output_mismatch": "an output of a timed call (spot-checked) differs from the reference",
    "timer_mismatch": "the parent's wall clock and the reported event times disagree beyond the stated bound",
    "implausible_time": "faster than moving the problem's minimum bytes (or doing its FLOPs) allows",
}
KNOWN_FLAGS = {**STATIC_FLAGS, **DYNAMIC_FLAGS}

# Statuses a tolerance override can turn into a pass or a pass into (values only; NaN needs infinite tolerance).
_TOLERANCE_STATUSES = {Status.PASS, Status.INCORRECT}


@dataclass(frozen=True)
class Profile:
    name: str
    forbid: frozenset[str]
    grad_required: bool
    tolerance: Optional[float] = None   # one atol = rtol for re-deriving statuses; None: the run's own verdicts

    @classmethod
    def from_config(cls, config: "Config") -> "Profile":
        tolerance = config.atol if config.atol is not None and config.atol == config.rtol else None
        return cls(config.profile, frozenset(config.forbid), config.grad_failure_fails, tolerance)


CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (configs/<name>.yaml) or from a YAML path."""
    from harness.config import load_config  # config imports this module to validate `forbid`

    path = Path(name_or_path) if name_or_path.endswith((".yaml", ".yml")) else CONFIGS_DIR / f"{name_or_path}.yaml"
    return Profile.from_config(load_config(path))


def unknown_flags(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - set(KNOWN_FLAGS))


def derive(check_status: Status, grad_failure: Optional[Status], flags: Iterable[str],
           tolerance_needed: Optional[float], profile: Profile) -> tuple[Status, Optional[str]]:
    """The status under `profile` and, for a rule violation, the message naming the forbidden findings."""
    flags = set(flags)
    status = check_status
    if (profile.tolerance is not None and status in _TOLERANCE_STATUSES and tolerance_needed is not None
            and "timed_output_mismatch" not in flags):
        status = Status.PASS if tolerance_needed <= profile.tolerance else Status.INCORRECT
    if status != Status.PASS:
        return status, None
    if profile.grad_required and grad_failure is not None:
        return grad_failure, None
    broken = sorted(flags & profile.forbid)
    if broken:
        return Status.RULE_VIOLATION, f"forbidden under profile '{profile.name}': {', '.join(broken)}"
    return Status.PASS, None


def status_under(record: "Record", profile: Profile) -> Status:
    """A stored record's status under another profile (records older than profiles keep their status)."""
    if record.check_status is None:
        return record.status
    return derive(record.check_status, record.grad_failure, record.flags or (), record.tolerance_needed,
                  profile)[0]
