"""What a run's folder holds besides its records: an artifacts folder per evaluation, batch.json (the run's
throughput, `Summary`), logs/judge.log (the judge's own tracebacks), batch.lock (the batch judging into it now).
Loads no torch: the command line writes a record extraction decided without it (harness/cli.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from harness.shared.resources import usable_cores
from harness.submission.submissions import Submission

SUMMARY_FILE = "batch.json"
RUN_LOG = "logs/judge.log"   # tracebacks of the judge's own failures (never on the console)
LOCK_FILE = "batch.lock"     # held (flock) by the batch judging into the folder; names it


class RunBusy(RuntimeError):
    """Another batch is judging into the same run folder."""


@contextlib.contextmanager
def claimed(run_dir: Path):
    """The run folder for this batch alone while it runs. Two batches resuming one run would each judge what the
    other has not recorded yet and append every record twice; the second one stops here instead (RunBusy, naming
    the first). An flock on LOCK_FILE, so a batch killed outright leaves nothing to clear (the file stays; only the
    lock says a batch is there); the file's text says which process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a process that has not said which"
            raise RunBusy(f"{run_dir} is being judged by another batch ({holder}): let it finish, stop it, or give "
                          f"this one another --run") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S %z')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


@dataclass
class Summary:
    """batch.json: the run's throughput (see docs/performance.md for what each figure means)."""
    wall_s: float = 0.0
    build_cpu_s: float = 0.0
    build_jobs: int = 0
    cores: int = field(default_factory=usable_cores)
    gpus: list[str] = field(default_factory=list)
    gpu_s: float = 0.0
    gpu_tasks: int = 0          # evaluations sent to the GPU workers
    gpu_busy_share: Optional[float] = None
    submissions: int = 0
    evaluated: int = 0
    reused: int = 0
    builds: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    per_worker_s: dict[str, float] = field(default_factory=dict)
    engine: str = ""
    device: str = ""            # cpu | cuda: what the workers evaluate on
    target_s: float = 0.0       # describing the GPU for the builds (before the first build starts)
    # references started in the background (Station.start_ahead), off the workers' path (not in gpu_s): seconds
    # their starts took, those an evaluation used, and those closed unused
    ahead_s: float = 0.0
    ahead_used_s: float = 0.0
    ahead_unused_s: float = 0.0
    # worker -> (first evaluation's start, last evaluation's end), seconds since the batch started
    timeline: dict[str, tuple[float, float]] = field(default_factory=dict)
    interrupted: bool = False   # the batch was stopped by Ctrl-C (rerunning it resumes)
    phases: dict[str, float] = field(default_factory=dict)   # the evaluated records' `phases`, summed (seconds)
    # per evaluation that checked and timed a kernel: its GPU-worker time (the wait for its reference included)
    # over its own correctness, gradients and timing (`phases`); the median of those (the batch bench asks <= 2)
    own_work_ratio: Optional[float] = None
    # submissions judged at a later attempt: [label, why the earlier failed] (its reference or the judge failed under
    # way: evaluate_task; its Dask worker was lost: engines._dask_evaluate)
    retried: list[tuple[str, str]] = field(default_factory=list)
    # every submission of the batch without a verdict: [label, why] (its reference failed, the judge ran short:
    # status judge_error, judged again on resume, or no record at all); empty when each has one
    no_verdict: list[tuple[str, str]] = field(default_factory=list)
    # builds the build pool left to the evaluation (outcome `deferred`: the module failed in the build child for a
    # reason a GPU may change, so it is loaded, and built, on the GPU worker's time): [label, the build child's error]
    deferred: list[tuple[str, str]] = field(default_factory=list)
    # the child processes this process started for the batch (builds, candidates, references; not a Dask worker's)
    # and what starting them cost here (spawn.Starts): children, cage_s, lock_wait_s, fork_s, start_s, slowest_start_s
    starts: dict = field(default_factory=lambda: {"children": 0, "cage_s": 0.0, "lock_wait_s": 0.0, "fork_s": 0.0,
                                                  "start_s": 0.0, "slowest_start_s": 0.0})

    def busy_share(self) -> Optional[float]:
        """gpu_s over the wall of every GPU worker: those the batch started with (`gpus`) and any that joined it
        and evaluated (`per_worker_s`; a Dask worker started after the batch), so that it never passes 1."""
        workers = set(self.gpus) | set(self.per_worker_s)
        return self.gpu_s / (self.wall_s * len(workers)) if workers and self.wall_s > 0 else None


def new_artifacts_dir(run_dir: Path, submission: Submission) -> Path:
    """A folder of its own for one evaluation of `submission` (source, build log, log, timing evidence), created here:
    `<problem>/<name>-<hash>`, then `-2`, `-3`, ... for each later evaluation of the same file, so every record keeps
    the artifacts it points at (resume goes by the records, never by these names)."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", submission.label)[-80:].strip("_")
    parent = run_dir / "artifacts" / submission.problem.id.replace("/", "_")
    parent.mkdir(parents=True, exist_ok=True)
    name = f"{tail}-{submission.hash[:8]}"
    for attempt in itertools.count(1):
        folder = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            folder.mkdir()   # atomic: two evaluations at once never get the same folder
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def torn(path: Path) -> bool:
    """The file ends without a newline (a run was killed while writing its last record)."""
    with open(path, "rb") as handle:
        if handle.seek(0, 2) == 0:
            return False
        handle.seek(-1, 2)
        return handle.read(1) != b"\n"
