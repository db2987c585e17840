"""The orchestration of one evaluation (harness/judge/evaluate.py) where it needs no candidate process: extraction's
verdicts, the profile applied to them, the speedup after a drifted reference, the compiler's first error.
tests/judge/test_statuses.py runs every status end to end; test_drift.py the re-timing of a drifted reference."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import judge_config

from harness.judge import evaluate
from harness.shared import findings
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import Submission

PROBLEM = resolve_problem("level0/1")
SOURCE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def _prepared(text: str, tmp_path, is_python: bool = False, not_text=None, **overrides):
    submission = Submission(label="s", text=text, is_python=is_python, problem=PROBLEM, not_text=not_text)
    return evaluate.prepare(submission, judge_config(device="cpu", **overrides), "cpu", tmp_path)


def test_extraction_ends_a_submission_before_anything_runs(tmp_path):
    big = _prepared("x" * 2000, tmp_path, max_submission_bytes=1000)
    assert big.status == Status.TOO_LARGE and "above max_submission_bytes (0.001 MB)" in big.error
    assert not tmp_path.exists() or not any(tmp_path.iterdir())   # nothing of it was written
    assert _prepared("x", tmp_path, not_text="byte 0x80 at 3").status == Status.SYNTAX_ERROR
    none = _prepared("Here is my answer, in words only.", tmp_path)
    assert none.status == Status.NO_CODE and none.check_status == Status.NO_CODE
    broken = _prepared("```python\nclass ModelNew(:\n```", tmp_path)
    assert broken.status == Status.SYNTAX_ERROR and broken.source_path == str(tmp_path / "source.py")


def test_a_runnable_submission_comes_back_with_its_source_and_explanation(tmp_path):
    record, source = _prepared(f"It returns x.\n```python\n{SOURCE}```\n", tmp_path)
    assert source == SOURCE and (tmp_path / "source.py").read_text() == SOURCE
    assert (tmp_path / "explanation.md").read_text().startswith("It returns x.")
    assert record.backend == "cuda" and record.problem == "level0/1" and record.runtime_ms is None


def test_the_profile_turns_forbidden_findings_of_a_pass_into_a_rule_violation():
    config = judge_config(device="cpu")
    record = replace(evaluate.blank_record(SimpleNamespace(problem_id="level0/1", label="s", hash="0", model=None,
                                                           run=None, sample_id=None), config, "cpu"),
                     status=Status.PASS)
    passed = evaluate._apply_profile(record, findings.Found({findings.LIBRARY_KERNELS: "mm x1"}), config)
    assert passed.status == Status.PASS and passed.flags == (findings.LIBRARY_KERNELS,)
    found = findings.Found({findings.TIMER_MISMATCH: "spans 1 ms, wall 9 ms", findings.LIBRARY_KERNELS: "mm x1"})
    violated = evaluate._apply_profile(record, found, config)
    assert violated.status == Status.RULE_VIOLATION and violated.check_status == Status.PASS
    assert "timer_mismatch" in violated.error and violated.flag_evidence == dict(sorted(found.items()))
    failed = evaluate._apply_profile(replace(record, status=Status.INCORRECT, error="off"), found, config)
    assert failed.status == Status.INCORRECT and failed.error == "off"   # a finding never hides a wrong answer


def test_a_drifted_reference_is_replaced_only_by_a_faster_time_alone():
    record = SimpleNamespace(ref_runtime_ms=2.0, runtime_ms=1.0, speedup_compile=4.0, runtime_ci_low_ms=0.9,
                             runtime_ci_high_ms=1.1, ref_source="interleaved")
    alone = SimpleNamespace(median_ms=1.5, ci_low_ms=1.4, ci_high_ms=1.6, min_ms=1.3, iqr_ms=0.1, reps=100,
                            calls_per_span=3)
    blank = evaluate.blank_record(SimpleNamespace(problem_id="level0/1", label="s", hash="0", model=None, run=None,
                                                  sample_id=None), judge_config(device="cpu"), "cpu")
    taken = evaluate._against_alone(replace(blank, **vars(record)), alone)
    assert taken.ref_runtime_ms == 1.5 and taken.speedup == 1.5 and taken.speedup_compile == 3.0
    assert taken.ref_calls_per_span == 3   # the time alone's own spans
    assert taken.speedup_ci_low == 1.4 / 1.1 and taken.speedup_ci_high == 1.6 / 0.9
    assert "drifted to 2 ms" in taken.ref_source
    slower = SimpleNamespace(**{**vars(alone), "median_ms": 2.5})
    kept = replace(blank, **vars(record))
    assert evaluate._against_alone(kept, slower) is kept


def test_the_first_compiler_error_is_quoted_from_the_log(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("building ext\nwarning: unused x\nkernel.cu(3): error: identifier \"y\" is undefined\nerror: 2\n")
    assert evaluate._first_compiler_error(log) == 'kernel.cu(3): error: identifier "y" is undefined'
    log.write_text("all fine\n")
    assert evaluate._first_compiler_error(log) is None
    assert evaluate._first_compiler_error(tmp_path / "missing.txt") is None


def test_the_reference_is_timed_clean_once_and_only_when_timed_live():
    ref = SimpleNamespace(clean=None)
    assert evaluate.needs_clean_time(ref, judge_config(device="cpu"))
    assert not evaluate.needs_clean_time(ref, judge_config(device="cpu", time_candidates=False))
    assert not evaluate.needs_clean_time(ref, judge_config(device="cpu", ref_timing="stored"))
    assert not evaluate.needs_clean_time(SimpleNamespace(clean=object()), judge_config(device="cpu"))


def test_a_fresh_calls_time_is_its_span_less_the_seen_calls_and_work_left_on_another_stream_counts():
    from harness.judge.evaluate import fresh_call_ms

    assert fresh_call_ms(14.5, 14, 1.0) == pytest.approx(1.5)          # 13 seen calls at the rotating median
    assert fresh_call_ms(12.0, 14, 1.0) == 0.0                         # never below zero
    assert fresh_call_ms(0.05, 1, 0.05) == pytest.approx(0.05)         # a span of one call: itself
    # its synchronized span less the blocks' gap, where longer: the work a side stream did after the stream's end
    assert fresh_call_ms(1.0, 1, 1.0, synced_ms=9.03, span_gap_ms=0.03) == pytest.approx(9.0)
    assert fresh_call_ms(1.0, 1, 1.0, synced_ms=1.02, span_gap_ms=0.03) == pytest.approx(1.0)
    assert fresh_call_ms(1.0, 1, 1.0, synced_ms=9.0) == pytest.approx(1.0)   # no gap from the blocks: the stream span


def test_a_fresh_span_loses_the_round_trip_of_its_moment_but_no_more_than_a_bound_beyond_the_blocks():
    from harness.integrity import detectors
    from harness.judge.evaluate import NEAR_GAP_SLACK_MS, fresh_call_ms, fresh_gap_ms

    assert fresh_gap_ms(None, (0.1,)) is None                      # no gap from the blocks: none at all
    assert fresh_gap_ms(0.03, ()) == 0.03                          # no seen-set spans before it: the blocks'
    assert fresh_gap_ms(0.03, (0.01, 0.02)) == 0.03                # never below the blocks'
    assert fresh_gap_ms(0.03, (0.05, 0.07, 0.06)) == pytest.approx(0.07)   # the largest of the moment's
    assert fresh_gap_ms(0.03, (0.5,)) == pytest.approx(0.03 + NEAR_GAP_SLACK_MS)   # bounded
    # the measured case (an honest 2.5 us ReLU, 27 calls a span, on an H200): its blocks' median gap 0.026 ms,
    # the fresh span and its seen-set spans just before it 0.12 ms; with the blocks' gap alone it read 22x
    rotating, gap = 0.0025, 0.0255
    slow = fresh_call_ms(0.0681, 27, rotating, 0.1981, gap)
    assert slow > 20 * rotating and detectors.fresh_slowdown([slow], rotating)
    assert not detectors.fresh_slowdown([fresh_call_ms(0.0681, 27, rotating, 0.1981, fresh_gap_ms(gap, (0.12, 0.13)))],
                                        rotating)
    # a side stream's 1 ms of work on the fresh set still shows in full
    assert fresh_call_ms(0.0681, 27, rotating, 1.1981, fresh_gap_ms(gap, (0.12, 0.13))) > 1.0


def test_a_result_stopped_after_trial_0_holds_only_where_that_trial_decides_the_status():
    import torch

    from harness.shared.check import Tolerance
    from harness.shared.messages import CandidateResult, Malformed

    config = judge_config(device="cpu")
    record = evaluate.blank_record(SimpleNamespace(problem_id="level0/1", label="s", hash="0", model=None, run=None,
                                                   sample_id=None), config, "cpu")
    ref = SimpleNamespace(truth=SimpleNamespace(outputs=[[torch.ones(4, 2)] for _ in range(3)]),
                          tolerance=Tolerance())

    def stopped(output) -> CandidateResult:
        return CandidateResult.from_file({"outputs": [[output]], "repeat": [], "stopped": True, "weights_loaded": 0},
                                         trials=3)

    assert evaluate._compared(stopped(torch.ones(2, 4)), ref, record, None).status == Status.SHAPE_MISMATCH
    dtype = evaluate._compared(stopped(torch.ones(4, 2, dtype=torch.float64)), ref, record, None)
    assert dtype.status == Status.DTYPE_MISMATCH
    for unearned in (torch.ones(4, 2), torch.zeros(4, 2)):   # right, or only its values wrong: a tampered stop
        judged = evaluate._compared(stopped(unearned), ref, record, None)
        assert judged.status == Status.RUNTIME_ERROR and "stopped after trial 0" in judged.error
    with pytest.raises(Malformed):   # one trial without saying so is short
        CandidateResult.from_file({"outputs": [[torch.ones(2, 4)]], "repeat": [], "weights_loaded": 0}, trials=3)
