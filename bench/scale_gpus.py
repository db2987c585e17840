#!/usr/bin/env python3
r"""How the batch pipeline's throughput scales with its GPU workers (1, 2, 4) on one host, locally and through Dask,
and whether a batch survives losing a worker in the middle of an evaluation.

  python bench/scale_gpus.py SOURCE [--problems-dir D] [--device cuda|cpu] [--runs R,R,...] [--limit N]
                            [--include GLOB] [--out DIR] [--timeout S] [--build-jobs N] [--kill-at F]
                            [--config C] [--redo] [--dry-run]

SOURCE is a folder `run_eval.py batch` takes (folder per problem, or KernelBench run naming resolved against
--problems-dir). The files chosen (--include, then every k-th of the sorted list to keep --limit of them) are copied
once into OUT/source, so every run judges the same files under the same labels. Runs (--runs, in this order):

  warm          the local pipeline on the most workers any run asks for (named alone: every GPU there is, as
                CUDA_VISIBLE_DEVICES or nvidia-smi lists them), with the build cache OUT/build-cache
                emptied first: it pays every build (its figures are the cold batch's) and leaves the cache that
                every later run reuses. So the runs below measure the GPU side, the target being
                wall(1 worker) / wall(4 workers) >= 3.5; every run has the same build pool (--build-jobs, default
                the usable cores less 2 per GPU worker of the largest run)
  local:N       `run_eval.py batch` with its own GPU workers, config `gpus: 0,...,N-1` (the first N that
                CUDA_VISIBLE_DEVICES lists where it is set; CPU device: one worker only: the local pipeline has one
                CPU worker)
  dask:N        `run_eval.py scheduler` and `run_eval.py worker` as processes of their own (cuda: one worker
                command `--gpus 0,...,N-1`: N GPU workers and a build worker; cpu: N worker commands, each one CPU
                evaluation worker and a build worker), then `batch --scheduler tcp://127.0.0.1:PORT`
  --cold        every run builds from an empty build cache of its own (OUT/build-cache-RUN, removed after),
                as a batch of new samples does: its wall is the whole batch's, builds included, each run with the
                build pool of its own cores (--build-jobs; on one host, a run confined with taskset to a GPU's share
                of the cores is that GPU's machine). Scaling then compares cold runs with cold runs; no warm run
                is needed
  fault-local:N, fault-dask:N   the same, and once --kill-at of the records are written and an evaluation is under
                way (a candidate process with its submission; one that timed for seconds in the fault-free run,
                which then still needs its reference and worker, while there are records to spare), SIGKILL: on
                Dask that evaluation's worker process (the Dask worker; its nanny starts another); locally, where
                GPU workers are threads of the batch's process and no worker process can die alone, the reference
                (oracle) process that evaluation uses. With one worker (fault-dask:1, fault-local:1) the
                worker that takes the retry is the one the nanny starts again, or the same GPU worker with a new
                reference: a host with one GPU proves the recovery, not the hand-over to another GPU.
                The batch must finish with one record per submission (none lost, none written twice), each
                submission's status, compiled and correct as in the fault-free run of the same engine and size
                (else the nearest one), exit code 0, and batch.json's `retried` naming the one killed in flight
  late-dask:N   dask:N (N >= 2) whose last worker command starts only once the batch has written its first
                record: a worker that joins a running batch (cuda: the first command `--gpus` of N-1 GPUs, the late
                one the last GPU and one build slot; each GPU worker's references get its share of the host's
                memory budget, `ahead_budget_gb`, since two worker commands do not know of each other). The late
                command's workers must take evaluations, with the same checks on the records and verdicts as a
                fault run; it is not a scaling figure

Per run: the command's wall (start to exit), submissions per minute, the records' statuses and verdicts,
batch.json's figures, and per worker its busy share and where it waited (before its first evaluation, between
evaluations, after its last; and, summed over the records, the phases spent waiting: queue, reference_start,
gate_wait, started_ahead_wait, retried_attempt). On CUDA nvidia-smi utilization is sampled too. A process census
(bench/census.py) goes to OUT/logs/RUN-census.jsonl, and every minute the judge's commands write every thread's
stack to their logs: the row's `census` has each kind's most processes at once and process-samples per state.

Everything goes to OUT/scale_gpus.json (default OUT: results/scale-gpus), with device, date and commit, and a short
table is printed. The file accumulates: a later invocation with the same OUT adds its runs (a run already there
is kept unless --redo; one that failed or timed out is run again), so a long plan can be split into commands that
each fit a time limit (--budget). Each run is bounded by --timeout (then the batch gets SIGTERM, 60 s to stop, and
the run is marked timed out), and after each run every
process the bench started is killed: the bench is a child subreaper, so the harness's children, which run in
sessions of their own, are still found under it once their parents are gone. --dry-run prints the plan and the
commands and starts nothing.

On the 4-GPU machine (no network; carry .realrun, .kb and a folder of wheels for the dask extra, built for the
machine's Python, its dependencies included: PLAN.sh starts with `python3 -m pip install --no-index --find-links
WHEELS dask distributed`), from the repository root, on `.realrun/l12-scale`
(bench/real_runs.py: 102 real submissions of levels 1 and 2 whose inputs are MBs, not GBs), cold (every sample of
a generation run is new to the build cache): the lines below as one script (PLAN.sh, with OUT=/tmp/sg), started by
`bash bench/background.sh start /tmp/sg 560 -- bash PLAN.sh` and polled by `bash bench/background.sh poll /tmp/sg
560` calls, one right after the other, each of which copies OUT/scale_gpus.json and the records out (a machine
given back between two calls takes OUT with it; a poll on a fresh machine says so at once):

  S="python3 bench/scale_gpus.py .realrun/l12-scale --problems-dir .kb/KernelBench --cold --out OUT"
  $S --runs local:4
  CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 $S --runs local:1 --timeout 1500 &     # a 1-GPU, 16-core machine's share
  CUDA_VISIBLE_DEVICES=1 taskset -c 16-31 $S --runs dask:1 --timeout 1500 &
  CUDA_VISIBLE_DEVICES=2,3 taskset -c 32-63 $S --runs local:2,dask:2 --timeout 700 &
  wait; $S --runs dask:4,fault-local:4,fault-dask:4,late-dask:4

Benches confined to other GPUs and cores of the host go side by side and add their runs to one report (a lock
keeps their writes apart; each run notes its cores, build pool and GPUs). A cold 4-worker run of l12-scale judged
95 of the 102 in about 580 s on a 4-GPU H200 host with one process-wide start gate; local:1 takes longer than a
device call, hence the background plan.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from batch_bench import GpuSampler, read_jsonl  # noqa: E402
from census import Census  # noqa: E402

from harness.build import pch  # noqa: E402
from harness.pipeline import run_folder as pipeline_run_folder  # noqa: E402

CANDIDATE_MODULE = "harness.children.candidate.main"   # harness/shared/specs.py
ORACLE_MODULE = "harness.children.oracle.main"
RUN_NAME = "scale"
WAIT_PHASES = ("queue", "reference_start", "gate_wait", "started_ahead_wait", "retried_attempt")
SCALE_TARGET = 3.5        # wall of 1 worker over wall of 4 workers
STOP_GRACE_S = 60.0       # a batch past its timeout gets SIGTERM, then this long before SIGKILL
CLEANUP_S = 100.0         # a run past its timeout: the batch's grace, the workers' stop, the sweep
LONG_TIMING_S = 2.0       # a fault run kills in the middle of an evaluation that timed this long in the fault-free run
ANY_AFTER = 0.35          # ... until this share of the records more is written: then any evaluation under way
JOIN_TIMEOUT_S = 240.0    # Dask workers must have joined within this (on a loaded 2-core machine: 30-90 s)
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Spec:
    name: str          # as given: warm, local:2, fault-dask:4
    engine: str        # local | dask
    workers: int
    fault: bool = False
    cold: bool = False
    late: bool = False    # late-dask:N: the last worker command starts once the batch has written its first record

    @property
    def folder(self) -> str:
        return self.folder_of(self.name)

    @staticmethod
    def folder_of(name: str) -> str:
        return name.replace(":", "-")


def parse_runs(text: str, device: str, most: int) -> list[Spec]:
    specs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item == "warm":
            specs.append(Spec("warm", "local", 1 if device == "cpu" else most, cold=True))
            continue
        kind, _, count = item.partition(":")
        if kind == "late-dask" and count.isdigit() and int(count) >= 2:
            specs.append(Spec(item, "dask", int(count), late=True))
            continue
        fault = kind.startswith("fault-")
        engine = kind.removeprefix("fault-")
        if engine not in ("local", "dask") or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--runs: {item!r} is not warm, local:N, dask:N, fault-local:N, fault-dask:N or "
                             f"late-dask:N (N >= 2)")
        if engine == "local" and device == "cpu" and int(count) != 1:
            raise SystemExit(f"--runs: {item!r}: on the CPU device the local pipeline has one worker (use dask:N)")
        specs.append(Spec(item, engine, int(count), fault=fault))
    return specs


# ---------------------------------------------------------------- processes

def become_subreaper() -> bool:
    """Orphans of the bench's descendants (the harness's children run in sessions of their own and outlive a killed
    parent) are re-parented to the bench, so `sweep` finds every one of them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_table() -> dict[int, tuple[int, list[str]]]:
    """pid -> (parent pid, argv) of every process readable in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        table[int(entry)] = (int(stat.rsplit(")", 1)[1].split()[1]), argv)
    return table


def descendants(root: int, table: Optional[dict] = None) -> list[int]:
    table = table if table is not None else process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap(keep: set[int]) -> None:
    """Collect the exit of re-parented orphans (not of the bench's own Popen objects, which wait for theirs)."""
    for pid in descendants(os.getpid()):
        if pid in keep:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def sweep(keep: set[int] = frozenset(), rounds: int = 20) -> int:
    """SIGKILL every process below the bench (what a run left behind); returns how many were found."""
    killed: set[int] = set()
    for _ in range(rounds):
        alive = [pid for pid in descendants(os.getpid()) if pid not in keep and _alive(pid)]
        if not alive:
            break
        for pid in alive:
            killed.add(pid)
            with _quiet():
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        reap(keep)
    reap(keep)
    return len(killed)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError))


