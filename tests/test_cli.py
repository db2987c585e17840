"""The command line as users run it: a subprocess, stdout and exit codes. Calls that must end before any work (usage
errors, an unwritable folder) run in this process: the same `main`, without an interpreter and torch to start."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from conftest import FIXTURES, REPO, TEST_SETTINGS, make

from harness import cli
from harness.cli import _parser


def run_cli(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_eval.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def run_cli_here(*args: str) -> subprocess.CompletedProcess:
    """`main` in this process, for a call that ends before it starts any work (no child, no worker thread)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:   # argparse
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def test_submit_json_is_one_object_and_nothing_else(tmp_path):
    config = tmp_path / "fast.yaml"
    config.write_text("warmup_ms: 1\nblock_ms: 2\nmin_blocks: 3\ntiming_cap_s: 0.2\n")
    result = run_cli("--results-dir", str(tmp_path), "submit", "--problem", "level0/1", "--submission",
                     str(FIXTURES / "cpu" / "rule_violation.py"), "--device", "cpu", "--config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)  # the whole stdout is one JSON object
    assert record["status"] == "rule_violation" and record["correct"] is True
    assert record["problem"] == "level0/1" and record["device"] == "cpu"
    assert record["speedup"] > 0 and len(record["submission_hash"]) == 16
    assert record["check_status"] == "pass" and "no_custom_kernel" in record["flags"]
    # The same record under another profile: KernelBench's legacy rules allow pure PyTorch.
    for profile, passes in ((None, "0"), ("kernelbench-legacy", "1"), ("strict", "0")):
        args = ["--profile", profile] if profile else []
        board = run_cli("--results-dir", str(tmp_path), "leaderboard", *args)
        assert board.returncode == 0, board.stderr
        name = f"leaderboard-{profile}.csv" if profile else "leaderboard.csv"
        row = next(csv.DictReader((tmp_path / name).open()))
        assert row["pass"] == passes, (profile, row)


def test_bad_config_names_file_and_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("trails: 2\n")
    result = run_cli_here("submit", "--problem", "level0/1", "--submission", str(FIXTURES / "cpu" / "no_code.md"),
                          "--config", str(config))
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "'trails'" in result.stderr


def test_unknown_problem_exit_code():
    result = run_cli_here("submit", "--problem", "level9/99", "--submission", str(FIXTURES / "cpu" / "no_code.md"))
    assert result.returncode == 2 and "level9/99" in result.stderr


def test_batch_then_leaderboard(tmp_path):
    folder = tmp_path / "level0" / "1_Tiny_ReLU"
    folder.mkdir(parents=True)
    for name in ("no_code.md", "syntax_error.md", "load_error.py"):
        (folder / name).write_text((FIXTURES / "cpu" / name).read_text())
    run, results = "cli", tmp_path / "results"
    result = run_cli("--results-dir", str(results), "batch", str(tmp_path / "level0"), "--run", run, "--device",
                     "cpu", "--model", "fixture-model")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (results / run / "records.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in records) == ["load_error", "no_code", "syntax_error"]
    assert (results / run / "results.csv").is_file()
    # the module failed in the build child too (a GPU might change that): left to its evaluation, with why
    deferred = json.loads((results / run / "batch.json").read_text())["deferred"]
    assert [label.endswith("load_error.py") for label, _ in deferred] == [True], deferred
    assert "NameError" in deferred[0][1], deferred
    out_csv = tmp_path / "board.csv"
    board = run_cli("leaderboard", str(results / run), "--output", str(out_csv))
    assert board.returncode == 0, board.stderr
    text = out_csv.read_text()
    assert text.splitlines()[0].startswith("model,run,precision,n,") and "fixture-model" in text
    # A rerun reuses every finished record and judges nothing again.
    again = run_cli("--results-dir", str(results), "batch", str(tmp_path / "level0"), "--run", run, "--device",
                    "cpu", "--model", "fixture-model")
    assert "3 reused" in again.stdout
    assert len((results / run / "records.jsonl").read_text().splitlines()) == 3


# ---------------------------------------------------------------- what a new user hits first

def _fast_config(tmp_path, **keys) -> str:
    """Fast timing and the session's build cache (warm once examples_batch_cpu has run)."""
    settings = {"warmup_ms": 1, "block_ms": 2, "min_blocks": 3, "timing_cap_s": 0.2,
                "build_cache_dir": TEST_SETTINGS["build_cache_dir"], **keys}
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(settings))
    return str(path)


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_demo_leaderboard_counts_each_record_once(examples_demo):
    done, results = examples_demo   # scripts/demo.sh, run once for the session (conftest.py)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = sorted(p.parent.name for p in results.glob("*/records.jsonl"))
    assert runs == ["examples-level0-cpu", "examples-level2-" + ("cuda" if torch.cuda.is_available() else "cpu")]
    records = [r for run in runs for r in _records(results / run / "records.jsonl")]
    rows = list(csv.DictReader((results / "leaderboard-examples.csv").open()))
    assert sum(int(row["n"]) for row in rows) == len(records) > 0
    for status in {r["status"] for r in records}:
        assert sum(int(row[status]) for row in rows) == sum(r["status"] == status for r in records), status
    for run in runs:   # each run's table holds its own batch
        table = list(csv.DictReader((results / run / "results.csv").open()))
        assert len(table) == len(_records(results / run / "records.jsonl"))


@pytest.mark.parametrize("stop, code, said", [(signal.SIGINT, 130, "interrupted: 1 records kept"),
                                              (signal.SIGTERM, 143, "terminated (SIGTERM): 1 records kept")])
def test_usr1_shows_where_it_waits_and_a_stop_keeps_what_finished_and_leaves_no_process(tmp_path, stop, code, said):
    folder = tmp_path / "level0" / "1_Tiny_ReLU"
    folder.mkdir(parents=True)
    for name in ("no_code.md", "timeout.py"):
        (folder / name).write_text((FIXTURES / "cpu" / name).read_text())
    results, scratch = tmp_path / "results", tmp_path / "tmp"
    scratch.mkdir()   # the batch's children work in folders under it: how this test tells them from any other
    command = [sys.executable, str(REPO / "run_eval.py"), "batch", str(tmp_path / "level0"), "--run", "stop",
               "--device", "cpu", "--results-dir", str(results), "--config", _fast_config(tmp_path, run_timeout_s=120)]
    # SIGINT as a terminal leaves it: a test run started in the background (CI) inherits it ignored, and Python only
    # turns SIGINT into KeyboardInterrupt when it is not ignored.
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TMPDIR": str(scratch)},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not _children_under(scratch, "/candidate-") and time.monotonic() < deadline:
            time.sleep(0.5)   # until the candidate's evaluation runs (its forward loops until run_timeout_s)
        assert _children_under(scratch, "/candidate-"), "the batch never started the candidate's evaluation"
        time.sleep(2)
        process.send_signal(signal.SIGUSR1)   # every thread's stack to stderr; the batch goes on
        time.sleep(1)
        assert process.poll() is None, "SIGUSR1 ended the batch"
        process.send_signal(stop)   # what Ctrl-C sends to the command in the foreground; `kill`, a batch system
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == code, stderr[-2000:]
    assert said in stderr and "rerun the same command to resume" in stderr
    assert "Traceback" not in stderr
    assert "(most recent call first)" in stderr and "in cmd_batch" in stderr, stderr[-3000:]   # the main thread's
    assert [r["status"] for r in _records(results / "stop" / "records.jsonl")] == ["no_code"]
    assert (results / "stop" / "results.csv").is_file()
    assert json.loads((results / "stop" / "batch.json").read_text())["interrupted"] is True
    assert not _children_under(scratch, "harness."), "children left running after the interrupt"
    assert not sorted(p.name for p in scratch.iterdir()), "the interrupted batch left these in its temporary folder"


def _children_under(scratch, needle: str) -> list[str]:
    """Command lines of live processes started with a spec under `scratch` that contain `needle`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in line and str(scratch) in line:
            found.append(line)
    return found


def test_an_unwritable_results_folder_is_one_line_before_any_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = str(blocker / "results")   # below a file: no one can create it, root included
    no_code = str(FIXTURES / "cpu" / "no_code.md")
    for args in (["submit", "--problem", "level0/1", "--submission", no_code, "--device", "cpu"],
                 ["batch", str(FIXTURES / "cpu"), "--problem", "level0/1", "--device", "cpu"],
                 ["leaderboard"], ["leaderboard", "--output", unwritable + "/board.csv"]):
        result = run_cli_here("--results-dir", unwritable, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("error: cannot write to") and "Traceback" not in result.stderr, args
    (tmp_path / "records.jsonl").write_text(make().to_json() + "\n")   # a run to report on, somewhere readable
    report = run_cli_here("report", str(tmp_path), "--out", unwritable)
    assert report.returncode == 2 and report.stderr.startswith("error: cannot write to"), report.stderr


def test_a_batch_that_judges_nothing_fails(tmp_path):
    (tmp_path / "notes.py").write_text("print('no problem can be inferred for me')\n")
    result = run_cli_here("--results-dir", str(tmp_path / "results"), "batch", str(tmp_path))
    assert result.returncode == 2 and "nothing to judge" in result.stderr


def test_a_too_large_submission_is_recorded_and_never_copied(tmp_path):
    big = tmp_path / "big.md"
    big.write_text("```python\nclass ModelNew: pass\n```\n" + "x" * 5000)
    result = run_cli("--results-dir", str(tmp_path), "submit", "--problem", "level0/1", "--submission", str(big),
                     "--device", "cpu", "--config", _fast_config(tmp_path, max_submission_bytes=1000), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["status"] == "too_large" and "max_submission_bytes" in record["error"]
    assert record["source_path"] is None and not list(tmp_path.glob("submit/artifacts/**/source.py"))


def test_a_cached_build_and_the_time_split_are_shown(tmp_path, examples_batch_cpu):
    passing = REPO / "submissions" / "examples" / "level0" / "1_Tiny_ReLU" / "correct_cpp.py"
    result = run_cli("--results-dir", str(tmp_path), "submit", "--problem", "level0/1", "--submission", str(passing),
                     "--device", "cpu", "--config", _fast_config(tmp_path))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "pass" in text and "cached: this build was done by an earlier run" in text
    assert "time s" in text and "wall" in text and "evaluation" in text


def test_configs_by_name_typos_and_results_dir_after_the_command(tmp_path, capsys):
    no_code = str(FIXTURES / "cpu" / "no_code.md")
    strict = run_cli("submit", "--problem", "level0/1", "--submission", no_code, "--device", "cpu", "--config",
                     "strict", "--json", "--results-dir", str(tmp_path / "after"))
    assert strict.returncode == 0, strict.stderr
    assert json.loads(strict.stdout)["profile"] == "strict" and (tmp_path / "after" / "submit").is_dir()
    typo = run_cli_here("submit", "--problem", "level0/1", "--submission", no_code, "--config", "strcit")
    assert typo.returncode == 2 and "did you mean strict?" in typo.stderr
    profile = run_cli_here("--results-dir", str(tmp_path), "leaderboard", "--profile", "fusoin")
    assert profile.returncode == 2 and "did you mean fusion?" in profile.stderr
    problem = run_cli_here("submit", "--problem", "level2/620", "--submission", no_code)
    assert problem.returncode == 2 and "did you mean level2/62?" in problem.stderr
    for command in ("submit", "batch", "leaderboard", "report", "problems", "baseline"):
        with pytest.raises(SystemExit):
            _parser().parse_args([command, "--help"])
        assert "--results-dir" in capsys.readouterr().out, command


def test_cpu_batches_speak_of_cpu_workers_and_start_no_unused_reference(tmp_path):
    results = tmp_path / "results"
    result = run_cli("--results-dir", str(results), "batch", str(FIXTURES / "cpu" / "needs_cuda.py"), "--problem",
                     "level2/62", "--device", "cpu", "--run", "cuda-only",
                     "--config", _fast_config(tmp_path, build_cache_dir=str(tmp_path / "cache")))   # built here
    assert result.returncode == 0, result.stderr
    assert "GPU" not in result.stdout + result.stderr and "CPU workers" in result.stdout
    summary = json.loads((results / "cuda-only" / "batch.json").read_text())
    assert summary["builds"] == {"needs_cuda": 1} and summary["ahead_s"] == 0 and summary["gpu_tasks"] == 0
    assert not list((results / "cuda-only").glob("logs/oracle-*.log"))   # no reference was started


def test_files_that_are_not_utf8_text_are_refused_with_the_reason(tmp_path):
    latin = tmp_path / "latin1.py"
    latin.write_bytes(b"# caf\xe9\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n    pass\n")
    binary = tmp_path / "blob.md"
    binary.write_bytes(bytes(range(256)) * 4)
    for path, where in ((latin, "offset 5"), (binary, "offset 128")):
        result = run_cli("--results-dir", str(tmp_path), "submit", "--problem", "level0/1", "--submission",
                         str(path), "--device", "cpu", "--json")
        assert result.returncode == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["status"] == "syntax_error" and "not UTF-8 text" in record["error"] and where in record["error"]
        assert "line None" not in record["error"]


def test_precision_is_a_flag_of_the_commands_that_run_a_reference(capsys):
    from harness.cli import _config

    for command in (["submit", "--problem", "level0/1", "--submission", "s.py"], ["batch", "folder"], ["baseline"],
                    ["problems", "--check"]):
        assert _config(_parser().parse_args([*command, "--precision", "bf16"])).precision == "bf16"
        assert _config(_parser().parse_args(command)).precision == "fp32"
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["batch", "folder", "--precision", "fp8"])
    assert exited.value.code == 2 and "fp8" in capsys.readouterr().err


def test_reading_commands_never_import_torch(tmp_path):
    # leaderboard and its like only read records: torch's 2 s import is for the commands that judge
    records = tmp_path / "records.jsonl"
    records.write_text(make(speedup=2.0).to_json() + "\n")
    script = ("import sys; from harness.cli import main; "
              f"code = main(['leaderboard', {str(records)!r}, '--output', {str(tmp_path / 'board.csv')!r}]); "
              "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "0 False", done.stderr


def test_a_missing_problems_folder_names_the_ways_to_point_at_one(tmp_path):
    # Outside a checkout the data root is the current folder: the error says how to name the real one.
    submit = ["submit", "--problem", "level0/1", "--submission", str(FIXTURES / "cpu" / "no_code.md")]
    for command in (["problems"], submit):
        result = run_cli_here("--root", str(tmp_path), *command)
        assert result.returncode == 2, result.stderr
        assert str(tmp_path / "problems") in result.stderr
        assert "--root" in result.stderr and "KERNEL_JUDGE_ROOT" in result.stderr, result.stderr
    given = run_cli_here("problems", "--problems-dir", str(tmp_path / "mine"))   # named by the user: no hint
    assert given.returncode == 2 and "KERNEL_JUDGE_ROOT" not in given.stderr


def test_problem_ids_by_file_stem_and_typos_suggest(tmp_path):
    typo = run_cli_here("submit", "--problem", "levl0/1", "--submission", str(FIXTURES / "cpu" / "no_code.md"))
    assert typo.returncode == 2 and "did you mean level0/1?" in typo.stderr


def test_idle_timeouts_are_positive_seconds_and_the_background_judge_has_a_default(capsys):
    submit = ["submit", "--problem", "level0/1", "--submission", "s.py"]
    assert _parser().parse_args(submit).idle_timeout == cli.DEFAULT_IDLE_TIMEOUT_S >= 60
    assert _parser().parse_args([*submit, "--idle-timeout", "1.5"]).idle_timeout == 1.5
    assert _parser().parse_args(["serve"]).idle_timeout is None   # a serve started by hand runs until stopped
    assert _parser().parse_args(["serve", "--idle-timeout", "30"]).idle_timeout == 30
    for bad in ("0", "-5", "soon"):
        with pytest.raises(SystemExit):
            _parser().parse_args([*submit, "--idle-timeout", bad])
        assert "expected seconds > 0" in capsys.readouterr().err


def test_the_background_judge_can_be_turned_off_by_flag_or_environment(monkeypatch):
    submit = ["submit", "--problem", "level0/1", "--submission", "s.py"]
    monkeypatch.delenv(cli.BACKGROUND_ENV, raising=False)
    assert cli._background_wanted(_parser().parse_args(submit))
    assert not cli._background_wanted(_parser().parse_args([*submit, "--no-background"]))
    for off in ("0", "false", "No", "off"):
        monkeypatch.setenv(cli.BACKGROUND_ENV, off)
        assert not cli._background_wanted(_parser().parse_args(submit))
    monkeypatch.setenv(cli.BACKGROUND_ENV, "1")
    assert cli._background_wanted(_parser().parse_args(submit))


def test_a_second_batch_on_a_run_being_judged_stops_at_once_and_names_the_first(tmp_path):
    from harness.pipeline.run_folder import LOCK_FILE, claimed

    run_dir = tmp_path / "results" / "r"
    args = ("--results-dir", str(tmp_path / "results"), "batch", str(FIXTURES / "cpu" / "no_code.md"),
            "--problem", "level0/1", "--device", "cpu", "--run", "r")
    with claimed(run_dir):   # as a batch started earlier on the same run holds it
        busy = run_cli_here(*args)
        assert busy.returncode == 2, busy.stderr
        assert f"being judged by another batch (pid {os.getpid()} on " in busy.stderr, busy.stderr
        assert "Traceback" not in busy.stderr
        assert not (run_dir / "records.jsonl").exists()
    done = run_cli_here(*args)   # the first one has ended: the run is free again, and the lock file stays
    assert done.returncode == 0, done.stderr
    assert len((run_dir / "records.jsonl").read_text().splitlines()) == 1
    assert (run_dir / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on ")
