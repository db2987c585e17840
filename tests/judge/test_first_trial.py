"""Trial 0's outputs reach the parent as soon as they are made and are checked there while the other trials run: a
candidate wrong on trial 0 is ended at once (its other trials, backward and profile never run); one right on it is
judged on every trial as before."""
from __future__ import annotations

import pytest
from conftest import FIXTURES, judge_config

from harness.judge import evaluate
from harness.oracle.reference import run_oracle
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import Submission

PROBLEM = resolve_problem("level0/1")
RELU = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
# right on its first call (trial 0), wrong on every later one: only the full check can tell
RIGHT_ONCE = """import torch


class ModelNew(torch.nn.Module):
    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        return torch.relu(x) + (0.0 if ModelNew.calls == 1 else 1.0)
"""
# wrong on trial 0, and every later call takes 20 s: ended after trial 0, it never gets to them
WRONG_THEN_SLOW = """import time

import torch


class ModelNew(torch.nn.Module):
    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls > 1:
            time.sleep(20)
        return torch.relu(x) + 1.0
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    config = judge_config(device="cpu", run_timeout_s=60.0, forbid=["gaming"])   # a plain torch.relu passes
    ref = run_oracle(PROBLEM, config, "cpu", tmp_path_factory.mktemp("logs"))
    yield ref, config
    ref.close()


def _judge(reference, name: str, text: str, folder):
    ref, config = reference
    submission = Submission(label=name, text=text, is_python=True, problem=PROBLEM)
    return evaluate.evaluate(submission, lambda: ref, config, "cpu", folder / name)


def test_a_candidate_wrong_on_trial_0_is_ended_there(reference, tmp_path):
    for name, text in (("incorrect.py", (FIXTURES / "cpu" / "incorrect.py").read_text()),
                       ("slow.py", WRONG_THEN_SLOW)):
        record = _judge(reference, name, text, tmp_path)
        assert record.status == Status.INCORRECT and record.correct is False, (name, record.error)
        assert record.error.startswith("trial 0 output 0") and record.max_abs_error >= 1e-3
        assert record.phases["first_check"] > 0 and record.phases["first_read"] > 0
        # the checks never reported: no other trial, backward, profile or result; the parent's wait for trial 0 and
        # its check stand for the trials
        assert not {"model", "profile", "result_save", "output_check"} & set(record.phases), record.phases
        # each phase is rounded to 0.1 ms in the record
        assert record.phases["correctness"] >= record.phases["first_read"] + record.phases["first_check"] - 1.5e-4
        assert record.own_kernels is None and record.runtime_ms is None
        assert record.phases["teardown"] < 10   # killed at once, not waited for through its 20 s calls


def test_a_candidate_right_on_trial_0_is_judged_on_every_trial(reference, tmp_path):
    right = _judge(reference, "relu.py", RELU, tmp_path)
    assert right.status == Status.PASS, right.error
    assert {"first_check", "correctness", "output_check"} <= set(right.phases)
    once = _judge(reference, "right_once.py", RIGHT_ONCE, tmp_path)
    assert once.status == Status.INCORRECT and once.error.startswith("trial 1"), once.error
    assert {"first_check", "correctness", "output_check"} <= set(once.phases)