def start(command: list[str], log: Path, env: Optional[dict] = None) -> subprocess.Popen:
    sink = open(log, "w")
    try:
        return subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    finally:
        sink.close()


def stop(process: subprocess.Popen, sig: int, grace_s: float, group: bool = True) -> None:
    """`sig` to the process's group (or to it alone: a command that stops its own children), SIGKILL to the group
    after `grace_s`."""
    if process.poll() is None:
        with _quiet():
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with _quiet():
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_line(log: Path, text: str, process: subprocess.Popen, deadline: float, count: int = 1) -> bool:
    while time.monotonic() < deadline:
        if log.is_file() and log.read_text(errors="replace").count(text) >= count:
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.5)
    return False


# ---------------------------------------------------------------- the fault

def in_flight(table: dict[int, tuple[int, list[str]]], under: set[int]) -> list[tuple[int, Path]]:
    """(pid, folder) of each candidate process evaluating a submission (its folder holds the submission; one
    started ahead has none yet, a build's child runs in a build- folder) below the processes `under`."""
    found = []
    for pid, (_, argv) in table.items():
        if CANDIDATE_MODULE not in argv or pid not in under:
            continue
        try:
            folder = Path(argv[argv.index(CANDIDATE_MODULE) + 1]).parent
        except IndexError:
            continue
        if folder.name.startswith("candidate-") and (folder / "submission.py").is_file():
            found.append((pid, folder))
    return found


def memfd_inodes(pid: int) -> set[int]:
    """Inodes of the memfds a process holds open or maps (the reference's feed: lent to its candidate)."""
    inodes = set()
    with _quiet_os():
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with _quiet_os():
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    with _quiet_os():
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/memfd:"):
                inodes.add(int(parts[4]))
    return inodes


