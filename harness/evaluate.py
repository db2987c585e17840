"""Judge one submission against one problem: extraction -> candidate process -> verdict -> Record.

Runs in the parent. Candidate code executes only in the child started by `CandidateRun`; what comes back is
event lines and a weights_only torch.save file of CPU tensors.
"""
from __future__ import annotations

import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import torch

from harness import check, protocol
from harness.config import Config
from harness.extract import extract
from harness.oracle import Reference, timing_spec
from harness.record import Record, Status
from harness.spawn import Child
from harness.submissions import Submission

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stop:
    """A stage ended the run: its status and short message."""
    status: Status
    error: str
    compile_s: Optional[float] = None   # how long the module ran before a compile or load failure


def evaluate(submission: Submission, reference: Callable[[], Reference], config: Config, device: str,
             artifacts_dir: Path) -> Record:
    """`reference` is called only when the candidate gets as far as running (no_code needs no oracle)."""
    record = _evaluate(submission, reference, config, device, artifacts_dir)
    return replace(record, timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _evaluate(submission: Submission, reference: Callable[[], Reference], config: Config, device: str,
              artifacts_dir: Path) -> Record:
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    record = _blank_record(submission, config, device)
    extraction = extract(submission.text, submission.is_python)
    if extraction.explanation:
        explanation_path = artifacts_dir / "explanation.md"
        explanation_path.write_text(extraction.explanation)
        record = replace(record, explanation_path=str(explanation_path))
    if extraction.source is None:
        return replace(record, status=Status.NO_CODE, error="no complete Python block that defines ModelNew")
    source_path = artifacts_dir / "source.py"
    source_path.write_text(extraction.source)
    record = replace(record, source_path=str(source_path))
    if extraction.syntax_error:
        return replace(record, status=Status.SYNTAX_ERROR, error=extraction.syntax_error)

    ref = reference()
    record = replace(record, device_name=ref.device_name, ref_runtime_ms=_median(ref.timing),
                     ref_runtime_iqr_ms=_iqr(ref.timing), log_path=str(artifacts_dir / "log.txt"))
    with CandidateRun(source_path, ref, config, artifacts_dir / "log.txt") as run:
        record = _judge(run, ref, config, record)
    _cap_log(artifacts_dir / "log.txt", config.max_log_bytes)
    if record.status == Status.COMPILE_ERROR:
        record = replace(record, error=_first_compiler_error(artifacts_dir / "log.txt") or record.error)
    return record


def _judge(run: "CandidateRun", ref: Reference, config: Config, record: Record) -> Record:
    compiled = run.until_compiled()
    if isinstance(compiled, Stop):
        # A build or module failure says the code did not compile; a timeout, crash or needs_cuda says nothing.
        was_compiled = False if compiled.status in (Status.COMPILE_ERROR, Status.LOAD_ERROR) else None
        return replace(record, status=compiled.status, error=compiled.error, compiled=was_compiled,
                       compile_s=compiled.compile_s)
    record = replace(record, compiled=True, compile_s=compiled["compile_s"],
                     extensions_built=compiled["extensions_built"])

    result = run.until_checked()
    if isinstance(result, Stop):
        return replace(record, status=result.status, error=result.error)
    record = replace(record, weights_loaded=result["weights_loaded"])

    outputs = check.check_outputs(result["outputs"], ref.truth["outputs"], ref.tolerance)
    record = replace(record, max_abs_error=outputs.max_abs_error, max_rel_error=outputs.max_rel_error)
    if outputs.status is not None:
        return replace(record, status=outputs.status, error=outputs.error, correct=False)
    repeat_problem = check.check_repeat(result["outputs"][0], result["repeat"], ref.tolerance)
    if repeat_problem is not None:
        return replace(record, status=Status.NONDETERMINISTIC, error=repeat_problem, correct=False)
    record = replace(record, correct=True)

    failures: list[Stop] = []
    if ref.check_grad:
        grads = check.check_grads(result, ref.truth, ref.grad_tolerance)
        record = replace(record, grad_correct=grads.correct, grad_max_abs_error=grads.max_abs_error,
                         grads_compared=grads.compared, grads_not_comparable=grads.not_comparable)
        if grads.correct is False and config.grad_failure_fails:
            status = Status.NO_GRAD if not result.get("has_graph") and not result.get("grad_error") else (
                Status.GRAD_MISMATCH)
            failures.append(Stop(status, grads.error))
        elif grads.correct is False:
            record = replace(record, error=f"gradients (not required): {grads.error}")
    if config.require_custom_extension and not record.extensions_built:
        failures.append(Stop(Status.RULE_VIOLATION, "no custom extension was built (pure PyTorch)"))

    if config.time_candidates:
        timing = run.timing()
        if isinstance(timing, Stop):
            return replace(record, status=timing.status, error=f"during timing: {timing.error}")
        speedup = record.ref_runtime_ms / timing["median_ms"] if record.ref_runtime_ms and timing["median_ms"] \
            else None
        record = replace(record, runtime_ms=timing["median_ms"], runtime_iqr_ms=timing["iqr_ms"],
                         runtime_reps=timing["reps"], speedup=speedup)
    if failures:
        return replace(record, status=failures[0].status, error=failures[0].error)
    return replace(record, status=Status.PASS)


class CandidateRun:
    """The candidate's child process, one phase at a time, each with its own deadline."""

    def __init__(self, source_path: Path, ref: Reference, config: Config, log_path: Path):
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="candidate-"))
        shutil.copy(source_path, self.workdir / "submission.py")
        spec = {"source_path": str(self.workdir / "submission.py"), "feed": str(ref.feed_path),
                "device": ref.device, "seed": config.seed, "check_grad": ref.check_grad,
                "allow_tf32": config.allow_tf32, "timing": timing_spec(config), "out_dir": str(self.workdir)}
        self.child = Child("harness.candidate_child", spec, self.workdir, log_path, with_commands=True)
        self.phase = "compile"

    def __enter__(self) -> "CandidateRun":
        return self

    def __exit__(self, *exc_info) -> None:
        self.child.finish()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def until_compiled(self) -> dict | Stop:
        return self._expect(protocol.COMPILED, self.config.compile_timeout_s)

    def until_checked(self) -> dict | Stop:
        self.phase = "checks"
        event = self._expect(protocol.CHECKED, self.config.run_timeout_s)
        if isinstance(event, Stop):
            return event
        try:
            return torch.load(self.workdir / protocol.RESULT_FILE, weights_only=True)
        except Exception as exc:  # boundary: whatever the child left there is untrusted
            return Stop(Status.RUNTIME_ERROR, f"unreadable result: {type(exc).__name__}: {str(exc)[:200]}")

    def timing(self) -> dict | Stop:
        self.phase = "timing"
        self.child.send(protocol.CMD_TIME)
        event = self._expect(protocol.TIMED, self.config.run_timeout_s)
        return event if isinstance(event, Stop) else event["timing"]

    def _expect(self, wanted: str, timeout_s: float) -> dict | Stop:
        event = self.child.next_event(timeout_s)
        if event is None:
            ended = self.child.ended
            if ended.timed_out:
                return Stop(Status.TIMEOUT, f"{self.phase} exceeded {timeout_s:g} s")
            return Stop(Status.CRASH, f"{ended.detail} during {self.phase}")
        if event["event"] == protocol.FAILED:
            compile_s = event.get("compile_s")
            return Stop(_status(event.get("status")), str(event.get("error"))[:400],
                        compile_s if isinstance(compile_s, (int, float)) else None)
        if event["event"] != wanted:
            return Stop(Status.CRASH, f"protocol violation during {self.phase}: got {event['event']!r}")
        return event


