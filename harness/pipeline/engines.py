"""Where the batch's tasks run: `LocalEngine` (this machine) or `DaskEngine` (a Dask cluster, one or many machines).

Both take the same two task functions from harness/pipeline/driver.py: build tasks on the CPU cores, evaluation tasks on
GPU workers, one evaluation at a time per GPU. Candidate code runs only in the child processes those tasks start.

Local: a thread pool of `build_jobs` starts build children; one thread per GPU (CPU device: one) takes the next
evaluation, preferring one of a problem whose reference it already runs (it keeps `oracles_per_gpu` of them, and
starts some ahead while the first builds run) and, among those, one of the problem whose evaluations have taken
longest (the batch ends on short ones); it starts its children with CUDA_VISIBLE_DEVICES set to its GPU. As it
takes an evaluation it starts, in the background, the references of the queued evaluations it will take next, then
those of the builds still running (driver.Station.start_ahead), within `oracles_per_gpu`.

Dask: build tasks need the worker resource `build`, evaluations the resource `GPU` (a worker per GPU with GPU=1 runs
one at a time). Started by `run_eval.py worker --scheduler ADDRESS` on each machine (see README), or all on this
machine with `--scheduler local`. Built libraries travel with the build's result (Dask moves it to the GPU worker),
so machines share nothing but the scheduler.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Optional

import torch

from harness.build import builder as builds
from harness.judge import warm
from harness.judge.compare_on import comparison_device
from harness.oracle import budget
from harness.pipeline.driver import Evaluated, Station
from harness.shared.record import NOT_RUN, Status
from harness.shared.settings import CPU_PER_GPU_WORKER, PipelineSettings  # noqa: F401 (one figure, both paths)

log = logging.getLogger(__name__)

BUILD_RESOURCE, GPU_RESOURCE = "build", "GPU"


def visible_gpus(settings: PipelineSettings) -> list[str]:
    """GPU ids for the workers: the config's list, else every GPU this process may use (as the driver sees them)."""
    listed = settings.listed_gpus()
    return listed if listed is not None else [str(i) for i in range(torch.cuda.device_count())]


STOP_GRACE_S = 30.0   # an interrupted batch waits this long for each GPU worker to wind down
EXPECTED_AHEAD = 2    # how far a worker looks into the builds still running: this many times oracles_per_gpu problems
# Evaluations whose candidate never produced an output: their time is no guide to their problem's cost (_count_cost)
ENDED_BEFORE_RUNNING = frozenset(NOT_RUN | {Status.INIT_ERROR})


