"""The batch pipeline on the CPU device: the build pool decides build failures and feeds built extensions to the
workers, the cache means a second run compiles nothing, a driver killed with SIGKILL loses no finished record, and
the same batch runs through a Dask LocalCluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import yaml
from conftest import (
    FIXTURES,
    REPO,
    TEST_SETTINGS,
    by_name,
    expected_status,
    judge_config,
    pipeline_settings,
    run_folder,
)

from harness.build import builder as builds
from harness.pipeline import driver as pipeline
from harness.pipeline.batch import run_batch
from harness.shared.problems import resolve_problem
from harness.shared.record import Status, phases_total
from harness.submission.submissions import Submission, discover

PASSING = FIXTURES / "cheap_relu.py"    # builds a C++ extension through load_inline (in about a second), passes
MIXED = [PASSING] + [FIXTURES / "cpu" / name for name in (
    "needs_cuda.py",          # CUDA sources on the CPU device: decided by the build pool
    "incorrect.py",           # builds nothing at import: evaluated
    "no_code.md")]            # never built
# The build fails: decided by the build pool. PASSING with a C syntax error, where fixtures/cpu/compile_error.py fails
# in torch/extension.h code: the build pool decides both alike, and this one fails in about a second where that one
# compiles torch's headers for ~20 s on 2 cores (in this test's own cache, where nothing is built before).
# tests/judge/test_statuses.py judges compile_error.py itself.
BROKEN = "cheap_compile_error.py"
BROKEN_SOURCE = PASSING.read_text().replace("# expected: pass", "# expected: compile_error", 1).replace(
    "Py_RETURN_NONE;", "Py_RETURN_NONE", 1)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixed")
    for path in MIXED:
        (folder / path.name).write_text(path.read_text())
    (folder / BROKEN).write_text(BROKEN_SOURCE)
    results = tmp_path_factory.mktemp("results")
    # A cache of their own: other tests of the session build some of the same sources into the shared one.
    cache = str(tmp_path_factory.mktemp("build-cache"))
    first = run_folder(folder, results / "first", "cpu", problem="level0/1", build_cache_dir=cache)
    second = run_folder(folder, results / "second", "cpu", problem="level0/1",   # a new run: judged again
                        build_cache_dir=cache)
    return folder, first, second


def test_build_pool_decides_build_failures_and_feeds_the_workers(two_runs):
    folder, first, _ = two_runs
    records = by_name(first)
    for name, record in records.items():
        assert record.status.value == expected_status(folder / name), (name, record.error)
    summary = first.summary
    assert summary.builds == {"built": 1, "failed": 1, "needs_cuda": 1, "none": 1}, summary.builds
    assert summary.gpu_tasks == 2             # the pass and the incorrect one; build failures never reach a worker
    assert summary.build_cpu_s > 1 and summary.gpu_s > 0 and summary.evaluated == len(MIXED) + 1   # and BROKEN
    passing = records[PASSING.name]
    assert passing.prebuilt is True and passing.extensions_built == 1 and passing.compile_s > 0.1
    failed = records[BROKEN]
    assert failed.compiled is False and "error" in failed.error and failed.log_path.endswith("build.log")
    assert records["incorrect.py"].prebuilt is None   # nothing to build
    written = json.loads((first.run_dir / "batch.json").read_text())
    assert written["builds"] == summary.builds and written["gpu_tasks"] == 2
    # the reference started in the background was used by the first evaluation, which claims its time (not GPU-worker
    # time: it ran beside, and the evaluation waited only for what was left of it)
    assert summary.ahead_s > 0 and summary.ahead_used_s == summary.ahead_s and summary.ahead_unused_s == 0
    evaluated = [r for r in records.values() if r.phases and "reference_start" in r.phases]
    claimed = [r.phases["reference_ahead"] for r in evaluated if "reference_ahead" in r.phases]
    assert len(claimed) == 1 and claimed[0] == pytest.approx(summary.ahead_s, abs=1e-3)
    first_use = next(r for r in evaluated if "reference_ahead" in r.phases)
    assert first_use.phases["reference_start"] <= first_use.phases["reference_ahead"]
    assert "ref_gate" in first_use.phases and "ref_load" in first_use.phases   # the steps of that start
    # the one timed evaluation's GPU-worker time over its own checks and timing (the incorrect one was not timed)
    own = sum(passing.phases[name] for name in ("correctness", "gradients", "timing"))
    assert summary.own_work_ratio > 1 and written["own_work_ratio"] == summary.own_work_ratio
    worker_s = phases_total(passing.phases) - passing.phases["queue"]   # its phases cover its GPU-worker time
    assert summary.own_work_ratio == pytest.approx(worker_s / own, rel=0.05)
    (start, end), = summary.timeline.values()
    assert 0 < start < end <= summary.wall_s and written["timeline"]["cpu"] == [start, end]
    # where each evaluation's time went: its phases, and the batch's sum of them
    phases = passing.phases
    assert {"queue", "reference_start", "candidate_start", "spawn_import", "cuda_init", "load", "model",
            "correctness", "profile", "result_save", "result_read", "output_check", "timing", "spot_read",
            "spot_check", "teardown", "evaluation_other", "gate_wait", "timing_gate_wait"} <= set(phases), phases
    assert all(seconds >= 0 for seconds in phases.values()) and phases["timing"] > 0 and phases["spawn_import"] > 0
    fresh = [phases[f"fresh_{step}"] for step in ("write", "call", "read", "check")]   # the fresh-input calls
    assert all(seconds > 0 for seconds in fresh) and sum(fresh) <= phases["timing_fresh"], phases
    assert phases_total(phases) < summary.wall_s   # the phases that follow one another: within the batch's wall
    assert written["phases"] == summary.phases and summary.phases["timing"] >= phases["timing"]
    # the children it started (two builds, a reference, candidate processes) and what starting them cost here
    starts = summary.starts
    assert written["starts"] == starts and starts["children"] >= 5, starts
    assert starts["start_s"] > 0 and min(starts.values()) >= 0
    assert 0 < starts["fork_s"] < starts["start_s"]   # the lock is held through the forks, not the children's steps


def test_second_run_compiles_nothing(two_runs):
    _, first, second = two_runs
    assert second.summary.builds == {"cached": 4}, second.summary.builds   # built, two failures, nothing built
    assert second.summary.build_cpu_s == 0
    assert 0 < second.summary.starts["children"] < first.summary.starts["children"]   # its own starts: no build
    before, after = by_name(first), by_name(second)
    for name in before:
        assert after[name].status == before[name].status, name
    assert after[PASSING.name].prebuilt is True
    assert after[BROKEN].error == before[BROKEN].error   # the cached verdict and its log


QUICK = ["incorrect.py", "runtime_error.py", "shape_mismatch.py", "dtype_mismatch.py", "init_error.py",
         "rule_violation.py"]


def test_sigkill_of_the_driver_loses_no_finished_record(tmp_path):
    folder = tmp_path / "quick"
    folder.mkdir()
    for name in QUICK:
        (folder / name).write_text((FIXTURES / "cpu" / name).read_text())
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(TEST_SETTINGS))
    command = [sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(tmp_path / "results"), "batch",
               str(folder), "--problem", "level0/1", "--device", "cpu", "--run", "killed", "--config", str(config)]
    records = tmp_path / "results" / "killed" / "records.jsonl"
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (records.exists() and records.read_text().count("\n") >= 2):
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    kept = records.read_text()
    finished = [json.loads(line) for line in kept.splitlines() if line.strip()]
    assert 2 <= len(finished) < len(QUICK), "the driver should have been killed mid-batch"

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"({len(finished)} reused from an earlier run)" in " ".join(rerun.stdout.split())
    assert records.read_text().startswith(kept)          # nothing finished was rewritten or lost
    final = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    assert sorted(os.path.basename(r["submission"]) for r in final) == sorted(QUICK)
    for record in final:
        assert record["status"] == expected_status(FIXTURES / "cpu" / os.path.basename(record["submission"]))


def test_the_same_batch_through_a_dask_local_cluster(two_runs, tmp_path):
    folder, first, _ = two_runs
    submissions, skipped = discover(folder, resolve_problem("level0/1"), REPO / "problems", run="dask")
    assert not skipped
    outcome = run_batch(submissions, pipeline_settings(device="cpu"), tmp_path / "dask", scheduler="local")
    assert outcome.summary.engine.startswith("dask")
    assert list(outcome.summary.per_worker_s) == [w for w in outcome.summary.gpus]   # the one CPU worker evaluated
    before, records = by_name(first), by_name(outcome)
    assert sorted(records) == sorted(before)
    for name, record in records.items():
        assert record.status == before[name].status, (name, record.error)
    # the built library travelled as bytes from the build worker's result to the evaluating worker
    assert records[PASSING.name].prebuilt is True and records[PASSING.name].status == Status.PASS


def test_later_builds_run_at_lower_priority(tmp_path):
    # The module reports its own niceness by failing at import: a load_error, which the build leaves to the GPU
    source = "import os\nraise RuntimeError(f'niceness {os.nice(0)}')\n"
    config = judge_config(device="cpu")
    target = builds.Target("cpu")
    urgent = builds.build(source, config, target, tmp_path / "cache", tmp_path / "a.log")
    later = builds.build(source, config, target, tmp_path / "cache", tmp_path / "b.log", nice=pipeline.BUILD_NICE)
    base = os.nice(0)
    assert urgent.outcome == later.outcome == "deferred"
    assert f"niceness {base}" in urgent.error and f"niceness {base + pipeline.BUILD_NICE}" in later.error


def test_builds_sent_behind_others_get_lower_priority_in_order():
    # one GPU worker: its first two builds feed it at normal priority; each later one one step below those ahead of it
    nice = [pipeline.build_nice(sent, in_flight=sent, workers=1) for sent in range(16)]
    assert nice[:2] == [0, 0]
    assert nice[2:6] == [pipeline.BUILD_NICE + k for k in range(4)]
    assert nice == sorted(nice) and nice[-1] == pipeline.MAX_NICE
    # a build sent once the earlier ones have landed is not pushed back behind them
    assert pipeline.build_nice(100, in_flight=2, workers=1) == pipeline.BUILD_NICE
    assert pipeline.build_nice(3, in_flight=3, workers=2) == 0   # two workers: four urgent builds


def test_a_failing_reference_leaves_its_submissions_not_judged(tmp_path):
    problem_file = tmp_path / "broken_problem.py"
    problem_file.write_text((REPO / "problems" / "level0" / "1_Tiny_ReLU.py").read_text()
                            + "\n\ndef get_inputs():\n    raise RuntimeError('the reference cannot make inputs')\n")
    folder = tmp_path / "answers"
    folder.mkdir()
    for name in ("incorrect.py", "runtime_error.py", "compile_error.py"):
        (folder / name).write_text((FIXTURES / "cpu" / name).read_text())
    submissions, _ = discover(folder, resolve_problem(str(problem_file)), REPO / "problems", run="broken")
    outcome = run_batch(submissions, pipeline_settings(device="cpu"), tmp_path / "broken")
    assert len(outcome.problem_errors) == 1 and "cannot make inputs" in str(outcome.problem_errors[0])
    assert sorted(os.path.basename(s.label) for s in outcome.skipped) == ["incorrect.py", "runtime_error.py"]
    # the build verdict needs no reference: it is still recorded
    assert [(os.path.basename(r.submission), r.status) for r in outcome.records] == [
        ("compile_error.py", Status.COMPILE_ERROR)]


# ---------------------------------------------------------------- references started ahead (no child processes)

class FakeReference:
    def __init__(self, problem):
        self.problem, self.closed = problem, False
        self.start_steps = {"ref_process": 0.01}
        self.held_bytes = 1 << 20   # its feed and truth (the worker's budget: harness/oracle/budget.py)
        self.clean = "timed"   # its clean time (evaluate.time_clean): None until timed where a test says so

    def close(self):
        self.closed = True


def _problems(*ids):
    return [resolve_problem(problem_id) for problem_id in ids]


def _submission(problem, name="a.py"):
    return Submission(label=name, text=f"# {name} for {problem.id}", is_python=True, problem=problem)


def test_warm_plan_spreads_problems_over_workers():
    p0, p1, p2, p3 = _problems("level0/1", "level0/2", "level0/3", "level0/4")
    batch = [_submission(p0, "x"), _submission(p0, "y"), _submission(p1), _submission(p2), _submission(p3)]
    plan = pipeline.warm_plan(batch, ["gpu0", "gpu1"], keep=2)
    # the first problem's builds land first: both workers start it; each next one goes to the least loaded, 2 each
    assert {w: [s.problem.id for s in subs] for w, subs in plan.items()} == {
        "gpu0": ["level0/1", "level0/2"], "gpu1": ["level0/1", "level0/3"]}
    assert plan["gpu0"][0].label == "x"
    lone = pipeline.warm_plan([_submission(p0), _submission(p1)], ["gpu0", "gpu1"], keep=3)
    assert {w: [s.problem.id for s in subs] for w, subs in lone.items()} == {"gpu0": ["level0/1"],
                                                                            "gpu1": ["level0/2"]}
    assert pipeline.warm_plan(batch, ["gpu0"], keep=0) == {"gpu0": []}


def test_a_station_keeps_references_and_evaluations_claim_their_ahead_time(monkeypatch, tmp_path):
    started = []
    start_s = 0.3   # a reference's start: long beside the bookkeeping around it, even on a loaded 2-core machine

    def fake_oracle(problem, config, device, log_dir, env=None, gate=None):
        time.sleep(start_s)
        started.append((problem.id, gate is not None))
        reference = FakeReference(problem)
        reference.clean = None
        return reference

    timed_clean = []

    def fake_time_clean(reference, config):
        # a background start times it between two evaluations: never while one holds the station's gate, and
        # never beside another reference's (the gate's `alone` lock)
        assert station.gate._timings == 0 and station.gate._starting >= 1 and station.gate.alone.locked()
        timed_clean.append(reference.problem.id)
        reference.clean = "clean"

    monkeypatch.setattr(pipeline, "run_oracle", fake_oracle)
    monkeypatch.setattr(pipeline.evaluation, "evaluate", lambda submission, oracle, *rest: (oracle(), "record")[1])
    monkeypatch.setattr(pipeline.evaluation, "time_clean", fake_time_clean)
    settings = pipeline_settings(device="cpu", oracles_per_gpu=2)
    p0, p1, p2 = _problems("level0/1", "level0/2", "level0/3")
    station = pipeline.Station("gpu0")

    def evaluate(problem):
        return pipeline.evaluate_task(station, _submission(problem), problem.path.read_text(), settings, "cpu", None,
                                      str(tmp_path))

    warmed = pipeline.warm_task(station, _submission(p0), p0.path.read_text(), settings, "cpu", str(tmp_path))
    assert warmed.warm and warmed.record is None and warmed.busy_s < start_s   # the start runs in the background
    assert station.resident() == ["level0/1"] and "level0/1" in station.starting
    first, second = evaluate(p0), evaluate(p0)
    assert first.record == "record" and first.ahead_s >= start_s               # claimed once, by the first use
    assert second.ahead_s == 0.0 and started == [("level0/1", True)]           # gated; the reference ran once
    assert timed_clean == ["level0/1"] and station.references["level0/1"].clean == "clean"   # in the background
    assert first.busy_s < first.ahead_s + start_s and first.span[0] <= first.span[1] <= second.span[0]

    evaluate(p1)                                   # started on demand (not gated): two resident, level0/2 most recent
    assert station.resident() == ["level0/2", "level0/1"] and started[-1] == ("level0/2", False)
    p0_reference = station.references["level0/1"]
    evaluate(p2)                                   # the least recently used one is closed
    assert station.resident() == ["level0/3", "level0/2"] and p0_reference.closed
    evaluate(p0)
    assert [problem_id for problem_id, _ in started] == ["level0/1", "level0/2", "level0/3", "level0/1"]

    # room for a start in the background: a reference outside `keep` is closed; one still starting never is
    assert station.make_room(settings, keep={"level0/1"}) and station.resident() == ["level0/1"]   # level0/3 closed
    assert station.start_ahead(p0, settings, "cpu", tmp_path) is False   # resident already
    assert station.start_ahead(p1, settings, "cpu", tmp_path)
    evaluate(p0)
    assert station.resident() == ["level0/1", "level0/2"]
    station.starting["level0/2"][1].result()
    evaluate(p2)                                   # level0/1 goes for it: level0/2, started for a queued one, stays
    assert station.resident() == ["level0/3", "level0/2"] and "level0/2" in station.starting
    assert not station.make_room(settings, keep={"level0/3"})   # full, and nothing but level0/3 may be closed
    station.close()
    assert station.resident() == [] and station.unused_ahead_s >= start_s   # level0/2's start, never used


def test_references_started_in_the_background_time_themselves_alone_one_at_a_time(monkeypatch, tmp_path):
    """Two references started together must not take their clean times (nor the GPU pace) beside each other: each
    would read the other's work as its own time."""
    at_once, most, lock = [0], [0], threading.Lock()

    def fake_oracle(problem, config, device, log_dir, env=None, gate=None):
        reference = FakeReference(problem)
        reference.clean = None
        return reference

    def fake_time_clean(reference, config):
        with lock:
            at_once[0] += 1
            most[0] = max(most[0], at_once[0])
        time.sleep(0.2)
        with lock:
            at_once[0] -= 1
        reference.clean = "clean"

    monkeypatch.setattr(pipeline, "run_oracle", fake_oracle)
    monkeypatch.setattr(pipeline.evaluation, "time_clean", fake_time_clean)
    settings = pipeline_settings(device="cpu", oracles_per_gpu=3)
    station = pipeline.Station("gpu0")
    problems = _problems("level0/1", "level0/2", "level0/3")
    assert all(station.start_ahead(problem, settings, "cpu", tmp_path) for problem in problems)
    for _, future in list(station.starting.values()):
        reference, _ = future.result(timeout=30)
        assert reference.clean == "clean"
    assert most[0] == 1