class _quiet_os:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, OSError)


def gpu_of(pid: int) -> Optional[str]:
    with _quiet_os():
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                return item.split(b"=", 1)[1].decode()
    return None


def long_evaluations(base: Optional[dict], results: Path) -> set[str]:
    """Labels whose evaluation in the fault-free run `base` timed for at least LONG_TIMING_S: killed in the middle
    of one, the evaluation still needs its reference and its worker (one whose verdict came at its first call can
    end on its own a moment after the kill, and then nothing had to be judged again)."""
    if base is None:
        return set()
    return {r["submission"] for r in read_jsonl(results / Spec.folder_of(base["name"]) / "records.jsonl")
            if (r.get("phases") or {}).get("timing", 0.0) >= LONG_TIMING_S}


def pick_victim(spec: Spec, batch: subprocess.Popen, workers: list[subprocess.Popen],
                wanted: Callable[[Path], bool] = lambda folder: True) -> Optional[dict]:
    """What to kill now, or None while no evaluation `wanted` (given its candidate's folder) is under way. Dask: the
    worker process running a candidate in evaluation (its parent, itself a child of a `run_eval.py worker` command).
    Local: the reference processes of that evaluation (children of the batch's process sharing a memfd with the
    candidate: its feed; where none is found, every reference of the candidate's GPU)."""
    table = process_table()
    roots = [batch.pid] + [w.pid for w in workers]
    under = {pid for root in roots for pid in descendants(root, table)}
    for candidate, folder in in_flight(table, under):
        if not wanted(folder):
            continue
        parent = table[candidate][0]
        if spec.engine == "dask":
            if table.get(parent, (0, []))[0] in {w.pid for w in workers}:
                return {"pids": [parent], "what": "Dask worker process", "candidate": candidate,
                        "folder": str(folder)}
            continue
        if parent != batch.pid:
            continue
        oracles = [pid for pid, (ppid, argv) in table.items() if ppid == batch.pid and ORACLE_MODULE in argv]
        feed = memfd_inodes(candidate)
        shared = [pid for pid in oracles if feed & memfd_inodes(pid)]
        if shared:
            return {"pids": shared, "what": "reference process (shares the candidate's feed)",
                    "candidate": candidate, "folder": str(folder)}
        gpu = gpu_of(candidate)
        same = [pid for pid in oracles if gpu_of(pid) == gpu]
        if same:
            return {"pids": same, "what": f"every reference process of the candidate's GPU ({gpu})",
                    "candidate": candidate, "folder": str(folder)}
    return None


# ---------------------------------------------------------------- one run

def listed_gpus() -> list[str]:
    """The GPU ids CUDA_VISIBLE_DEVICES lists (none where it is unset or empty)."""
    return [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]


def gpu_ids(count: int) -> list[str]:
    """The first `count` GPUs CUDA_VISIBLE_DEVICES lists (else 0, 1, ...): the harness sets each worker's
    CUDA_VISIBLE_DEVICES to one id of its list, so without this a bench confined to GPUs 2,3 would run on 0,1."""
    listed = listed_gpus()
    if not listed:
        return [str(g) for g in range(count)]
    if count > len(listed):
        raise SystemExit(f"a run of {count} GPU workers, but CUDA_VISIBLE_DEVICES lists {len(listed)}")
    return listed[:count]


def cache_folders(out: Path, spec: Spec, cold: bool) -> tuple[Path, Path]:
    """A run's build cache and the precompiled headers beside it: one of its own under --cold, else the one every
    run shares (the warm run's)."""
    cache = out / (f"build-cache-{spec.folder}" if cold else "build-cache")
    return cache, cache.with_name(cache.name + pch.SUFFIX)


def write_config(base: Optional[str], path: Path, device: str, cache: Path, build_jobs: int,
                 gpus: Optional[int], split: int = 1) -> Path:
    """The run's config; `split`: GPU workers of worker commands that share this host without knowing of each
    other (late-dask), each given its share of the references' memory budget (harness/oracle/budget.py)."""
    import yaml

    from harness.shared.config import find_config, load_config

    values = yaml.safe_load(Path(find_config(base) if base else REPO / "configs" / "default.yaml").read_text()) or {}
    values.update(device=device, build_cache_dir=str(cache), build_jobs=build_jobs)
    if split > 1 and values.get("ahead_budget_gb") is None:
        from harness.oracle import budget
        from harness.shared.resources import available_memory

        share = budget.derived(available_memory(), None, split).memory_bytes   # what one worker command would give
        if share:
            values["ahead_budget_gb"] = round(share / budget.GB, 1)
    if gpus is not None:
        values["gpus"] = ",".join(gpu_ids(gpus))
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    load_config(path)   # a key the harness no longer takes stops here, named
    return path