class LocalEngine:
    name = "local"
    ships = False       # builds and evaluations share this machine's cache folder

    def __init__(self, settings: PipelineSettings, device: str):
        gpus = visible_gpus(settings) if device == "cuda" else []
        if device == "cuda" and not gpus:
            raise RuntimeError("device cuda but no GPU is visible")
        self.stations = [Station(f"gpu{g}", {"CUDA_VISIBLE_DEVICES": g}, sharers=len(gpus))
                         for g in gpus] or [Station("cpu")]
        self.workers = [s.name for s in self.stations]
        self.build_jobs = settings.build_slots(len(gpus))
        self._builds = ThreadPoolExecutor(self.build_jobs, thread_name_prefix="build")
        self._settings, self._device = settings, device
        self._jobs: list[tuple] = []
        self._expected: dict[int, tuple] = {}   # id(submission) -> (submission, ahead): builds in flight, in order
        self._ready = threading.Condition()
        self._running = 0
        self._closed = False
        self._all_sent = False   # every build of the batch has been sent (`all_sent`)
        self._cost: dict[str, tuple[float, int]] = {}   # problem id -> (seconds, evaluations) on this engine
        self._threads = [threading.Thread(target=self._serve, args=(s,), name=s.name, daemon=True)
                         for s in self.stations]
        for thread in self._threads:
            thread.start()

    def target(self, device: str) -> builds.Target:
        return builds.describe_target(device, self.stations[0].env)

    def build(self, task: Callable, args: tuple, on_done: Callable[[Future], None]) -> None:
        self._builds.submit(task, *args).add_done_callback(on_done)

    def evaluate(self, task: Callable, submission, args: tuple, on_done: Callable[[Future], None],
                 on_start: Callable[[str], None], ahead: Optional[Callable] = None) -> None:
        """`ahead(station)`: start this evaluation's reference in the background on a worker that will need it."""
        self.landed(submission)
        self._queue(task, submission, args, on_done, on_start, None, ahead)

    def expect(self, submission, ahead: Callable) -> None:
        """An evaluation of `submission` will likely follow its build, now sent: a worker looking ahead counts its
        problem after the queued ones (builds land roughly in the order they were sent, driver.build_nice)."""
        with self._ready:
            self._expected[id(submission)] = (submission, ahead)

    def landed(self, submission) -> None:
        """`submission`'s build is over (evaluated next, or decided by the build): no longer expected."""
        with self._ready:
            self._expected.pop(id(submission), None)

    def all_sent(self) -> None:
        """Every build of the batch has been sent: an evaluation taken when none is queued or expected is its
        worker's last, and no candidate process is started ahead to follow it (warm.stop_refilling)."""
        with self._ready:
            self._all_sent = True

    def warm(self, worker: str, task: Callable, submission, args: tuple, on_done: Callable[[Future], None]) -> int:
        """Run `task` on `worker` (a reference started ahead) when it has no evaluation of a problem whose
        reference it runs; returns how many tasks were queued (0 or 1)."""
        if worker not in self.workers:
            return 0
        self._queue(task, submission, args, on_done, lambda name: None, worker)
        return 1

    def _queue(self, task: Callable, submission, args: tuple, on_done: Callable[[Future], None],
               on_start: Callable[[str], None], owner: Optional[str], ahead: Optional[Callable] = None) -> None:
        future: Future = Future()
        future.add_done_callback(on_done)
        with self._ready:
            self._jobs.append((task, submission, args, future, on_start, owner, ahead))
            self._ready.notify_all()

    def unused_ahead_s(self) -> float:
        """Seconds of background reference starts no evaluation used (after close)."""
        return sum(station.unused_ahead_s for station in self.stations)

    def evaluations_running(self) -> int:
        return self._running

    def close(self, wait: bool = True) -> None:
        """`wait`: finish what was queued; else drop it (an interrupted batch, whose children were killed) and give
        the tasks in flight a short while to notice and close their references. Builds in flight are waited for
        either way (once their children are killed they end at once), so none starts a child after this returns."""
        with self._ready:
            self._closed = True
            if not wait:
                self._jobs.clear()
            self._ready.notify_all()
        for thread in self._threads:
            thread.join(timeout=None if wait else STOP_GRACE_S)
        self._builds.shutdown(wait=True, cancel_futures=not wait)

    def _serve(self, station: Station) -> None:
        if self._device == "cuda":   # this process's context on the station's GPU, before anything is timed there
            # (else inside the first evaluation's comparison)
            comparison_device(self._settings.judge_config, "cuda", station.env)
        try:
            while True:
                with self._ready:
                    while self._pick(station) is None and not self._closed:
                        self._ready.wait()
                    index = self._pick(station)
                    if index is None:
                        return
                    task, submission, args, future, on_start, owner, _ = self._jobs.pop(index)
                    self._running += 1
                    upcoming = self._upcoming(station, submission.problem.id) if owner is None else []
                    last = owner is None and self._all_sent and not self._expected and \
                        not any(job[5] is None for job in self._jobs)
                if last:
                    warm.stop_refilling(station.env)
                if upcoming:
                    self._start_ahead(station, submission.problem.id, upcoming)
                on_start(station.name)
                began, result = time.monotonic(), None
                try:
                    result = task(station, submission, *args)
                    future.set_result(result)
                except BaseException as exc:  # a bug in the task: the driver reports it, the worker goes on
                    future.set_exception(exc)
                finally:
                    with self._ready:
                        self._running -= 1
                        if owner is None:
                            self._count_cost(submission.problem.id, time.monotonic() - began, result)
        finally:
            station.close()

    def _upcoming(self, station: Station, current: str) -> list[tuple[str, Optional[Callable]]]:
        """(problem id, ahead) per queued problem, in the order this station would take their evaluations, then per
        problem whose builds are still running, in the order they were sent (the first EXPECTED_AHEAD x
        `oracles_per_gpu` of those); `ahead` is None where the station has that reference running or starting
        already, or where other stations have it for at least as many evaluations as there are. Called under the
        lock."""
        shared = [i for i, job in enumerate(self._jobs) if job[5] is None]
        coming = [(self._jobs[i][1], self._jobs[i][6]) for i in sorted(shared, key=self._rank, reverse=True)]
        building: set[str] = set()
        look = EXPECTED_AHEAD * self._settings.oracles_per_gpu
        for submission, ahead in self._expected.values():
            if submission.problem.id not in building and len(building) >= look:
                break
            building.add(submission.problem.id)
            coming.append((submission, ahead))
        counts = Counter(submission.problem.id for submission, _ in coming)
        have = set(station.resident()) | {current}
        wanted, seen = [], set()
        for submission, ahead in coming:
            problem_id = submission.problem.id
            if problem_id in seen:
                continue
            seen.add(problem_id)
            elsewhere = sum(problem_id in other.resident() for other in self.stations if other is not station)
            if problem_id in have or elsewhere >= counts[problem_id]:
                ahead = None
            wanted.append((problem_id, ahead))
        return wanted

    def _start_ahead(self, station: Station, current: str, upcoming: list[tuple[str, Optional[Callable]]]) -> None:
        """Start the references of `upcoming` (see _upcoming) in the background while there is room, never closing
        the current evaluation's or a queued one's. A failure here only costs the head start (the evaluation starts
        its reference itself)."""
        keep = {current} | {problem_id for problem_id, _ in upcoming}
        try:
            for problem_id, ahead in upcoming:
                if ahead is None:
                    continue
                if not station.make_room(self._settings, keep):
                    return
                ahead(station)
        except Exception:   # noqa: BLE001 - the worker goes on with its evaluation
            log.exception("starting a reference ahead on %s failed", station.name)

    def _pick(self, station: Station) -> Optional[int]:
        """This station's own (warm) jobs in order (each only starts a reference in the background); else an
        evaluation of a problem whose reference this station runs (or has started and is done); else one whose
        reference is still starting here (it goes on starting while the others are evaluated); else any evaluation;
        None when there is none. Among evaluations, `_longest`."""
        own = [i for i, job in enumerate(self._jobs) if job[5] == station.name]
        if own:
            return own[0]
        shared = [i for i, job in enumerate(self._jobs) if job[5] is None]
        for have in (station.ready(), set(station.resident())):
            on_hand = [i for i in shared if self._jobs[i][1].problem.id in have]
            if on_hand:
                return self._longest(on_hand)
        return self._longest(shared) if shared else None

    def _longest(self, indices: list[int]) -> int:
        """The oldest job of the problem whose evaluations have taken longest so far (one with no candidate run yet
        counts as longest): long evaluations early, so that the batch ends on short ones and no GPU waits long for
        the last one."""
        return max(indices, key=self._rank)

    def _count_cost(self, problem_id: str, seconds: float, result: Optional[Evaluated]) -> None:
        """An evaluation's seconds into its problem's cost so far, unless its candidate never produced an output
        (it failed to build, load or construct): such an end says nothing of what a sample that runs costs (a
        sample of a 4 GB-output problem that fails at import takes 20 s, one that runs 110 s). Called under the
        lock."""
        record = result.record if isinstance(result, Evaluated) else None
        if record is None or record.status in ENDED_BEFORE_RUNNING:
            return
        total, count = self._cost.get(problem_id, (0.0, 0))
        self._cost[problem_id] = (total + seconds, count + 1)

    def _rank(self, index: int) -> tuple[float, int]:
        total, count = self._cost.get(self._jobs[index][1].problem.id, (0.0, 0))
        return (total / count if count else float("inf"), -index)