def test_a_station_waits_for_a_background_start_and_its_failure_is_the_problems(monkeypatch, tmp_path):
    from harness.oracle.reference import OracleError

    release = threading.Event()

    def fake_oracle(problem, config, device, log_dir, env=None, gate=None):
        release.wait(5)
        if problem.id == "level0/2":
            raise OracleError(problem, "the reference raised", log_dir)
        return FakeReference(problem)

    monkeypatch.setattr(pipeline, "run_oracle", fake_oracle)
    settings = pipeline_settings(device="cpu", oracles_per_gpu=2)
    p0, p1 = _problems("level0/1", "level0/2")
    station = pipeline.Station("gpu0")
    assert station.start_ahead(p0, settings, "cpu", tmp_path) and station.start_ahead(p1, settings, "cpu", tmp_path)
    threading.Timer(0.2, release.set).start()
    began = time.monotonic()
    reference = station.oracle_for(p0, settings, "cpu", tmp_path)()
    assert reference.problem is p0 and time.monotonic() - began >= 0.15 and station.started_s["level0/1"] >= 0.15
    with pytest.raises(OracleError, match="the reference raised"):
        station.oracle_for(p1, settings, "cpu", tmp_path)()
    assert station.failed["level0/2"] == "the reference raised" and station.resident() == ["level0/1"]
    assert station.start_ahead(p1, settings, "cpu", tmp_path) is False   # failed here: never started again
    station.close()


