"""The verdict on a reference that ran slower beside its candidate than alone (evaluate.drift_verdict), with a
scripted reference process: whether it is the candidate's doing is decided by timing the reference again once the
candidate's processes are gone."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from types import SimpleNamespace

from harness.judge import evaluate
from harness.shared import findings, protocol
from harness.shared.config import load_config
from harness.shared.record import Status
from harness.shared.settings import TimingSettings
from harness.timing.interleave import CpuUse, run_timing
from tests.timing.test_interleave import TIMING, FakeProcess, SlowFirstBlocks, _clean


class FakeRun:
    """The candidate's side as drift_verdict sees it: a freezer's evidence and a way to end it."""

    def __init__(self, stragglers=()):
        self.held: list[str] = []
        self.child = SimpleNamespace(freezer=SimpleNamespace(stragglers=list(stragglers),
                                                             freeze=lambda: self.held.append("freeze"),
                                                             thaw=lambda: self.held.append("thaw")))
        self.findings = findings.Found()
        self.phases: dict = {}
        self.ended = False

    def end_now(self) -> None:
        self.ended = True


CLEAN_PACE_MS = 0.4   # the GPU's pace with no candidate alive (harness/children/oracle/pace.py), in _verdict


def _verdict(slow_blocks: int, slow_alone: bool, stragglers=(), device="cuda", cpu=None, alone_factor=None,
             pace_ms=None):
    """A reference that is 2x slow for its first `slow_blocks` blocks beside the candidate, and (`slow_alone`) for
    every block after that too, the re-timing alone included (or `alone_factor` times slow there); `cpu`: the
    candidate's CPU use; `pace_ms`: the GPU's pace when asked (clean: CLEAN_PACE_MS; None: not told)."""
    config = load_config(overrides={**TIMING, "ref_drift_retries": 1})
    process = SlowFirstBlocks(1.0, 10_000 if slow_alone else slow_blocks, 2.0, [])
    process.pace_ms = pace_ms
    ref_side = process.side("reference")
    measured, _ = run_timing(FakeProcess(0.5).side("candidate"), ref_side, TimingSettings.from_config(config),
                             clean=_clean(1.0), device="cuda")
    if not slow_alone:
        process.slow = 0   # whatever slowed it went away with the candidate
    if alone_factor is not None:
        process.slow, process.factor = 10_000, alone_factor
    ref = SimpleNamespace(clean=_clean(1.0), device=device, env=None, problem=SimpleNamespace(id="level9/9"),
                          log_path="log", clean_pace_ms=CLEAN_PACE_MS if device != "cpu" else None)
    record = evaluate.blank_record(SimpleNamespace(problem_id="level9/9", label="s.py", hash="0", model=None,
                                                   run=None, sample_id=None), config, "cuda")
    theirs, mine = measured.stats
    record = replace(record, ref_runtime_ms=theirs.median_ms, runtime_ms=mine.median_ms,
                     runtime_ci_low_ms=mine.ci_low_ms, runtime_ci_high_ms=mine.ci_high_ms,
                     speedup=theirs.median_ms / mine.median_ms, ref_source="interleaved")
    run = FakeRun(stragglers)
    return evaluate.drift_verdict(run, ref, ref_side, measured, config, record, cpu), run, ref


def test_a_reference_slowed_beside_its_candidate_only_is_timing_interference():
    record, run, _ = _verdict(slow_blocks=10_000, slow_alone=False)
    assert run.ended and record.status == Status.TIMING_INTERFERENCE
    assert record.ref_clean_ms == 1.0 and record.ref_drift == 2.0
    assert "reference clean 1 ms" in record.error and "alone again after the candidate was killed" in record.error
    assert "): 1 ms" in record.error


def test_a_reference_slow_alone_too_means_the_machine_changed():
    record, run, ref = _verdict(slow_blocks=10_000, slow_alone=True)
    assert run.ended and record.status == Status.PASS
    assert ref.clean.median_ms == 2.0 and record.ref_clean_ms == 2.0 and record.ref_drift == 1.0


def test_timing_json_holds_the_alone_time_and_what_it_made_of_the_drift(tmp_path, monkeypatch):
    """The record's clean time and timing.json's agree after a re-timing: the alone time is written beside the
    interleaved blocks with its outcome."""
    log = tmp_path / "log.txt"
    (tmp_path / evaluate.TIMING_FILE).write_text(json.dumps({"interleaved": True, "sides": {},
                                                             "reference_clean": {"median_ms": 1.0}}))
    blank = evaluate.blank_record
    monkeypatch.setattr(evaluate, "blank_record", lambda *a: replace(blank(*a), log_path=str(log)))
    for slow_alone, outcome in ((True, "machine_changed"), (False, "interference")):
        record, _, _ = _verdict(slow_blocks=10_000, slow_alone=slow_alone)
        evidence = json.loads((tmp_path / evaluate.TIMING_FILE).read_text())
        alone = evidence["reference_alone"]
        assert alone["outcome"] == outcome and evidence["reference_clean"] == {"median_ms": 1.0}
        assert alone["median_ms"] == (2.0 if slow_alone else 1.0) and alone["blocks"] >= 1
        assert record.ref_clean_ms == (alone["median_ms"] if slow_alone else 1.0)


def test_a_block_or_two_of_noise_is_retimed_and_passes_without_ending_the_candidate():
    record, run, _ = _verdict(slow_blocks=2, slow_alone=False)
    assert not run.ended and record.status == Status.PASS and record.ref_drift == 1.0


def test_a_freeze_that_did_not_hold_is_checked_alone_even_without_drift():
    record, run, _ = _verdict(slow_blocks=0, slow_alone=False, stragglers=["freeze did not settle"])
    assert run.ended and record.status == Status.TIMING_INTERFERENCE and "freeze did not settle" in record.error




# The candidate's CPU use as measured on the CPU machine (harness/integrity/drift.py OUTSIDE_MS_PER_FREEZE): an
# honest one, and the saboteur fixture 31 (threads that burn while its forward is idle).
HONEST = CpuUse(own_ms=95.0, own_wall_ms=100.0, outside_ms=5.1, freezes=24)
BUSY_OUTSIDE = CpuUse(own_ms=95.0, own_wall_ms=100.0, outside_ms=7.0, freezes=2)
BUSY_INSIDE = CpuUse(own_ms=140.0, own_wall_ms=100.0, outside_ms=0.5, freezes=24)


def test_on_cpu_a_drift_beside_a_candidate_that_used_no_cpu_of_its_own_is_the_machine():
    record, run, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cpu", cpu=HONEST)
    assert run.ended and record.status == Status.PASS and record.ref_drift == 2.0
    assert "alone again" in run.findings["reference_drift"] and "stopped 24 times" in run.findings["reference_drift"]


def test_on_cpu_a_drift_beside_a_candidate_that_burned_cpu_is_timing_interference():
    for cpu in (BUSY_OUTSIDE, BUSY_INSIDE, None):
        record, run, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cpu", cpu=cpu)
        assert record.status == Status.TIMING_INTERFERENCE and not run.findings, cpu
        assert ("cores in them" if cpu else "not known") in record.error


def test_on_a_gpu_cpu_use_does_not_clear_the_candidate():
    record, _, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cuda", cpu=HONEST)
    assert record.status == Status.TIMING_INTERFERENCE and "on a GPU" in record.error
    assert "pace could not be measured" in record.error


def test_on_a_gpu_a_drift_with_the_gpu_at_its_clean_pace_beside_the_stopped_candidate_is_the_host():
    """Measured on an H200 (2026-11-26): an honest bf16 kernel on level0/5, whose reference read 0.022 ms clean,
    0.041 ms through a whole interleaved timing with the candidate stopped and settled before every block timed again,
    and 0.023 ms alone after the kill: timing_interference in 1 of 4 submits. The reference's calls are host-bound,
    and a stopped candidate has no thread on the host; with the GPU at its clean pace (nothing else held it), the
    drift was the host's: a pass, its speedup against the faster reference time."""
    record, run, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cuda", pace_ms=CLEAN_PACE_MS * 1.05)
    assert run.ended and record.status == Status.PASS, record.error
    assert run.held == ["freeze", "thaw"]   # the pace was taken with the candidate stopped, before the kill
    assert "at 1.05x its clean time" in run.findings["reference_drift"]
    assert record.ref_runtime_ms == 1.0 and record.speedup == 1.0 / record.runtime_ms


