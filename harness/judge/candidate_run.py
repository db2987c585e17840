"""The parent's handle on the candidate's process: one phase at a time, each with its own deadline, in the sandbox.

Runs in the parent (a GPU worker). The child is harness/children/candidate/main.py, started by module name and never
imported here; what comes back is event lines (harness/shared/protocol.py) and weights_only torch.save files.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.build.builder import install
from harness.integrity import detectors
from harness.isolation import policy, sandbox
from harness.isolation.spawn import Child
from harness.judge import warm
from harness.oracle.reference import Reference
from harness.shared import check, commands, findings, handover, protocol, resources
from harness.shared.config import Config
from harness.shared.messages import (
    Audit,
    CandidateResult,
    Checked,
    Compiled,
    Failed,
    FreshTimed,
    KernelCounts,
    Malformed,
    reported_findings,
)
from harness.shared.record import Status
from harness.shared.settings import SandboxSettings
from harness.shared.sizes import tensor_bytes
from harness.shared.specs import CANDIDATE_MODULE, CandidateSpec
from harness.timing.interleave import SideStopped


@dataclass(frozen=True)
class FirstFailed:
    """Trial 0's outputs, handed over before the other trials ran, failed the parent's check: nothing more runs."""
    verdict: check.OutputVerdict


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
        self.phases: dict[str, float] = {}   # seconds per phase (docs/performance.md); child-reported ones included
        pool = warm.pool_for(config, ref.device, ref.env)
        waited = time.perf_counter()
        ahead = pool.take() if pool is not None else None
        began = time.perf_counter()   # the parent's part of the start (`candidate_start`): files, spec, sandbox
        self.workdir = ahead.workdir if ahead is not None else Path(tempfile.mkdtemp(prefix="candidate-"))
        try:
            shutil.copyfile(source_path, self.workdir / "submission.py")
            prebuilt = install(libraries, self.workdir / "prebuilt") if libraries else {}
            spec = CandidateSpec.for_evaluation(config, self.workdir / "submission.py", self.workdir, ref.device,
                                                ref.feed_path, ref.check_grad, prebuilt,
                                                check.output_signature(ref.truth.outputs[0]) if ref.truth.outputs
                                                else None)
            confinement = policy.for_candidate(SandboxSettings.from_config(config), self.workdir, ref.env,
                                               ref.device)
            self.sandbox_warnings = sandbox.describe(confinement.policy)[1]
            if ahead is not None:   # started ahead under this same confinement; it runs this one submission
                self.phases["started_ahead_wait"] = began - waited
                ahead.child.output.move_to(log_path)
                self.child = ahead.child
                # it runs as its own user already: what was put into its folder since is handed to it, read-only
                for placed in ("submission.py", "prebuilt"):
                    if (self.workdir / placed).exists():
                        self.child.hand_over(self.workdir / placed)
                self._spawned = time.time()
                _lend_feed(self.child, ref)
                self.child.send(commands.Run(dataclasses.asdict(spec)))
            else:
                self._spawned = time.time()
                self.child = Child(CANDIDATE_MODULE, spec, self.workdir, log_path, with_commands=True,
                                   handover=handover.candidate_files(config.fresh_inputs),
                                   lend=ref.feed_fd is not None, **confinement.options())
                _lend_feed(self.child, ref)
        except BaseException:
            # nothing of a start that failed is left (a batch interrupted meanwhile refuses the child:
            # spawn.ShuttingDown): its folder, with the submission copied there, and a process started ahead
            if ahead is not None:
                ahead.child.finish()
                if ahead.child.output.path == ahead.log_path:   # not moved to the evaluation's log yet
                    ahead.log_path.unlink(missing_ok=True)
            elif getattr(self, "child", None) is not None:   # started, but its feed could not be lent
                self.child.finish()
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.phases["candidate_start"] = time.perf_counter() - began
        self.trials = len(ref.truth.outputs)
        self.phase = "compile"
        self.reused = 0     # extension calls served by the build pool's libraries (reported by the child)
        self.fresh_calls = 0   # calls on fresh input sets asked for so far (each hands its outputs over apart)
        self._fresh_folder: Optional[Path] = None   # where they are written, when in memory (_fresh_path)
        self.findings = findings.Found()   # dynamic: reported by the child (IN_CANDIDATE only) or seen here
        self.source_streams: Optional[str] = None   # the static side_stream finding: timed conservatively
        self.kernels: Optional[KernelCounts] = None   # None: not reported (or malformed)
        self._blocked: list[str] = []
        self._leftovers: Optional[list[str]] = None   # taken when the child is ended early (end_now)

    def __enter__(self) -> "CandidateRun":
        return self

    def __exit__(self, *exc_info) -> None:
        started = time.perf_counter()
        leftovers = self.child.leftovers() if self._leftovers is None else self._leftovers   # before finish()
        # killed at once: everything it hands over is in the parent's hands by now, and its own exit (the
        # interpreter's and CUDA's teardown of a process that held GBs) took up to 7 s of the GPU worker's time
        self.child.finish(grace_s=0)
        flooded = self.config.max_log_bytes if self.child.output.flooded else None
        self.findings.update(detectors.aftermath(leftovers, self.child.forged, self.child.output.total, flooded,
                                                 self._blocked))
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._fresh_folder is not None:
            shutil.rmtree(self._fresh_folder, ignore_errors=True)
        self.phases["teardown"] = time.perf_counter() - started

    def end_now(self) -> None:
        """Kill the candidate's processes now (the reference is timed again with none alive); what it left running
        is noted first, for the findings."""
        if self._leftovers is None:
            self._leftovers = self.child.leftovers()
        self.child.kill()

    def until_compiled(self) -> Compiled | Stop:
        event = self._expect(protocol.COMPILED, self.config.compile_timeout_s)
        if isinstance(event, Stop):
            return event
        try:
            compiled = Compiled.from_event(event)
        except Malformed as exc:
            return Stop(Status.CRASH, f"protocol violation during {self.phase}: {exc}")
        self.reused = compiled.reused
        clock = compiled.clock   # the child's wall clock: diagnostics, never part of a verdict
        if "main" in clock:
            self.phases["spawn_import"] = max(clock["main"] - self._spawned, 0.0)
            if "prepared" in clock:
                self.phases["cuda_init"] = max(clock["prepared"] - clock["main"], 0.0)
        if compiled.compile_s is not None:
            self.phases["load"] = compiled.compile_s
        return compiled

    def until_checked(self, first_check: Optional[Callable[[list], Optional[check.OutputVerdict]]] = None
                      ) -> CandidateResult | FirstFailed | Stop:
        """The checks' result. `first_check`: the verdict on trial 0's outputs where the candidate hands them over
        first (a failing one ends the run here: FirstFailed), None where they pass; it runs while the other trials
        do (phases `first_read`, `first_check`)."""
        self.phase = "checks"
        started, deadline = time.perf_counter(), time.monotonic() + self.config.run_timeout_s
        event = self._expect((protocol.FIRST, protocol.CHECKED), self.config.run_timeout_s)
        if isinstance(event, Stop):
            return event
        first = None
        if event["event"] == protocol.FIRST:
            began = time.perf_counter()
            try:
                first = self._read_once(protocol.FIRST_FILE)
            except Exception as exc:  # boundary: whatever the child left there is untrusted
                return Stop(Status.RUNTIME_ERROR, f"unreadable outputs of trial 0: {type(exc).__name__}: "
                                                  f"{str(exc)[:200]}")
            finally:
                self._add_phase("first_read", time.perf_counter() - began)
            if not isinstance(first, list):
                return Stop(Status.RUNTIME_ERROR, "unreadable outputs of trial 0: not a list")
            if first_check is not None:
                began = time.perf_counter()
                verdict = first_check(first)
                self._add_phase("first_check", time.perf_counter() - began)
                if verdict is not None:   # the child never reports its phases: the parent's view of them
                    self.phases["correctness"] = time.perf_counter() - started
                    return FirstFailed(verdict)
            event = self._expect(protocol.CHECKED, max(deadline - time.monotonic(), 0.0))
            if isinstance(event, Stop):
                return event
        checked = Checked.from_event(event)
        self.kernels = checked.kernels
        self.phases.update(checked.seconds)
        began = time.perf_counter()
        try:
            loaded = self._read_once(protocol.RESULT_FILE)
        except Exception as exc:  # boundary: whatever the child left there is untrusted
            return Stop(Status.RUNTIME_ERROR, f"unreadable result: {type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self._add_phase("result_read", time.perf_counter() - began)
        try:
            return CandidateResult.from_file(loaded, self.trials, first)
        except Malformed as exc:
            return Stop(Status.RUNTIME_ERROR, f"unreadable result: {exc}")

    def _read_once(self, name: str) -> Any:
        """A file the child handed over, loaded (mapped where it could be sealed), its memfd's fd then closed here:
        each is read once, and its pages go as soon as the tensors loaded from it are dropped (the child closes its
        own fd once written: harness/children/candidate/main.py _hand_over)."""
        try:
            return self.child.handover.load(name)
        finally:
            self.child.handover.release(name)

    def expect(self, wanted: str, timeout_s: float) -> dict:
        """For the timing dialogue: the event, or SideStopped carrying the Stop."""
        event = self._expect(wanted, timeout_s)
        if isinstance(event, Stop):
            raise SideStopped("candidate", event)
        return event

    def _fresh_path(self, needed: int) -> Path:
        """Where a fresh input set of `needed` bytes is written: a folder in memory made for this run while the
        machine has room for the set there (a set can be GBs, written and deleted within a second: on disk it only
        churns the disk), else the candidate's folder."""
        memory = resources.memory_folder(needed)
        if memory is None:
            return self.workdir / protocol.FRESH_FILE
        if self._fresh_folder is None:
            self._fresh_folder = _fresh_folder_in(memory)
        return self._fresh_folder / protocol.FRESH_FILE

    def time_fresh(self, input_set: list, l2_flush: bool, sync: str, near: Optional[int] = None,
                   ahead_ms: float = 0.0, span_calls: int = 1) -> tuple[FreshTimed, Any] | Stop:
        """One timed span of `span_calls` calls whose last is on an input set the candidate has never been given:
        written only now, one set per span (in memory where there is room: _fresh_path), after `near` timed spans on
        a set it has seen (None: commands.FRESH_NEAR). (its times, the outputs it saved), or the Stop that ended
        it."""
        began = time.perf_counter()
        try:
            path = self._fresh_path(tensor_bytes(input_set))
            _write_new(path, input_set)
        except OSError as exc:
            return Stop(Status.RUNTIME_ERROR, f"the fresh inputs could not be handed over: {exc.strerror or exc}")
        self.child.hand_over(path)
        written = time.perf_counter()
        self.child.send(commands.FreshCall(l2_flush, sync, ahead_ms, commands.FRESH_NEAR if near is None else near,
                                           span_calls, str(path)))
        self.fresh_calls += 1
        event = self._expect(protocol.FRESH, self.config.run_timeout_s)
        answered = time.perf_counter()
        self._add_phase("fresh_write", written - began)
        self._add_phase("fresh_call", answered - written)
        path.unlink(missing_ok=True)
        if isinstance(event, Stop):
            return event
        try:
            timed = FreshTimed.from_event(event)
        except Malformed as exc:
            return Stop(Status.CRASH, f"protocol violation during {self.phase}: {exc}")
        if timed.calls != span_calls:
            return Stop(Status.CRASH, f"protocol violation during {self.phase}: a fresh span of {timed.calls} "
                                      f"call(s) where {span_calls} were asked")
        try:
            outputs = self._read_once(handover.fresh_out_file(self.fresh_calls - 1))
        except Exception as exc:  # boundary: whatever the child left there is untrusted
            return Stop(Status.RUNTIME_ERROR, f"unreadable outputs of a fresh input set: {type(exc).__name__}")
        self._add_phase("fresh_read", time.perf_counter() - answered)
        return timed, outputs

    def _add_phase(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def spot_checks(self) -> Optional[list]:
        began = time.perf_counter()
        try:
            kept = self._read_once(protocol.SPOT_FILE)
        except Exception:  # boundary: missing or forged
            return None
        finally:
            self._add_phase("spot_read", time.perf_counter() - began)
        return kept if isinstance(kept, list) else None

    def _expect(self, wanted: str | tuple[str, ...], timeout_s: float) -> dict | Stop:
        """The next event, one of `wanted` (audits collected on the way), or the Stop that came instead."""
        wanted = (wanted,) if isinstance(wanted, str) else wanted
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
            # Only names the candidate's side detects: untrusted, it may not speak for the parent's detectors.
            self.findings.update(reported_findings(event, findings.IN_CANDIDATE))
            if event["event"] == protocol.FAILED:
                failed = Failed.from_event(event)
                return Stop(_status(failed.status), failed.error, failed.compile_s)
            if event["event"] not in wanted:
                return Stop(Status.CRASH, f"protocol violation during {self.phase}: got {event['event']!r}")
            return event


def _lend_feed(child: Child, ref: Reference) -> None:
    """The candidate's own read-only fd of the reference's sealed feed, sent over its lend socket (a process started
    ahead gets it with its submission); none where the feed is a file (the spec names it)."""
    if ref.feed_fd is None:
        return
    fd = handover.read_only(ref.feed_fd)
    try:
        child.lend_fds([fd], ref.feed_bytes)
    finally:
        os.close(fd)   # the child has its own now


def _fresh_folder_in(memory: Path) -> Path:
    """A new folder in `memory` for a candidate's fresh input sets: this process's, which the candidate's own user
    can pass through to a file handed over to it but cannot list or write into."""
    folder = resources.scratch_folder("fresh", memory)
    os.chmod(folder, 0o711)
    return folder


def _write_new(path: Path, value: Any) -> None:
    """torch.save into a file made now: the candidate's folder is its own while it runs, and a link it planted
    under this name (to a file of the judge's) is removed, never written through."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as file:
        torch.save(value, file)


# What a candidate's process may say of itself when a stage fails: a failure its own stages can meet. Any other claim
# (`pass`, `incorrect`, a status the parent decides) is a crash: the process is untrusted, and code that read its
# event token could otherwise end its own evaluation with a verdict no check produced.
CHILD_FAILURES = frozenset({Status.NEEDS_CUDA, Status.COMPILE_ERROR, Status.LOAD_ERROR, Status.INIT_ERROR,
                            Status.RUNTIME_ERROR})


def _status(value: object) -> Status:
    try:
        status = Status(value)
    except ValueError:
        return Status.CRASH
    return status if status in CHILD_FAILURES else Status.CRASH