def commands(spec: Spec, args, paths: dict, port: int) -> dict:
    """The run's commands: the batch, and for Dask the scheduler and the worker commands."""
    python = args.python
    config = paths["config"]
    batch = [python, str(REPO / "run_eval.py"), "--results-dir", str(paths["results"]), "batch", str(paths["source"]),
             "--run", spec.folder, "--config", str(config), "--problems-dir", str(args.problems_dir)]
    if spec.engine == "local":
        return {"batch": batch}
    address = f"tcp://127.0.0.1:{port}"
    scheduler = [python, str(REPO / "run_eval.py"), "scheduler", "--port", str(port)]
    worker = [python, str(REPO / "run_eval.py"), "worker", "--scheduler", address, "--device", args.device,
              "--config", str(config)]
    if args.device == "cuda" and spec.late:   # the last GPU's command comes late, with one build slot
        ids = gpu_ids(spec.workers)
        workers = [worker + ["--gpus", ",".join(ids[:-1]), "--build-jobs", str(max(1, args.build_jobs - 1))],
                   worker + ["--gpus", ids[-1], "--build-jobs", "1"]]
    elif args.device == "cuda":
        workers = [worker + ["--gpus", ",".join(gpu_ids(spec.workers)),
                             "--build-jobs", str(args.build_jobs)]]
    else:   # one CPU evaluation worker per command
        jobs = max(1, args.build_jobs // spec.workers)
        workers = [worker + ["--build-jobs", str(jobs)] for _ in range(spec.workers)]
    return {"scheduler": scheduler, "workers": workers, "batch": batch + ["--scheduler", address]}


def run_one(spec: Spec, args, out: Path, labels: dict[str, str], timeout: float,
            prefer: frozenset = frozenset()) -> dict:
    """One run of `spec`; a fault run kills an evaluation of a submission in `prefer` (labels) where it can. One
    bench at a time on a run of OUT: another bench already on it (a plan started twice) gets an error row, before
    anything of the running one (its caches, its records) is deleted."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    with open(out / "logs" / f"{spec.folder}.running", "w") as slot:
        try:
            fcntl.flock(slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return {"name": spec.name, "engine": spec.engine, "workers": spec.workers, "fault": spec.fault,
                    "error": f"another bench is running {spec.name} in {out}"}
        return _run_one(spec, args, out, labels, timeout, prefer)


def _run_one(spec: Spec, args, out: Path, labels: dict[str, str], timeout: float, prefer: frozenset) -> dict:
    results, logs = out / "results", out / "logs"
    cache, headers = cache_folders(out, spec, args.cold)
    if spec.cold or args.cold:
        for folder in (cache, headers):
            shutil.rmtree(folder, ignore_errors=True)
    try:   # a batch still judging this run (left by a killed bench, or started by hand): leave its folder alone
        with pipeline_run_folder.claimed(results / spec.folder):
            pass
    except pipeline_run_folder.RunBusy as exc:
        return {"name": spec.name, "engine": spec.engine, "workers": spec.workers, "fault": spec.fault,
                "error": str(exc)}
    shutil.rmtree(results / spec.folder, ignore_errors=True)   # never resume an earlier run's records
    config = write_config(args.config, out / f"{spec.folder}.yaml", args.device, cache, args.build_jobs,
                          spec.workers if spec.engine == "local" and args.device == "cuda" else None,
                          split=spec.workers if spec.late and args.device == "cuda" else 1)
    paths = {"config": config, "results": results, "source": out / "source"}
    cmds = commands(spec, args, paths, free_port())
    row: dict = {"name": spec.name, "engine": spec.engine, "workers": spec.workers, "fault": spec.fault,
                 "cold_cache": spec.cold or args.cold, "timeout_s": round(timeout), "commands": cmds,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    deadline = time.monotonic() + timeout
    began = time.monotonic()
    helpers: list[subprocess.Popen] = []
    batch: Optional[subprocess.Popen] = None
    sampler = None
    census = Census(logs / f"{spec.folder}-census.jsonl")
    try:
        if spec.engine == "dask":
            scheduler = start(cmds["scheduler"], logs / f"{spec.folder}-scheduler.log")
            helpers.append(scheduler)
            if not wait_for_line(logs / f"{spec.folder}-scheduler.log", "scheduler listening at", scheduler,
                                 deadline):
                row["error"] = "the scheduler did not start (see its log)"
                return row
            workers = []
            for i, command in enumerate(cmds["workers"][:-1] if spec.late else cmds["workers"]):
                log = logs / f"{spec.folder}-worker{i}.log"
                workers.append(start(command, log))
            helpers.extend(workers)
            for i, worker in enumerate(workers):
                if not wait_for_line(logs / f"{spec.folder}-worker{i}.log", " joined tcp://", worker,
                                     min(deadline, time.monotonic() + JOIN_TIMEOUT_S)):
                    row["error"] = f"worker command {i} did not join (see its log)"
                    return row
            row["cluster_start_s"] = round(time.monotonic() - began, 2)
        worker_commands = helpers[1:]
        if args.device == "cuda":
            sampler = GpuSampler(logs / f"{spec.folder}-nvidia-smi.csv")
        batch_log = logs / f"{spec.folder}-batch.log"
        t0 = time.monotonic()
        batch = start(cmds["batch"], batch_log)
        records_path = results / spec.folder / "records.jsonl"
        fault: Optional[dict] = {"killed": False} if spec.fault else None
        late: Optional[dict] = {"started": False} if spec.late else None
        late_log = logs / f"{spec.folder}-worker{len(cmds['workers']) - 1}.log" if spec.late else None
        timed_out = False
        while batch.poll() is None:
            if time.monotonic() > deadline:
                timed_out = True
                stop(batch, signal.SIGTERM, STOP_GRACE_S, group=False)   # as Ctrl-C; SIGINT is ignored in background
                break
            if late is not None and not late["started"]:
                done = len(read_jsonl(records_path))
                if done >= 1:   # the batch is under way: its first verdict is in
                    joining = start(cmds["workers"][-1], late_log)
                    helpers.append(joining)
                    late.update(started=True, at_s=round(time.monotonic() - t0, 2), records_before=done,
                                pid=joining.pid, gpu=gpu_ids(spec.workers)[-1] if args.device == "cuda" else None)
                    print(f"  started the late worker command [{joining.pid}] at {late['at_s']} s ({done} of "
                          f"{len(labels)} records)", flush=True)
            elif late is not None and "joined_at_s" not in late and " joined tcp://" in _read(late_log):
                late["joined_at_s"] = round(time.monotonic() - t0, 2)
            if fault is not None and not fault["killed"]:
                done = len(read_jsonl(records_path))
                if done >= args.kill_at * len(labels):
                    # one whose evaluation is long, while the batch has records to spare; then any
                    choosy = bool(prefer) and done < (args.kill_at + ANY_AFTER) * len(labels)
                    victim = pick_victim(spec, batch, worker_commands, lambda folder: not choosy or labels.get(
                        _digest(_read(folder / "submission.py"))) in prefer)
                    if victim is not None:
                        for pid in victim["pids"]:
                            with _quiet():
                                os.kill(pid, signal.SIGKILL)
                        text = _read(Path(victim["folder"]) / "submission.py")
                        fault.update(killed=True, at_s=round(time.monotonic() - t0, 2), records_before=done,
                                     in_flight=labels.get(_digest(text), "unknown"), **victim)
                        print(f"  killed {victim['what']} {victim['pids']} at {fault['at_s']} s "
                              f"({done} of {len(labels)} records), evaluating {fault['in_flight']}", flush=True)
            time.sleep(0.2)
        wall = time.monotonic() - t0
        row.update(rc=batch.returncode, timed_out=timed_out, wall_s=round(wall, 2), batch_log=str(batch_log))
        if sampler is not None:
            busy, ids = sampler.stop() or {}, gpu_ids(spec.workers)
            row["nvidia_smi_busy"] = {gpu: v for gpu, v in busy.items() if gpu in ids} or busy   # its own GPUs
            sampler = None
        row.update(figures(results / spec.folder, wall, labels))
        if fault is not None:
            row["fault"] = fault
        if late is not None:
            row["late"] = late
        return row
    finally:
        row["census"] = census.stop()
        if sampler is not None:
            sampler.stop()
        if batch is not None and batch.poll() is None:
            stop(batch, signal.SIGKILL, 5)
        for helper in reversed(helpers):
            stop(helper, signal.SIGTERM, 20)
        row["left_behind_killed"] = sweep()
        row["run_s"] = round(time.monotonic() - began, 2)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def figures(run_dir: Path, wall: float, labels: dict[str, str]) -> dict:
    """The run's figures from its records and batch.json."""
    lines = read_jsonl(run_dir / "records.jsonl")
    batch = json.loads((run_dir / "batch.json").read_text()) if (run_dir / "batch.json").is_file() else None
    counts: dict[str, int] = {}
    for record in lines:
        counts[record["submission"]] = counts.get(record["submission"], 0) + 1
    last = {record["submission"]: record for record in lines}
    statuses: dict[str, int] = {}
    for record in last.values():
        statuses[record["status"]] = statuses.get(record["status"], 0) + 1
    waits = {phase: round(sum((r.get("phases") or {}).get(phase, 0.0) for r in lines), 2) for phase in WAIT_PHASES}
    row = {"records": len(lines), "submissions": len(labels), "statuses": statuses,
           "per_minute": round(len(last) / wall * 60, 2) if wall > 0 else None, "waits_summed_s": waits,
           "verdicts": {label: [r["status"], r.get("compiled"), r.get("correct")] for label, r in sorted(last.items())},
           "record_lines": counts}
    if batch is None:
        return {**row, "batch": None}
    harness_wall = batch.get("wall_s") or wall
    per_worker = {}
    for worker in sorted(set(batch.get("gpus") or []) | set(batch.get("per_worker_s") or {})):
        busy = (batch.get("per_worker_s") or {}).get(worker, 0.0)
        first, end = (batch.get("timeline") or {}).get(worker, (None, None))
        per_worker[worker] = {
            "busy_s": round(busy, 2), "busy_share": round(busy / harness_wall, 4) if harness_wall else None,
            "before_first_s": None if first is None else round(first, 2),
            "between_s": None if first is None else round(max(end - first - busy, 0.0), 2),
            "after_last_s": None if end is None else round(max(harness_wall - end, 0.0), 2)}
    keep = ("wall_s", "gpu_s", "gpu_busy_share", "gpu_tasks", "evaluated", "build_jobs", "build_cpu_s", "builds",
            "cores", "gpus", "engine", "device", "target_s", "ahead_s", "ahead_used_s", "ahead_unused_s",
            "own_work_ratio", "retried", "no_verdict", "interrupted", "statuses", "starts", "deferred")
    kept = {k: batch.get(k) for k in keep}
    return {**row, "batch": kept, "per_worker": per_worker, "bound": bound(kept, len(per_worker))}


def bound(batch: dict, workers: int) -> Optional[dict]:
    """What bounds the run's wall from below: its builds (build CPU seconds over the build pool) or its GPU workers
    (their busy seconds over their number), and how far the wall is from the larger."""
    builds_s = batch["build_cpu_s"] / batch["build_jobs"] if batch.get("build_cpu_s") and batch.get("build_jobs") \
        else 0.0
    gpu_s = (batch.get("gpu_s") or 0.0) / workers if workers else 0.0
    if not (builds_s or gpu_s) or not batch.get("wall_s"):
        return None
    lower = max(builds_s, gpu_s)
    return {"builds_s": round(builds_s, 1), "workers_s": round(gpu_s, 1), "by": "builds" if builds_s > gpu_s
            else "GPU workers", "wall_over_bound": round(batch["wall_s"] / lower, 2)}


# ---------------------------------------------------------------- checks and the report

def plain(row: dict) -> bool:
    """A run with nothing done to it: no fault, no worker started late (the runs scaling and baselines take)."""
    return not row.get("fault") and not row.get("late")


def baseline_for(spec: Spec, runs: dict) -> Optional[dict]:
    """The plain run to compare a fault or late run with: same engine and size, else same engine, else any."""
    clean = [r for r in runs.values() if plain(r) and r.get("rc") == 0 and r.get("verdicts")]
    for match in (lambda r: r["engine"] == spec.engine and r["workers"] == spec.workers,
                  lambda r: r["engine"] == spec.engine, lambda r: True):
        found = [r for r in clean if match(r)]
        if found:
            return found[0]
    return None


def check_records(row: dict, base: Optional[dict], problems: list[str]) -> dict:
    """One record per submission of the plain run `base` (none lost, none written twice, none unexpected), each
    verdict as there, exit code 0; what is not so goes to `problems`."""
    if row.get("rc") != 0:
        problems.append(f"batch exit code {row.get('rc')}")
    if row.get("timed_out"):
        problems.append("timed out")
    lines = row.get("record_lines") or {}
    expected = set((base or {}).get("verdicts") or {}) or set(lines)
    lost = sorted(expected - set(lines))
    duplicated = sorted(label for label, n in lines.items() if n > 1)
    extra = sorted(set(lines) - expected)
    diffs = {}
    if base is not None:
        for label in sorted(expected & set(lines)):
            if row["verdicts"][label] != base["verdicts"][label]:
                diffs[label] = {"this_run": row["verdicts"][label], "baseline": base["verdicts"][label]}
    else:
        problems.append("no plain run to compare verdicts with")
    for what, items in (("lost", lost), ("duplicated", duplicated), ("unexpected", extra)):
        if items:
            problems.append(f"{len(items)} {what}")
    if diffs:
        problems.append(f"{len(diffs)} verdicts differ")
    return {"baseline": (base or {}).get("name"), "lost": lost, "duplicated": duplicated, "unexpected": extra,
            "verdict_diffs": diffs}


def check_fault(row: dict, base: Optional[dict]) -> dict:
    fault = row.get("fault") or {}
    problems = []
    if not fault.get("killed"):
        problems.append("no evaluation was found in flight to kill")
    compared = check_records(row, base, problems)
    retried = ((row.get("batch") or {}).get("retried")) or []
    names_it = any(fault.get("in_flight") and label == fault["in_flight"] for label, _ in retried)
    if not retried:
        problems.append("batch.json lists nothing retried")
    elif fault.get("killed") and not names_it:
        problems.append(f"batch.json's retried does not name the submission in flight ({fault.get('in_flight')})")
    return {**compared, "retried": retried, "retried_names_in_flight": names_it, "ok": not problems,
            "problems": problems}


def late_workers(row: dict) -> list[str]:
    """The evaluation workers of the late worker command, as batch.json names them: its GPU's (`HOST-gpuN`), or on
    the CPU device its own (`HOST-PID-cpu`)."""
    late = row.get("late") or {}
    names = (row.get("per_worker") or {}).keys()
    if late.get("gpu") is not None:
        return [n for n in names if n.endswith(f"-gpu{late['gpu']}")]
    return [n for n in names if n.endswith(f"-{late.get('pid')}-cpu")]


def check_late(row: dict, base: Optional[dict]) -> dict:
    late = row.get("late") or {}
    problems = []
    if not late.get("started"):
        problems.append("the batch ended before its first record: the late worker command never started")
    compared = check_records(row, base, problems)
    workers = {name: (row.get("per_worker") or {})[name] for name in late_workers(row)}
    if late.get("started") and not workers:
        problems.append("batch.json names no worker of the late command")
    elif workers and not all(w.get("busy_s", 0) > 0 for w in workers.values()):
        problems.append(f"the late worker took no evaluation: {workers}")
    return {**compared, "late_workers": workers, "ok": not problems, "problems": problems}


def scaling_key(row: dict) -> str:
    """The group a run's wall is compared within: its engine, and whether its builds were cold (--cold)."""
    return row["engine"] + (" cold" if row.get("cold_cache") else "")


def scaling(runs: dict) -> dict:
    """Per engine (and cache state: `scaling_key`): wall(fewest workers) / wall(N), fault-free runs only (the warm
    run, which only fills the cache, is left out); `base` names the fewest (1 where that run is there)."""
    table = {}
    for key in sorted({scaling_key(r) for r in runs.values()}):
        clean = {r["workers"]: r for r in runs.values() if scaling_key(r) == key and plain(r)
                 and r["name"] != "warm" and r.get("rc") == 0 and r.get("wall_s")}
        if not clean:
            continue
        one = clean[min(clean)]
        table[key] = {str(n): {"wall_s": r["wall_s"], "speedup": round(one["wall_s"] / r["wall_s"], 3),
                               "per_minute": r.get("per_minute")} for n, r in sorted(clean.items())}
        table[key]["base"] = min(clean)
        if 1 in clean and 4 in clean:
            table[key]["target_4_over_1"] = SCALE_TARGET
            table[key]["met"] = one["wall_s"] / clean[4]["wall_s"] >= SCALE_TARGET
    return table


def agreement(runs: dict) -> dict:
    """Submissions whose verdict differs between fault-free runs (the judge should give the same each time)."""
    clean = [r for r in runs.values() if plain(r) and r.get("verdicts")]
    differ = {}
    for label in sorted({label for r in clean for label in r["verdicts"]}):
        seen = {r["name"]: r["verdicts"].get(label) for r in clean}
        if len({json.dumps(v) for v in seen.values()}) > 1:
            differ[label] = seen
    return {"runs": [r["name"] for r in clean], "differ": differ}


def print_table(report: dict) -> None:
    print(f"\n{'run':16s} {'wall s':>8s} {'subs/min':>8s} {'x':>6s} {'busy':>6s}  per worker busy "
          f"(before first / between / after last, s)  statuses")
    ones = {engine: table[str(table["base"])]["wall_s"] for engine, table in report["scaling"].items()}
    for name, r in report["runs"].items():
        if r.get("error"):
            print(f"{name:16s} error: {r['error']}")
            continue
        speedup = ones[scaling_key(r)] / r["wall_s"] if r.get("wall_s") and scaling_key(r) in ones and \
            plain(r) and name != "warm" else None
        busy = (r.get("batch") or {}).get("gpu_busy_share")
        workers = "; ".join(f"{w} {v['busy_share']:.0%} ({_f(v['before_first_s'])}/{_f(v['between_s'])}/"
                            f"{_f(v['after_last_s'])})" for w, v in (r.get("per_worker") or {}).items()
                            if v.get("busy_share") is not None)
        flag = " TIMED OUT" if r.get("timed_out") else (f" rc={r['rc']}" if r.get("rc") else "")
        limit = r.get("bound") or {}
        limit_text = f"  bound: {limit['by']} (wall {limit['wall_over_bound']}x)" if limit else ""
        print(f"{name:16s} {r['wall_s']:8.1f} {_f(r.get('per_minute')):>8s} {_f(speedup, '.2f'):>6s} "
              f"{_f(busy, '.0%'):>6s}  {workers}  {r.get('statuses')}{flag}{limit_text}")
    for name, r in report["runs"].items():
        for key in ("fault_check", "late_check"):
            check = r.get(key)
            if not check:
                continue
            if key == "fault_check":
                fault = r.get("fault") or {}
                what = (f"killed {fault.get('what')} {fault.get('pids')} at {fault.get('at_s')} s evaluating "
                        f"{fault.get('in_flight')}; retried {check['retried']}")
            else:
                late = r.get("late") or {}
                what = (f"the late worker command started at {late.get('at_s')} s, joined at "
                        f"{late.get('joined_at_s')} s; its workers {check['late_workers']}")
            print(f"{name}: {'OK' if check['ok'] else 'FAILED'}: {what}; lost {len(check['lost'])}, duplicated "
                  f"{len(check['duplicated'])}, verdicts differing from {check['baseline']}: "
                  f"{len(check['verdict_diffs'])}" + (f"; problems: {check['problems']}" if check["problems"] else ""))
    for engine, table in report["scaling"].items():
        print(f"scaling {engine} (x: wall of {table['base']} worker(s) over wall of N): "
              + ", ".join(f"{n} -> {v['speedup']}x" for n, v in table.items() if isinstance(v, dict))
              + (f" (target 4 over 1 >= {SCALE_TARGET}: {'met' if table['met'] else 'not met'})"
                 if "met" in table else ""))
    warm = report["runs"].get("warm") or {}
    if (warm.get("batch") or {}).get("gpu_s"):
        print(f"warm: its workers were busy {warm['batch']['gpu_s']:.0f} s in all: about what local:1 will take "
              f"(each run's --timeout must exceed it)")
    for name, r in report["runs"].items():
        built = ((r.get("batch") or {}).get("builds") or {}).get("built")
        if built and not r.get("cold_cache"):
            print(f"{name}: {built} builds compiled (the cache was not warm for them: run `warm` first)")
    for name, r in report["runs"].items():   # a build child that sent no result: compiled again on a GPU worker
        lost = [error for _, error in (r.get("batch") or {}).get("deferred") or [] if error.startswith("build child")]
        if lost:
            print(f"{name}: {len(lost)} build(s) ended without a result, built again in their evaluations: "
                  + "; ".join(f"{n} x {why}" for why, n in collections.Counter(lost).most_common()))
    if report["agreement"]["differ"]:
        print(f"verdicts that differ between fault-free runs: {report['agreement']['differ']}")


def save_report(path: Path, change: Callable[[dict], None]) -> dict:
    """Read OUT/scale_gpus.json afresh, apply `change`, recompute the comparisons and write it back, under a lock:
    benches confined to other GPUs of the host (side by side, one OUT) add their runs to one report. Returns it."""
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        report = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
        change(report)
        report["date"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        report["scaling"], report["agreement"] = scaling(report["runs"]), agreement(report["runs"])
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(report, indent=1, default=str) + "\n")
        partial.replace(path)
    return report


def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


# ---------------------------------------------------------------- the set

def choose(source: Path, include: Optional[str], limit: Optional[int]) -> list[Path]:
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".txt")
                   and p.name.upper() != "README.MD")
    if include:
        files = [p for p in files if fnmatch.fnmatch(str(p.relative_to(source)), include)]
    if limit and len(files) > limit:   # every k-th: spread over the problems as the sorted names are
        step = len(files) / limit
        files = [files[int(i * step)] for i in range(limit)]
    return files


