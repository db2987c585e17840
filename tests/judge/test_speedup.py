"""The speedup arithmetic: live (paired blocks) or against a stored baseline (ratio of medians, far CI ends)."""
from types import SimpleNamespace

import pytest

from harness.judge.speedup import against_reference, speed_of_light
from harness.oracle.baselines import Stored
from harness.shared.config import load_config
from harness.shared.messages import Rates, Roofline
from harness.shared.timer import Block, Measurement, TimingStats


def _stats(median_ms: float, low_ms: float, high_ms: float) -> TimingStats:
    return TimingStats(median_ms=median_ms, ci_low_ms=low_ms, ci_high_ms=high_ms, iqr_ms=0.1, min_ms=low_ms,
                       max_ms=high_ms, mean_ms=median_ms, reps=60, blocks=6, calls=70, events_ms=60 * median_ms,
                       outside_ms=1.0, wall_ms=70 * median_ms, converged=True, method="events, device sync")


def _stored(eager: TimingStats, peaks=None) -> Stored:
    fields = {**eager.to_dict(), "note": "keys TimingStats lacks are ignored"}
    return Stored(file="NVIDIA-H200.json", date="2025-03-04T10:00:00", eager=fields, compile=None, peaks=peaks)


def _live(ref_ms: list[float], mine_ms: list[float]) -> Measurement:
    blocks = [[Block([ms] * 3, 3 * ms, 0.0) for ms in side] for side in (ref_ms, mine_ms)]
    return Measurement([_stats(4.0, 3.9, 4.1), _stats(2.0, 1.9, 2.1)], blocks, interleaved=True)


def test_a_live_reference_gives_the_paired_ratio_and_the_timing_mode():
    measured = _live([4.0, 4.4, 4.0, 4.0, 4.0, 4.0], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    theirs, speedup, source = against_reference(measured, None, load_config(None, {"ref_timing": "interleaved"}), "")
    assert theirs is measured.stats[0] and source == "interleaved"
    assert speedup == (2.0, 2.0, 2.2)   # per pair: 4/2 five times, 4.4/2 once


def test_a_live_fallback_from_stored_says_why_there_was_no_stored_baseline():
    _, _, source = against_reference(_live([4.0] * 6, [2.0] * 6), None, load_config(None, {"ref_timing": "stored"}),
                                     "no stored baseline for level1/1")
    assert source == "interleaved (no stored baseline for level1/1)"


def test_a_stored_baseline_gives_the_ratio_of_medians_and_the_far_ends_of_both_intervals():
    mine = _stats(2.0, 1.6, 2.5)
    stored = _stored(_stats(4.0, 3.0, 5.0))
    theirs, speedup, source = against_reference(Measurement([mine], [[]], True), stored,
                                                load_config(None, {"ref_timing": "stored"}), "")
    assert theirs == _stats(4.0, 3.0, 5.0) and source == "stored NVIDIA-H200.json (2025-03-04)"
    assert speedup == pytest.approx((4.0 / 2.0, 3.0 / 2.5, 5.0 / 1.6))


ROOFLINE = SimpleNamespace(roofline=Roofline(flops=2e9, bytes=4e6, rates=Rates(20.0, 1.0)))
PEAKS = {"bandwidth_gbps": 100.0, "fp32_tflops": 10.0}   # floor: max(4e6 / 1e8, 2e9 / 1e10) = 0.2 ms


def test_speed_of_light_is_the_floor_at_the_stored_peaks():
    assert speed_of_light(ROOFLINE, _stored(_stats(1.0, 0.9, 1.1), PEAKS), _stats(1.0, 0.9, 1.1)) == pytest.approx(0.2)


def test_no_speed_of_light_without_peaks_or_above_the_reference_s_own_time():
    reference = _stats(1.0, 0.9, 1.1)
    assert speed_of_light(ROOFLINE, None, reference) is None
    assert speed_of_light(ROOFLINE, _stored(reference, peaks=None), reference) is None
    fast = _stats(0.1, 0.09, 0.11)   # the floor (0.2 ms) above the reference's median: peaks do not bound it
    assert speed_of_light(ROOFLINE, _stored(fast, PEAKS), fast) is None
