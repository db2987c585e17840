"""The parent's side of the timing dialogue: a side's reports are validated, and run_timing drives both sides."""
import gc
import math
import threading

import pytest

from harness.shared import protocol
from harness.shared.config import load_config
from harness.shared.settings import TimingSettings
from harness.shared.timer import HEAD_MAX_MS, Block
from harness.timing.interleave import (
    SPOT_BYTES,
    RemoteSide,
    SideStopped,
    collector_off,
    drift_margin,
    drift_of,
    run_timing,
    spot_count,
    wall_mismatch,
)

TIMING = {"warmup_ms": 0.0, "block_ms": 1.0, "min_blocks": 3, "timing_cap_s": 0.5, "max_block_reps": 4,
          "spot_checks": 2}


def timing(**overrides) -> TimingSettings:
    """The timing settings of a config with TIMING's keys and `overrides`."""
    return TimingSettings.from_config(load_config(None, {**TIMING, **overrides}))


class FakeProcess:
    """A side's process: answers each command as a timer whose every call takes `per_call_ms`.
    `capture`: whether a CUDA-graph request succeeds; `block_reply` replaces the BLOCK answer."""

    def __init__(self, per_call_ms: float, capture: bool = True, block_reply=None):
        self.per_call_ms, self.capture, self.block_reply = per_call_ms, capture, block_reply
        self.commands: list[dict] = []
        self.pace_ms = None   # the answer to CMD_PACE (the oracle's GPU pace; None: not told)

    def send(self, command) -> None:
        self.commands.append(command.to_command())

    def expect(self, wanted: str, timeout_s: float) -> dict:
        last = self.commands[-1]
        if last["cmd"] == protocol.CMD_TIME_START:
            graph = last["graph"] and self.capture
            return {"event": wanted, "per_call_ms": self.per_call_ms,
                    "method": "cuda_graph, device sync" if graph else "events, device sync",
                    "graph_error": None if graph or not last["graph"] else "capture failed"}
        if last["cmd"] == protocol.CMD_BLOCK:
            if self.block_reply is not None:
                return {"event": wanted, **self.block_reply}
            reps = last["reps"]
            return {"event": wanted, "samples": [self.per_call_ms] * reps,
                    "events_ms": self.per_call_ms * (reps + 1), "outside_ms": 0.01}
        if last["cmd"] == protocol.CMD_PACE:
            return {"event": wanted, "ms": self.pace_ms}
        return {"event": wanted}

    def side(self, name: str, input_sets: int = 0) -> RemoteSide:
        return RemoteSide(name, self.send, self.expect, timeout_s=1.0, input_sets=input_sets)

    def sent(self, cmd: str) -> list[dict]:
        return [c for c in self.commands if c["cmd"] == cmd]


def test_a_side_reports_its_warmup_and_blocks():
    process = FakeProcess(0.5)
    side = process.side("candidate")
    side.start(warmup_ms=2.0, l2_flush=True, sync="device", graph=False)
    assert (side.per_call_ms, side.method, side.graph_error) == (0.5, "events, device sync", None)
    block = side.block(3, keep=[1])
    assert block.samples == [0.5, 0.5, 0.5] and block.events_ms == 2.0 and side.calls == 4
    assert process.commands[-1] == {"cmd": "block", "reps": 3, "keep": [1], "ahead_ms": 0.0}
    assert process.commands[0]["warmup_ms"] == 2.0 and isinstance(process.commands[0]["order_seed"], int)


def test_the_parent_chooses_the_input_set_of_every_counted_span_and_remembers_the_kept_ones():
    process = FakeProcess(0.5)
    side = process.side("candidate", input_sets=5)
    side.start(graph=False)
    side.block(40, keep=[3, 17])
    side.block(40, keep=[0])
    first, second = (command["sets"] for command in process.sent(protocol.CMD_BLOCK))
    # one set a span, kept or not (the sets say nothing the keep list does not), drawn over all five
    assert len(first) == len(second) == 40 and set(first + second) == set(range(5))
    assert side.kept_sets == [first[3], first[17], second[0]] and side.kept_asked == 3
    # secret: another side (another process of the parent's) draws other sets
    other = FakeProcess(0.5)
    other_side = other.side("candidate", input_sets=5)
    other_side.start(graph=False)
    other_side.block(40, keep=[3, 17])
    assert other.sent(protocol.CMD_BLOCK)[0]["sets"] != first
    # a side whose count the parent does not know draws its own, in the seeded order
    plain = FakeProcess(0.5)
    plain_side = plain.side("reference")
    plain_side.start(graph=False)
    plain_side.block(3, keep=[1])
    assert "sets" not in plain.sent(protocol.CMD_BLOCK)[0] and plain_side.kept_sets == []