def test_a_reference_failing_under_way_costs_the_submission_one_more_attempt_not_its_record(monkeypatch, tmp_path):
    """A reference that fails once an evaluation is under way (or an error of the harness's own) is no verdict on the
    submission nor, once, on its problem: the submission is judged again against a fresh reference. Twice: it has no
    record (the reason is given); MID_EVALUATION_FAILURES in a row fail the problem on the worker."""
    from conftest import make

    from harness.oracle.reference import OracleError

    started, plan = [], []

    def fake_oracle(problem, config, device, log_dir, env=None, gate=None):
        started.append(problem.id)
        return FakeReference(problem)

    def fake_evaluate(submission, oracle, *rest):
        reference = oracle()
        failure = plan.pop(0)
        if failure == "reference":
            raise OracleError(reference.problem, "the reference stopped answering", tmp_path)
        if failure == "harness":
            raise ValueError("a bug of the harness")
        return make(phases={"timing": 0.01})

    monkeypatch.setattr(pipeline, "run_oracle", fake_oracle)
    monkeypatch.setattr(pipeline.evaluation, "evaluate", fake_evaluate)
    settings = pipeline_settings(device="cpu")
    (p0,) = _problems("level0/1")
    station = pipeline.Station("cpu")

    def evaluate(*failures):
        plan[:] = list(failures)
        result = pipeline.evaluate_task(station, _submission(p0), p0.path.read_text(), settings, "cpu", None,
                                        str(tmp_path))
        assert not plan   # every planned attempt was made, and no more
        return result

    first = evaluate(None)
    assert first.record.status == Status.PASS and "retried_attempt" not in first.record.phases
    assert first.retried is None
    assert started == ["level0/1"]
    for failure in ("reference", "harness"):
        again = evaluate(failure, None)
        assert again.record.status == Status.PASS and again.problem_error is None
        assert again.record.phases["retried_attempt"] > 0 and started[-2:] == ["level0/1", "level0/1"]
        assert again.retried == ("the reference failed: the reference stopped answering" if failure == "reference"
                                 else "the judge raised ValueError: a bug of the harness")
    assert station.mid_failures == {} and station.failed == {}

    lost = evaluate("reference", "reference")   # no record, the reason given; the problem still judged
    assert lost.record is None and lost.problem_error == "the reference stopped answering"
    assert station.failed == {} and station.mid_failures == {"level0/1": 2}
    third = evaluate("reference")               # the third failure in a row: the problem is failed on this worker
    assert third.record is None and "failed during 3 evaluations in a row" in station.failed["level0/1"]
    with pytest.raises(OracleError, match="3 evaluations in a row"):
        station.oracle_for(p0, settings, "cpu", tmp_path)()

    station = pipeline.Station("cpu")
    with pytest.raises(ValueError, match="a bug of the harness"):   # the harness's own error, twice: raised
        evaluate("harness", "harness")
    station.close()


