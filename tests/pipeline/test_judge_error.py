"""The judge running short: a submission it cannot judge for want of room for the reference's feed gets judge_error
(no verdict), the batch goes on, lists it and says so in its exit code, prints no traceback, and a rerun judges it."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import types
from concurrent.futures import Future
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, REPO, TEST_SETTINGS, make, run_folder

from harness.cli import EXIT_JUDGE_ERROR
from harness.isolation import spawn
from harness.oracle import budget
from harness.pipeline.driver import no_verdict
from harness.report.scoring import leaderboard
from harness.shared.record import Status
from harness.shared.resources import JudgeShort, no_room, ran_short
from harness.submission.submissions import Skipped

# A right answer in plain PyTorch: no build, so the only large file of its evaluation is the reference's feed
# (level0/1: five trials of 64 x 1024 floats, about 1.3 MB).
PLAIN = '''```python
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
```
'''
FEED_TOO_BIG = 1 << 20   # bytes: the temporary space or file size the judge gets, under the feed's size


def _batch(tmp_path: Path, env: dict, preexec=None) -> subprocess.CompletedProcess:
    config = tmp_path / "fast.yaml"
    config.write_text(yaml.safe_dump({"warmup_ms": 1, "block_ms": 2, "min_blocks": 3, "timing_cap_s": 0.2,
                                      "build_cache_dir": TEST_SETTINGS["build_cache_dir"]}))
    return subprocess.run([sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(tmp_path / "results"),
                           "batch", str(tmp_path / "src"), "--problem", "level0/1", "--run", "r", "--device", "cpu",
                           "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, **env},
                          preexec_fn=preexec, check=False)


def _sources(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "plain.md").write_text(PLAIN)
    (folder / "no_code.md").write_text((FIXTURES / "cpu" / "no_code.md").read_text())


@contextlib.contextmanager
def _tiny_tmpfs(size: int):
    """A tmpfs of `size` bytes (root only): the judge's temporary folder made smaller than a feed."""
    folder = Path(tempfile.mkdtemp(prefix="tiny-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0711", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
        folder.rmdir()


def _limit_file_size() -> None:   # in the CLI's process before exec: every process of the judge inherits it
    resource.setrlimit(resource.RLIMIT_FSIZE, (FEED_TOO_BIG, resource.RLIM_INFINITY))


def _assert_short_batch(done: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert done.returncode == EXIT_JUDGE_ERROR, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    run = tmp_path / "results" / "r"
    records = {Path(r["submission"]).name: r for r in map(json.loads, (run / "records.jsonl").read_text().splitlines())}
    assert records["no_code.md"]["status"] == "no_code"       # the batch went on
    assert records["plain.md"]["status"] == "judge_error"
    assert "the judge ran short" in records["plain.md"]["error"]
    listed = json.loads((run / "batch.json").read_text())["no_verdict"]
    assert [Path(label).name for label, _ in listed] == ["plain.md"]
    assert "plain.md" in done.stdout.split("no verdict", 1)[1]   # the CLI's last lines list it
    assert "Traceback" in (run / "logs" / "oracle-level0_1.log").read_text()   # kept in the logs instead


def test_a_feed_over_the_file_size_limit_is_judge_error_and_a_rerun_judges_it(tmp_path):
    # the limit binds the oracle's write into the feed's memfd as it binds a file: the kernel refuses it (EFBIG)
    _sources(tmp_path)
    done = _batch(tmp_path, {}, preexec=_limit_file_size)
    _assert_short_batch(done, tmp_path)

    again = _batch(tmp_path, {})   # room again: the judge_error record is judged, the no_code one reused
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 reused" in again.stdout
    run = tmp_path / "results" / "r"
    last = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()][-1]
    assert Path(last["submission"]).name == "plain.md" and last["status"] in ("pass", "rule_violation")
    assert json.loads((run / "batch.json").read_text())["no_verdict"] == []


def test_the_feed_and_truth_take_no_room_in_the_temporary_folder(tmp_path):
    # they are memfds: a temporary folder smaller than the feed holds the reference's and the candidate's folders
    _sources(tmp_path)
    with _tiny_tmpfs(FEED_TOO_BIG) as tiny:
        done = _batch(tmp_path, {"TMPDIR": str(tiny)})
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (tmp_path / "results" / "r" / "records.jsonl").read_text().splitlines()]
    assert {Path(r["submission"]).name: r["status"] in ("pass", "rule_violation") for r in records} == \
        {"plain.md": True, "no_code.md": False}


# ---------------------------------------------------------------- the pieces, without a batch

def test_running_short_is_told_by_type_and_errno_never_by_wording():
    import errno

    assert ran_short(OSError(errno.ENOSPC, "No space left on device"))
    assert ran_short(OSError(errno.EFBIG, "File too large")) and ran_short(MemoryError())
    assert not ran_short(OSError(errno.ENOENT, "No space left on device"))   # the words do not count
    assert not ran_short(RuntimeError("No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "full")
        except OSError as exc:
            raise RuntimeError("unexpected pos 704 vs 598") from exc   # torch's zip writer over a full disk
    except RuntimeError as wrapped:
        assert ran_short(wrapped)
    assert ran_short(JudgeShort("no room"))


def test_no_room_reads_free_space_and_the_file_size_limit(tmp_path):
    assert no_room(tmp_path, 1) is None
    assert "free" in no_room(tmp_path, 1 << 62)
    script = ("import resource, sys; from pathlib import Path; from harness.shared.resources import no_room; "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY)); "
              "print(no_room(Path(sys.argv[1]), 8192)); print(no_room(Path(sys.argv[1]), 100))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                          timeout=60, check=False)
    first, second = done.stdout.splitlines()
    assert "file size limit" in first and second == "None"


def test_the_budget_is_the_config_or_a_share_of_the_machine():
    configured = budget.derived(available=10 * budget.GB, configured_gb=2.5)
    assert configured.limit("cpu") == configured.limit("cuda") == int(2.5 * budget.GB)
    machine = budget.derived(available=10 * budget.GB, configured_gb=None)
    assert machine.memory_bytes == 5 * budget.GB
    assert machine.limit("cuda") == machine.limit("cpu") == 5 * budget.GB   # GPU unbounded unless set
    assert budget.derived(None, None).limit("cpu") is None
    assert budget.derived(None, 0.0).limit("cpu") == 0   # nothing started ahead
    # four GPU workers of one host: together the share, not four times it
    assert budget.derived(available=10 * budget.GB, configured_gb=None, sharers=4).memory_bytes == int(1.25 * budget.GB)
    assert budget.derived(available=10 * budget.GB, configured_gb=2.5, sharers=4).memory_bytes == int(2.5 * budget.GB)


def test_the_gpu_workers_of_one_host_split_its_share(monkeypatch):
    from harness.pipeline import engines
    from harness.shared.config import load_config
    from harness.shared.settings import PipelineSettings

    settings = PipelineSettings.from_config(load_config(None, {"gpus": "0,1,2,3"}))
    monkeypatch.setattr(budget, "available_memory", lambda: 64 * budget.GB)
    # the engine's own names only: a class patched for the whole process broke any executor or thread that something
    # else (a Dask cluster left by an earlier test) made meanwhile
    monkeypatch.setattr(engines, "ThreadPoolExecutor", lambda *args, **kwargs: None)
    idle = types.SimpleNamespace(start=lambda: None)
    monkeypatch.setattr(engines, "threading", types.SimpleNamespace(**{**vars(engines.threading),
                                                                       "Thread": lambda *args, **kwargs: idle}))
    stations = engines.LocalEngine(settings, "cuda").stations
    assert [s.name for s in stations] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert sum(s.limit(settings, "cpu") for s in stations) == 32 * budget.GB   # BUDGET_SHARE of 64 GB in all
    specs = engines.worker_specs(settings, "cuda", tag="t")   # a Dask `worker` command's GPU processes are told
    told = [spec["options"]["env"] for spec in specs.values() if "env" in spec["options"]]
    assert len(told) == 4 and {env[budget.HOST_WORKERS_ENV] for env in told} == {"4"}
    monkeypatch.setenv(budget.HOST_WORKERS_ENV, told[0][budget.HOST_WORKERS_ENV])
    assert budget.host_workers() == 4 and budget.for_machine(settings.judge_config, budget.host_workers()) \
        .memory_bytes == 8 * budget.GB
    monkeypatch.setenv(budget.HOST_WORKERS_ENV, "many")
    assert budget.host_workers() == 1


def test_a_reference_fits_beside_those_held_or_is_not_started_ahead():
    gb = budget.GB
    assert budget.fits([4 * gb, 4 * gb], 2 * gb, 10 * gb)
    assert not budget.fits([4 * gb, 4 * gb], 3 * gb, 10 * gb)
    assert budget.fits([4 * gb, 4 * gb], 10**15, None)      # no bound
    assert not budget.fits([], 1, 0)
    sizes = {"level2/19": 9 * gb, "level2/62": 2 * gb}
    assert budget.expected_size("level2/62", sizes) == 2 * gb      # its own size from an earlier start
    assert budget.expected_size("level2/1", sizes) == 9 * gb       # unknown: the largest seen
    assert budget.expected_size("level2/1", {}) == 0               # nothing known: the first one starts


def test_a_station_starts_ahead_only_what_fits(monkeypatch):
    from harness.pipeline import driver
    from harness.shared.config import load_config
    from harness.shared.problems import resolve_problem
    from harness.shared.settings import PipelineSettings

    started = []
    monkeypatch.setattr(driver.threading, "Thread", lambda target, **kw: type("T", (), {
        "start": lambda self: started.append(target)})())
    station = driver.Station("w")
    station.sizes = {"level0/1": 3 * budget.GB, "level0/2": 3 * budget.GB}
    settings = PipelineSettings.from_config(load_config(None, {"ahead_budget_gb": 5.0}))
    one, two = resolve_problem("level0/1"), resolve_problem("level0/2")
    assert station.start_ahead(one, settings, "cpu", Path("/nonexistent"))
    assert not station.start_ahead(two, settings, "cpu", Path("/nonexistent"))   # 3 + 3 GB over 5
    assert len(started) == 1


def test_judge_error_is_in_no_rate_and_no_denominator():
    records = [make(Status.PASS, speedup=2.0), make(Status.INCORRECT), make(Status.JUDGE_ERROR),
               make(Status.JUDGE_ERROR)]
    row = leaderboard(records).iloc[0]
    assert row["n"] == 2 and row["pass_rate"] == 0.5 and row["fast_0"] == 0.5 and row["judge_error"] == 2
    only = leaderboard([make(Status.JUDGE_ERROR)]).iloc[0]
    assert only["n"] == 0 and only["pass_rate"] != only["pass_rate"]   # NaN: nothing judged, not 0%


def test_every_submission_without_a_verdict_is_listed_with_why():
    records = [make(Status.PASS, submission="a"), make(Status.JUDGE_ERROR, submission="b", error="the judge ran short")]
    listed = no_verdict(["a", "b", "c", "d"], records, [Skipped("c", "reference failed")])
    assert listed[:2] == [("b", "the judge ran short"), ("c", "reference failed")]
    assert listed[2][0] == "d" and "no record" in listed[2][1]
    assert no_verdict(["a", "d"], records, [], interrupted=True) == []   # interrupted: the rerun resumes them


def test_a_build_that_fails_with_no_room_left_is_judge_error_and_is_not_kept(tmp_path, monkeypatch):
    # A compile that fails while its folder has no room may have failed for want of it: the machine's failure, never
    # cached as the submission's compile_error (the same failure with room is the submission's, and kept)
    from harness.build import builder

    source = (FIXTURES / "cheap_relu.py").read_text().replace("Py_RETURN_NONE;", "Py_RETURN_NONE")   # no ';'
    config, target = judge_config_for_builds(tmp_path), builder.Target("cpu")
    monkeypatch.setattr(builder.resources, "no_room", lambda folder, needed: f"{folder} has 0.0 MB free")
    short = builder.build(source, config, target, tmp_path / "cache", tmp_path / "short.log")
    assert (short.status, short.outcome) == (Status.JUDGE_ERROR, "failed") and "ran short" in short.error
    assert not any((tmp_path / "cache").glob("*/manifest.json"))
    monkeypatch.undo()
    failed = builder.build(source, config, target, tmp_path / "cache", tmp_path / "room.log")
    assert failed.status == Status.COMPILE_ERROR
    assert builder.build(source, config, target, tmp_path / "cache", tmp_path / "again.log").outcome == "cached"


def judge_config_for_builds(tmp_path: Path):
    from harness.shared.config import load_config

    return load_config(None, {**TEST_SETTINGS, "build_cache_dir": str(tmp_path / "cache")})


KILLED = '''```python
import os
import signal

import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        os.kill(os.getpid(), signal.SIGKILL)
```
'''


@pytest.mark.parametrize("host_oom", [True, False])
def test_a_candidate_killed_while_the_oom_killer_ran_says_so_and_stays_a_crash(tmp_path, monkeypatch, host_oom):
    # A SIGKILL no one here sent while the kernel's out-of-memory killer ran (its count rose since the candidate
    # started): most likely the host ran out of memory, and the record says so. The status stays the submission's
    # crash: without a memory.max of its own, its use cannot be told from the host's, and a candidate could run the
    # host out of memory on purpose to turn a crash into a record with no verdict.
    counts = itertools.count()
    monkeypatch.setattr(spawn, "oom_kills", (lambda: next(counts)) if host_oom else (lambda: 7))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "killed.md").write_text(KILLED)
    (record,) = run_folder(tmp_path / "src", tmp_path / "run", "cpu", problem="level0/1").records
    assert record.status == Status.CRASH and "killed by SIGKILL" in record.error, (record.status, record.error)
    assert ("out-of-memory killer ran (the host out of memory?)" in record.error) == host_oom, record.error


class _Held:
    """A reference as the station holds one: closing it is all a test needs."""

    def __init__(self, problem_id: str, closed: list):
        self.problem_id, self.closed = problem_id, closed

    def close(self) -> None:
        self.closed.append(self.problem_id)


OUT_OF_HOST_MEMORY = f"killed by SIGKILL {spawn.HOST_OOM_NOTE} (the host out of memory?) during timing"


@pytest.mark.parametrize("device, error, others, judged", [
    ("cpu", OUT_OF_HOST_MEMORY, True, 2),
    ("cuda", "during timing: OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB", True, 2),
    ("cpu", OUT_OF_HOST_MEMORY, False, 1),                     # no other reference held memory: the record stands
    ("cpu", "during timing: OutOfMemoryError: CUDA out of memory.", True, 1),   # a CPU evaluation's words: its own
    ("cuda", "killed by SIGKILL during timing", True, 1),      # no out-of-memory: the submission's crash
], ids=["host", "cuda-allocation", "alone", "cpu-says-cuda", "no-oom"])
def test_an_evaluation_out_of_memory_beside_other_references_is_judged_again_with_them_closed(
        monkeypatch, tmp_path, device, error, others, judged):
    from harness.pipeline import driver
    from harness.shared.config import load_config
    from harness.shared.problems import resolve_problem
    from harness.shared.settings import PipelineSettings
    from harness.submission.submissions import Submission

    closed: list = []
    station = driver.Station("w")
    if others:   # one running, one started in the background (its start over, not yet used)
        station.references["level0/2"] = _Held("level0/2", closed)
        started: Future = Future()
        started.set_result((_Held("level0/3", closed), 4.0))
        station.starting["level0/3"] = (None, started)
    station.references["level0/1"] = mine = _Held("level0/1", closed)
    monkeypatch.setattr(station, "oracle_for", lambda *args: lambda: mine)
    status = Status.CRASH if "SIGKILL" in error else Status.RUNTIME_ERROR
    outcomes = iter([make(status, error=error), make(status, error=error)])   # the second stands, whatever it is
    calls = []
    monkeypatch.setattr(driver.evaluation, "evaluate", lambda *args: calls.append(args[1]()) or next(outcomes))
    problem = resolve_problem("level0/1")
    submission = Submission(label="s.py", text="", is_python=True, problem=problem)
    settings = PipelineSettings.from_config(load_config(None, {}))
    result = driver.evaluate_task(station, submission, problem.path.read_text(), settings, device, None,
                                  str(tmp_path))
    assert len(calls) == judged and all(reference is mine for reference in calls)
    assert result.record.status == status and (result.retried is not None) == (judged == 2)
    if judged == 2:
        assert "ran out of memory beside the references of 2 other problem" in result.retried
        assert closed == ["level0/3", "level0/2"] and list(station.references) == ["level0/1"]   # its own kept
        assert station.starting == {} and station.unused_ahead_s == 4.0
        assert result.record.phases["retried_attempt"] >= 0
    else:
        assert closed == [] and len(station.references) + len(station.starting) == 1 + 2 * others
