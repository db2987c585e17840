"""Batch pipeline (driver side): builds ahead on the CPU cores, evaluations on the GPU workers, records as they finish.

    submissions --extract--> build pool (build/builder.py) --built--> GPU workers (judge/evaluate.py) --> records
                                 |--compile_error / needs_cuda / timeout: recorded here, never sent to a GPU

The engine (harness/pipeline/engines.py) says where the two kinds of task run: threads of this process starting child
processes (one machine), or Dask workers (many machines); the tasks below and this driver are the same for both.
The driver never imports candidate code. Every record is appended to records.jsonl and fsynced as it arrives; a
rerun skips every (submission, content hash, problem, config hash) already there, and the build cache means
nothing is compiled twice. batch.json holds the run's throughput figures (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import statistics
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from harness.build import builder as builds
from harness.isolation import spawn
from harness.judge import evaluate as evaluation
from harness.judge import warm
from harness.oracle import ahead, budget
from harness.oracle.reference import OracleError, Reference, ReferenceShort, run_oracle
from harness.pipeline.run_folder import SUMMARY_FILE, Summary, new_artifacts_dir
from harness.shared import backends, check
from harness.shared.paths import data_root
from harness.shared.problems import Problem
from harness.shared.record import NO_VERDICT, Record, Status, phases_total
from harness.shared.resources import ran_short
from harness.shared.settings import PipelineSettings
from harness.submission.submissions import Skipped, Submission

log = logging.getLogger(__name__)
# Tracebacks of the judge's own failures: to the run's log file (harness/pipeline/run_folder.py RUN_LOG) while a batch
# runs, never to the console, whose line says what failed.
trace = logging.getLogger("harness.trace")
trace.propagate = False
trace.setLevel(logging.DEBUG)

# ---------------------------------------------------------------- tasks (run by an engine's workers)

@dataclass(frozen=True)
class Evaluated:
    """What a GPU worker sends back: the record, or the reference's failure; how long the worker was busy and when
    (wall-clock start and end, for the batch's timeline). A warm task (`warm`: it starts a reference in the
    background) has no record; an evaluation's `ahead_s` is the time the background start of the reference it used
    took (off the worker's path: not in `busy_s`), claimed by the first evaluation that uses it."""
    record: Optional[Record]
    busy_s: float
    worker: str
    problem_error: Optional[str] = None
    span: tuple[float, float] = (0.0, 0.0)
    warm: bool = False
    ahead_s: float = 0.0
    retried: Optional[str] = None   # why a first attempt failed, the record being the second's (evaluate_task)


class Station:
    """One GPU worker's state: its GPU (environment for its children) and the references (oracles) it keeps running.

    A worker keeps up to the config's `oracles_per_gpu` references alive, the least recently used one is closed
    first (but one started ahead and not used yet only when every other is), so a worker that stays on a problem,
    or returns to it, pays the reference once. References are also started in the background, ahead of their first
    evaluation (`start_ahead`: the problems the worker's queue will need next, and those of the first builds): their
    CPU work (the model made, the inputs drawn, the files written, the truth mapped) runs beside the worker's
    evaluations but is stopped while anything is timed on this GPU, their truth's GPU work only while nothing is
    timed there (another worker's timings, on their own GPUs, hold off neither: spawn.start_gate), and
    their measurement of the device's rates (for the roofline) and their clean time (the reference timed alone,
    harness/judge/evaluate.py) only between two evaluations (`gate`: the worker holds its `timing()` for each
    evaluation), when no candidate process is alive on this GPU (harness/oracle/reference.py): while the worker
    waits for the first builds, that costs it nothing. The first evaluation of a problem waits for what is left of
    its start and claims the time it took (`ahead_s`)."""

    def __init__(self, name: str, env: Optional[dict] = None, sharers: int = 1):
        check.limit_host_threads()   # the comparisons run in this process, beside the children
        self.name, self.env = name, env
        self.references: OrderedDict[str, Reference] = OrderedDict()   # problem id -> reference, most recent last
        self.starting: dict[str, tuple[Problem, Future]] = {}           # problem id -> its start in the background
        self.unclaimed: dict[str, float] = {}   # problem id -> seconds its background start took, not yet claimed
        self.unused_ahead_s = 0.0               # background starts closed before any evaluation used them
        self.failed: dict[str, str] = {}   # problem id -> why its reference failed on this worker
        self.mid_failures: dict[str, int] = {}   # problem id -> evaluations in a row its reference failed under way
        self.started_s: dict[str, float] = {}   # problem id -> seconds an evaluation just spent starting it
        self.start_steps: dict[str, dict] = {}  # problem id -> that start's steps (the record's ref_* phases)
        self.gate = spawn.StartGate()          # evaluations (timing) against background GPU work (start_up)
        self.sizes: dict[str, int] = {}     # problem id -> its reference's files at its last start here (budget.py)
        self.budget: Optional[budget.Budget] = None   # what this worker's references may hold, once first asked
        self.sharers = sharers   # GPU workers whose references share this host's memory (budget.py), this one among

    def resident(self) -> list[str]:
        """Problems with a running reference here, most recently used first, then those starting in the background."""
        return list(reversed(self.references)) + [p for p in self.starting if p not in self.references]

    def ready(self) -> set[str]:
        """Problems whose reference can be used at once: running here, or started in the background and done."""
        done = {problem_id for problem_id, (_, future) in self.starting.items() if future is None or future.done()}
        return set(self.references) | done

    def start_ahead(self, problem: Problem, settings: PipelineSettings, device: str, log_dir: Path) -> bool:
        """Start `problem`'s reference in the background (see the class); False when it is resident or starting here
        already, or failed here before."""
        if problem.id in self.references or problem.id in self.starting or problem.id in self.failed:
            return False
        if not budget.fits(self.held(), budget.expected_size(problem.id, self.sizes), self.limit(settings, device)):
            log.info("%s: no room to start %s's reference ahead (%s)", self.name, problem.id, self.budget)
            return False
        future: Future = Future()

        def start() -> None:
            began = time.monotonic()
            try:
                reference = run_oracle(problem, settings.judge_config, device, log_dir, env=self.env, gate=self.gate)
                if evaluation.needs_clean_time(reference, settings.judge_config):
                    try:   # its clean time too, between two evaluations (no candidate process alive on this GPU),
                        with self.gate.start_up(), self.gate.alone:   # and one reference at a time
                            evaluation.time_clean(reference, settings.judge_config)
                    except BaseException:
                        reference.close()
                        raise
                future.set_result((reference, time.monotonic() - began))
            except BaseException as exc:   # handed to the evaluation that waits for it (OracleError: the problem's)
                future.set_exception(exc)

        self.starting[problem.id] = (problem, future)
        threading.Thread(target=start, daemon=True, name=f"{self.name}-reference-ahead").start()
        return True

    def make_room(self, settings: PipelineSettings, keep: set[str], device: Optional[str] = None,
                  problem_id: Optional[str] = None) -> bool:
        """Room for one more reference (running or starting) under `oracles_per_gpu` and, given its `problem_id`,
        under the budget (harness/oracle/budget.py), closing those `to_close` picks among the running ones whose
        problems are not in `keep` if need be; False when it cannot."""
        def over() -> bool:
            if len(self.references) + len(self.starting) >= max(settings.oracles_per_gpu, 1):
                return True
            return problem_id is not None and device is not None and not budget.fits(
                self.held(), budget.expected_size(problem_id, self.sizes), self.limit(settings, device))

        while over():
            spare = [problem_id for problem_id in self.references if problem_id not in keep]
            if not spare:
                return False
            self.drop(self.to_close(spare))
        return True

    def limit(self, settings: PipelineSettings, device: str) -> Optional[int]:
        if self.budget is None:
            self.budget = budget.for_machine(settings.judge_config, self.sharers)
        return self.budget.limit(device)

    def held(self) -> list[int]:
        """Bytes held by the references here: those running, and those starting at their expected size."""
        return [self.references[p].held_bytes for p in self.references] + \
            [budget.expected_size(p, self.sizes) for p in self.starting if p not in self.references]

    def oracle_for(self, problem: Problem, settings: PipelineSettings, device: str,
                   log_dir: Path) -> Callable[[], Reference]:
        def get() -> Reference:
            if problem.id in self.failed:
                raise OracleError(problem, self.failed[problem.id], log_dir)
            reference = self.references.get(problem.id)
            if reference is not None and reference.problem.path != problem.path:
                self.drop(problem.id)   # another file under the same id (another batch's copy)
                reference = None
            if reference is None:
                reference = self._take_started(problem)
            if reference is None:   # over the limits only while starts in the background fill them
                self.make_room(settings, keep=set(), device=device, problem_id=problem.id)
                pool = warm.pool_for(settings.judge_config, device, self.env)
                if pool is not None:   # its first candidate process starts while the reference does
                    pool.fill()
                started = time.monotonic()
                try:
                    reference = run_oracle(problem, settings.judge_config, device, log_dir, env=self.env)
                    self.started_s[problem.id] = time.monotonic() - started
                    self.start_steps[problem.id] = reference.start_steps
                except ReferenceShort:
                    raise   # the machine's, not the problem's: the next submission tries again
                except OracleError as exc:
                    self.failed[problem.id] = exc.message
                    raise
                self.references[problem.id] = reference
                self.sizes[problem.id] = reference.held_bytes
            self.references.move_to_end(problem.id)
            return reference
        return get

    def _take_started(self, problem: Problem) -> Optional[Reference]:
        """The reference started in the background for `problem` (waiting for the rest of its start), or None when
        none was started (or it was started from another file under the same id: it is closed)."""
        entry = self.starting.get(problem.id)
        if entry is None:
            return None
        waited = time.monotonic()
        try:
            reference, took = entry[1].result()
        except ReferenceShort:
            raise
        except OracleError as exc:
            self.failed[problem.id] = exc.message
            raise
        finally:
            del self.starting[problem.id]
        if entry[0].path != problem.path:
            reference.close()
            self.unused_ahead_s += took
            return None
        self.references[problem.id] = reference
        self.sizes[problem.id] = reference.held_bytes
        self.started_s[problem.id] = time.monotonic() - waited
        self.start_steps[problem.id] = reference.start_steps
        self.unclaimed[problem.id] = took
        return reference

    def to_close(self, among: list[str]) -> str:
        """The reference to close for a new one, `among` those running: the least recently used of those an
        evaluation has used, before any started ahead and not used yet (its builds have not landed: closing it
        wastes its start)."""
        used = [problem_id for problem_id in among if problem_id not in self.unclaimed]
        return used[0] if used else among[0]

    def claim_ahead(self, problem_id: str) -> float:
        return self.unclaimed.pop(problem_id, 0.0)

    def drop(self, problem_id: str) -> None:
        reference = self.references.pop(problem_id, None)
        self.unused_ahead_s += self.unclaimed.pop(problem_id, 0.0)
        self.started_s.pop(problem_id, None)     # its start's figures go with it
        self.start_steps.pop(problem_id, None)
        if reference is not None:
            reference.close()

    def close_others(self, problem_id: str) -> int:
        """Close every reference here but `problem_id`'s, one starting in the background once its start has ended
        (its host and GPU memory back for an evaluation that ran out of them); how many were closed."""
        closed = self._close_starting(but=problem_id)
        others = [p for p in self.references if p != problem_id]
        for other in others:
            self.drop(other)
        return closed + len(others)

    def _close_starting(self, but: Optional[str] = None) -> int:
        """Close the references starting in the background (each once its start has ended), `but`'s aside; how
        many."""
        closing = [p for p in self.starting if p != but]
        for problem_id in closing:
            _, future = self.starting.pop(problem_id)
            try:
                reference, took = future.result()
            except BaseException:   # noqa: BLE001 - a start that failed has nothing to close
                continue
            reference.close()
            self.unused_ahead_s += took
        return len(closing)

    def close(self) -> None:
        self._close_starting()
        for problem_id in list(self.references):
            self.drop(problem_id)
        warm.close_all(self.env or {})
        ahead.close_all(self.env or {})


# An evaluation whose reference failed under way (or the harness itself) is tried once more against a fresh reference;
# this many such failures of one problem in a row on a worker fail the problem there (evaluate_task).
ATTEMPTS = 2
MID_EVALUATION_FAILURES = 3


# Build priority: the first builds feed the idle GPUs at the start and run at normal priority; the rest run at
# BUILD_NICE or below, so that they neither delay those nor take CPU from the processes being timed. Among those, a
# build sent while others are in flight runs one niceness step lower per build ahead of it (to MAX_NICE): the cores
# go to the oldest builds first, so builds land roughly in the order they were sent, which the workers' look-ahead
# counts on (it does not make the first CUDA builds land sooner: their compiler steps run one after another).
BUILD_NICE = 10
MAX_NICE = 19
URGENT_BUILDS_PER_WORKER = 2


def build_nice(sent: int, in_flight: int, workers: int) -> int:
    """The niceness of the build sent after `sent` others, with `in_flight` builds not finished yet."""
    urgent = URGENT_BUILDS_PER_WORKER * workers
    if sent < urgent:
        return 0
    return min(MAX_NICE, BUILD_NICE + max(0, in_flight - urgent))


def build_task(source: str, settings: PipelineSettings, target: builds.Target, cache_dir: str, log_path: str,
               ship: bool, nice: int = 0) -> builds.Build:
    return builds.build(source, settings.judge_config, target, Path(cache_dir), Path(log_path), ship, nice)


def evaluate_task(station: Station, submission: Submission, problem_text: str, settings: PipelineSettings, device: str,
                  build: Optional[builds.Build], run_dir: str, artifacts: Optional[str] = None,
                  queued_at: Optional[float] = None) -> Evaluated:
    """`artifacts`: the evaluation's folder for its source and logs, from new_artifacts_dir (default: a new one in the
    run's folder). `queued_at`: when it was handed to the engine (the record's `queue` phase). The reference comes
    first (waiting for its background start, if any), then the evaluation holds the station's gate (no reference's
    GPU work starts beside it).

    A reference that fails to start fails its problem on this worker (`Station.failed`). One that fails once the
    evaluation is under way, or an error of the harness itself, costs this submission one more attempt against a
    fresh reference (the failed attempt's seconds: phase `retried_attempt`). After a second failure the submission
    has no record: the reference's failure is returned (the driver lists the submission with it), the harness's
    error raised; MID_EVALUATION_FAILURES such failures in a row fail the problem on this worker. An evaluation
    that ran out of memory while this worker held other problems' references is judged once more with those closed
    (_out_of_memory_beside_others); the second record stands.

    Where the judge itself ran short (the reference could not be kept, harness/oracle/reference.py ReferenceShort,
    or the evaluation's own work met a full disk or no memory, harness/shared/resources.py), the references not in
    use are closed for room and the submission tried again; the last attempt short too, its record is judge_error
    (no verdict, judged again on resume) and the problem stays open on this worker."""
    began, start = time.time(), time.monotonic()
    submission = replace(submission, problem=_local_problem(submission.problem, problem_text))
    run_path = Path(run_dir)
    oracle = station.oracle_for(submission.problem, settings, device, run_path / "logs")
    problem_id = submission.problem.id
    record, error, last, retried, gate_wait_s, lost_s, ahead_s = None, None, None, None, 0.0, 0.0, 0.0
    short: Optional[str] = None   # the last attempt's failure, where the judge ran short
    for attempt in range(ATTEMPTS):
        attempt_began = time.monotonic()
        try:
            reference = oracle()
        except ReferenceShort as exc:   # the machine's: room made, tried again
            short = error = exc.message
            log.warning("evaluating %s (attempt %d of %d): the judge ran short starting the reference: %s",
                        submission.label, attempt + 1, ATTEMPTS, error)
            _free_room(station)
            lost_s += time.monotonic() - attempt_began
            retried = retried or f"the judge ran short: {error}"
            continue
        except OracleError as exc:   # at its start: the problem is failed on this worker from now on
            station.failed[problem_id] = exc.message
            station.drop(problem_id)
            error = exc.message
            break
        try:
            with station.gate.timing(settings.oracle_timeout_s) as gate_wait_s:   # background GPU work under way
                record = evaluation.evaluate(submission, lambda held=reference: held, settings.judge_config, device,
                                             Path(artifacts) if artifacts else new_artifacts_dir(run_path, submission),
                                             build)
            station.mid_failures.pop(problem_id, None)
            crowded = _out_of_memory_beside_others(record, station, problem_id, device)
            if crowded is None or attempt + 1 == ATTEMPTS:
                break
            closed = station.close_others(problem_id)
            log.warning("evaluating %s (attempt %d of %d): %s; judged again with them closed (%d)", submission.label,
                        attempt + 1, ATTEMPTS, crowded, closed)
            lost_s += time.monotonic() - attempt_began
            retried = retried or f"{crowded}: judged again with them closed"
            record = None
            continue
        except Exception as exc:   # the reference failed under way, or the harness did
            last, error = exc, exc.message if isinstance(exc, OracleError) else f"{type(exc).__name__}: {exc}"
            short = error if ran_short(exc) else None
            if spawn.stopping():   # an interrupted batch: its children were killed; nothing is tried again
                break
            log.warning("evaluating %s (attempt %d of %d): %s", submission.label, attempt + 1, ATTEMPTS, error)
            if not isinstance(exc, OracleError):
                trace.debug("evaluating %s (attempt %d of %d)", submission.label, attempt + 1, ATTEMPTS, exc_info=exc)
            if short is not None:
                _free_room(station)
            ahead_s += station.claim_ahead(problem_id)   # its background start was used, by this attempt
            station.drop(problem_id)   # the next attempt (or evaluation) starts a fresh reference
            failures = station.mid_failures[problem_id] = station.mid_failures.get(problem_id, 0) + 1
            if failures >= MID_EVALUATION_FAILURES:
                station.failed[problem_id] = f"failed during {failures} evaluations in a row; the last: {error}"
                break
            lost_s += time.monotonic() - attempt_began
            retried = retried or (f"the reference failed: {error}" if isinstance(exc, OracleError)
                                  else f"the judge raised {error}")
    if record is None and short is not None and not spawn.stopping():
        record = replace(evaluation.blank_record(submission, settings.judge_config, device), status=Status.JUDGE_ERROR,
                         error=f"the judge ran short: {short}"[:500])
    elif record is None and last is not None and not isinstance(last, OracleError):
        raise last   # the harness's own error, twice: the driver (or the API's caller) is told of it
    ahead_s += station.claim_ahead(problem_id)   # 0 when the reference was not started in the background
    if isinstance(record, Record):
        # what no phase of the evaluation names (extraction, static checks, the record itself ...)
        other = time.monotonic() - start - phases_total(record.phases) - station.started_s.get(problem_id, 0.0) \
            - gate_wait_s - lost_s
        spent = {"queue": max(began - queued_at, 0.0) if queued_at else 0.0, "evaluation_other": max(other, 0.0),
                 "gate_wait": gate_wait_s,
                 "reference_start": station.started_s.pop(problem_id, 0.0),
                 **station.start_steps.pop(problem_id, {})}
        if ahead_s:
            spent["reference_ahead"] = ahead_s
        if lost_s:
            spent["retried_attempt"] = lost_s
        record = replace(record, phases={**{k: round(v, 4) for k, v in spent.items()}, **(record.phases or {})})
        error = None
    return Evaluated(record, time.monotonic() - start, station.name, error, span=(began, time.time()),
                     ahead_s=ahead_s, retried=retried if record is not None else None)


GPU_OUT_OF_MEMORY = ("CUDA out of memory", "OutOfMemoryError")   # torch's words for a CUDA allocation that failed
HOST_OUT_OF_MEMORY = spawn.HOST_OOM_NOTE                           # the parent's, on a child the OOM killer took


def _out_of_memory_beside_others(record: Record, station: Station, problem_id: str, device: str) -> Optional[str]:
    """Why `record` may be the judge's doing, not the submission's, or None: it ended for want of memory (the GPU's,
    a runtime_error naming torch's CUDA out-of-memory error; the host's, a child killed while the kernel's
    out-of-memory killer ran) while references of other problems held memory on this worker. The submission is
    then judged once more with those closed, and that record stands whatever it says: a candidate that claims to
    have run out, or runs the host out on purpose, gains one more evaluation and never a record without a verdict."""
    if not isinstance(record, Record):
        return None
    error = record.error or ""
    gpu = device == "cuda" and record.status == Status.RUNTIME_ERROR and any(w in error for w in GPU_OUT_OF_MEMORY)
    host = record.status in (Status.CRASH, Status.RUNTIME_ERROR) and HOST_OUT_OF_MEMORY in error
    others = [p for p in station.resident() if p != problem_id]
    if not (gpu or host) or not others:
        return None
    return f"the {'GPU' if gpu else 'host'} ran out of memory beside the references of {len(others)} other problem(s)"


def _free_room(station: Station) -> None:
    """The judge ran short: close this worker's references that no evaluation is using (all of them: the worker
    runs one evaluation at a time), so the next attempt has their disk and memory."""
    for problem_id in list(station.references):
        station.drop(problem_id)


def reference_ahead(station: Station, submission: Submission, problem_text: str, settings: PipelineSettings,
                    device: str, run_dir: str) -> bool:
    """Start the reference of `submission`'s problem on this worker in the background (Station.start_ahead)."""
    problem = _local_problem(submission.problem, problem_text)
    return station.start_ahead(problem, settings, device, Path(run_dir) / "logs")


def warm_task(station: Station, submission: Submission, problem_text: str, settings: PipelineSettings,
              device: str, run_dir: str) -> Evaluated:
    """Start the reference of `submission`'s problem on this worker, in the background, before its first evaluation
    arrives (its first candidate process starts meanwhile)."""
    began, start = time.time(), time.monotonic()
    pool = warm.pool_for(settings.judge_config, device, station.env)
    if pool is not None:
        pool.fill()
    reference_ahead(station, submission, problem_text, settings, device, run_dir)
    return Evaluated(None, time.monotonic() - start, station.name, span=(began, time.time()), warm=True)


def warm_plan(submissions: list[Submission], workers: list[str], keep: int) -> dict[str, list[Submission]]:
    """Which references each GPU worker starts before the first builds land: the first problem (it gets the first
    builds) on as many workers as it has submissions, then each next problem on the worker with the fewest, `keep`
    per worker at most. Returns worker -> one submission of each problem it warms, in the order it starts them."""
    first: dict[str, Submission] = {}
    counts: dict[str, int] = {}
    for submission in submissions:
        first.setdefault(submission.problem.id, submission)
        counts[submission.problem.id] = counts.get(submission.problem.id, 0) + 1
    plan: dict[str, list[Submission]] = {worker: [] for worker in workers}
    problems = list(first)
    if not problems or keep < 1:
        return plan
    for worker in workers[:counts[problems[0]]]:
        plan[worker].append(first[problems[0]])
    for problem_id in problems[1:]:
        worker = min(workers, key=lambda w: len(plan[w]))   # the least loaded, the first of those
        if len(plan[worker]) >= keep:
            break
        plan[worker].append(first[problem_id])
    return plan


def _local_problem(problem: Problem, text: str) -> Problem:
    """The problem as this machine has it: its own path when the file there is the driver's, else a copy."""
    try:
        if problem.path.read_text() == text:
            return problem
    except OSError:
        pass
    folder = Path(tempfile.gettempdir()) / "judge-problems" / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / problem.path.name
    if not copy.exists():
        copy.write_text(text)
    return replace(problem, path=copy)


# ---------------------------------------------------------------- the driver

@dataclass
class Progress:
    """The live view's numbers; `gpu_busy` maps each worker to the problem it is on (None: idle)."""
    total: int
    done: int = 0
    reused: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    building: int = 0           # builds queued or running in the build pool
    sent: int = 0               # built and sent to the GPU workers, not finished
    evaluating: int = 0         # of those, running now (so sent - evaluating are builds ahead of the GPUs)
    workers: int = 1
    gpu_busy: dict[str, Optional[str]] = field(default_factory=dict)   # worker -> problem it evaluates, None: idle

    @property
    def builds_ahead(self) -> int:
        return max(self.sent - self.evaluating, 0)

    def count(self, record: Record) -> None:
        self.done += 1
        self.statuses[record.status.value] = self.statuses.get(record.status.value, 0) + 1


@dataclass
class BatchOutcome:
    run_dir: Path
    records: list[Record]                  # this batch's, earlier finished ones included
    reused: int                            # records found finished from an earlier run
    skipped: list[Skipped]                 # submissions that could not be attempted (their reference failed)
    problem_errors: list[OracleError]      # references that failed
    summary: Summary                       # throughput figures (batch.json)
    interrupted: bool = False              # Ctrl-C: the records are those finished before it

    @property
    def no_verdict(self) -> list[tuple[str, str]]:
        """(submission, why) for every submission without a verdict (Summary.no_verdict)."""
        return self.summary.no_verdict

    @property
    def judge_errors(self) -> list[Record]:
        """Records of submissions the judge could not judge for want of its own resources (judge_error)."""
        return [r for r in self.records if r.status in NO_VERDICT]


def run_pipeline(submissions: list[Submission], settings: PipelineSettings, device: str, run_dir: Path, engine,
                 finished: dict, sink, on_record: Optional[Callable[[Record], None]] = None,
                 on_progress: Optional[Callable[[Progress], None]] = None) -> BatchOutcome:
    """Judge `submissions` with `engine`; `finished` maps resume keys to earlier records; records go to `sink`."""
    driver = _Driver(settings, device, run_dir, engine, sink, on_record, len(submissions))
    completed = interrupted = False
    try:
        pending = []
        for submission in sorted(submissions, key=lambda s: (s.problem.id, str(s.problem.path))):
            previous = finished.get(resume_key(submission.label, submission.hash, submission.problem.id,
                                               settings.config_hash))
            if previous is not None:
                driver.reuse(previous)
            else:
                pending.append(submission)
        # Extraction first: what it decides (too_large, not text, no_code, syntax_error) is recorded before any
        # reference, candidate or build starts, so a batch of such files ends at once.
        extracted = [(submission, driver.extract(submission)) for submission in pending]
        to_build = [(submission, found) for submission, found in extracted if found is not None]
        # References started while the first builds run (see _worth_a_reference); no more oracle processes started
        # ahead than the batch has problems (a reference dropped for room and started again starts on demand)
        ahead.expect_takes(len({s.problem.id for s, _ in to_build}))
        likely = [s for s, _ in to_build if _worth_a_reference(s.text, settings, device)]
        driver.warm(warm_plan(likely, list(engine.workers), settings.oracles_per_gpu))
        for submission, found in to_build:
            driver.start(submission, found)
        engine.all_sent()
        driver.drain(on_progress)
        completed = True
    except KeyboardInterrupt:
        # Ctrl-C: what finished is on disk already; nothing still running may be recorded (a killed child would
        # read as a crash) or left behind. Kill every child, drop the queued work, keep the records so far.
        interrupted = True
        spawn.stop_all()
    finally:
        engine.close(wait=completed)
        ahead.expect_takes(None)
        if interrupted:
            spawn.allow_new()
    return driver.outcome(interrupted, [s.label for s in submissions])


class _Driver:
    """The driver's state: what is in flight, the records so far, the throughput figures."""

    def __init__(self, settings: PipelineSettings, device: str, run_dir: Path, engine, sink,
                 on_record: Optional[Callable[[Record], None]], total: int):
        self.settings, self.device, self.run_dir, self.engine, self.sink = settings, device, run_dir, engine, sink
        self.on_record = on_record
        self.started = time.monotonic()
        self.cache_dir = build_cache_dir(settings)
        self.progress = Progress(total=total, workers=len(engine.workers), gpu_busy={w: None for w in engine.workers})
        self.summary = Summary(build_jobs=engine.build_jobs, gpus=list(engine.workers), engine=engine.name,
                               submissions=total, device=device)
        self.records: list[Record] = []
        self.skipped: list[Skipped] = []            # not judged: their problem's reference failed
        self.problem_errors: dict[str, OracleError] = {}
        self.texts: dict[Path, str] = {}
        self.done: queue.Queue = queue.Queue()
        self.target: Optional[builds.Target] = None
        self.in_flight = 0
        self.builds_sent = 0
        self.began = time.time()
        self.own_work_ratios: list[float] = []   # Summary.own_work_ratio's values
        self.starts_before = spawn.starts()       # Summary.starts: this batch's share of them

    def reuse(self, record: Record) -> None:
        self.progress.reused += 1
        self._finish(record, write=False)

    def extract(self, submission: Submission) -> Optional[tuple[Path, str]]:
        """Extraction: None once it decided the record (finished here), else (artifacts folder, source)."""
        artifacts = new_artifacts_dir(self.run_dir, submission)
        prepared = evaluation.prepare(submission, self.settings.judge_config, self.device, artifacts)
        if isinstance(prepared, Record):
            with contextlib.suppress(OSError):
                artifacts.rmdir()   # only if nothing was written there (too_large, not text)
            self._finish(prepared)
            return None
        return artifacts, prepared[1]

    def start(self, submission: Submission, extracted: tuple[Path, str]) -> None:
        """The build pool, for a submission whose extraction left a source."""
        artifacts, source = extracted
        if self.target is None:
            began = time.monotonic()
            self.target = self.engine.target(self.device)
            self.summary.target_s = time.monotonic() - began
        nice = build_nice(self.builds_sent, self.progress.building, len(self.engine.workers))
        args = (source, self.settings, self.target, self.cache_dir, str(artifacts / "build.log"), self.engine.ships,
                nice)
        self.engine.build(build_task, args, lambda future: self.done.put(("built", (submission, artifacts), future)))
        if _worth_a_reference(submission.text, self.settings, self.device):
            self.engine.expect(submission, self._ahead(submission))
        self.progress.building += 1
        self.builds_sent += 1
        self.in_flight += 1

    def _ahead(self, submission: Submission) -> Callable[[Station], bool]:
        """What a worker calls to start `submission`'s reference in the background."""
        text = self._problem_text(submission)
        return lambda station: reference_ahead(station, submission, text, self.settings, self.device,
                                               str(self.run_dir))

    def warm(self, plan: dict[str, list[Submission]]) -> None:
        """Each GPU worker starts the references of `plan` while the first builds run (local engine only)."""
        for worker, problems in plan.items():
            for submission in problems:
                args = (self._problem_text(submission), self.settings, self.device, str(self.run_dir))
                self.in_flight += self.engine.warm(worker, warm_task, submission, args,
                                                   lambda future: self.done.put(("warmed", None, future)))

    def drain(self, on_progress: Optional[Callable[[Progress], None]]) -> None:
        last_shown = 0.0
        while self.in_flight:
            try:
                kind, submission, future = self.done.get(timeout=0.5)
            except queue.Empty:
                kind = None
            if kind == "built":
                self._built(*submission, _result(future))
            elif kind == "evaluated":
                self._evaluated(submission, _result(future))
            elif kind == "warmed":
                self.in_flight -= 1
                self._count_busy(_result(future))
            self.progress.evaluating = self.engine.evaluations_running()
            if on_progress is not None and (kind is not None or time.monotonic() - last_shown > 0.5):
                last_shown = time.monotonic()
                on_progress(self.progress)
        if on_progress is not None:
            on_progress(self.progress)

    def _built(self, submission: Submission, artifacts: Path, build: object) -> None:
        self.progress.building -= 1
        if isinstance(build, BaseException):
            build = builds.Build(key="", outcome="deferred", error=f"build task failed: {build!r}")
        self.summary.build_cpu_s += build.cpu_s
        self.summary.builds[build.outcome] = self.summary.builds.get(build.outcome, 0) + 1
        if build.outcome == "deferred":
            log.info("%s: its build is left to its evaluation: %s", submission.label, build.error)
            self.summary.deferred.append((submission.label, (build.error or "")[:300]))
        if build.status is not None:   # decided by the build: never reaches a GPU worker
            self.engine.landed(submission)
            self.in_flight -= 1
            self._finish(evaluation.evaluate(submission, no_reference, self.settings.judge_config, self.device,
                                             artifacts, build))
            return
        text = self._problem_text(submission)
        self.engine.evaluate(evaluate_task, submission,
                             (text, self.settings, self.device, build, str(self.run_dir), str(artifacts), time.time()),
                             lambda future: self.done.put(("evaluated", submission, future)),
                             lambda worker: self.progress.gpu_busy.update({worker: submission.problem.id}),
                             ahead=self._ahead(submission))
        self.progress.sent += 1
        self.summary.gpu_tasks += 1

    def _evaluated(self, submission: Submission, result: object) -> None:
        self.in_flight -= 1
        self.progress.sent -= 1
        if isinstance(result, BaseException):   # the worker itself failed (a lost machine): say so, go on
            log.error("evaluating %s failed on its worker: %r", submission.label, result)
            trace.debug("evaluating %s failed on its worker", submission.label, exc_info=result)
            result = Evaluated(None, 0.0, "", f"worker failed: {type(result).__name__}: {result}")
        else:
            self.progress.gpu_busy[result.worker] = None
            self._count_busy(result)
        if result.record is None:
            reason = result.problem_error or "reference failed"
            self.problem_errors.setdefault(submission.problem.id,
                                           OracleError(submission.problem, reason, self.run_dir / "logs"))
            self.skipped.append(Skipped(submission.label, reason))
        else:
            phases = result.record.phases or {}
            for phase, seconds in phases.items():
                self.summary.phases[phase] = round(self.summary.phases.get(phase, 0.0) + seconds, 4)
            own = sum(phases.get(name, 0.0) for name in ("correctness", "gradients", "timing"))
            if own > 0 and phases.get("timing", 0.0) > 0:
                self.own_work_ratios.append(result.busy_s / own)
            if result.retried:
                self.summary.retried.append((submission.label, result.retried))
            self._finish(result.record)

    def _count_busy(self, result: object) -> None:
        """GPU-worker time: evaluations (a warm task only hands a reference to the background); the time of the
        background starts they used is reported apart (ahead_used_s)."""
        if not isinstance(result, Evaluated) or result.warm:
            return
        summary = self.summary
        busy = result.busy_s
        summary.ahead_used_s += result.ahead_s
        summary.gpu_s += busy
        summary.per_worker_s[result.worker] = summary.per_worker_s.get(result.worker, 0.0) + busy
        first, last = summary.timeline.get(result.worker, (float("inf"), 0.0))
        summary.timeline[result.worker] = (min(first, result.span[0] - self.began),
                                           max(last, result.span[1] - self.began))

    def _problem_text(self, submission: Submission) -> str:
        return self.texts.setdefault(submission.problem.path, submission.problem.path.read_text())

    def _finish(self, record: Record, write: bool = True) -> None:
        if write:
            self.sink.write(record.to_json() + "\n")
            self.sink.flush()
            os.fsync(self.sink.fileno())
        self.records.append(record)
        self.progress.count(record)
        if self.on_record is not None:
            self.on_record(record)

    def outcome(self, interrupted: bool = False, labels: Optional[list[str]] = None) -> BatchOutcome:
        summary = self.summary
        summary.interrupted = interrupted
        summary.no_verdict = no_verdict(labels or [], self.records, self.skipped, interrupted)
        summary.wall_s = time.monotonic() - self.started
        summary.reused = self.progress.reused
        summary.evaluated = len(self.records) - self.progress.reused
        summary.statuses = dict(self.progress.statuses)
        summary.ahead_unused_s = getattr(self.engine, "unused_ahead_s", lambda: 0.0)()
        summary.ahead_s = summary.ahead_used_s + summary.ahead_unused_s
        summary.own_work_ratio = round(statistics.median(self.own_work_ratios), 3) if self.own_work_ratios else None
        summary.starts = spawn.starts().since(self.starts_before)
        summary.gpu_busy_share = summary.busy_share()
        (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary.__dict__, indent=1) + "\n")
        return BatchOutcome(self.run_dir, self.records, self.progress.reused, self.skipped,
                            list(self.problem_errors.values()), summary, interrupted)