def test_a_reference_killed_while_timing_is_started_again_and_the_submission_still_judged(monkeypatch, tmp_path):
    """Real processes: the reference's process is killed just before the first evaluation's timing; that evaluation
    is tried again against a fresh reference and ends in its own status, and batch.json says why it was retried."""
    from harness.judge import evaluate as evaluation

    folder = tmp_path / "answers"
    folder.mkdir()
    (folder / "pure_pytorch.py").write_text((FIXTURES / "cpu" / "rule_violation.py").read_text())
    real_timed, killed = evaluation._timed, []

    def timed_after_a_kill(run, ref, config, record):
        if not killed:
            killed.append(ref.child.process.pid)
            os.kill(ref.child.process.pid, signal.SIGKILL)
            ref.child.process.wait()
        return real_timed(run, ref, config, record)

    monkeypatch.setattr(evaluation, "_timed", timed_after_a_kill)
    outcome = run_folder(folder, tmp_path / "run", "cpu", problem="level0/1")
    (record,) = outcome.records
    assert killed and not outcome.skipped and not outcome.problem_errors
    assert record.status == Status.RULE_VIOLATION and record.speedup is not None   # judged in full, the second time
    assert record.phases["retried_attempt"] > 0 and record.phases["reference_start"] > 0   # a fresh reference
    summary = json.loads((tmp_path / "run" / "batch.json").read_text())
    assert [label for label, _ in summary["retried"]] == [record.submission]
    assert summary["retried"][0][1] == "the reference failed: while timing: killed by SIGKILL"


