"""Run many submissions (harness/pipeline/driver.py on a local or Dask engine) and keep their records.

results/<run>/records.jsonl is appended and fsynced after every submission, so a killed batch loses nothing that
finished; rerunning the same batch skips every (submission, content hash, problem, config) already recorded, except
those the judge could not judge (judge_error: it ran short of disk or memory), which it judges again.
results/<run>/results.csv is the table of those records; results/<run>/batch.json the run's throughput and every
submission without a verdict; results/<run>/logs/judge.log the tracebacks of the judge's own failures. One batch at
a time judges into a run folder (run_folder.claimed): a second one started on the same run stops at once.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable, Optional

import torch

from harness.pipeline.driver import BatchOutcome, Progress, resume_key, run_pipeline, trace
from harness.pipeline.engines import DaskEngine, LocalEngine
from harness.pipeline.run_folder import RUN_LOG, claimed, torn
from harness.report import scoring
from harness.shared.record import NO_VERDICT, RECORDS_FILE, RESULTS_CSV, Record, read_records
from harness.shared.settings import PipelineSettings
from harness.submission.submissions import Submission

log = logging.getLogger(__name__)


def resolve_device(device: Optional[str]) -> str:
    """The config's `device`, or where it is not set cuda when available, else cpu."""
    if device is not None:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_batch(submissions: list[Submission], settings: PipelineSettings, run_dir: Path,
              on_record: Optional[Callable[[Record], None]] = None, resume: bool = True,
              on_progress: Optional[Callable[[Progress], None]] = None, scheduler: Optional[str] = None
              ) -> BatchOutcome:
    """Judge every submission; with `resume`, records already in run_dir for the same key are reused.
    `scheduler`: a Dask scheduler address (or "local" for a Dask cluster on this machine); None: this process's
    own build pool and GPU workers (harness/pipeline/engines.py). `settings`: PipelineSettings.from_config of the
    batch's config. A batch that resumes holds the run folder while it runs (another one there: RunBusy); one
    that does not (a submit: one new record among others) shares it."""
    device = resolve_device(settings.device)
    with claimed(run_dir) if resume else contextlib.nullcontext():
        run_dir.mkdir(parents=True, exist_ok=True)
        records_path = run_dir / RECORDS_FILE
        finished = {resume_key(r.submission, r.submission_hash, r.problem, r.config_hash): r
                    for r in read_records(records_path)} if resume else {}
        finished = {key: r for key, r in finished.items() if r.status not in NO_VERDICT}   # judged again
        engine = DaskEngine(settings, device, scheduler) if scheduler else LocalEngine(settings, device)
        with open(records_path, "a") as sink, run_log(run_dir):
            if torn(records_path):
                sink.write("\n")   # a line torn by a killed run stays unreadable instead of swallowing the next one
            outcome = run_pipeline(submissions, settings, device, run_dir, engine, finished, sink, on_record,
                                   on_progress)
        scoring.records_table(outcome.records).to_csv(run_dir / RESULTS_CSV, index=False)
    return outcome


@contextlib.contextmanager
def run_log(run_dir: Path):
    """The judge's tracebacks (driver.trace) go to the run's RUN_LOG while the batch runs."""
    path = run_dir / RUN_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    trace.addHandler(handler)
    try:
        yield path
    finally:
        trace.removeHandler(handler)
        handler.close()