def _status(value: object) -> Status:
    try:
        return Status(value)
    except ValueError:
        return Status.CRASH


def _blank_record(submission: Submission, config: Config, device: str) -> Record:
    return Record(
        problem=submission.problem_id, submission=submission.label, submission_hash=submission.hash,
        model=submission.model, run=submission.run, sample_id=submission.sample_id, status=Status.CRASH,
        compiled=None, correct=None, grad_correct=None, error=None, max_abs_error=None, max_rel_error=None,
        grad_max_abs_error=None, grads_compared=None, grads_not_comparable=None, weights_loaded=None,
        runtime_ms=None, runtime_iqr_ms=None, runtime_reps=None, ref_runtime_ms=None, ref_runtime_iqr_ms=None,
        speedup=None, compile_s=None, extensions_built=None, device=device, device_name=None,
        torch_version=torch.__version__, cuda_version=torch.version.cuda, config_hash=config.hash(),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), log_path=None, source_path=None,
        explanation_path=None)


def _median(timing: Optional[dict]) -> Optional[float]:
    return timing["median_ms"] if timing else None


def _iqr(timing: Optional[dict]) -> Optional[float]:
    return timing["iqr_ms"] if timing else None


_COMPILER_ERROR = re.compile(r"^.*?(?:error:|error [A-Z]*\d+:|\berror\b.*: ).*$", re.MULTILINE)


def _first_compiler_error(log_path: Path) -> Optional[str]:
    """For display only: the first compiler diagnostic in the build output (verbose builds print it to the log)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    match = _COMPILER_ERROR.search(text)
    return match.group(0).strip()[:300] if match else None


def _cap_log(path: Path, max_bytes: int) -> None:
    """Keep the head and the tail of an oversized log (the head has the first error, the tail the last)."""
    if not path.exists() or path.stat().st_size <= max_bytes:
        return
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(max_bytes // 4)
        f.seek(size - (max_bytes - len(head)))
        tail = f.read()
    marker = f"\n[harness] ... {size - len(head) - len(tail)} bytes of log cut ...\n".encode()
    path.write_bytes(head + marker + tail)