# ---------------------------------------------------------------- Dask

_STATION: Optional[Station] = None     # one per Dask GPU worker process (nthreads=1)
STARTED_TOPIC = "kernel-judge-evaluation-started"   # a Dask event per evaluation attempt: {"key", "worker"}


def _dask_evaluate(task: Callable, submission, *args):
    """An evaluation on a Dask GPU worker. The scheduler runs a task again on another worker when the one running it
    is lost (its process killed, its machine gone); that attempt starts from scratch here (this worker's reference,
    a new candidate process) and its result says which worker the earlier attempt was lost with and which took it
    (`retried`, listed in batch.json). Each attempt logs an event on the scheduler, which is how the next one knows."""
    global _STATION
    from distributed import get_client, get_worker

    worker = get_worker()
    if _STATION is None:
        _STATION = Station(worker.name or worker.address, sharers=budget.host_workers())
    key = str(worker.get_current_task())
    lost = [str(event.get("name")) for _, event in get_client().get_events(STARTED_TOPIC)
            if isinstance(event, dict) and event.get("key") == key]
    worker.log_event(STARTED_TOPIC, {"key": key, "name": _STATION.name})
    result = task(_STATION, submission, *args)
    if lost and isinstance(result, Evaluated) and result.record is not None:
        why = (f"its Dask worker was lost before its result reached the driver ({', '.join(lost)}); judged again on "
               f"{_STATION.name}")
        result = replace(result, retried=f"{why}; then {result.retried}" if result.retried else why)
    return result