def test_on_a_gpu_a_drift_with_the_gpu_held_beside_the_stopped_candidate_is_timing_interference():
    """A candidate that left work running on the GPU (a kernel that never ends, a deep queue) slows its reference
    while its threads are stopped, and a fixed workload takes longer on the GPU with the host ahead."""
    record, run, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cuda", pace_ms=CLEAN_PACE_MS * 1.9)
    assert run.ended and record.status == Status.TIMING_INTERFERENCE
    assert "1.90x its clean time" in record.error and "other work held the GPU" in record.error


def test_on_cpu_a_drift_that_half_persists_alone_is_not_put_down_to_the_candidate():
    """Measured in CI (2026-11-25): an honest bf16 kernel's reference 0.377 ms clean, 0.590 ms interleaved, 0.431 ms
    alone after the kill. Back within the clean margin alone, but the interleaved time is within the margin of that
    alone time too: the machine, not the candidate. The record passes and its speedup is taken against the alone
    time, so the drift is not credited to the candidate."""
    record, run, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cpu", cpu=BUSY_INSIDE, alone_factor=1.4)
    assert run.ended and record.status == Status.PASS and record.ref_drift == 2.0
    assert "within +50% of it" in run.findings["reference_drift"]
    assert record.ref_runtime_ms == 1.4 and record.speedup == 1.4 / record.runtime_ms
    assert "speedup against the reference alone" in record.ref_source


