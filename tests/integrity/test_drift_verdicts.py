"""Whose doing a drifted reference was (harness/integrity/drift.py), from the numbers alone; tests/judge/test_drift.py
drives the whole re-timing with a scripted reference process."""
from harness.integrity import drift
from harness.integrity.drift import Outcome, Pace
from harness.timing.interleave import CpuUse

# The candidate's CPU use as measured on the CPU machine: an honest one, and the saboteur fixture 31 (threads that burn
# while its forward is idle, outside its own commands or beside them in them).
HONEST = CpuUse(own_ms=95.0, own_wall_ms=100.0, outside_ms=5.1, freezes=24)
BUSY_OUTSIDE = CpuUse(own_ms=95.0, own_wall_ms=100.0, outside_ms=7.0, freezes=2)
BUSY_INSIDE = CpuUse(own_ms=140.0, own_wall_ms=100.0, outside_ms=0.5, freezes=24)
EVIDENCE = "reference clean 1 ms (95% CI 0.9-1.1), interleaved 2 ms (2.00x)"


def test_a_freeze_that_did_not_hold_always_blames_the_candidate():
    for device in ("cpu", "cuda"):
        blamed = drift.blame(device, ["pid 7 still running", "pid 9"], HONEST, Pace(0.4, 0.4))
        assert blamed == "pid 7 still running, pid 9"


def test_on_cpu_the_candidates_own_cpu_use_decides():
    assert drift.blame("cpu", [], HONEST) is None
    assert drift.blame("cpu", [], BUSY_OUTSIDE) == BUSY_OUTSIDE.describe()
    assert drift.blame("cpu", [], BUSY_INSIDE) == BUSY_INSIDE.describe()
    assert "not known" in drift.blame("cpu", [], None)
    # the bounds themselves are clear: OUTSIDE_MS_PER_FREEZE per stop plus one, OWN_CORES_MAX cores
    at_bound = CpuUse(own_ms=120.0, own_wall_ms=100.0, outside_ms=drift.OUTSIDE_MS_PER_FREEZE * 3, freezes=2)
    assert drift.blame("cpu", [], at_bound) is None
    assert drift.blame("cpu", [], CpuUse(own_ms=120.0, own_wall_ms=100.0, outside_ms=3.01, freezes=2)) is not None
    assert drift.blame("cpu", [], CpuUse(own_ms=121.0, own_wall_ms=100.0, outside_ms=0.0, freezes=2)) is not None


def test_on_a_gpu_the_pace_beside_the_stopped_candidate_decides_not_its_cpu_use():
    assert drift.blame("cuda", [], HONEST, Pace(0.4, 0.42), margin=0.1) is None           # at its clean pace: the host
    held = drift.blame("cuda", [], HONEST, Pace(0.4, 0.76), margin=0.1)
    assert held.startswith("with the candidate stopped the GPU ran a fixed workload at 1.90x its clean time")
    assert held.endswith(": other work held the GPU")
    for unknown in (None, Pace(0.4, None), Pace(None, 0.4), Pace(0.0, 0.4)):
        assert "pace could not be measured" in drift.blame("cuda", [], BUSY_INSIDE, unknown)


def test_the_reference_is_timed_alone_again_only_when_it_drifted_or_a_freeze_failed():
    assert not drift.worth_timing_alone(False, [])
    assert drift.worth_timing_alone(True, [])
    assert drift.worth_timing_alone(False, ["freeze did not settle"])
    assert drift.worth_timing_alone(False, [], suspect=True)


def test_on_cpu_a_candidate_that_could_have_slowed_its_reference_has_it_timed_alone_whatever_it_read():
    # against its clean time the interleaved reference says little: a clean time read beside a build was 2.5x its
    # alone time, and a saboteur's reference 1.2x the twin's passed within the CPU margin (+50%)
    assert drift.could_have_slowed("cpu", BUSY_OUTSIDE)
    assert drift.could_have_slowed("cpu", BUSY_INSIDE)
    assert not drift.could_have_slowed("cpu", HONEST)          # an honest one: the machine's noise
    assert not drift.could_have_slowed("cpu", None)            # not known: the CI bound alone decides
    assert not drift.could_have_slowed("cuda", BUSY_OUTSIDE)   # the GPU's pace decides there


def _after(alone_ms, interleaved_ms=2.0, device="cpu", stragglers=(), cpu=HONEST, pace=Pace(None, None)):
    return drift.after_alone(EVIDENCE, 0.5, clean_ci_high_ms=1.1, interleaved_ms=interleaved_ms, alone_ms=alone_ms,
                             device=device, stragglers=list(stragglers), cpu=cpu, pace=pace)


def test_slow_alone_too_the_machine_changed():
    assert _after(alone_ms=1.66, cpu=BUSY_OUTSIDE) == drift.Verdict(Outcome.MACHINE_CHANGED, None)
    assert _after(alone_ms=1.65, interleaved_ms=3.0, cpu=BUSY_OUTSIDE).outcome is Outcome.INTERFERENCE   # 1.1 x 1.5


def test_back_at_its_clean_time_alone_a_candidate_that_could_have_slowed_it_did():
    verdict = _after(alone_ms=1.0, cpu=BUSY_OUTSIDE)
    assert verdict == drift.Verdict(Outcome.INTERFERENCE, (
        f"timing interference: {EVIDENCE}; alone again after the candidate was killed (idle between its blocks as "
        f"interleaved): 1 ms; {BUSY_OUTSIDE.describe()}"))
    assert _after(alone_ms=1.0, interleaved_ms=1.0, stragglers=["pid 7"]).outcome is Outcome.INTERFERENCE


def test_a_drift_the_candidate_could_not_have_caused_is_the_machines():
    verdict = _after(alone_ms=1.0, cpu=HONEST)
    assert verdict.outcome is Outcome.DRIFT and verdict.evidence.endswith(f"1 ms; {HONEST.describe()}")
    gpu = _after(alone_ms=1.0, device="cuda", pace=Pace(0.4, 0.41))
    assert gpu.outcome is Outcome.DRIFT and gpu.evidence.endswith(Pace(0.4, 0.41).describe())


def test_an_interleaved_time_within_the_margin_of_the_alone_time_is_not_put_down_to_the_candidate():
    """The CPU machine (CI): 0.377 ms clean, 0.590 ms interleaved, 0.431 ms alone after the kill, beside a candidate
    that used more than a core: within +50% of the alone time, the machine slowed both."""
    verdict = _after(alone_ms=1.4, interleaved_ms=2.0, cpu=BUSY_INSIDE)
    assert verdict.outcome is Outcome.DRIFT and verdict.evidence.endswith("; the interleaved time is within +50% of it")
    assert _after(alone_ms=1.3, interleaved_ms=2.0, cpu=BUSY_INSIDE).outcome is Outcome.INTERFERENCE   # 2.0 > 1.95
