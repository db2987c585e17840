"""Rule profiles: which findings turn a measured pass into rule_violation, and whether gradients must be right.

A record keeps what was measured (`check_status`: the first failing check, ignoring rules) and every finding (`flags`
with evidence). The status under a profile is derived from those alone, so one set of records gives a leaderboard
per profile (`run_eval.py leaderboard --profile strict`). Profiles live in configs/<name>.yaml as the keys `profile`,
`forbid`, `grad_mismatch_fails`, `grad_failure_fails` and, for looser tolerances, `atol`/`rtol`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

from harness.shared import findings
from harness.shared.record import Status
from harness.shared.settings import IntegritySettings

if TYPE_CHECKING:
    from harness.shared.record import Record

# Every finding a record can carry (harness/shared/findings.py is the catalogue).
KNOWN_FLAGS = {kind.name: kind.meaning for kind in findings.CATALOGUE}

# Statuses a tolerance override can turn into a pass or a pass into (values only; NaN needs infinite tolerance).
_TOLERANCE_STATUSES = {Status.PASS, Status.INCORRECT}


@dataclass(frozen=True)
class Profile:
    name: str
    forbid: frozenset[str]
    grad_required: bool                 # every gradient failure is the status (no_grad too)
    tolerance: Optional[float] = None   # one atol = rtol for re-deriving statuses; None: the run's own verdicts
    mismatch_fails: bool = True         # grad_mismatch (an output with a graph, wrong gradients) is the status

    @classmethod
    def from_settings(cls, settings: IntegritySettings) -> "Profile":
        tolerance = settings.atol if settings.atol is not None and settings.atol == settings.rtol else None
        # A profile that does not check gradients (forward-only, kernelbench-legacy) fails none, also when its
        # leaderboard re-derives records judged with gradients checked.
        return cls(settings.profile, frozenset(settings.forbid), settings.check_grad and settings.grad_failure_fails,
                   tolerance, settings.check_grad and settings.grad_mismatch_fails)


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (configs/<name>.yaml) or from a YAML path."""
    return Profile.from_settings(IntegritySettings.load(name_or_path))


def derive(check_status: Status, grad_failure: Optional[Status], flags: Iterable[str],
           tolerance_needed: Optional[float], profile: Profile) -> tuple[Status, Optional[str]]:
    """The status under `profile` and, for a rule violation, the message naming the forbidden findings."""
    flags = set(flags)
    status = check_status
    if (profile.tolerance is not None and status in _TOLERANCE_STATUSES and tolerance_needed is not None
            and findings.TIMED_OUTPUT_MISMATCH not in flags):
        status = Status.PASS if tolerance_needed <= profile.tolerance else Status.INCORRECT
    if status != Status.PASS:
        return status, None
    if grad_failure is not None and (profile.grad_required
                                     or (profile.mismatch_fails and grad_failure == Status.GRAD_MISMATCH)):
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