def test_a_pass_after_a_drift_never_credits_the_drift():
    record, _, _ = _verdict(slow_blocks=10_000, slow_alone=False, device="cpu", cpu=HONEST)
    assert record.status == Status.PASS and record.ref_runtime_ms == 1.0 and record.speedup == 1.0 / record.runtime_ms
    record, _, ref = _verdict(slow_blocks=10_000, slow_alone=True)   # the machine changed: nothing faster to take
    assert record.status == Status.PASS and record.ref_runtime_ms == 2.0 and "alone" not in record.ref_source


class SlowAfterIdling(FakeProcess):
    """A launch-bound reference: its two blocks after an idle gap longer than `gap_ms` run 2x slow (a process woken
    from an idle pipe runs its first calls cold), whoever made the gap."""

    def __init__(self, per_call_ms: float, gap_ms: float):
        super().__init__(per_call_ms)
        self.gap_ms, self.last_block, self.slow_left = gap_ms, time.perf_counter(), 0

    def expect(self, wanted: str, timeout_s: float) -> dict:
        event = super().expect(wanted, timeout_s)
        if self.commands[-1]["cmd"] == protocol.CMD_BLOCK:
            if (time.perf_counter() - self.last_block) * 1e3 > self.gap_ms:
                self.slow_left = 2
            if self.slow_left > 0:
                self.slow_left -= 1
                event["samples"] = [s * 2 for s in event["samples"]]
            self.last_block = time.perf_counter()
        return event


class TakesWallTime(FakeProcess):
    """A candidate whose every block takes `block_s` of wall time."""

    def __init__(self, per_call_ms: float, block_s: float):
        super().__init__(per_call_ms)
        self.block_s = block_s

    def expect(self, wanted: str, timeout_s: float) -> dict:
        if self.commands[-1]["cmd"] == protocol.CMD_BLOCK:
            time.sleep(self.block_s)
        return super().expect(wanted, timeout_s)


def test_a_reference_slow_after_idling_is_timed_alone_with_the_same_idle_gaps():
    """On the GPU (2026-11-26, H200) a launch-bound reference read 1.34x its clean time interleaved and its clean
    time alone again after the kill, and an honest-enough candidate was judged timing_interference. Interleaved, the
    reference idles while the candidate runs two blocks; timed alone again with the same idle gaps, whatever the
    gaps themselves cost shows there too, and is not put down to the candidate."""
    config = load_config(overrides={**TIMING, "ref_drift_retries": 1, "block_ms": 5.0})
    process = SlowAfterIdling(1.0, gap_ms=4.0)
    ref_side = process.side("reference")
    measured, _ = run_timing(TakesWallTime(0.5, 0.005).side("candidate"), ref_side,
                             TimingSettings.from_config(config), clean=_clean(1.0), device="cuda")
    assert measured.stats[0].median_ms == 2.0   # every pair of reference blocks came after the candidate's two
    ref = SimpleNamespace(clean=_clean(1.0), device="cuda", env=None, problem=SimpleNamespace(id="level9/9"),
                          log_path="log", clean_pace_ms=None)
    record = evaluate.blank_record(SimpleNamespace(problem_id="level9/9", label="s.py", hash="0", model=None,
                                                   run=None, sample_id=None), config, "cuda")
    theirs, mine = measured.stats
    record = replace(record, ref_runtime_ms=theirs.median_ms, runtime_ms=mine.median_ms, ref_source="interleaved",
                     speedup=theirs.median_ms / mine.median_ms)
    run = FakeRun()
    record = evaluate.drift_verdict(run, ref, ref_side, measured, config, record, None)
    assert run.ended and record.status == Status.PASS, record.error
    assert ref.clean.median_ms == 2.0   # alone with the gaps reads the same: the machine, not the candidate
    assert 10.0 <= evaluate.idle_between_pairs_ms(measured, config) <= 20.0
    # a candidate whose blocks take longer in wall than two honest ones does not lengthen the reference's idling
    stretched = load_config(overrides={**TIMING, "block_ms": 1.0})
    assert evaluate.idle_between_pairs_ms(measured, stretched) == 4.0