def stage(source: Path, files: list[Path], out: Path) -> list[str]:
    """Copy the chosen files into OUT/source (relative paths kept); refuse to change a set earlier runs judged."""
    staged = out / "source"
    wanted = {str(p.relative_to(source)): _digest(p.read_text(errors="replace")) for p in files}
    manifest = out / "source.json"
    if manifest.is_file():
        if json.loads(manifest.read_text()) != wanted:
            raise SystemExit(f"{out} holds runs of another set of files: take another --out (or remove it)")
        return sorted(wanted)
    shutil.rmtree(staged, ignore_errors=True)
    for path in files:
        target = staged / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    manifest.write_text(json.dumps(wanted, indent=1) + "\n")
    return sorted(wanted)


def discovered(out: Path, problems_dir: Path) -> tuple[dict[str, str], list[dict]]:
    """What `batch` will judge in OUT/source: text digest -> label, and the files it skips."""
    from harness.submission.submissions import discover

    found, skipped = discover(out / "source", None, problems_dir)
    return {_digest(s.text): s.label for s in found}, [{"file": s.label, "reason": s.reason} for s in skipped]


def device_name(device: str) -> list[str]:
    if device == "cuda" and shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        return [line.strip() for line in done.stdout.splitlines() if line.startswith("GPU ")]
    for line in _read(Path("/proc/cpuinfo")).splitlines():
        if line.startswith("model name"):
            return [f"CPU: {line.split(':', 1)[1].strip()}"]
    return ["CPU"]


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt   # SIGTERM: the same cleanup as Ctrl-C