def no_verdict(labels: list[str], records: list[Record], skipped: list[Skipped],
               interrupted: bool = False) -> list[tuple[str, str]]:
    """(label, why) for each of `labels` without a verdict: a judge_error record, a listed skip (its reference
    failed), or (a batch that ran to its end) no record at all. An interrupted batch's unjudged ones are not listed:
    the interruption is their reason, and a rerun resumes them."""
    judged = {r.submission for r in records if r.status not in NO_VERDICT}
    why = {s.label: s.reason for s in skipped}
    why.update({r.submission: r.error or r.status.value for r in records if r.status in NO_VERDICT})
    listed = []
    for label in dict.fromkeys(labels):
        if label in judged:
            continue
        if label in why:
            listed.append((label, why[label]))
        elif not interrupted:
            listed.append((label, "no record: the judge lost it (see the run's logs/judge.log)"))
    return listed


def _worth_a_reference(text: str, settings: PipelineSettings, device: str) -> bool:
    """Whether to start a submission's reference before its build lands: always on a GPU; on the CPU not when it
    hands CUDA sources to its builds or its backend's kernels run only on CUDA (they end needs_cuda, and their
    reference would only take the builds' cores). A scheduling hint only: the build decides needs_cuda."""
    if device == "cuda":
        return True
    return not ("cuda_sources" in text or "__global__" in text or backends.select(settings.backend, text).needs_cuda)


def build_cache_dir(settings: PipelineSettings) -> str:
    """The build cache's folder: the config's `build_cache_dir`, else build-cache/ in the data root."""
    return str(Path(settings.build_cache_dir) if settings.build_cache_dir else data_root() / "build-cache")


def resume_key(label: str, content_hash: str, problem: str, config_hash: str) -> tuple[str, str, str, str]:
    return (label, content_hash, problem, config_hash)


def no_reference() -> Reference:
    """The reference argument of an evaluation whose build decided its verdict (it is never called)."""
    raise RuntimeError("a build verdict needs no reference")


def _result(future) -> object:
    try:
        return future.result()
    except BaseException as exc:  # the engine's boundary: a lost worker or a bug in a task
        return exc
