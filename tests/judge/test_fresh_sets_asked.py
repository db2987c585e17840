"""The fresh input sets are asked of the reference's oracle (Reference.with_fresh_sets) only when a candidate reaches
the fresh-input check, after its timing: a wrong candidate never costs the oracle their draw, forward and save; the
first that gets there does, once per reference, and every later one is checked on the same sets."""
from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES, judge_config

from harness.judge import evaluate
from harness.oracle.reference import run_oracle
from harness.shared import timer
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import Submission
from harness.timing import interleave

PROBLEM = resolve_problem("level0/1")
RELU = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"


@pytest.fixture
def reference(tmp_path):
    # no custom kernel needed: a plain torch.relu reaches the fresh-input check
    config = judge_config(device="cpu", fresh_inputs=2, forbid=["gaming"])
    ref = run_oracle(PROBLEM, config, "cpu", tmp_path / "logs")
    yield ref, config
    ref.close()


def _why(record) -> str:
    """The whole of what a record says of itself (a tuple's strings would be cut short in pytest's message)."""
    return f"{record.status.value}: {record.error}; flags {record.flags}; evidence {record.flag_evidence}"


def _judge(ref, config, name: str, text: str, folder):
    submission = Submission(label=name, text=text, is_python=True, problem=PROBLEM)
    return evaluate.evaluate(submission, lambda: ref, config, "cpu", folder / name)


def test_fresh_sets_are_drawn_for_the_first_candidate_that_reaches_their_check_and_kept(reference, tmp_path):
    ref, config = reference
    assert not ref.fresh_in and ref.truth.fresh_inputs == []   # not in the truth the reference started with
    wrong = _judge(ref, config, "incorrect.py", (FIXTURES / "cpu" / "incorrect.py").read_text(), tmp_path)
    assert wrong.status == Status.INCORRECT and "fresh_sets" not in wrong.phases and not ref.fresh_in
    held = ref.held_bytes

    first = _judge(ref, config, "relu.py", RELU, tmp_path)
    assert first.status == Status.PASS and first.fresh_runtime_ms is not None, _why(first)
    assert first.phases["fresh_sets"] > 0 and ref.fresh_in and ref.held_bytes > held
    fresh = ref.truth.fresh_inputs
    assert len(fresh) == len(ref.truth.fresh_outputs) == 4   # two rounds of two
    for inputs, outputs in zip(fresh, ref.truth.fresh_outputs):   # the reference's outputs on sets it never fed
        assert torch.equal(outputs[0], torch.relu(inputs[0]))
        assert not any(torch.equal(inputs[0], trial) for trial in _fed(ref))

    second = _judge(ref, config, "relu2.py", RELU, tmp_path)
    assert second.status == Status.PASS and second.fresh_runtime_ms is not None, _why(second)
    assert "fresh_sets" not in second.phases and ref.truth.fresh_inputs is fresh   # asked once


def _fed(ref) -> list:
    from harness.shared.messages import Feed
    feed = Feed.from_file(torch.load(f"/proc/self/fd/{ref.feed_fd}", weights_only=True, mmap=True)) if (
        ref.feed_fd is not None) else Feed.from_file(torch.load(ref.feed_path, weights_only=True))
    return [trial[0] for trial in feed.trials]


def test_the_trials_outputs_are_let_go_on_both_sides_before_the_timing(reference, tmp_path, monkeypatch):
    # what holds host memory while a candidate is timed: the outputs of its trials, read and checked, must not (a
    # level-1 problem's are gigabytes); neither the judge nor the candidate's process keeps the memfds open
    import os

    from harness.shared import protocol

    ref, config = reference
    seen = {}
    timed = evaluate._timed

    def look(run, *args):
        seen["judge"] = set(run.child.handover.fds)
        folder = f"/proc/{run.child.process.pid}/fd"
        seen["candidate"] = {os.readlink(f"{folder}/{fd}") for fd in os.listdir(folder)}
        return timed(run, *args)

    monkeypatch.setattr(evaluate, "_timed", look)
    record = _judge(ref, config, "relu.py", RELU, tmp_path)
    assert record.status == Status.PASS, _why(record)
    for name in (protocol.RESULT_FILE, protocol.FIRST_FILE):
        assert name not in seen["judge"], seen["judge"]
        assert not any(link.startswith(f"/memfd:{name}") for link in seen["candidate"]), seen["candidate"]
    assert protocol.SPOT_FILE in seen["judge"]   # written later, during the timing
    assert any(link.startswith(f"/memfd:{protocol.SPOT_FILE}") for link in seen["candidate"])


def test_timed_calls_keep_fewer_outputs_where_they_are_large(reference, tmp_path, monkeypatch):
    ref, config = reference
    checked = []
    real = evaluate.detectors.spot_mismatch

    def spy(spots, *args, **kwargs):
        checked.append(len(spots))
        return real(spots, *args, **kwargs)

    monkeypatch.setattr(evaluate.detectors, "spot_mismatch", spy)
    record = _judge(ref, config, "relu.py", RELU, tmp_path)
    assert record.status == Status.PASS, _why(record)
    monkeypatch.setattr(interleave, "SPOT_BYTES", 1)   # every output is large now: the fewest calls keep theirs
    record = _judge(ref, config, "relu2.py", RELU, tmp_path)
    assert record.status == Status.PASS, _why(record)
    assert checked == [config.spot_checks, interleave.SPOT_MIN]


def test_both_sides_time_on_the_fewer_sets_the_reference_holds_where_sets_are_large(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_JUDGE_TIMING_SET_BYTES", "1")   # every set is large: the fewest sets, in both children
    config = judge_config(device="cpu", forbid=["gaming"])
    ref = run_oracle(PROBLEM, config, "cpu", tmp_path / "logs")
    try:
        chosen = []
        real = evaluate.detectors.spot_mismatch
        monkeypatch.setattr(evaluate.detectors, "spot_mismatch",
                            lambda spots, *args: chosen.extend(args[-1]) or real(spots, *args))
        assert ref.timing_sets == timer.TIMING_SETS_MIN < len(ref.truth.outputs) == config.trials
        record = _judge(ref, config, "relu.py", RELU, tmp_path)
        assert record.status == Status.PASS, _why(record)
        assert chosen and set(chosen) <= set(range(ref.timing_sets))   # the parent chose among those alone
    finally:
        ref.close()