def test_a_gpu_worker_takes_its_warm_jobs_then_problems_it_runs():
    from harness.pipeline.engines import LocalEngine

    p0, p1, p2 = _problems("level0/1", "level0/2", "level0/3")
    station = pipeline.Station("gpu0")
    station.references["level0/2"] = FakeReference(p1)
    engine = LocalEngine.__new__(LocalEngine)
    engine._cost = {}
    job = lambda problem, owner=None: (None, _submission(problem), (), None, None, owner, None)  # noqa: E731
    engine._jobs = [job(p0), job(p2, "gpu0"), job(p1, "gpu1"), job(p1)]
    assert engine._pick(station) == 1          # its own warm job first (it only hands a start to the background)
    engine._jobs.pop(1)
    assert engine._pick(station) == 2          # then an evaluation of the problem it runs
    engine._jobs.pop(2)
    assert engine._pick(station) == 0          # then the oldest evaluation; never another worker's job
    engine._jobs.pop(0)
    assert engine._pick(station) is None


def test_a_gpu_worker_takes_a_problem_whose_reference_is_ready_before_one_still_starting():
    from concurrent.futures import Future

    from harness.pipeline.engines import LocalEngine

    p0, p1, p2 = _problems("level0/1", "level0/2", "level0/3")
    station = pipeline.Station("gpu0")
    starting, done = Future(), Future()
    station.starting.update({"level0/1": (p0, starting), "level0/3": (p2, done)})
    engine = LocalEngine.__new__(LocalEngine)
    engine._cost = {}
    job = lambda problem: (None, _submission(problem), (), None, None, None, None)  # noqa: E731
    engine._jobs = [job(p1), job(p0), job(p2)]
    assert engine._pick(station) == 1          # still starting, but better than none at all
    done.set_result((FakeReference(p2), 1.0))
    assert engine._pick(station) == 2          # started and done: no wait
    station.references["level0/2"] = FakeReference(p1)
    assert engine._pick(station) == 0          # running here: the oldest of the ready ones
    station.starting.clear()