def test_run_timing_remembers_the_chosen_set_of_every_spot_checked_call():
    reference, candidate = FakeProcess(2.0), FakeProcess(1.0)
    side = candidate.side("candidate", input_sets=5)
    run_timing(side, reference.side("reference", input_sets=5), timing(spot_checks=3))
    blocks = candidate.sent(protocol.CMD_BLOCK)
    assert side.kept_sets == [c["sets"][k] for c in blocks for k in c["keep"]] and len(side.kept_sets) == 3
    assert all(len(c["sets"]) == c["reps"] for c in blocks + reference.sent(protocol.CMD_BLOCK))


def test_spot_checks_keep_fewer_calls_where_their_outputs_are_large():
    assert spot_count(8, 4 * 2**20) == 8                  # small outputs: as the config asks
    assert spot_count(8, SPOT_BYTES // 4) == 4            # as many as fit in SPOT_BYTES
    assert spot_count(8, 6_400_000_000) == 2              # a level-1 problem's 6.4 GB output: never fewer than two
    assert spot_count(1, 6_400_000_000) == spot_count(1, 0) == 1 and spot_count(0, 10) == 0   # never more than asked


def _enqueue_times(ref, cand, ref_ms: float, cand_ms: float) -> None:
    ref_expect, cand_expect = ref.expect, cand.expect
    ref.expect = lambda wanted, timeout_s: {**ref_expect(wanted, timeout_s), "launch_ms": ref_ms}
    cand.expect = lambda wanted, timeout_s: {**cand_expect(wanted, timeout_s), "launch_ms": cand_ms}


def test_both_sides_get_the_head_start_the_longer_enqueue_time_sets():
    # On CUDA each side reports its host time per call in WARM; both sides' blocks carry the head start computed from
    # the longer (the candidate's here), and the method says how long
    ref, cand = FakeProcess(0.5), FakeProcess(0.5)
    _enqueue_times(ref, cand, 0.1, 0.3)
    measured, _ = run_timing(cand.side("candidate"), ref.side("reference"), timing(), device="cuda")
    asked = [c["ahead_ms"] for process in (ref, cand) for c in process.sent(protocol.CMD_BLOCK)]
    assert len(asked) >= 6 and asked == pytest.approx([0.6] * len(asked))
    assert all(stats.method.endswith("host 0.60 ms ahead") for stats in measured.stats)
    ref, cand = FakeProcess(0.5), FakeProcess(0.5)   # a candidate that reports a long one buys no more than the cap
    _enqueue_times(ref, cand, 0.1, 5.0)
    run_timing(cand.side("candidate"), ref.side("reference"), timing(), device="cuda")
    assert {c["ahead_ms"] for c in ref.sent(protocol.CMD_BLOCK) + cand.sent(protocol.CMD_BLOCK)} == {HEAD_MAX_MS}
    # off, on the CPU device, and for a candidate timed the conservative way (work on other streams could run
    # beside the spin): none
    for device, ahead, conservative in (("cuda", False, None), ("cpu", True, None), ("cuda", True, "side streams")):
        ref, cand = FakeProcess(0.5), FakeProcess(0.5)
        _enqueue_times(ref, cand, 0.1, 0.3)
        measured, _ = run_timing(cand.side("candidate"), ref.side("reference"), timing(timer_host_ahead=ahead),
                                 device=device, conservative=conservative)
        assert {c["ahead_ms"] for c in ref.sent(protocol.CMD_BLOCK) + cand.sent(protocol.CMD_BLOCK)} == {0.0}
        assert "ahead" not in measured.stats[0].method


@pytest.mark.parametrize("reply", [
    {"samples": ["fast", "fast"], "events_ms": 1.0, "outside_ms": 0.0},
    {"samples": [1.0], "events_ms": 1.0, "outside_ms": 0.0},                 # fewer samples than reps
    {"samples": [1.0, -1.0], "events_ms": 1.0, "outside_ms": 0.0},
    {"samples": [1.0, 1.0], "events_ms": math.inf, "outside_ms": 0.0},
    {"samples": "1.0,1.0", "events_ms": 1.0, "outside_ms": 0.0},
])
def test_a_malformed_block_stops_the_side(reply):
    side = FakeProcess(1.0, block_reply=reply).side("candidate")
    side.start(graph=False)
    with pytest.raises(SideStopped) as stopped:
        side.block(2)
    assert stopped.value.side == "candidate" and "timing event" in str(stopped.value.cause)


def test_a_malformed_warmup_stops_the_side():
    side = RemoteSide("reference", lambda *a, **k: None,
                      lambda wanted, timeout_s: {"event": wanted, "per_call_ms": math.nan}, timeout_s=1.0)
    with pytest.raises(SideStopped, match="reference: malformed per_call_ms"):
        side.start(graph=False)


def test_run_timing_interleaves_both_sides_and_spot_checks_the_candidate_only():
    reference, candidate = FakeProcess(2.0), FakeProcess(1.0)
    measurement, graph_error = run_timing(candidate.side("candidate"), reference.side("reference"), timing())
    assert graph_error is None and measurement.interleaved
    assert measurement.ratio(0, 1) == (2.0, 2.0, 2.0)   # reference time over candidate time, per pair
    assert [s.median_ms for s in measurement.stats] == [2.0, 1.0]
    assert sum(len(c["keep"]) for c in candidate.sent("block")) == 2
    assert all(not c["keep"] for c in reference.sent("block"))
    for process in (reference, candidate):
        assert len(process.sent("time_start")) == 1 and len(process.sent("time_end")) == 1


def test_when_one_side_cannot_be_captured_both_are_timed_eagerly():
    reference, candidate = FakeProcess(2.0), FakeProcess(1.0, capture=False)
    measurement, graph_error = run_timing(candidate.side("candidate"), reference.side("reference"),
                                          timing(cuda_graph=True))
    assert graph_error == "candidate: capture failed"
    assert [c["graph"] for c in reference.sent("time_start")] == [True, False]
    assert [s.method for s in measurement.stats] == ["events, device sync, host 0.02 ms ahead"] * 2   # the least


def test_a_stored_baseline_times_the_candidate_alone_and_sequential_timing_is_not_paired():
    candidate = FakeProcess(1.0)
    alone, _ = run_timing(candidate.side("candidate"), None, timing())
    assert len(alone.stats) == 1 and sum(len(c["keep"]) for c in candidate.sent("block")) == 2
    sequential, _ = run_timing(FakeProcess(1.0).side("candidate"), FakeProcess(3.0).side("reference"),
                               timing(ref_timing="sequential"))
    assert not sequential.interleaved and sequential.ratio(0, 1) == (3.0, 3.0, 3.0)


def test_a_malformed_block_in_the_middle_of_run_timing_names_the_side():
    broken = FakeProcess(1.0, block_reply={"samples": [], "events_ms": 0.0, "outside_ms": 0.0})
    with pytest.raises(SideStopped, match="candidate"):
        run_timing(broken.side("candidate"), FakeProcess(1.0).side("reference"), timing())


class Recorder:
    """A holder that logs freeze/thaw calls, and which side's block ran while it was frozen."""

    def __init__(self, log: list):
        self.log = log

    def freeze(self) -> None:
        self.log.append("freeze")

    def thaw(self) -> None:
        self.log.append("thaw")

    def cpu_ms(self) -> None:
        return None

    @property
    def freezes(self) -> int:
        return self.log.count("freeze")


class SlowFirstBlocks(FakeProcess):
    """A reference whose first `slow` blocks run at `factor` times its speed (something slowed it)."""

    def __init__(self, per_call_ms: float, slow: int, factor: float, log: list):
        super().__init__(per_call_ms)
        self.slow, self.factor, self.log = slow, factor, log

    def expect(self, wanted: str, timeout_s: float) -> dict:
        event = super().expect(wanted, timeout_s)
        if self.commands[-1]["cmd"] == protocol.CMD_BLOCK:
            self.log.append("reference block")
            if self.slow > 0:
                self.slow -= 1
                event["samples"] = [s * self.factor for s in event["samples"]]
        return event


def _clean(median_ms: float):
    from harness.shared.timer import Block, summarize
    return summarize([Block([median_ms] * 10, median_ms * 10, 0.0)], 10, True, "events")


def test_the_candidate_is_stopped_exactly_while_reference_blocks_run():
    log: list = []
    reference = SlowFirstBlocks(1.0, 0, 1.0, log).side("reference")
    candidate_process = FakeProcess(0.5)
    candidate = RemoteSide("candidate", candidate_process.send, candidate_process.expect, 1.0, holder=Recorder(log))
    measured, _ = run_timing(candidate, reference, timing())
    blocks = log.count("reference block")
    assert blocks == measured.stats[0].blocks and blocks >= 3
    assert log == ["freeze", "reference block", "thaw"] * blocks
    assert len(reference.hold_ms) == blocks and reference.quiet == [] and candidate.quiet == []


def test_a_drifted_reference_block_is_timed_again_and_a_persistent_one_counted():
    settings = timing(ref_drift_retries=2, ref_drift_margin=0.15)
    for slow, remeasured, refused in ((1, 1, 0), (3, 2, 1)):
        log: list = []
        reference = SlowFirstBlocks(1.0, slow, 2.0, log).side("reference")
        candidate = FakeProcess(0.5).side("candidate")
        measured, _ = run_timing(candidate, reference, settings, clean=_clean(1.0), device="cuda")
        assert (measured.remeasured[0], measured.refused[0]) == (remeasured, refused)
        assert measured.remeasured[1] == 0 and measured.refused[1] == 0   # the candidate is never re-timed
        drift = drift_of(measured, _clean(1.0), 0.15)
        assert drift.blocks_refused == refused and not drift.beyond   # one slow block leaves the median alone


def test_a_block_timed_again_waits_first_with_the_candidate_stopped_into_it(monkeypatch):
    import harness.timing.interleave as interleave
    log: list = []
    # time.sleep is the process's: other threads (spawn's memory watch, up for the process's life once a child with
    # a memory limit started, waits 100 ms between passes) sleep through the real one
    sleep, here = interleave.time.sleep, threading.current_thread()
    monkeypatch.setattr(interleave.time, "sleep", lambda s: log.append(f"settle {s * 1e3:.0f} ms")
                        if threading.current_thread() is here else sleep(s))
    reference = SlowFirstBlocks(1.0, 2, 2.0, log).side("reference")
    process = FakeProcess(0.5)
    candidate = RemoteSide("candidate", process.send, process.expect, 1.0, holder=Recorder(log))
    run_timing(candidate, reference, timing(ref_drift_retries=2, ref_drift_margin=0.15), clean=_clean(1.0),
               device="cuda")
    settle = next(entry for entry in log if entry.startswith("settle"))
    # the first reference block (slow) runs before any candidate block: the wait is the floor, and the candidate
    # is stopped once for the wait and the block after it, then resumed
    assert settle == f"settle {interleave.SETTLE_MIN_MS:.0f} ms"
    assert log[:8] == ["freeze", "reference block", "thaw", "freeze", settle, "reference block", "thaw", "freeze"]


def test_drift_is_beyond_only_when_the_median_moved_and_blocks_stayed_slow():
    settings = timing(ref_drift_retries=1)
    reference = SlowFirstBlocks(1.0, 1000, 1.5, []).side("reference")
    measured, _ = run_timing(FakeProcess(0.5).side("candidate"), reference, settings, clean=_clean(1.0), device="cuda")
    drift = drift_of(measured, _clean(1.0), drift_margin(settings, "cuda"))
    assert drift.beyond and drift.ratio == pytest.approx(1.5)
    assert "interleaved 1.5 ms (1.50x)" in drift.evidence(0.15)
    assert not drift_of(measured, _clean(1.0), drift_margin(settings, "cpu")).beyond   # CPU: a 50% margin


def test_waiting_for_a_cpu_is_not_counted_as_work_the_events_missed():
    from harness.shared.timer import Block, summarize
    busy = Block([1.0] * 10, 10.0, 1.0, wall_ms=400.0)
    assert wall_mismatch(summarize([busy], 10, True, "perf_counter")) is not None
    busy.held_ms = 380.0   # the kernel's run-queue accounting: the side waited that long for a core
    assert wall_mismatch(summarize([busy], 10, True, "perf_counter")) is None


def test_the_parents_garbage_collector_is_off_while_blocks_are_timed_and_as_it_was_after():
    # a full collection of the judge's heap inside a block's wall time (the GIL held 0.15-1 s on a loaded machine)
    # would read as work the side's events missed: timer_mismatch on an honest kernel
    reference, candidate = FakeProcess(2.0), FakeProcess(1.0)
    seen: list[tuple[str, bool]] = []
    answer = candidate.expect
    candidate.expect = lambda wanted, timeout_s: seen.append((wanted, gc.isenabled())) or answer(wanted, timeout_s)
    assert gc.isenabled()
    run_timing(candidate.side("candidate"), reference.side("reference"), timing())
    blocks = [on for wanted, on in seen if wanted == protocol.BLOCK]
    assert blocks and not any(blocks)
    assert gc.isenabled() and dict(seen)[protocol.WARM] and dict(seen)[protocol.SPOTS]   # on outside the blocks
    with collector_off():
        with collector_off():   # another worker's timing, ended first
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()   # off before the first timing: left off after the last
    try:
        with collector_off():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_candidate_whose_reports_leave_more_wall_unexplained_than_its_reference_is_noted():
    """Both sides run the same timer code around their calls; a candidate whose reported spans (or preparation)
    account for much less of its blocks' wall time than the reference's do under-states its time."""
    from harness.shared.timer import Block, summarize
    from harness.timing.interleave import unexplained_beyond_reference

    def side(events_per_call: float, outside_ms: float, unexplained_ms: float, blocks: int = 24, calls: int = 8):
        per_block = [Block([events_per_call] * (calls - 1), events_per_call * calls, outside_ms,
                           wall_ms=events_per_call * calls + outside_ms + unexplained_ms) for _ in range(blocks)]
        return summarize(per_block, calls * blocks, True, "events")

    reference = side(3.0, 0.5, 2.0)
    assert unexplained_beyond_reference(side(2.9, 0.5, 1.6), reference, kept=4) is None     # honest (level2/62)
    # reporting half its spans: 11.6 ms a block the reports do not explain
    halved = side(1.45, 0.5, 1.6 + 8 * 1.45)
    assert "a block (" in unexplained_beyond_reference(halved, reference, kept=4)
    # moving its spans into reported preparation instead
    moved = side(1.45, 0.5 + 8 * 1.45, 1.6)
    assert "reported preparation" in unexplained_beyond_reference(moved, reference, kept=4)
    # spot-check copies are the candidate's own preparation: allowed for, by their size (level2/40 on an H100: eight
    # copies of 268 MB outputs, 1.4 s)
    assert unexplained_beyond_reference(side(2.9, 0.5 + 4 * 4.0 / 24, 1.6), reference, kept=4) is None
    copies = side(11.0, 1400 / 24, 1.3, calls=3)
    assert unexplained_beyond_reference(copies, side(11.0, 0.3, 1.7, calls=3), kept=8) is not None
    assert unexplained_beyond_reference(copies, side(11.0, 0.3, 1.7, calls=3), kept=8, output_bytes=268 << 20) is None
    # a fast candidate runs more calls a block, each with the same host work around it: scaled by its calls
    # (level2/51 on an H100: 0.2 ms calls, 80 a block, 2.8-3.9 ms a block against 0.5-0.7 ms at 5 calls)
    fast, slow_reference = side(0.2, 8.0, 3.9, calls=80), side(5.6, 1.0, 0.6, calls=5)
    assert unexplained_beyond_reference(fast, slow_reference, kept=8) is None
    assert unexplained_beyond_reference(side(0.2, 8.0, 3.9, calls=5), slow_reference, kept=8) is not None


def _checked_block(spans: list[float], gap_ms: float) -> Block:
    return Block(list(spans), sum(spans), 0.0, synced=[span + gap_ms for span in spans])


def test_work_that_outlives_its_stream_is_found_against_the_references_gap():
    """Under sync "checked" each call reports its stream span and its span to an end event after a device-wide
    synchronize; the gap is the host's round trip on both sides, more where the candidate left work running."""
    from harness.timing.interleave import ESCAPE_ALONE_MS, escaped_work, synced_gap_ms

    reference = [_checked_block([1.0, 1.1, 0.9], 0.040)]
    honest = [_checked_block([0.2, 0.21, 0.19], 0.042)]
    hidden = [_checked_block([0.01, 0.012, 0.011], 0.3)]   # its kernels ran on another stream after it returned
    assert synced_gap_ms(reference) == pytest.approx(0.040)
    assert escaped_work(honest, reference) is None
    evidence = escaped_work(hidden, reference)
    assert evidence is not None and "outlived their stream" in evidence and "300.0 us" in evidence
    assert escaped_work([_checked_block([0.2], 0.055)], reference) is None       # within 40 us + 50% of it
    assert escaped_work([_checked_block([0.2], 0.065)], reference) is not None   # beyond it
    assert escaped_work([_checked_block([0.2], ESCAPE_ALONE_MS * 0.9)], None) is None   # no live reference
    assert escaped_work([_checked_block([0.2], ESCAPE_ALONE_MS * 1.5)], None) is not None
    assert escaped_work([Block([0.2], 0.2, 0.0)], reference) is None   # no synced spans: another sync


def test_a_candidate_process_with_a_longer_round_trip_of_its_own_is_not_taken_for_escaped_work():
    """The gap to the after-synchronize end event is each process's round trip: an honest ReLU's process read 67 us
    a span where its reference's read 33 us (an H100, submit after submit). Null spans (no call before the
    synchronize) measure each process's own; the candidate's counts in place of the reference's gap, up to
    ROUND_TRIP_CREDIT times the reference's own, so that work left on a side stream still shows."""
    from harness.timing.interleave import ROUND_TRIP_CREDIT, escaped_work, null_gap_ms

    def side(gap_ms: float, nulls: list[float], spans=(0.036, 0.037, 0.035)) -> list[Block]:
        block = _checked_block(list(spans), gap_ms)
        block.null_gaps = list(nulls)
        return [block]

    reference = side(0.033, [0.032, 0.034, 0.033])
    assert null_gap_ms(reference) == pytest.approx(0.033)
    slow_process = side(0.067, [0.066, 0.068, 0.067])
    assert escaped_work([_checked_block([0.036], 0.067)], reference) is not None   # no null spans: against 33 us
    evidence = escaped_work(side(0.067 + 0.060, [0.066, 0.068, 0.067]), reference)  # 60 us left on a side stream
    assert evidence is not None and "its own round trip 67.0 us" in evidence
    assert escaped_work(slow_process, reference) is None
    # a process whose own round trip reads more than ROUND_TRIP_CREDIT times the reference's is credited no more
    inflated = 0.033 * ROUND_TRIP_CREDIT * 3
    assert escaped_work(side(inflated, [inflated] * 3), reference) is not None
    # a candidate's round trip shorter than the reference's changes nothing: the reference's gap stays the base
    assert escaped_work(side(0.045, [0.010] * 3), reference) is None
    assert escaped_work(side(0.055, [0.010] * 3), reference) is not None
    # without the reference's null spans (another sync, a stored baseline's blocks) the reference's gap alone
    assert escaped_work(slow_process, [_checked_block([0.036], 0.033)]) is not None


def test_a_measurement_taken_by_its_synced_spans_keeps_the_stream_stats_for_the_drift_check():
    from harness.shared.timer import Measurement, summarize, synced_measurement

    sides = [[_checked_block([1.0, 1.0, 1.0], 0.04)] * 6, [_checked_block([0.01, 0.01, 0.01], 0.5)] * 6]
    stats = [summarize(blocks, 18, True, "events, stream end, checked") for blocks in sides]
    measured = Measurement(stats, sides, interleaved=True)
    synced = synced_measurement(measured, "why")
    assert synced.escaped == "why" and synced.stream_stats == stats
    assert synced.stats[0].median_ms == pytest.approx(1.04) and synced.stats[1].median_ms == pytest.approx(0.51)
    assert synced.stats[1].method == "events, device sync (work outlived its stream)"
    assert synced.ratio(0, 1)[0] == pytest.approx(1.04 / 0.51)
    assert drift_of(synced, stats[0], 0.15).ratio == pytest.approx(1.0)   # the reference's stream spans


def _span_block(per_call_ms: float, calls: int, gap_ms: float, claimed=None, reps: int = 40) -> Block:
    """A block of spans of `calls` back-to-back calls: samples per call, events_ms whole spans (the uncounted first
    one too), synced spans `gap_ms` a span beyond the stream's, per call as the samples; `claimed`: the count the
    side reports (its own, unless forged)."""
    return Block([per_call_ms] * reps, per_call_ms * calls * (reps + 1), 0.0,
                 synced=[per_call_ms + gap_ms / calls] * reps, calls_per_span=calls if claimed is None else claimed)


def test_the_parent_reads_how_many_calls_a_span_held_from_the_side_s_spans_not_its_word():
    from harness.shared.timer import summarize
    from harness.timing.interleave import held_calls_per_span, read_calls_per_span, stats_calls_per_span

    assert read_calls_per_span(events_ms=0.005 * 8 * 41, mean_ms=0.005, samples=40, blocks=1) == 8
    assert read_calls_per_span(events_ms=0.0, mean_ms=0.0, samples=0, blocks=0) == 1
    assert held_calls_per_span(8, 8) == 8 and held_calls_per_span(1, 2) == 1   # a slow first span reads high
    assert held_calls_per_span(1, 8) == 8 and held_calls_per_span(64, 8) == 8  # a claim its spans do not bear out
    honest = summarize([_span_block(0.005, 8, 0.04)] * 3, 123, True, "events")
    forged = summarize([_span_block(0.005, 8, 0.04, claimed=1)] * 3, 123, True, "events")
    assert honest.calls_per_span == 8 and forged.calls_per_span == 1   # the side's word, kept as evidence
    assert stats_calls_per_span(honest) == stats_calls_per_span(forged) == 8


def test_work_a_span_s_calls_leave_beyond_their_stream_adds_up_over_the_span():
    """The host's round trip comes once a span; work each call leaves on another stream, once a call. Per call, a
    span of 8 calls would spread the leftover work over them and hide it under the reference's round trip."""
    from harness.timing.interleave import escaped_work

    reference = [_span_block(1.0, 1, 0.040, reps=5)]
    assert escaped_work([_span_block(0.005, 8, 0.042)], reference) is None        # the round trip alone
    leaving = [_span_block(0.005, 8, 0.040 + 8 * 0.010)]   # 10 us a call left on a side stream: 15 us a call
    evidence = escaped_work(leaving, reference)
    assert evidence is not None and "120.0 us longer a span" in evidence and "8 calls a span" in evidence
    # saying it held one call a span does not spread it back over the calls: its spans say eight
    assert escaped_work([_span_block(0.005, 8, 0.040 + 8 * 0.010, claimed=1)], reference) is not None


def test_a_span_of_several_calls_prepares_a_clone_for_each_and_that_is_not_unexplained():
    from harness.shared.timer import summarize
    from harness.timing.interleave import unexplained_beyond_reference

    def side(per_call_ms: float, calls: int, outside_per_span_ms: float, claimed=None, spans: int = 40):
        blocks = [Block([per_call_ms] * spans, per_call_ms * calls * (spans + 1), outside_per_span_ms * (spans + 1),
                        wall_ms=(per_call_ms * calls + outside_per_span_ms + 0.02) * (spans + 1),
                        calls_per_span=calls if claimed is None else claimed) for _ in range(6)]
        return summarize(blocks, 6 * (spans + 1), True, "events")

    reference = side(0.05, 1, 0.02)                    # a clone and a flush a span
    # 8 calls a span: 8 clones and a flush, 4.5 times the reference's preparation a span
    assert unexplained_beyond_reference(side(0.003, 8, 0.09), reference, kept=0) is None
    # the same preparation for one call a span is beyond it
    assert "reported preparation" in unexplained_beyond_reference(side(0.024, 1, 0.09), reference, kept=0)


def test_a_side_s_block_carries_the_calls_its_spans_held():
    process = FakeProcess(0.005, block_reply={"samples": [0.005] * 3, "events_ms": 0.005 * 8 * 4,
                                              "outside_ms": 0.01, "calls_per_span": 8})
    side = process.side("candidate")
    side.start(warmup_ms=2.0, l2_flush=True, sync="checked", graph=False)
    assert side.block(3).calls_per_span == 8


def test_a_measurement_taken_by_its_synced_spans_keeps_their_calls_a_span():
    """Synced spans are per call as the samples are; the whole spans, and the count they held, stay as they were."""
    from harness.shared.timer import Measurement, summarize, synced_measurement
    from harness.timing.interleave import stats_calls_per_span

    sides = [[_span_block(1.0, 1, 0.04, reps=5)] * 6, [_span_block(0.005, 8, 0.2)] * 6]
    stats = [summarize(blocks, 200, True, "events, stream end, checked" + text)
             for blocks, text in zip(sides, ("", ", 8 calls a span"))]
    synced = synced_measurement(Measurement(stats, sides, interleaved=True), "why")
    mine = synced.stats[1]
    assert mine.method == "events, device sync (work outlived its stream), 8 calls a span"
    assert mine.median_ms == pytest.approx(0.005 + 0.2 / 8) and mine.calls_per_span == 8
    assert stats_calls_per_span(mine) == 8 and synced.blocks[1][0].events_ms == pytest.approx(
        (0.005 + 0.2 / 8) * 8 * 41)
    assert synced.stats[0].method == "events, device sync (work outlived its stream)"


class StallsOnce(FakeProcess):
    """A candidate whose first timing reports event times the parent's wall clock never saw pass (as a host stall
    between its spans reads from the other end), then honest ones; `always`: every timing so (a lying timer)."""

    def __init__(self, always: bool = False):
        super().__init__(40.0)
        self.always, self.starts = always, 0

    def expect(self, wanted: str, timeout_s: float) -> dict:
        if self.commands[-1]["cmd"] == protocol.CMD_TIME_START:
            self.starts += 1
            self.per_call_ms = 40.0 if self.always or self.starts == 1 else 0.002
        return super().expect(wanted, timeout_s)


def test_a_wall_clock_disagreement_is_timed_again_and_only_a_second_one_stands():
    once, reference = StallsOnce(), FakeProcess(0.002)
    side = once.side("candidate", input_sets=4)
    measured, _ = run_timing(side, reference.side("reference"), timing())
    assert once.starts == 2 and len(reference.sent(protocol.CMD_TIME_START)) == 2   # both sides from a fresh start
    assert "parent wall" in measured.retimed and wall_mismatch(measured.stats[-1]) is None
    assert measured.stats[-1].median_ms == pytest.approx(0.002)   # the figures are the second timing's
    assert len(side.kept_sets) == side.kept_asked == 2            # the spot checks are the second timer's alone
    assert len(once.sent(protocol.CMD_TIME_END)) == 1

    always = StallsOnce(always=True)
    measured, _ = run_timing(always.side("candidate"), FakeProcess(0.002).side("reference"), timing())
    assert always.starts == 2 and wall_mismatch(measured.stats[-1]) is not None and measured.retimed is not None

    honest = FakeProcess(0.002)
    measured, _ = run_timing(honest.side("candidate"), FakeProcess(0.002).side("reference"), timing())
    assert len(honest.sent(protocol.CMD_TIME_START)) == 1 and measured.retimed is None