def _git(*args: str) -> Optional[str]:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", type=Path, help="folder of submissions (batch's layouts)")
    p.add_argument("--problems-dir", type=Path, default=REPO / "problems", help="default: problems/")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--runs", help="default cuda: warm,local:1,local:2,local:4,dask:1,dask:2,dask:4,fault-local:4,"
                   "fault-dask:4,late-dask:4; cpu: warm,dask:1,dask:2,fault-local:1,fault-dask:2,late-dask:2")
    p.add_argument("--limit", type=int, help="judge this many files of SOURCE (every k-th of the sorted list)")
    p.add_argument("--include", help="only files whose path relative to SOURCE matches this glob")
    p.add_argument("--out", type=Path, default=REPO / "results" / "scale-gpus")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per run, cluster start included "
                   "(default 540)")
    p.add_argument("--budget", type=float, help="seconds for this whole invocation: each run's timeout is cut to "
                   "what is left (less the cleanup), and no run starts with less than 90 s left")
    p.add_argument("--build-jobs", type=int, help="the build pool of every run (default: usable cores less 2 per "
                   "GPU worker of the largest run)")
    p.add_argument("--cold", action="store_true", help="every run builds from an empty build cache of its own")
    p.add_argument("--kill-at", type=float, default=0.3, help="fault runs kill once this share of the records "
                   "is written and an evaluation is under way (default 0.3)")
    p.add_argument("--config", help="base config (path or name in configs/; default configs/default.yaml)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the runs (default: this one)")
    p.add_argument("--redo", action="store_true", help="run again the runs already in OUT/scale_gpus.json")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the commands; start nothing")
    args = p.parse_args(argv)
    default_runs = ("warm,local:1,local:2,local:4,dask:1,dask:2,dask:4,fault-local:4,fault-dask:4,late-dask:4"
                    if args.device == "cuda" else "warm,dask:1,dask:2,fault-local:1,fault-dask:2,late-dask:2")
    probe = parse_runs(args.runs or default_runs, args.device, 1)
    most = max(s.workers for s in probe if s.name != "warm") if any(s.name != "warm" for s in probe) else (
        max(1, len(listed_gpus() or device_name("cuda"))) if args.device == "cuda" else 1)
    specs = parse_runs(args.runs or default_runs, args.device, most)
    if args.build_jobs is None:
        args.build_jobs = max(1, len(os.sched_getaffinity(0)) - 2 * (most if args.device == "cuda" else 1))
    if args.device == "cuda":
        gpu_ids(most)   # the largest run fits the GPUs CUDA_VISIBLE_DEVICES lists
    args.source, args.problems_dir, args.out = args.source.resolve(), args.problems_dir.resolve(), args.out.resolve()
    if any(s.engine == "dask" for s in specs):
        try:
            import distributed  # noqa: F401
        except ImportError:
            p.error("the dask runs need the dask extra (pip install '.[dask]')")
    files = choose(args.source, args.include, args.limit)
    if not files:
        p.error(f"no submission files in {args.source}" + (f" matching {args.include}" if args.include else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    stage(args.source, files, args.out)
    labels, skipped = discovered(args.out, args.problems_dir)
    print(f"{len(labels)} submissions staged in {args.out / 'source'} ({len(skipped)} skipped by discovery); "
          f"build pool {args.build_jobs}; runs: {', '.join(s.name for s in specs)}", flush=True)
    report_path = args.out / "scale_gpus.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {"runs": {}}
    if args.dry_run:
        for spec in specs:
            cmds = commands(spec, args, {"config": args.out / f"{spec.folder}.yaml", "results": args.out / "results",
                                         "source": args.out / "source"}, 8786)
            print(f"\n{spec.name}: {spec.workers} worker(s)" + (" (kept: already in the report; --redo runs it again)"
                                      if spec.name in report["runs"] and not args.redo else ""))
            listed = [("scheduler", cmds["scheduler"])] if "scheduler" in cmds else []
            workers = cmds.get("workers", [])
            listed += [("worker (once the batch has a record)" if spec.late and i == len(workers) - 1 else "worker",
                        command) for i, command in enumerate(workers)] + [("batch", cmds["batch"])]
            for key, command in listed:
                print(f"  {key}: {' '.join(command)}")
        return 0
    if not become_subreaper():
        print("warning: not a child subreaper: processes whose parents die may be missed by the cleanup",
              flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    setting = dict(device=device_name(args.device), device_kind=args.device, cores=len(os.sched_getaffinity(0)),
                   commit=_git("rev-parse", "HEAD"),
                   tree_dirty=bool(_git("status", "--porcelain", "--untracked-files=no")),
                   source=str(args.source), problems_dir=str(args.problems_dir), limit=args.limit,
                   include=args.include, files=len(files), submissions=len(labels), skipped=skipped,
                   build_jobs=args.build_jobs, cold=args.cold, timeout_s=args.timeout, kill_at=args.kill_at,
                   python=args.python)
    report = save_report(report_path, lambda r: r.update(setting))
    ends = time.monotonic() + args.budget if args.budget else None
    try:
        for spec in specs:
            earlier = report["runs"].get(spec.name)
            if earlier and not args.redo and earlier.get("rc") == 0 and not earlier.get("timed_out"):
                print(f"{spec.name}: kept from an earlier invocation", flush=True)
                continue
            timeout = args.timeout
            if ends is not None:
                timeout = min(timeout, ends - time.monotonic() - CLEANUP_S)
                if timeout < 90:
                    print(f"{spec.name}: not started, the budget is spent", flush=True)
                    continue
            print(f"{spec.name}: running (timeout {timeout:.0f} s)", flush=True)
            base = baseline_for(spec, report["runs"]) if spec.fault or spec.late else None
            row = run_one(spec, args, args.out, labels, timeout,
                          frozenset(long_evaluations(base, args.out / "results")))
            if args.cold:   # its own cache served this run alone
                for folder in cache_folders(args.out, spec, cold=True):
                    shutil.rmtree(folder, ignore_errors=True)
            if spec.fault:
                row["fault_check"] = check_fault(row, base)
            if spec.late:
                row["late_check"] = check_late(row, base)
            row.update(cores=setting["cores"], build_jobs=args.build_jobs, commit=setting["commit"],
                       gpu_ids=gpu_ids(spec.workers) if args.device == "cuda" else None)
            report = save_report(report_path, lambda r: r["runs"].__setitem__(spec.name, row))
            print(f"{spec.name}: wall {row.get('wall_s')} s, rc {row.get('rc')}, statuses {row.get('statuses')}"
                  + (f", error {row['error']}" if row.get("error") else ""), flush=True)
    except KeyboardInterrupt:
        print("interrupted: killing what the bench started", flush=True)
        sweep()
        return 130
    report = save_report(report_path, lambda r: None)
    print_table(report)
    print(f"\nwritten: {report_path}")
    failed = [name for name, r in report["runs"].items()
              if r.get("error") or r.get("rc") != 0 or not (r.get("fault_check") or {"ok": True})["ok"]
              or not (r.get("late_check") or {"ok": True})["ok"]]
    if failed:
        print(f"runs that failed or whose fault or late check failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