def test_a_gpu_worker_starts_the_references_its_queue_needs_next(tmp_path):
    from harness.pipeline.engines import LocalEngine

    p0, p1, p2, p3 = _problems("level0/1", "level0/2", "level0/3", "level0/4")
    station = pipeline.Station("gpu0")
    station.references["level0/1"] = FakeReference(p0)
    station.references["level0/4"] = FakeReference(p3)
    engine = LocalEngine.__new__(LocalEngine)
    engine._cost, engine._settings, engine._expected = {}, pipeline_settings(device="cpu", oracles_per_gpu=3), {}
    engine.stations = [station]
    asked = []
    job = lambda problem: (None, _submission(problem), (), None, None, None,  # noqa: E731
                           lambda s: asked.append(problem.id) or s.starting.setdefault(problem.id, (problem, None)))
    engine._jobs = [job(p1), job(p0), job(p2), job(p1)]
    upcoming = engine._upcoming(station, current="level0/1")
    # one entry per queued problem in the order it would take them; none for what it runs already
    assert [(problem_id, ahead is not None) for problem_id, ahead in upcoming] == [
        ("level0/2", True), ("level0/1", False), ("level0/3", True)]
    engine._start_ahead(station, "level0/1", upcoming)
    # room for one more beside level0/1 and level0/4; then level0/4 (no queued evaluation) is closed for the next
    assert asked == ["level0/2", "level0/3"] and list(station.references) == ["level0/1"]
    assert station.resident() == ["level0/1", "level0/2", "level0/3"]
    engine._jobs.append(job(p3))
    assert engine._upcoming(station, current="level0/1")[-1][0] == "level0/4"
    engine._start_ahead(station, "level0/1", engine._upcoming(station, current="level0/1"))
    assert asked == ["level0/2", "level0/3"]   # full: level0/1 runs and the others are queued, none may close

    other = pipeline.Station("gpu1")             # another GPU worker that runs level0/3 (one queued) and level0/2
    other.references.update({"level0/3": FakeReference(p2), "level0/2": FakeReference(p1)})
    engine.stations = [other, pipeline.Station("gpu0")]
    ahead_for = dict(engine._upcoming(engine.stations[1], current="level0/1"))
    # level0/3 has one queued evaluation and a worker with its reference; level0/2 has two: a second start is worth it
    assert ahead_for["level0/3"] is None and ahead_for["level0/2"] is not None and ahead_for["level0/4"] is not None


