"""Precision modes end to end on the CPU device: a bf16 batch and an fp16 `submit`, on level0/2 (Linear + ReLU).

The C++ fixture (tests/fixtures/precision/half_linear_relu.py) includes only Python.h, so it builds in about a
second.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from conftest import (
    FIXTURES,
    REPO,
    TEST_SETTINGS,
    by_name,
    expected_status,
    judge_config,
    run_folder,
)

from harness.judge import evaluate
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import from_file

PRECISION_FIXTURES = FIXTURES / "precision"


def test_every_record_says_its_precision_and_tf32_policy(tmp_path):
    submission = from_file(FIXTURES / "cpu" / "no_code.md", resolve_problem("level0/2"), run="r")
    record = evaluate.prepare(submission, judge_config(precision="fp16", allow_tf32=True), "cpu", tmp_path)
    assert record.status == Status.NO_CODE and (record.precision, record.allow_tf32) == ("fp16", True)
    assert record.atol is None and record.rtol is None   # no reference ran, so no tolerance was applied


@pytest.fixture(scope="module")
def bf16_batch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precision_fixtures")
    for path in PRECISION_FIXTURES.glob("*.py"):
        (folder / path.name).write_text(path.read_text())
    return run_folder(folder, tmp_path_factory.mktemp("runs") / "bf16", "cpu", problem="level0/2", precision="bf16")


@pytest.mark.parametrize("name", sorted(p.name for p in PRECISION_FIXTURES.glob("*.py")))
def test_each_fixture_ends_in_its_status_in_a_bf16_run(bf16_batch, name):
    record = by_name(bf16_batch)[name]
    assert record.status.value == expected_status(PRECISION_FIXTURES / name), record.error


def test_a_bf16_kernel_gets_bf16_inputs_and_weights_and_passes(bf16_batch):
    """The kernel raises on anything but bf16 inputs and weights alike, so its pass shows what it was handed."""
    record = by_name(bf16_batch)["half_linear_relu.py"]
    assert (record.precision, record.atol, record.rtol, record.allow_tf32) == ("bf16", 1e-2, 1e-2, False)
    assert record.weights_loaded == 2 and record.own_kernels >= 1
    assert record.grad_correct is True and record.grads_compared == 3   # backward in bf16, against a bf16 reference
    assert record.speedup is not None


def test_bf16_values_are_judged_by_bf16_tolerance(bf16_batch):
    """Truncated to bf16: off by up to one bf16 step, which only bf16's tolerance accepts; measured a pass."""
    record = by_name(bf16_batch)["truncated_output.py"]
    assert record.check_status == Status.PASS and record.correct is True
    assert 1e-4 < record.tolerance_needed < 1e-2   # beyond fp32's default, within bf16's
    assert "no_custom_kernel" in record.flags


def test_a_float32_output_in_a_bf16_run_is_a_dtype_mismatch(bf16_batch):
    record = by_name(bf16_batch)["float_output.py"]
    assert record.correct is False and "torch.float32, expected torch.bfloat16" in record.error


def test_fp16_from_the_command_line(bf16_batch, tmp_path):
    """`--precision fp16` on `submit`: the same kernel in its fp16 format; the record and the leaderboard say fp16."""
    config = tmp_path / "fast.yaml"
    config.write_text(yaml.safe_dump(TEST_SETTINGS))
    run = [sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(tmp_path)]
    result = subprocess.run([*run, "submit", "--problem", "level0/2", "--submission",
                             str(PRECISION_FIXTURES / "half_linear_relu.py"), "--device", "cpu", "--precision", "fp16",
                             "--config", str(config), "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(result.stdout)
    assert (record["status"], record["precision"], record["atol"]) == ("pass", "fp16", 1e-2)
    assert record["grad_correct"] is True
    board = subprocess.run([*run, "leaderboard"], capture_output=True, text=True, timeout=120)
    assert board.returncode == 0, board.stderr
    header, row = (tmp_path / "leaderboard.csv").read_text().splitlines()
    assert header.startswith("model,run,precision,n,") and row.startswith("-,submit,fp16,1,")
