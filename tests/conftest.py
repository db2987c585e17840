"""Shared fixtures: building extensions is slow (~20 s each on 2 cores), so each batch runs once per session."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from harness.pipeline.batch import run_batch
from harness.shared.config import load_config
from harness.shared.problems import resolve_problem
from harness.shared.record import Record, Status, read_records, record_fields
from harness.shared.settings import PipelineSettings
from harness.submission.submissions import discover

# One temporary root for the whole session, children included (they inherit TMPDIR), removed at its end: what the
# judge or a killed test leaves there never piles up in the machine's /tmp, and a test can tell the judge's own
# leftovers from anyone else's.
SESSION_TMP = tempfile.mkdtemp(prefix="judge-tests-")
os.chmod(SESSION_TMP, 0o711)   # a candidate under a uid of its own must reach its folder here, as under /tmp
os.environ["TMPDIR"] = tempfile.tempdir = SESSION_TMP
# The tests' many `submit`s judge in their own process: a background judge for each throwaway results folder would
# outlive its test by its idle timeout. tests/test_judge_server.py turns it back on where it tests it.
os.environ["KERNEL_JUDGE_BACKGROUND"] = "0"

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = REPO / "submissions" / "examples"
CONTROLS = REPO / "submissions" / "controls"
SEEDS = Path(os.environ.get("JUDGE_SEEDS_DIR", REPO.parent / "shared" / "seeds"))  # never copied into the repo
SEED_PROBLEM = REPO / "problems" / "level2" / "62_Matmul_GroupNorm_LeakyReLU_Sum.py"
_EXPECTED = re.compile(r"^#\s*expected:\s*([\w|]+)", re.MULTILINE)

# Fast timing and tight limits for tests; gradients required so grad_mismatch / no_grad are statuses.
# The build cache is one folder for the whole session: a fixture built once is reused by later batches, as in use.
TEST_SETTINGS = {"grad_failure_fails": True, "run_timeout_s": 15.0, "compile_timeout_s": 300.0,
                 "warmup_ms": 1.0, "block_ms": 2.0, "min_blocks": 3, "timing_cap_s": 0.2, "max_block_reps": 50,
                 "max_submission_bytes": 64_000,   # fixtures/cpu/too_large.py is above it, every other file well below
                 "build_cache_dir": tempfile.mkdtemp(prefix="judge-test-builds-")}


def expected_status(path: Path) -> str:
    """The status a fixture's '# expected: <status>' line names; 'a|b' where either may occur (races)."""
    match = _EXPECTED.search(path.read_text())
    if match is None:
        raise ValueError(f"{path} has no '# expected: <status>' line")
    return match.group(1)


def matches_expected(status: str, path: Path) -> bool:
    return status in expected_status(path).split("|")


def header(path: Path, key: str) -> str | None:
    """The value of a '# key: value' line in a fixture's header, if any."""
    match = re.search(rf"^#\s*{re.escape(key)}:\s*(.+)$", path.read_text(), re.MULTILINE)
    return match.group(1).strip() if match else None


def expected_flags(path: Path) -> set[str]:
    """Findings a fixture's '# flags: a b' line says its record must carry."""
    return set((header(path, "flags") or "").split())


def copy_fixtures(source: Path, target_root: Path, default_problem: str) -> dict[str, Path]:
    """Fixtures copied into one folder per '# problem:' header (default_problem when absent)."""
    folders: dict[str, Path] = {}
    for path in sorted(source.glob("*.py")):
        problem = header(path, "problem") or default_problem
        folder = folders.setdefault(problem, target_root / problem.replace("/", "_"))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / path.name).write_text(path.read_text())
    return folders


def make(status=Status.PASS, speedup=None, model="m", run="r", **fields):
    """A record with every measurement unset but the given ones (for scoring and profile tests)."""
    base = {name: None for name in record_fields()}
    base.update(problem="level0/1", submission="s.py", submission_hash="h", status=status, device="cpu",
                precision="fp32", torch_version="x", config_hash="c", timestamp="t", model=model, run=run,
                speedup=speedup,
                compiled=status not in (Status.NO_CODE, Status.COMPILE_ERROR),
                correct=status in (Status.PASS, Status.RULE_VIOLATION))
    base.update(fields)
    return Record(**base)