def _dask_close_station() -> None:
    global _STATION
    if _STATION is not None:
        _STATION.close()
        _STATION = None


class DaskEngine:
    """`address`: a scheduler (tcp://HOST:8786), or "local" for a cluster of this machine's GPUs and cores."""
    name = "dask"
    ships = True

    def __init__(self, settings: PipelineSettings, device: str, address: str):
        from distributed import Client

        self._cluster = None
        if address == "local":
            self._cluster = local_cluster(settings, device)
            self.client = Client(self._cluster)
        else:
            self.client = Client(address, timeout="60s")
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        self.workers = sorted(w.get("name") or w["id"] for w in workers if w["resources"].get(GPU_RESOURCE))
        self.build_jobs = int(sum(w["resources"].get(BUILD_RESOURCE, 0) for w in workers))
        if not self.workers or not self.build_jobs:
            raise RuntimeError(f"the Dask cluster at {address} needs workers with resource {GPU_RESOURCE} and "
                               f"{BUILD_RESOURCE} (start them with `run_eval.py worker`); it has {len(self.workers)} "
                               f"GPU worker(s) and {self.build_jobs} build slot(s)")
        self.name = f"dask ({address})"
        self._sent: list = []

    def target(self, device: str) -> builds.Target:
        return self.client.submit(builds.describe_target, device, resources={GPU_RESOURCE: 1},
                                  pure=False).result()

    def build(self, task: Callable, args: tuple, on_done: Callable) -> None:
        _hand_over(self.client.submit(task, *args, resources={BUILD_RESOURCE: 1}, pure=False), on_done)

    def evaluate(self, task: Callable, submission, args: tuple, on_done: Callable,
                 on_start: Callable[[str], None], ahead: Optional[Callable] = None) -> None:
        # Earlier problems first, so that workers stay on one problem (one oracle) as long as it has work
        future = self.client.submit(_dask_evaluate, task, submission, *args, resources={GPU_RESOURCE: 1},
                                    pure=False, priority=-_problem_rank(submission.problem.id))
        self._sent.append(future)
        _hand_over(future, on_done)

    def warm(self, worker: str, task: Callable, submission, args: tuple, on_done: Callable) -> int:
        return 0   # the scheduler places evaluations; a worker starts a reference with its first evaluation

    def expect(self, submission, ahead: Callable) -> None:
        pass

    def landed(self, submission) -> None:
        pass

    def evaluations_running(self) -> int:
        self._sent = [f for f in self._sent if not f.done()]
        return min(len(self._sent), len(self.workers))

    def all_sent(self) -> None:
        """(LocalEngine.all_sent) The workers' processes started ahead are theirs to manage: nothing to tell."""

    def close(self, wait: bool = True) -> None:
        try:
            if not wait:
                self.client.cancel(self._sent)
            self.client.run(_dask_close_station)
        finally:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()


def _hand_over(future, on_done: Callable[[Future], None]) -> None:
    """Hand `on_done` the task's result (or error) in a plain Future, and release the Dask future: the scheduler
    computes again a result that a lost worker held while a future still refers to it, and a result the driver has
    taken must not be (an evaluation judged twice)."""
    def done(finished) -> None:
        result: Future = Future()
        try:
            result.set_result(finished.result())
        except BaseException as exc:   # noqa: BLE001 - the driver's boundary (driver._result) reports it
            result.set_exception(exc)
        finally:
            finished.release()
        on_done(result)

    future.add_done_callback(done)