def test_a_gpu_worker_looks_ahead_to_the_builds_still_running(tmp_path):
    import threading

    from harness.pipeline.engines import LocalEngine

    p0, p1, p2, p3 = _problems("level0/1", "level0/2", "level0/3", "level0/4")
    station = pipeline.Station("gpu0")
    engine = LocalEngine.__new__(LocalEngine)
    engine._cost, engine._settings, engine._ready = {}, pipeline_settings(device="cpu", oracles_per_gpu=3), \
        threading.Lock()
    engine.stations, engine._jobs, engine._expected = [station], [], {}
    asked = []
    start = lambda problem: (lambda s: asked.append(problem.id)  # noqa: E731
                             or s.starting.setdefault(problem.id, (problem, None)))
    building = {problem.id: _submission(problem) for problem in (p3, p1, p2)}
    for problem_id, submission in building.items():   # sent in this order
        engine.expect(submission, start(submission.problem))
    engine._jobs = [(None, _submission(p2), (), None, None, None, start(p2))]
    engine.landed(building["level0/2"])              # its build failed: nothing to evaluate
    upcoming = engine._upcoming(station, current="level0/1")
    # the queued problem first, then those still building in the order they were sent; each problem once
    assert [problem_id for problem_id, _ in upcoming] == ["level0/3", "level0/4"]
    engine._start_ahead(station, "level0/1", upcoming)
    assert asked == ["level0/3", "level0/4"]
    # a submission that reaches the queue is no longer expected
    engine.evaluate = LocalEngine.evaluate.__get__(engine)
    engine._queue = lambda *args: None
    engine.evaluate(None, building["level0/4"], (), None, None)
    assert [entry[0] for entry in engine._expected.values()] == [building["level0/3"]]
    # it looks only so far into the builds: EXPECTED_AHEAD x oracles_per_gpu problems
    from harness.pipeline import engines
    engine._jobs, engine._expected = [], {}
    engine._settings = pipeline_settings(device="cpu", oracles_per_gpu=1)
    many = _problems(*(f"level0/{n}" for n in range(1, 6)))
    for problem in many:
        engine.expect(_submission(problem), start(problem))
    assert len(engine._upcoming(pipeline.Station("gpu1"), current="level9/9")) == engines.EXPECTED_AHEAD


def test_a_gpu_worker_takes_long_evaluations_first():
    from harness.pipeline.engines import LocalEngine

    p0, p1, p2 = _problems("level0/1", "level0/2", "level0/3")
    engine = LocalEngine.__new__(LocalEngine)
    engine._cost = {"level0/1": (30.0, 3), "level0/3": (40.0, 2)}    # 10 s and 20 s per evaluation so far
    job = lambda problem: (None, _submission(problem), (), None, None, None, None)  # noqa: E731
    engine._jobs = [job(p0), job(p2), job(p2)]
    assert engine._pick(pipeline.Station("gpu0")) == 1     # the longer problem, its oldest job
    engine._jobs.append(job(p1))
    assert engine._pick(pipeline.Station("gpu0")) == 3     # a problem not evaluated yet counts as longest


