"""`submit` of a file whose text alone decides the verdict (empty, binary, Latin-1, too large, no code, a syntax
error) answers without torch (harness/pipeline/text_verdict.py), and leaves exactly what the judge's path leaves:
the same status, record, results.csv, batch.json, artifacts, summary panel and exit code. Each file is submitted
twice, once as users do and once with the text verdict turned off (the judge's path: torch, run_batch)."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from harness import cli, serve

NORMAL = {**os.environ, cli.TEXT_VERDICT_ENV: "0"}   # the judge's path, for the comparison
LIMIT = 4000   # max_submission_bytes for these tests: the oversized file is twice that


def _kinds(folder: Path) -> dict[str, tuple[Path, str, str]]:
    """name -> (file, its status, a piece of its error)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "empty": ("empty.py", b"", "no_code", "defines ModelNew"),
        "binary": ("blob.py", bytes(range(256)) * 4, "syntax_error", "not UTF-8 text: byte 0x80 at offset 128"),
        "latin1": ("latin1.py", b"# caf\xe9\nclass ModelNew:\n    pass\n", "syntax_error",
                   "not UTF-8 text: byte 0xe9 at offset 5"),
        "oversized": ("big.py", b"# pad\n" * (2 * LIMIT // 6), "too_large", "above max_submission_bytes"),
        "prose": ("answer.md", b"I would fuse the two loops.\n\n```python\nprint('no model')\n```\n", "no_code",
                  "defines ModelNew"),
        "unparsable": ("broken.md", b"Here:\n```python\nclass ModelNew(:\n    pass\n```\n", "syntax_error",
                       "SyntaxError"),
    }
    kinds = {}
    for name, (file_name, content, status, error) in files.items():
        (folder / file_name).write_bytes(content)
        kinds[name] = (folder / file_name, status, error)
    return kinds


def _submit(results: Path, submission: Path, config: Path, *flags: str, env=None, importtime: bool = False):
    python = [sys.executable, *(["-X", "importtime"] if importtime else [])]
    return subprocess.run([*python, str(REPO / "run_eval.py"), "--results-dir", str(results), "submit", "--problem",
                           "level0/1", "--submission", str(submission), "--config", str(config), *flags],
                          capture_output=True, text=True, cwd=REPO, timeout=300, env=env)


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _tree(run_dir: Path) -> dict[str, str]:
    """Every file and folder of a run, by relative path: a file's content with the results folder's path masked."""
    return {str(path.relative_to(run_dir)): path.read_text().replace(str(run_dir), "RUN") if path.is_file() else "/"
            for path in sorted(run_dir.rglob("*"))}


def _without_moments(record: dict, run_dir: Path) -> dict:
    return {key: value.replace(str(run_dir), "RUN") if isinstance(value, str) else value
            for key, value in record.items() if key != "timestamp"}


@pytest.fixture(scope="module")
def both_paths(tmp_path_factory):
    """Each kind submitted by the text verdict and by the judge's path, into results folders of their own."""
    root = tmp_path_factory.mktemp("text-verdict")
    config = root / "config.yaml"
    config.write_text(f"max_submission_bytes: {LIMIT}\n")
    kinds = _kinds(root / "files")
    runs = {}
    for name, (path, _, _) in kinds.items():
        fast = _submit(root / "fast" / name, path, config, "--device", "cpu", importtime=True)
        normal = _submit(root / "normal" / name, path, config, "--device", "cpu", env=NORMAL, importtime=True)
        runs[name] = (fast, normal, root / "fast" / name / "submit", root / "normal" / name / "submit")
    return kinds, runs, config


@pytest.mark.parametrize("kind", ["empty", "binary", "latin1", "oversized", "prose", "unparsable"])
def test_a_verdict_of_the_text_is_the_judges_without_torch(both_paths, kind):
    kinds, runs, _ = both_paths
    _, status, error = kinds[kind]
    fast, normal, fast_dir, normal_dir = runs[kind]
    assert fast.returncode == normal.returncode == 0, (fast.stderr[-2000:], normal.stderr[-2000:])
    assert "torch" not in _imported(fast.stderr) and "pandas" not in _imported(fast.stderr)
    assert "torch" in _imported(normal.stderr)   # the comparison did take the judge's path
    records = [[json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
               for run in (fast_dir, normal_dir)]
    assert [len(r) for r in records] == [1, 1]
    fast_record, normal_record = records[0][0], records[1][0]
    assert fast_record["status"] == status and error in fast_record["error"]
    assert _without_moments(fast_record, fast_dir) == _without_moments(normal_record, normal_dir)
    rows = [list(csv.DictReader((run / "results.csv").open())) for run in (fast_dir, normal_dir)]
    assert [len(r) for r in rows] == [1, 1]
    assert _without_moments(rows[0][0], fast_dir) == _without_moments(rows[1][0], normal_dir)
    fast_csv, normal_csv = ((run / "results.csv").read_text().replace(record["timestamp"], "T")
                            for run, record in ((fast_dir, fast_record), (normal_dir, normal_record)))
    assert fast_csv.replace(str(fast_dir), "RUN") == normal_csv.replace(str(normal_dir), "RUN")
    summaries = [json.loads((run / "batch.json").read_text()) for run in (fast_dir, normal_dir)]
    for summary in summaries:
        summary.pop("wall_s")
    assert summaries[0] == summaries[1]
    fast_tree, normal_tree = _tree(fast_dir), _tree(normal_dir)
    for tree in (fast_tree, normal_tree):
        tree.pop("batch.json")
        for name in ("records.jsonl", "results.csv"):
            tree[name] = re.sub(r"\d{4}-\d\d-\d\dT[\d:]+\+00:00", "T", tree[name])
    assert fast_tree == normal_tree
    wall = re.compile(r"wall \d+\.\d")
    assert wall.sub("wall", fast.stdout).replace(str(fast_dir), "RUN") == \
        wall.sub("wall", normal.stdout).replace(str(normal_dir), "RUN")
    assert "decided by extraction, nothing ran" in " ".join(fast.stdout.split())


def test_json_prints_the_record_it_writes_and_starts_no_judge(both_paths, tmp_path):
    kinds, _, config = both_paths
    results = tmp_path / "results"
    background_on = {**os.environ, cli.BACKGROUND_ENV: "1"}   # the test session turns it off (conftest.py)
    done = _submit(results, kinds["binary"][0], config, "--json", env=background_on)   # no --device: found
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)   # the whole stdout is one JSON object
    assert printed == json.loads((results / "submit" / "records.jsonl").read_text())
    assert printed["status"] == "syntax_error" and printed["device"] == "cpu"   # torch here is a CPU build
    assert "judge" not in done.stderr
    assert not serve.socket_path(results).exists() and not serve.log_path(results).exists()


def test_a_source_that_needs_a_build_takes_the_judges_path(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("warmup_ms: 1\nblock_ms: 2\nmin_blocks: 3\ntiming_cap_s: 0.2\n")
    source = tmp_path / "load_error.py"
    source.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n    raise RuntimeError('at import')\n")
    done = _submit(tmp_path / "results", source, config, "--device", "cpu", "--json", importtime=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "load_error"
    assert "torch" in _imported(done.stderr)
