"""Run many submissions: one oracle per problem, one child per submission, records appended as they finish.

results/<run>/records.jsonl is appended and fsynced after every submission, so a killed batch loses nothing that
finished; rerunning the same batch skips every (submission, content hash, problem, config) already recorded.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Callable, Optional

import torch

from harness import scoring
from harness.config import Config
from harness.evaluate import evaluate
from harness.oracle import OracleError, Reference, run_oracle
from harness.problems import Problem
from harness.record import Record
from harness.submissions import Skipped, Submission

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"
RESULTS_CSV = "results.csv"


@dataclass
class BatchOutcome:
    run_dir: Path
    records: list[Record]                                     # this batch's, earlier finished ones included
    reused: int = 0                                           # records found finished from an earlier run
    skipped: list[Skipped] = field(default_factory=list)      # submissions that could not be attempted
    problem_errors: list[OracleError] = field(default_factory=list)  # references that failed


def resolve_device(config: Config) -> str:
    if config.device is not None:
        return config.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_batch(submissions: list[Submission], config: Config, run_dir: Path,
              on_record: Optional[Callable[[Record], None]] = None, resume: bool = True) -> BatchOutcome:
    """Judge every submission; with `resume`, records already in run_dir for the same key are reused."""
    device = resolve_device(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    records_path = run_dir / RECORDS_FILE
    finished = {_key(r.submission, r.submission_hash, r.problem, r.config_hash): r
                for r in read_records(records_path)} if resume else {}
    outcome = BatchOutcome(run_dir, [])
    ordered = sorted(submissions, key=lambda s: (s.problem.id, str(s.problem.path)))
    with open(records_path, "a") as sink:
        for _, group in groupby(ordered, key=lambda s: str(s.problem.path)):
            group = list(group)
            cache = _LazyReference(group[0].problem, config, device, run_dir / "logs")
            try:
                for submission in group:
                    key = _key(submission.label, submission.hash, submission.problem.id, config.hash())
                    previous = finished.get(key)
                    if previous is not None:
                        outcome.records.append(previous)
                        outcome.reused += 1
                    else:
                        record = _evaluate_one(submission, cache, config, device, run_dir)
                        if record is None:
                            outcome.skipped.append(Skipped(submission.label, str(cache.error)))
                            continue
                        sink.write(record.to_json() + "\n")
                        sink.flush()
                        os.fsync(sink.fileno())
                        outcome.records.append(record)
                    if on_record is not None:
                        on_record(outcome.records[-1])
            finally:
                cache.close()
            if cache.error is not None:
                outcome.problem_errors.append(cache.error)
    scoring.records_table(outcome.records).to_csv(run_dir / RESULTS_CSV, index=False)
    return outcome


def _evaluate_one(submission: Submission, cache: "_LazyReference", config: Config, device: str,
                  run_dir: Path) -> Optional[Record]:
    artifacts = run_dir / "artifacts" / submission.problem.id.replace("/", "_") / _slug(submission)
    try:
        return evaluate(submission, cache.get, config, device, artifacts)
    except OracleError as exc:   # the reference failed (at its start or while timing): nothing more is judged
        if cache.error is None:
            log.error("%s", exc)
            cache.error = exc
        return None


class _LazyReference:
    """Runs the oracle for one problem on first use; a failure is remembered and not retried."""

    def __init__(self, problem: Problem, config: Config, device: str, log_dir: Path):
        self.problem, self.config, self.device, self.log_dir = problem, config, device, log_dir
        self.reference: Optional[Reference] = None
        self.error: Optional[OracleError] = None

    def get(self) -> Reference:
        if self.error is not None:
            raise self.error
        if self.reference is None:
            try:
                self.reference = run_oracle(self.problem, self.config, self.device, self.log_dir)
            except OracleError as exc:
                log.error("%s", exc)
                self.error = exc
                raise
        return self.reference

    def close(self) -> None:
        if self.reference is not None:
            self.reference.close()


def read_records(path: Path) -> list[Record]:
    """Records from a records.jsonl; a torn last line (a batch killed mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(Record.from_dict(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError, KeyError):
            log.warning("ignoring an unreadable line in %s", path)
    return records


def _key(label: str, content_hash: str, problem: str, config_hash: str) -> tuple[str, str, str, str]:
    return (label, content_hash, problem, config_hash)


def _slug(submission: Submission) -> str:
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", submission.label)[-80:].strip("_")
    return f"{tail}-{submission.hash[:8]}"
