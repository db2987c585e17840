"""The command line as users run it: a subprocess, stdout and exit codes."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

from conftest import FIXTURES, REPO


def run_cli(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_eval.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


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
    result = run_cli("submit", "--problem", "level0/1", "--submission", str(FIXTURES / "cpu" / "no_code.md"),
                     "--config", str(config))
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "'trails'" in result.stderr


def test_unknown_problem_exit_code():
    result = run_cli("submit", "--problem", "level9/99", "--submission", str(FIXTURES / "cpu" / "no_code.md"))
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
    out_csv = tmp_path / "board.csv"
    board = run_cli("leaderboard", str(results / run), "--output", str(out_csv))
    assert board.returncode == 0, board.stderr
    text = out_csv.read_text()
    assert text.splitlines()[0].startswith("model,run,n,") and "fixture-model" in text
    # A rerun reuses every finished record and judges nothing again.
    again = run_cli("--results-dir", str(results), "batch", str(tmp_path / "level0"), "--run", run, "--device",
                    "cpu", "--model", "fixture-model")
    assert "3 reused" in again.stdout
    assert len((results / run / "records.jsonl").read_text().splitlines()) == 3