def alive(pid: int, group: bool = False) -> bool:
    """The process `pid` (with `group`: any process of the process group `pid`) still exists."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    return True


def judge_config(**overrides):
    return load_config(None, {**TEST_SETTINGS, **overrides})


def pipeline_settings(**overrides) -> PipelineSettings:
    """What the batch pipeline takes (harness/pipeline) for judge_config(**overrides)."""
    return PipelineSettings.from_config(judge_config(**overrides))


def run_folder(source: Path, run_dir: Path, device: str, problem: str | None = None, order=None, **overrides):
    """The batch of `source`'s submissions; `order`: a sort key for the order they are sent in (None: as found)."""
    target = resolve_problem(problem) if problem else None
    submissions, skipped = discover(source, target, REPO / "problems", run=run_dir.name)
    assert not skipped, skipped
    if order is not None:
        submissions.sort(key=order)
    return run_batch(submissions, pipeline_settings(device=device, **overrides), run_dir)


class _ByName(dict):
    """Records by file name; a name without a record says why (the batch's skipped submissions)."""

    def __init__(self, outcome):
        super().__init__((Path(r.submission).name, r) for r in outcome.records)
        self.outcome = outcome

    def __missing__(self, name):
        raise KeyError(f"no record of {name}; skipped: {[(s.label, s.reason) for s in self.outcome.skipped]}")


def by_name(outcome) -> dict:
    return _ByName(outcome)


@pytest.fixture(scope="session")
def cpu_fixture_batch(tmp_path_factory):
    """Every CPU fixture but the compile timeout, judged against level0/1 in one batch."""
    folder = tmp_path_factory.mktemp("cpu_fixtures")
    for path in (FIXTURES / "cpu").iterdir():
        if path.name != "timeout_compile.py":
            (folder / path.name).write_text(path.read_text())
    # the two failing torch/extension.h compiles (~25 s each on 2 cores) go to the build pool last: the quick builds
    # ahead of them feed the evaluations meanwhile
    return run_folder(folder, tmp_path_factory.mktemp("runs") / "cpu_fixtures", "cpu", problem="level0/1",
                      order=lambda s: Path(s.label).name.startswith("compile_error"))


@pytest.fixture(scope="session")
def examples_demo(tmp_path_factory):
    """scripts/demo.sh run once with the tests' settings (TEST_SETTINGS, the session's build cache): (its process, its
    results folder). Its runs are the demo test's, and its level0 run is the CPU examples' (examples_batch_cpu): each
    example compiled and judged once in the session, where the demo test used to judge them all a second time."""
    results = tmp_path_factory.mktemp("demo") / "results"
    config = results.parent / "tests.yaml"
    config.write_text(yaml.safe_dump(TEST_SETTINGS))
    done = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh"), "--config", str(config)], cwd=REPO,
                          check=False, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "JUDGE_RESULTS_DIR": str(results)})
    return done, results


@pytest.fixture(scope="session")
def examples_batch_cpu(tmp_path_factory, examples_demo):
    """Every bundled example judged on the CPU device, in `.records`: level0 (the C++ examples) by the demo's
    `run_eval.py batch --device cpu` (examples_demo), the others (CUDA and GPU-language examples: needs_cuda on the CPU
    device, decided without a child) by run_batch here, as the demo judges them on CUDA where there is a GPU."""
    done, results = examples_demo
    assert done.returncode == 0, done.stderr[-3000:]
    level0 = [replace(record, submission=str(REPO / record.submission))   # the demo names them from the repository
              for record in read_records(results / "examples-level0-cpu" / "records.jsonl")]
    assert len(level0) == len(list((EXAMPLES / "level0").rglob("*.py"))), [r.submission for r in level0]
    submissions = []
    for level in sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "level0"):
        found, skipped = discover(level, None, REPO / "problems", run="examples")
        assert not skipped, skipped
        submissions += found
    others = run_batch(submissions, pipeline_settings(device="cpu"), tmp_path_factory.mktemp("runs") / "examples")
    return SimpleNamespace(records=level0 + others.records)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
