"""The parent's handle on the candidate's process: one phase at a time, each with its own deadline, in the sandbox.

Runs in the parent (a GPU worker). The child is harness/candidate/child.py, started by module name and never
imported here; what comes back is event lines (harness/core/protocol.py) and weights_only torch.save files.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from harness.build.builder import install
from harness.core import findings, protocol
from harness.core.config import Config
from harness.core.messages import Audit, CandidateResult, Compiled, Failed, KernelCounts, Malformed, reported_findings
from harness.core.record import Status
from harness.integrity import detectors
from harness.isolation import policy, sandbox
from harness.isolation.spawn import Child
from harness.isolation.specs import CANDIDATE_MODULE, CandidateSpec
from harness.oracle.reference import Reference
from harness.timing.interleave import SideStopped


@dataclass(frozen=True)
class Stop:
    """A stage ended the run: its status and short message."""
    status: Status
    error: str
    compile_s: Optional[float] = None   # how long the module ran before a compile or load failure


class CandidateRun:
    """The candidate's child process, one phase at a time, each with its own deadline, inside the sandbox."""

    def __init__(self, source_path: Path, ref: Reference, config: Config, log_path: Path,
                 libraries: Optional[dict] = None):
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="candidate-"))
        shutil.copy(source_path, self.workdir / "submission.py")
        prebuilt = install(libraries, self.workdir / "prebuilt") if libraries else {}
        spec = CandidateSpec.for_evaluation(config, self.workdir / "submission.py", self.workdir, ref.device,
                                            ref.feed_path, ref.check_grad, prebuilt)
        confinement = policy.for_candidate(config, self.workdir, ref.env)
        self.sandbox_warnings = sandbox.describe(confinement.policy)[1]
        self.child = Child(CANDIDATE_MODULE, spec, self.workdir, log_path, with_commands=True,
                           **confinement.options())
        self.trials = len(ref.truth.outputs)
        self.phase = "compile"
        self.reused = 0     # extension calls served by the build pool's libraries (reported by the child)
        self.findings: dict[str, str] = {}     # dynamic findings reported by the child or seen here
        self.kernels: Optional[KernelCounts] = None   # None: not reported (or malformed)
        self._blocked: list[str] = []

    def __enter__(self) -> "CandidateRun":
        return self

    def __exit__(self, *exc_info) -> None:
        leftovers = self.child.leftovers()   # before finish(), which kills them
        self.child.finish()
        flooded = self.config.max_log_bytes if self.child.output.flooded else None
        self.findings.update(detectors.aftermath(leftovers, self.child.forged, self.child.output.total, flooded,
                                                 self._blocked))
        shutil.rmtree(self.workdir, ignore_errors=True)

    def until_compiled(self) -> Compiled | Stop:
        event = self._expect(protocol.COMPILED, self.config.compile_timeout_s)
        if isinstance(event, Stop):
            return event
        try:
            compiled = Compiled.from_event(event)
        except Malformed as exc:
            return Stop(Status.CRASH, f"protocol violation during {self.phase}: {exc}")
        self.reused = compiled.reused
        return compiled

    def until_checked(self) -> CandidateResult | Stop:
        self.phase = "checks"
        event = self._expect(protocol.CHECKED, self.config.run_timeout_s)
        if isinstance(event, Stop):
            return event
        try:
            self.kernels = KernelCounts.from_event(event.get("kernels"))
        except Malformed:
            self.kernels = None
        try:
            loaded = torch.load(self.workdir / protocol.RESULT_FILE, weights_only=True)
        except Exception as exc:  # boundary: whatever the child left there is untrusted
            return Stop(Status.RUNTIME_ERROR, f"unreadable result: {type(exc).__name__}: {str(exc)[:200]}")
        try:
            return CandidateResult.from_file(loaded, self.trials)
        except Malformed as exc:
            return Stop(Status.RUNTIME_ERROR, f"unreadable result: {exc}")

    def expect(self, wanted: str, timeout_s: float) -> dict:
        """For the timing dialogue: the event, or SideStopped carrying the Stop."""
        event = self._expect(wanted, timeout_s)
        if isinstance(event, Stop):
            raise SideStopped("candidate", event)
        return event

    def spot_checks(self) -> Optional[list]:
        try:
            kept = torch.load(self.workdir / protocol.SPOT_FILE, weights_only=True)
        except Exception:  # boundary: missing or forged
            return None
        return kept if isinstance(kept, list) else None

    def _expect(self, wanted: str, timeout_s: float) -> dict | Stop:
        deadline = time.monotonic() + timeout_s
        while True:
            event = self.child.next_event(max(deadline - time.monotonic(), 0.0))
            if event is None:
                ended = self.child.ended
                if ended.timed_out:
                    return Stop(Status.TIMEOUT, f"{self.phase} exceeded {timeout_s:g} s")
                if ended.memory_exceeded:
                    return Stop(Status.RUNTIME_ERROR, f"{ended.detail} during {self.phase}")
                return Stop(Status.CRASH, f"{ended.detail} during {self.phase}")
            if event["event"] == protocol.AUDIT:
                self._blocked.append(Audit.from_event(event).line())
                continue
            self.findings.update(reported_findings(event, findings.DYNAMIC))   # known names only: untrusted
            if event["event"] == protocol.FAILED:
                failed = Failed.from_event(event)
                return Stop(_status(failed.status), failed.error, failed.compile_s)
            if event["event"] != wanted:
                return Stop(Status.CRASH, f"protocol violation during {self.phase}: got {event['event']!r}")
            return event


def _status(value: object) -> Status:
    try:
        return Status(value)
    except ValueError:
        return Status.CRASH