def _problem_rank(problem_id: str) -> int:
    level, _, number = problem_id.partition("/")
    try:
        return int(level.removeprefix("level")) * 10_000 + int(number)
    except ValueError:
        return 0


def worker_specs(settings: PipelineSettings, device: str, tag: Optional[str] = None) -> dict:
    """Dask worker specs for one machine: a worker per GPU (resource GPU=1, CUDA_VISIBLE_DEVICES set, one thread)
    and one build worker with `build_jobs` threads (resource build=build_jobs). Names are unique on the scheduler:
    a GPU's worker is named by the host and the GPU; the build worker and a CPU evaluation worker by the host and
    `tag` (default: this process's id), so that two `worker` commands on one host (one per GPU set, say) never
    clash."""
    from distributed import Nanny

    host = socket.gethostname()
    tag = f"{host}-{tag if tag is not None else os.getpid()}"
    gpus = visible_gpus(settings) if device == "cuda" else []
    jobs = settings.build_slots(len(gpus))
    stations = {f"{host}-gpu{g}": {"CUDA_VISIBLE_DEVICES": g, budget.HOST_WORKERS_ENV: str(len(gpus))}
                for g in gpus} or {f"{tag}-cpu": {}}
    # memory_limit 0: Dask's default share of RAM per worker is far below what a GB-sized problem's truth and
    # results need; each child process is held to the config's max_host_memory_gb by the harness itself.
    specs = {name: {"cls": Nanny, "options": {"nthreads": 1, "resources": {GPU_RESOURCE: 1}, "env": env,
                                               "name": name, "memory_limit": 0}}
             for name, env in stations.items()}
    specs[f"{tag}-build"] = {"cls": Nanny, "options": {"nthreads": jobs, "resources": {BUILD_RESOURCE: jobs},
                                                        "name": f"{tag}-build", "memory_limit": 0}}
    return specs


def local_cluster(settings: PipelineSettings, device: str):
    from distributed import Scheduler, SpecCluster

    return SpecCluster(workers=worker_specs(settings, device), scheduler={"cls": Scheduler, "options": {
        "dashboard_address": None}}, asynchronous=False)


NANNY_CLOSE_S = 30.0   # a worker process being stopped gets this long to end before its nanny kills it


def _until_stopped(serve) -> None:
    """Run `serve` (a coroutine function) until it returns, Ctrl-C (KeyboardInterrupt, as asyncio.run raises it) or
    SIGTERM (a service manager's or a batch system's stop), either of which cancels it so that it closes what it
    started. A worker process killed outright instead leaves its multiprocessing semaphores in /dev/shm, and
    SIGINT is ignored by a command started in the background of a shell script, so SIGTERM is the stop that always
    reaches it."""
    import asyncio
    import signal

    async def main() -> None:
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await serve()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        log.warning("stopped (SIGTERM)")


def serve_workers(address: str, settings: PipelineSettings, device: str) -> None:
    """`run_eval.py worker`: this machine's workers (see worker_specs) joined to the scheduler until interrupted
    (Ctrl-C or SIGTERM: each nanny then stops its worker process and ends)."""
    import asyncio

    async def serve() -> None:
        nannies = [spec["cls"](address, **spec["options"]) for spec in worker_specs(settings, device).values()]
        try:
            await asyncio.gather(*nannies)
            log.warning("workers %s joined %s", ", ".join(n.name for n in nannies), address)
            await asyncio.gather(*(nanny.finished() for nanny in nannies))
        finally:
            await asyncio.gather(*(nanny.close(timeout=NANNY_CLOSE_S, reason="worker command stopped")
                                   for nanny in nannies), return_exceptions=True)

    _until_stopped(serve)


def serve_scheduler(port: int) -> None:
    """`run_eval.py scheduler`: a Dask scheduler that can read the harness's task graphs (this repository is on its
    path, which a bare `dask scheduler` started elsewhere lacks), until interrupted (Ctrl-C or SIGTERM)."""
    from distributed import Scheduler

    async def serve() -> None:
        async with Scheduler(port=port, dashboard=False) as scheduler:
            log.warning("scheduler listening at %s", scheduler.address)
            await scheduler.finished()

    _until_stopped(serve)
