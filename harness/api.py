"""The Python API: a `Judge` that keeps its workers and references running between calls, for a loop that judges
one model output after another (a reinforcement-learning reward, an agent checking its own kernels).

    from harness import Judge

    with Judge(device="cpu", config="default") as judge:
        record = judge.evaluate("level1/1", completion)        # a Record, as `run_eval.py submit` writes it
        for record in judge.evaluate_many(pairs):             # (problem, submission) pairs, as they finish
            ...

Each call takes the batch pipeline's own path (harness/pipeline/driver.py), stage by stage with the same functions:
extraction here (`judge.evaluate.prepare`), the build in the engine's build pool (`build_task`, cached by content
in build-cache/), then either the build's verdict (compile_error, needs_cuda) or an evaluation on the engine's
worker (`evaluate_task`), whose Station keeps each problem's reference running for the next call. So a record is
the one `submit` or `batch` writes for the same submission and config. Candidate code runs only in the child
processes those tasks start; this module never imports it.

Runs in: the caller's process (the parent). Calls may come from any thread; each call's stages run on the engine's
threads (harness/pipeline/engines.py LocalEngine) and end in a concurrent.futures.Future.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter
from concurrent.futures import Future, InvalidStateError, as_completed
from concurrent.futures import wait as wait_for
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Union

from harness.build import builder as builds
from harness.isolation import spawn
from harness.judge import evaluate as evaluation
from harness.judge import warm
from harness.oracle.reference import OracleError
from harness.pipeline.batch import resolve_device
from harness.pipeline.driver import (
    BUILD_NICE,
    build_cache_dir,
    build_task,
    evaluate_task,
    new_artifacts_dir,
    no_reference,
    reference_ahead,
)
from harness.pipeline.engines import LocalEngine
from harness.shared.config import Config, ConfigError, find_config, load_config
from harness.shared.problems import (
    Problem,
    ProblemNotFound,
    default_problems_dir,
    resolve_problem,
)
from harness.shared.record import RECORDS_FILE, Record, Status
from harness.shared.settings import PipelineSettings
from harness.submission.submissions import SUBMISSION_SUFFIXES, Submission, from_file

__all__ = ["Judge", "JudgeClosed", "ConfigError", "ProblemNotFound", "OracleError", "Record", "Status"]

log = logging.getLogger(__name__)

TEXT_LABEL = "<text>"   # a record's `submission` when the submission was handed in as text, not as a file

PathOrText = Union[str, "os.PathLike[str]"]


class JudgeClosed(RuntimeError):
    """The judge was closed (or interrupted) before this call finished, or the call came after close()."""


class Judge:
    """Judges submissions against problems, keeping the build pool, the worker and each problem's reference
    running between calls. Use it as a context manager, or call close(); both stop every child process.

    `device`: "cpu" or "cuda" (default: cuda when available). `config`: a name in configs/ (`default`, `strict`,
    ...) or a YAML path; `overrides`: config keys that win over the file (as the command line's flags do), e.g.
    {"trials": 3}. `problems_dir`: where problem ids are looked up (default: problems/ in the data root,
    $KERNEL_JUDGE_ROOT or the checkout). `results_dir`: None keeps records in memory only (logs and extracted
    sources go to a temporary folder removed by close()); a folder: records are appended to
    `<results_dir>/<run>/records.jsonl` as each finishes, artifacts kept under `<results_dir>/<run>/artifacts/`.
    `run`, `model`: the records' labels.

    Raises ConfigError (unknown config name or key, bad value, device not cpu/cuda) or RuntimeError (cuda asked for,
    no GPU visible) before anything starts.
    """

    def __init__(self, device: Optional[str] = None, config: Union[str, os.PathLike, None] = "default", *,
                 overrides: Optional[Mapping[str, object]] = None, problems_dir: Optional[PathOrText] = None,
                 results_dir: Optional[PathOrText] = None, run: str = "api", model: Optional[str] = None):
        self.config: Config = load_config(find_config(config) if config is not None else None,
                                          {**(overrides or {}), "device": device})
        if self.config.warm_candidates is None:   # calls come one after another: one process up while one starts
            self.config = dataclasses.replace(self.config, warm_candidates=warm.KEPT_SIZE)
        self._settings = PipelineSettings.from_config(self.config)   # what the pipeline's tasks and engine take
        self.device: str = resolve_device(self.config.device)
        self.problems_dir = Path(problems_dir) if problems_dir is not None else default_problems_dir()
        self.run, self.model = run, model
        self._cache_dir = build_cache_dir(self._settings)
        if results_dir is None:
            self.run_dir, self._sink, self._temporary = Path(tempfile.mkdtemp(prefix="judge-")), None, True
        else:
            self.run_dir, self._temporary = Path(results_dir) / run, False
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._sink = open(self.run_dir / RECORDS_FILE, "a")
        self._sinks: dict = {}   # run -> records file, for calls that name a run other than the judge's
        self._lock = threading.Lock()
        self._pending: set[Future] = set()
        self._builds: Counter = Counter()
        self._target: Optional[builds.Target] = None
        self._target_lock = threading.Lock()
        self._closed = False    # no new calls
        self._stopped = False   # the engine is shut down
        try:
            self._engine = LocalEngine(self._settings, self.device)
        except BaseException:
            self._release_files()
            raise
        atexit.register(self._stop)   # a judge never closed still leaves no process behind

    # ------------------------------------------------------------ calls

    def evaluate(self, problem: PathOrText, submission: PathOrText, *, model: Optional[str] = None,
                 sample_id: Optional[str] = None, run: Optional[str] = None) -> Record:
        """Judge one submission and return its Record (a status for everything the submission did wrong).

        `problem`: an id ("level1/1") or a problem file. `submission`: a path (a `.py` file runs as it is, `.md` /
        `.txt` go through extraction), or the raw text of a model's output (prose, `<think>` blocks and fenced code
        are fine: the last complete Python block defining ModelNew is the source). A `str` is a path when it has no
        line break and names an existing file or ends in .py, .md or .txt; pass a Path to be explicit.

        Raises ProblemNotFound (unknown problem), OSError (a path that cannot be read), TypeError (neither text nor
        path), OracleError (the problem's reference itself failed), JudgeClosed (closed meanwhile). Ctrl-C stops
        every child process and closes the judge before KeyboardInterrupt reaches the caller."""
        try:
            return self.submit(problem, submission, model=model, sample_id=sample_id, run=run).result()
        except KeyboardInterrupt:
            self._stop()
            raise

    def evaluate_many(self, items: Iterable[tuple], *, model: Optional[str] = None) -> Iterator[Record]:
        """Judge (problem, submission) pairs, or (problem, submission, sample_id) triples, and yield each Record as
        it finishes (not in the order given). Builds run ahead on the build pool while the worker evaluates, as in
        `run_eval.py batch`. Without a sample_id, a record's `sample_id` is the item's position in `items`, so
        records can be matched to what was asked.

        Every item is checked, and the first bad one raised (the errors of `evaluate`), before any work starts. A
        reference that fails raises OracleError from the loop; leaving the loop early drops the items not yet
        evaluated."""
        submissions = []
        for index, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise TypeError(f"item {index}: expected (problem, submission) or (problem, submission, sample_id), "
                                f"got {item!r}")
            sample_id = str(item[2]) if len(item) == 3 else str(index)
            submissions.append(self._submission(item[0], item[1], model, sample_id))
        futures: list[Future] = []
        try:
            for submission in submissions:
                futures.append(self._submit(submission))
        except KeyboardInterrupt:
            self._stop()
            raise
        return self._as_finished(futures)

    def _as_finished(self, futures: list[Future]) -> Iterator[Record]:
        try:
            for future in as_completed(futures):
                yield future.result()
        except KeyboardInterrupt:
            self._stop()
            raise
        finally:
            for future in futures:
                future.cancel()   # those still in flight stop after their current stage

    def submit(self, problem: PathOrText, submission: PathOrText, *, model: Optional[str] = None,
               sample_id: Optional[str] = None, run: Optional[str] = None) -> Future:
        """`evaluate` without waiting: a Future of the Record, for callers with their own event loop or pool. Bad
        arguments raise here; failures of the reference or the judge are the future's exception. Cancelling it
        skips the stages it has not begun. `run` (both): the record's run label and, with a results_dir, the folder
        its record and artifacts go to (default: the judge's `run`)."""
        return self._submit(self._submission(problem, submission, model, sample_id, run))

    @property
    def builds(self) -> dict[str, int]:
        """Builds so far by outcome, as batch.json counts them: built, cached, failed, needs_cuda, deferred, none."""
        with self._lock:
            return dict(self._builds)

    @property
    def warm_problems(self) -> list[str]:
        """Problems whose reference is running now, ready for the next call (most recently used first)."""
        return [problem for station in self._engine.stations for problem in station.resident()]

    # ------------------------------------------------------------ closing

    def close(self) -> None:
        """Wait for the calls in flight, then stop the worker, every reference and the build pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending)
        try:
            wait_for(pending)
            self._engine.close(wait=True)
        except KeyboardInterrupt:
            self._stop()
            raise
        with self._lock:
            self._stopped = True
        self._release_files()
        atexit.unregister(self._stop)

    def __enter__(self) -> "Judge":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):   # Ctrl-C, SystemExit: do not wait
            self._stop()
        else:
            self.close()

    def _stop(self) -> None:
        """Ctrl-C (or exit): kill every child process now, fail the calls in flight with JudgeClosed, shut down.
        As for an interrupted batch, the kill covers every child this process started (harness/isolation/spawn)."""
        with self._lock:
            if self._stopped:
                return
            self._closed = self._stopped = True
            pending = list(self._pending)
        spawn.stop_all()
        try:
            for future in pending:
                _settle(future, JudgeClosed("the judge was interrupted"))
            self._engine.close(wait=False)
        finally:
            spawn.allow_new()
            self._release_files()
            atexit.unregister(self._stop)

    def _release_files(self) -> None:
        with self._lock:   # a call finishing on an engine thread writes under it
            if self._sink is not None:
                self._sink.close()
                self._sink = None
            for sink in self._sinks.values():
                sink.close()
            self._sinks.clear()
        if self._temporary:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ------------------------------------------------------------ one call, stage by stage (as _Driver does)

    def _submission(self, problem: PathOrText, submission: PathOrText, model: Optional[str],
                    sample_id: Optional[str], run: Optional[str] = None) -> Submission:
        """The Submission a call asks for; every bad argument raises here, before any work."""
        if isinstance(problem, Problem):
            target = problem
        elif isinstance(problem, (str, os.PathLike)):
            target = resolve_problem(problem, self.problems_dir)
        else:
            raise TypeError(f"problem must be an id such as 'level1/1' or a path, got {type(problem).__name__}")
        model = model if model is not None else self.model
        run = self.run if run is None else _run_name(run)
        path = _as_path(submission)
        if path is None:
            return Submission(label=TEXT_LABEL, text=submission, is_python=False, problem=target, model=model,
                              run=run, sample_id=sample_id)
        if not path.is_file():
            raise FileNotFoundError(f"submission not found (or not a file): {path}")
        return from_file(path, target, run=run, model=model, sample_id=sample_id)

    def _submit(self, submission: Submission) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise JudgeClosed("the judge is closed")
            self._pending.add(future)
        future.add_done_callback(self._forget)
        try:
            self._start(submission, future)
        except BaseException as exc:   # a bug or a full disk: the call's failure, not the caller's thread's
            _settle(future, exc)
            if not isinstance(exc, Exception):
                raise
        return future

    def _start(self, submission: Submission, future: Future) -> None:
        """Extraction (too_large, no_code, syntax_error end here), then the build pool."""
        artifacts = self._artifacts(submission)
        prepared = evaluation.prepare(submission, self.config, self.device, artifacts)
        if isinstance(prepared, Record):
            self._finish(future, prepared)
            return
        # Builds run at normal priority while nothing is being timed, else below the processes being timed.
        nice = BUILD_NICE if self._engine.evaluations_running() else 0
        args = (prepared[1], self._settings, self._build_target(), self._cache_dir, str(artifacts / "build.log"),
                self._engine.ships, nice)
        self._engine.build(build_task, args, lambda done: self._stage(future, self._built, submission, artifacts,
                                                                      future, done))

    def _built(self, submission: Submission, artifacts: Path, future: Future, done: Future) -> None:
        """The build's verdict ends the call here (compile_error, needs_cuda, a module that never finished); else the
        evaluation goes to the worker."""
        try:
            build = done.result()
        except Exception as exc:   # as the driver does: the evaluation runs the module itself
            build = builds.Build(key="", outcome="deferred", error=f"build task failed: {exc!r}")
        with self._lock:
            self._builds[build.outcome] += 1
        if build.status is not None:
            self._finish(future, evaluation.evaluate(submission, no_reference, self.config, self.device, artifacts,
                                                     build))
            return
        text, run_dir = submission.problem.path.read_text(), str(self._run_dir(submission.run))
        args = (text, self._settings, self.device, build, run_dir, str(artifacts))
        self._engine.evaluate(evaluate_task, submission, args,
                              lambda evaluated: self._stage(future, self._evaluated, submission, future, evaluated),
                              lambda worker: None,
                              ahead=lambda station: reference_ahead(station, submission, text, self._settings,
                                                                    self.device, run_dir))

    def _evaluated(self, submission: Submission, future: Future, done: Future) -> None:
        evaluated = done.result()
        if evaluated.record is None:   # the problem's reference failed on the worker: not the submission's doing
            raise OracleError(submission.problem, evaluated.problem_error or "reference failed", self.run_dir / "logs")
        self._finish(future, evaluated.record)

    def _stage(self, future: Future, stage, *args) -> None:
        """Run the next stage of a call on an engine thread, unless the call is over (cancelled, interrupted);
        whatever it raises becomes the call's exception (an engine thread swallows what its callbacks raise)."""
        if future.done():
            return
        try:
            stage(*args)
        except BaseException as exc:
            _settle(future, exc)

    def _finish(self, future: Future, record: Record) -> None:
        if future.done():
            return
        if self._sink is not None:
            with self._lock:
                if self._sink is not None:
                    sink = self._sink if record.run == self.run else self._sinks.get(record.run)
                    if sink is None:
                        folder = self._run_dir(record.run)
                        folder.mkdir(parents=True, exist_ok=True)
                        sink = self._sinks[record.run] = open(folder / RECORDS_FILE, "a")
                    sink.write(record.to_json() + "\n")
                    sink.flush()
                    os.fsync(sink.fileno())
        _settle(future, record)

    def _run_dir(self, run: str) -> Path:
        """Where a run's records and artifacts go: the judge's own run folder, or one beside it for a call that
        names another run (records kept in memory: the judge's temporary folder)."""
        return self.run_dir if run == self.run or self._temporary else self.run_dir.parent / run

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    def _artifacts(self, submission: Submission) -> Path:
        """A folder of its own for each call (the same submission may be judged twice at once), named as `batch`
        names that submission's."""
        return new_artifacts_dir(self._run_dir(submission.run), submission)

    def _build_target(self) -> builds.Target:
        with self._target_lock:   # asked once (on CUDA it may take a child process); not under _lock meanwhile
            if self._target is None:
                self._target = self._engine.target(self.device)
            return self._target


def _as_path(submission: PathOrText) -> Optional[Path]:
    """The submission's path, or None when it is the text itself."""
    if isinstance(submission, os.PathLike):
        return Path(submission)
    if not isinstance(submission, str):
        raise TypeError(f"submission must be a path or the submission's text, got {type(submission).__name__}")
    if "\n" in submission or not submission.strip():
        return None
    path = Path(submission)
    try:
        named = path.suffix in SUBMISSION_SUFFIXES or path.exists()
    except OSError:   # e.g. a long line of text is no file name
        return None
    return path if named else None


def _run_name(run: str) -> str:
    """A run label that is also a single folder name beside the judge's run folder."""
    if not isinstance(run, str) or not run or run in (".", "..") or "/" in run or "\0" in run:
        raise ValueError(f"run must be a folder name (no '/'), got {run!r}")
    return run


def _settle(future: Future, outcome: Union[Record, BaseException]) -> None:
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:   # cancelled or interrupted meanwhile
        pass