def test_an_evaluation_whose_candidate_never_ran_is_no_guide_to_its_problems_cost():
    """A sample that fails at import (load_error) or construction ends in seconds where one that runs takes minutes:
    its problem's other samples still count as longest; one that ran counts, whatever its verdict."""
    from harness.pipeline.engines import LocalEngine

    engine = LocalEngine.__new__(LocalEngine)
    engine._cost = {}
    evaluated = lambda status: pipeline.Evaluated(record=SimpleNamespace(status=status), busy_s=1.0,  # noqa: E731
                                                  worker="gpu0")
    for status in (Status.LOAD_ERROR, Status.INIT_ERROR, Status.COMPILE_ERROR):
        engine._count_cost("level1/7", 20.0, evaluated(status))
    no_reference = pipeline.Evaluated(record=None, busy_s=5.0, worker="gpu0", problem_error="no room")
    engine._count_cost("level1/7", 5.0, no_reference)
    assert engine._cost == {}
    engine._count_cost("level1/7", 110.0, evaluated(Status.INCORRECT))
    engine._count_cost("level1/7", 90.0, evaluated(Status.PASS))
    engine._count_cost("level2/60", 180.0, evaluated(Status.TIMEOUT))
    assert engine._cost == {"level1/7": (200.0, 2), "level2/60": (180.0, 1)}


def test_what_extraction_decides_ends_before_any_process_or_build_starts(tmp_path, monkeypatch):
    """Empty, comments only, binary, Latin-1 and too large: recorded without a build, a reference or a candidate (no
    child process at all), in well under the seconds a build's process would take."""
    files = {"empty.py": b"", "comments.py": b"# nothing yet\n\n", "blob.md": bytes(range(256)) * 4,
             "latin1.py": b"# caf\xe9\nclass ModelNew: pass\n", "huge.py": b"# padding\n" * 7_000}
    expected = {"empty.py": "no_code", "comments.py": "no_code", "blob.md": "syntax_error",
                "latin1.py": "syntax_error", "huge.py": "too_large"}
    folder = tmp_path / "level0" / "1_Tiny_ReLU"
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    started = []
    monkeypatch.setattr(subprocess.Popen, "__init__", lambda self, *a, **k: started.append(a) or 1 / 0)
    began = time.monotonic()
    outcome = run_folder(folder.parent, tmp_path / "run", "cpu", warm_candidates=1)
    elapsed = time.monotonic() - began
    assert {name: r.status.value for name, r in by_name(outcome).items()} == expected
    assert not started and outcome.summary.builds == {} and outcome.summary.gpu_tasks == 0
    assert not (tmp_path / "run" / "logs").exists() or not any((tmp_path / "run" / "logs").iterdir())
    assert elapsed < 3.0, elapsed   # about 0.1 s; a build's process alone takes seconds


def test_each_evaluation_of_the_same_file_keeps_its_own_artifacts(tmp_path):
    """Two judgings of one file (a repeated submit, a batch run again without resume) never share a folder: the
    first record's source and logs stay where it points."""
    first = pipeline.new_artifacts_dir(tmp_path, _submission(resolve_problem("level0/1")))
    second = pipeline.new_artifacts_dir(tmp_path, _submission(resolve_problem("level0/1")))
    assert first != second and first.is_dir() and second.is_dir() and second.name == f"{first.name}-2"
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "syntax_error.md").write_text((FIXTURES / "cpu" / "syntax_error.md").read_text())
    problem = resolve_problem("level0/1")
    submissions, _ = discover(folder, problem, REPO / "problems", run="again")
    records = [run_batch(submissions, pipeline_settings(device="cpu"), tmp_path / "again", resume=False).records[0]
               for _ in range(2)]
    sources = [r.source_path for r in records]
    assert sources[0] != sources[1] and all(os.path.isfile(path) for path in sources)


def test_a_batch_leaves_nothing_in_its_temporary_folder(tmp_path):
    """Candidates, references, builds and their logs work in folders the judge removes once done."""
    folder = tmp_path / "level0" / "1_Tiny_ReLU"
    folder.mkdir(parents=True)
    for path in (PASSING, FIXTURES / "cpu" / "incorrect.py", FIXTURES / "cpu" / "no_code.md"):
        (folder / path.name).write_text(path.read_text())
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    config = tmp_path / "fast.yaml"
    config.write_text(yaml.safe_dump({"warmup_ms": 1, "block_ms": 2, "min_blocks": 3, "timing_cap_s": 0.2,
                                      "build_cache_dir": TEST_SETTINGS["build_cache_dir"]}))
    done = subprocess.run([sys.executable, str(REPO / "run_eval.py"), "batch", str(tmp_path / "level0"), "--run", "r",
                           "--device", "cpu", "--results-dir", str(tmp_path / "results"), "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr[-2000:]
    statuses = sorted(json.loads(line)["status"] for line in (tmp_path / "results" / "r" / "records.jsonl").open())
    assert statuses == ["incorrect", "no_code", "pass"], statuses
    assert not list(scratch.iterdir())
