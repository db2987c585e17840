"""A Dask batch that loses a worker, or gains one, on the CPU device: a worker process killed (SIGKILL) in the middle of
an evaluation costs that evaluation one more attempt from scratch on another worker (the batch ends, no record is
lost or written twice, batch.json lists the retry), and a worker started after the batch began (`run_eval.py worker`)
takes evaluations, and the `worker` and `scheduler` commands stop cleanly on SIGTERM."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, alive, pipeline_settings

from harness.pipeline import engines
from harness.pipeline.batch import run_batch
from harness.shared.problems import resolve_problem
from harness.submission.submissions import discover

pytest.importorskip("distributed")

SLOW_MARK = "# slow evaluation"
SLOW_S = 6   # the candidate's model takes this long to make: long enough to kill its worker in the middle


def _slow_relu(seconds: float) -> str:
    """cheap_relu whose model takes `seconds` to make (each value a submission of its own)."""
    text = (FIXTURES / "cheap_relu.py").read_text()
    return text.replace("class ModelNew(nn.Module):\n",
                        f"class ModelNew(nn.Module):\n    def __init__(self):  {SLOW_MARK}\n"
                        f"        super().__init__()\n        import time\n        time.sleep({seconds})\n\n")


def _submissions(folder: Path, slow: list[float], run: str):
    folder.mkdir()
    (folder / "cheap_relu.py").write_text((FIXTURES / "cheap_relu.py").read_text())
    (folder / "incorrect.py").write_text((FIXTURES / "cpu" / "incorrect.py").read_text())
    for i, seconds in enumerate(slow):
        (folder / f"slow_relu_{i}.py").write_text(_slow_relu(seconds))
    submissions, skipped = discover(folder, resolve_problem("level0/1"), REPO / "problems", run=run)
    assert not skipped
    return submissions


def _cluster(evaluators: list[str]):
    """This machine's workers as `run_eval.py worker` makes them (engines.worker_specs), under names of their own:
    `evaluators` each with GPU=1, and one build worker."""
    from distributed import Scheduler, SpecCluster

    specs = engines.worker_specs(pipeline_settings(device="cpu"), "cpu")
    evaluator = next(s for s in specs.values() if engines.GPU_RESOURCE in s["options"]["resources"])
    builder = next(s for s in specs.values() if engines.BUILD_RESOURCE in s["options"]["resources"])
    workers = {name: {"cls": evaluator["cls"], "options": {**evaluator["options"], "name": name}}
               for name in evaluators}
    workers["builds"] = {"cls": builder["cls"], "options": {**builder["options"], "name": "builds"}}
    return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                       asynchronous=False)


def _slow_candidate() -> tuple[int, int] | None:
    """(candidate pid, its parent's pid: the worker process) of a candidate evaluating a slow submission."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
            if "harness.children.candidate.main" not in argv:
                continue
            folder = Path(argv[argv.index("harness.children.candidate.main") + 1]).parent
            # an evaluation's candidate (a build's child runs the same module, in a build- folder)
            if folder.name.startswith("candidate-") and SLOW_MARK in (folder / "submission.py").read_text():
                return int(pid), int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return None


def _in_background(function, *args):
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for(condition, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    return None


def _semaphores() -> set[str]:
    """The named semaphores on this machine (multiprocessing's are /dev/shm/sem.mp-*; none where there is no
    /dev/shm)."""
    return {entry.name for entry in Path("/dev/shm").glob("sem.*")}


class _Stderr:
    """A child's stderr, read into memory as it comes (its pipe never fills)."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self, timeout_s: float = 30) -> str:
        """All of it, once the process has closed it (or `timeout_s` passed)."""
        self._thread.join(timeout_s)
        return "".join(self.lines)


def _stop_command(command: subprocess.Popen, grace_s: float = 60.0) -> bool:
    """SIGTERM to a `run_eval.py worker` or `scheduler` command (started in a session of its own), then SIGKILL to
    its process group if it has not ended within `grace_s`. True where it ended by itself. (Not SIGINT: a command
    started in the background of a shell script, as CI may start these tests, ignores it.)"""
    command.send_signal(signal.SIGTERM)
    try:
        command.wait(timeout=grace_s)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(command.pid, signal.SIGKILL)
        command.wait()
        return False


def _check_records(outcome, run_dir: Path, names: list[str]) -> None:
    """Every submission has exactly one record, in records.jsonl as in the outcome, with the status it has when no
    worker is lost."""
    lines = [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    assert sorted(Path(r["submission"]).name for r in lines) == sorted(names)
    assert sorted(Path(r.submission).name for r in outcome.records) == sorted(names)
    assert not outcome.skipped
    statuses = {Path(r["submission"]).name: r["status"] for r in lines}
    assert statuses == {name: "incorrect" if name == "incorrect.py" else "pass" for name in names}, statuses


def test_a_dask_worker_killed_mid_evaluation_costs_one_more_attempt_not_a_record(tmp_path):
    submissions = _submissions(tmp_path / "subs", [SLOW_S], "killed")
    run_dir = tmp_path / "killed"
    with _cluster(["eval-a", "eval-b"]) as cluster:
        thread, outcome = _in_background(run_batch, submissions, pipeline_settings(device="cpu"), run_dir, None, False,
                                         None, cluster.scheduler_address)
        found = _wait_for(_slow_candidate, 240)
        assert found, "the slow submission's evaluation never started"
        candidate, worker = found
        time.sleep(1)   # its model is being made: the evaluation is under way
        os.kill(worker, signal.SIGKILL)
        thread.join(timeout=300)
        assert not thread.is_alive(), "the batch did not finish on the remaining workers"
    assert "error" not in outcome, outcome.get("error")
    _check_records(outcome["value"], run_dir, [Path(s.label).name for s in submissions])
    summary = json.loads((run_dir / "batch.json").read_text())
    (label, why), = summary["retried"]
    assert label.endswith("slow_relu_0.py") and "Dask worker was lost" in why and "eval-" in why, summary["retried"]
    assert re.search(r"; judged again on eval-[ab]$", why), why   # the worker left, or the one its nanny restarted
    slow = next(r for r in outcome["value"].records if r.submission.endswith("slow_relu_0.py"))
    assert slow.status.value == "pass" and slow.phases["model"] >= SLOW_S * 0.9   # judged in full, its model made again


def test_a_worker_that_joins_a_running_batch_takes_evaluations(tmp_path):
    # five slow ones: work enough to outlast the late worker's start (its imports and joining take 10-25 s on a
    # loaded 2-core machine), so it is there to take some
    submissions = _submissions(tmp_path / "subs", [SLOW_S + 0.1 * i for i in range(5)], "late")
    run_dir = tmp_path / "late"
    with _cluster(["eval-a"]) as cluster:
        thread, outcome = _in_background(run_batch, submissions, pipeline_settings(device="cpu"), run_dir, None, False,
                                         None, cluster.scheduler_address)
        assert _wait_for(_slow_candidate, 240), "the batch's first evaluation never started"
        semaphores_before = _semaphores()
        joined = subprocess.Popen([sys.executable, str(REPO / "run_eval.py"), "worker", "--scheduler",
                                   cluster.scheduler_address, "--device", "cpu", "--build-jobs", "1"],
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        stderr = _Stderr(joined)
        try:
            thread.join(timeout=420)
            assert not thread.is_alive(), "the batch did not finish"
        finally:
            stopped = _stop_command(joined)
            # its nannies stopped their worker processes, and the queues between them (named semaphores) went too
            group_ended = _wait_for(lambda: not alive(joined.pid, group=True), 20)
            left = _semaphores() - semaphores_before
    said = stderr.text()
    assert stopped and joined.returncode == 0, (joined.returncode, said[-2000:])
    assert "stopped (SIGTERM)" in said
    assert group_ended, "processes of the worker command outlived it"
    assert not left, left
    assert "error" not in outcome, outcome.get("error")
    result = outcome["value"]
    _check_records(result, run_dir, [Path(s.label).name for s in submissions])
    # `run_eval.py worker` names this machine's evaluation worker by the host and its process id: it evaluated
    late = [name for name in result.summary.per_worker_s
            if name.startswith(f"{socket.gethostname()}-{joined.pid}-") and name.endswith("-cpu")]
    assert late and result.summary.per_worker_s[late[0]] > 0, result.summary.per_worker_s
    assert result.summary.per_worker_s.get("eval-a", 0) > 0
    assert not result.summary.retried


def test_two_worker_commands_on_one_host_take_names_of_their_own():
    # one `run_eval.py worker` per GPU set on a host: the build workers (and a CPU evaluator) carry the command's tag
    first = engines.worker_specs(pipeline_settings(device="cpu", build_jobs=1), "cpu", tag="101")
    second = engines.worker_specs(pipeline_settings(device="cpu", build_jobs=1), "cpu", tag="202")
    assert not set(first) & set(second)
    assert all(name == spec["options"]["name"] for specs in (first, second) for name, spec in specs.items())
    assert {name.rsplit("-", 1)[-1] for name in first} == {"cpu", "build"}


def test_the_scheduler_command_stops_on_sigterm():
    scheduler = subprocess.Popen([sys.executable, str(REPO / "run_eval.py"), "scheduler", "--port", "0"], cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stderr = _Stderr(scheduler)
    try:
        listening = _wait_for(lambda: stderr.has("scheduler listening at") or scheduler.poll() is not None, 120)
    finally:
        stopped = _stop_command(scheduler, grace_s=30)
    said = stderr.text()
    assert listening and stopped and scheduler.returncode == 0, (scheduler.returncode, said[-2000:])
    assert "stopped (SIGTERM)" in said
