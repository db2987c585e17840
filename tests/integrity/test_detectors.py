"""The parent's pure detectors: findings from numbers it measured itself."""
import torch

from harness.integrity import detectors
from harness.shared.check import Tolerance
from harness.shared.messages import KernelCounts, Rates, Roofline


def _counts(own, library, streams=(), share=None):
    return KernelCounts(own=own, library=library, own_share=share, library_summary="gemm x1", side_streams=streams)


def test_kernel_findings():
    assert set(detectors.kernel_findings(_counts(0, 3), ref_kernels=3)) == {"no_custom_kernel", "library_kernels",
                                                                             "no_fusion"}
    fused = detectors.kernel_findings(_counts(1, 1, share=0.9), ref_kernels=5)
    assert set(fused) == {"library_kernels"} and "90%" in fused["library_kernels"]
    assert detectors.kernel_findings(_counts(1, 0), ref_kernels=2) == {}
    assert "no_fusion" in detectors.kernel_findings(_counts(1, 0), ref_kernels=1)
    assert "[7]" in detectors.kernel_findings(_counts(2, 0, streams=(7,)), ref_kernels=4)["side_stream_kernels"]


def test_spot_mismatch_checks_each_kept_call_against_the_input_set_the_judge_chose():
    truth = [[torch.ones(2)], [torch.zeros(2)]]
    good = [{"call": 3, "input_set": 1, "outputs": [torch.zeros(2)]}]
    assert detectors.spot_mismatch(good, truth, Tolerance(), chosen=[1]) is None
    # wrong outputs for the set the judge chose (and the entry names it too)
    assert "timed call 3 (input set 0)" in detectors.spot_mismatch([dict(good[0], input_set=0)], truth, Tolerance(),
                                                                   chosen=[0])
    # an entry that names the set its cached output is right for, not the one the judge chose: a mismatch whatever
    # its outputs
    assert "names input set 1, where the judge chose 0" in detectors.spot_mismatch(good, truth, Tolerance(),
                                                                                    chosen=[0])
    for named in (5, None, True, "1", torch.tensor(1)):
        assert "where the judge chose 1" in detectors.spot_mismatch([dict(good[0], input_set=named)], truth,
                                                                    Tolerance(), chosen=[1])
    assert "not a record" in detectors.spot_mismatch(["x"], truth, Tolerance(), chosen=[1])
    assert "missing" in detectors.spot_mismatch(None, truth, Tolerance(), chosen=[1])
    # an emptied spot file checks nothing, and one with more entries than asked is not the timer's: a mismatch
    assert "0 spot-checked output(s) came back for the 2 timed calls" in detectors.spot_mismatch(
        [], truth, Tolerance(), chosen=[0, 1])
    assert "2 spot-checked output(s) came back for the 1 timed calls" in detectors.spot_mismatch(
        good * 2, truth, Tolerance(), chosen=[1])
    # in the order the judge asked for them: two right entries swapped are two mismatches
    pair = [good[0], {"call": 5, "input_set": 0, "outputs": [torch.ones(2)]}]
    assert detectors.spot_mismatch(pair, truth, Tolerance(), chosen=[1, 0]) is None
    assert "where the judge chose 0" in detectors.spot_mismatch(pair, truth, Tolerance(), chosen=[0, 1])


def test_beyond_the_reference_roofline_only_below_half_the_floor():
    roof = Roofline(flops=1e9, bytes=1e6, rates=Rates(bandwidth_gbps=100.0, fp32_tflops=1.0))
    assert detectors.beyond_roofline(0.6, 1.0, roof) is None
    assert detectors.beyond_roofline(0.4, None, roof) is None
    assert "0.5 x floor 1 ms" in detectors.beyond_roofline(0.4, 1.0, roof)


def test_fresh_inputs_far_slower_than_rotating_ones_are_a_replay():
    assert detectors.fresh_slowdown([], 1.0) is None
    assert detectors.fresh_slowdown([1.1, 0.9, 1.4, 1.0], 1.0) is None         # an honest kernel: about the same
    assert detectors.fresh_slowdown([0.05, 0.06, 0.05], 0.01) is None          # 5x, but 40 us: below the 50 us gap
    evidence = detectors.fresh_slowdown([1.5, 1.6, 1.4, 9.0], 0.12)            # a cache: 12x on fresh inputs
    assert evidence is not None and "median 1.55 ms" in evidence and "12.9x" in evidence
    assert "fastest 1.4 ms" in evidence
    # the host's noise lands on some calls: one fresh call as fast as the blocks' is no cache (a median of 3.5x is)
    assert detectors.fresh_slowdown([0.03, 0.1, 0.12, 0.09], 0.03) is None
    assert detectors.fresh_slowdown([0.11, 0.1, 0.12, 0.13], 0.03) is not None


def test_aftermath():
    found = detectors.aftermath(["12 sleep"], ["bad line"], 3 * 2**20, 2**20, ["socket.connect: x"] * 7)
    assert set(found) == {"spawned_processes", "forged_events", "output_flood", "sandbox_blocked"}
    assert "(+2 more)" in found["sandbox_blocked"] and "3.0 MB" in found["output_flood"]
    assert detectors.aftermath([], [], 10, None, []) == {}


def test_a_timed_call_on_a_fresh_input_set_is_checked_against_that_sets_reference():
    truth = [torch.ones(3)]
    assert detectors.fresh_mismatch([torch.ones(3)], truth, 2, Tolerance()) is None
    evidence = detectors.fresh_mismatch([torch.zeros(3)], truth, 2, Tolerance())
    assert evidence is not None and evidence.startswith("fresh input set 2: ")
    assert detectors.fresh_mismatch([torch.ones(3), torch.ones(3)], truth, 0, Tolerance()) is not None   # one too many


def test_input_replay_needs_two_slow_rounds_on_never_seen_sets():
    slow, fast = [9.0, 8.0], [1.1, 1.0]
    assert detectors.input_replay([slow], 1.0) is None                 # one slow round: a busy CPU now and then
    assert detectors.input_replay([slow, fast], 1.0) is None           # slow only while it woke up
    assert detectors.input_replay([fast], 1.0) is None
    evidence = detectors.input_replay([slow, [8.0, 7.0, 9.0]], 1.0)
    assert evidence == (f"{detectors.fresh_slowdown(slow, 1.0)}; again on 3 other set(s): "
                        f"{detectors.fresh_slowdown([8.0, 7.0, 9.0], 1.0)}")
    near = detectors.input_replay([slow, slow], 1.0, near_ms=[1.0, 1.2, 0.9])
    assert near.endswith("; the calls on seen sets just before them: median 1 ms")
