"""Candidate processes started ahead (harness/judge/warm.py): one submission per process, the same confinement as
one started on demand, and never creating a CUDA context while something is timed; builds stopped while anything
is timed."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from conftest import FIXTURES, alive, judge_config, pipeline_settings

from harness.isolation import spawn, started_ahead
from harness.judge import evaluate, warm
from harness.pipeline.batch import run_batch
from harness.shared import findings
from harness.shared.check import Tolerance
from harness.shared.messages import FreshTimed
from harness.shared.problems import resolve_problem
from harness.submission.submissions import from_file


def test_each_process_started_ahead_is_taken_once_replaced_and_never_handed_out_dead(tmp_path):
    pool = warm.Pool(judge_config(device="cpu"), "cpu", {}, size=1)
    try:
        first = pool.take()
        second = pool.take()   # the replacement started when the first was taken
        assert first is not None and second is not None
        assert first.child.process.pid != second.child.process.pid
        assert first.workdir != second.workdir
        # held like any candidate: its own cgroup (where the machine has one) or its process group, sandboxed
        assert first.child.isolation() and first.child.freezer is not None
        for started in (first, second):
            started.child.finish()   # a taken process that is given nothing to run exits; it is never reused
            assert not alive(started.child.process.pid)
        pool._slots[0].ready.wait()   # the third, started when the second was taken
        spawn.stop_all()   # an interrupted batch kills every child, those started ahead included
        spawn.allow_new()
        assert pool.take() is None   # killed while it waited: not handed out (the caller starts one on demand)
    finally:
        spawn.allow_new()
        pool.close()
    assert pool.take() is None   # closed: nothing is started any more


class _Starting:
    """Stands for a child being started ahead: `settled` is set once it is up; its freezer logs what it is told."""
    is_build = False
    ended = None
    pause_beside_timing = False

    def __init__(self, gpu: Optional[str] = None):
        self.place = spawn.place("cuda", None if gpu is None else {"CUDA_VISIBLE_DEVICES": gpu})
        self.settled = threading.Event()
        self.log: list[str] = []
        self.freezer = SimpleNamespace(freeze=lambda hold=False: self.log.append("freeze"),
                                       thaw=lambda: self.log.append("thaw"))


def test_a_cpu_timing_stops_processes_still_starting_instead_of_waiting():
    starting, up = _Starting(), _Starting()
    up.settled.set()
    spawn._LIVE.update((starting, up))
    try:
        with spawn.builds_paused("cpu"):
            assert starting.log == ["freeze"] and not starting.settled.is_set()
        assert starting.log == ["freeze", "thaw"] and up.log == []   # one already up waits on its pipe: left alone
    finally:
        spawn._LIVE.difference_update((starting, up))


def test_a_hold_inside_another_is_part_of_it():
    """The timing holds the gate from its blocks to its fresh calls; the fresh calls' own hold inside it neither
    waits again nor resumes what the outer one stopped."""
    starting = _Starting()
    spawn._LIVE.add(starting)
    try:
        with spawn.builds_paused("cpu"):
            with spawn.builds_paused("cpu") as waited_s:
                assert waited_s == 0.0 and starting.log == ["freeze"]
            assert starting.log == ["freeze"]   # still stopped
        assert starting.log == ["freeze", "thaw"]
        with spawn.builds_paused("cpu"):   # a later hold is a hold of its own again
            assert starting.log == ["freeze", "thaw", "freeze"]
    finally:
        spawn._LIVE.discard(starting)


def test_a_process_started_or_marked_starting_during_a_cpu_timing_is_stopped_for_the_rest_of_it():
    # a build the pool sent, or a process started ahead, a moment after the timing began ran beside all of it: a
    # reference's clean time on 2 cores read 4.7-7.5 ms where it reads 3 ms alone, and a saboteur's drift went unseen
    build, starting = _Starting(), _Starting()
    build.is_build, build.settled = True, None
    starting.settled = None   # not yet marked: a process just started, its slot not yet told
    try:
        with spawn.builds_paused("cpu"):
            spawn._LIVE.update((build, starting))
            spawn._held_if_paused(build)   # what Child does once its process exists
            spawn._held_if_paused(starting)
            assert build.log == ["freeze"] and starting.log == []   # not starting (yet): runs on
            spawn.Child.mark_starting(starting, threading.Event())
            assert starting.log == ["freeze"]
        assert build.log == starting.log == ["freeze", "thaw"]
        spawn._held_if_paused(build)   # no timing under way: nothing stopped
        assert build.log == ["freeze", "thaw"]
    finally:
        spawn._LIVE.difference_update((build, starting))


def test_a_process_two_timings_hold_is_resumed_by_the_last_to_end():
    # two GPU workers' timings on one host (each stops the builds for a quiet round): the first to end must not
    # resume a build the other still needs stopped
    build = _Starting()
    build.is_build, build.settled = True, None
    spawn._LIVE.add(build)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def second() -> None:
        with spawn.builds_paused("cpu"):
            second_in.set()
            first_out.wait(5)

    other = threading.Thread(target=second)
    try:
        with spawn.builds_paused("cpu"):
            first_in.set()
            other.start()
            assert second_in.wait(5)
            assert build.log == ["freeze"]   # stopped once
        assert build.log == ["freeze"]       # the other timing still runs
        first_out.set()
        other.join(5)
        assert build.log == ["freeze", "thaw"]
    finally:
        first_out.set()
        spawn._LIVE.discard(build)


def test_a_gpu_timing_stops_references_started_in_the_background_only():
    background, candidate = _Starting(), _Starting()
    background.pause_beside_timing, candidate.pause_beside_timing = True, False
    spawn._LIVE.update((background, candidate))
    try:
        with spawn.builds_paused("cuda"):
            assert background.log == ["freeze"] and candidate.log == []   # a candidate's imports run on
        background.settled.set()   # READY: it serves timing from now on, never stopped again
        with spawn.builds_paused("cuda"):
            pass
        assert background.log == ["freeze", "thaw"]
    finally:
        spawn._LIVE.difference_update((background, candidate))


def test_a_round_timed_on_a_quiet_host_stops_builds_and_starting_processes_on_a_gpu_too():
    build, starting, background, up = _Starting(), _Starting(), _Starting(), _Starting()
    build.is_build, background.pause_beside_timing = True, True
    build.settled = None   # a build is never "started ahead"
    up.settled.set()
    spawn._LIVE.update((build, starting, background, up))
    try:
        with spawn.builds_paused("cuda"), spawn.host_quieted("cuda"):
            assert build.log == ["freeze"] and starting.log == ["freeze"]
            assert background.log == ["freeze"] and up.log == []   # stopped once, by builds_paused; one up is idle
        assert build.log == starting.log == background.log == ["freeze", "thaw"]
        with spawn.builds_paused("cpu"), spawn.host_quieted("cpu"):   # on the CPU builds_paused does it all
            pass
        assert build.log == starting.log == ["freeze", "thaw"] * 2
    finally:
        spawn._LIVE.difference_update((build, starting, background, up))


GPU0, GPU1 = {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}


def test_a_gpu_timing_stops_and_holds_off_its_own_gpus_start_ups_only():
    """GPU workers of one process: a timing on GPU 0 stops GPU 0's reference started in the background and holds off
    GPU 0's start-ups; GPU 1's go on (its evaluations time on a GPU of their own)."""
    mine, other = _Starting("0"), _Starting("1")
    mine.pause_beside_timing = other.pause_beside_timing = True
    spawn._LIVE.update((mine, other))
    began = threading.Event()

    def start_up(env: dict, done: threading.Event) -> None:
        began.set()
        with spawn.start_gate("cuda", env).start_up():
            done.set()

    try:
        with spawn.builds_paused("cuda", GPU0):
            assert mine.log == ["freeze"] and other.log == []
            for env in (GPU1, GPU0):
                done = threading.Event()
                threading.Thread(target=start_up, args=(env, done), daemon=True).start()
                assert done.wait(0.5) is (env is GPU1)   # GPU 1's start-up runs now; GPU 0's waits for the timing
        assert done.wait(5)
        assert mine.log == ["freeze", "thaw"] and other.log == []
        with spawn.builds_paused("cuda", GPU0), spawn.host_quieted("cuda", GPU0):   # a span that needs a quiet host
            assert mine.log == ["freeze", "thaw", "freeze"] and other.log == ["freeze"]
        assert other.log == ["freeze", "thaw"]
    finally:
        spawn._LIVE.difference_update((mine, other))


def test_a_gpu_timing_waits_for_a_start_up_under_way_and_holds_off_new_ones():
    began = time.perf_counter()
    under_way = threading.Event()

    def start_up(seconds: float) -> None:
        with spawn.start_gate("cuda").start_up():
            under_way.set()
            time.sleep(seconds)

    threading.Thread(target=start_up, args=(0.3,)).start()
    under_way.wait()
    with spawn.builds_paused("cuda"):
        assert time.perf_counter() - began >= 0.25   # the CUDA start-up under way ended first
        late = threading.Thread(target=start_up, args=(0.0,))
        late.start()
        time.sleep(0.3)
        assert late.is_alive()   # a start-up does not begin while something is timed
    late.join(5)
    assert not late.is_alive()


def test_a_process_started_ahead_creates_its_cuda_context_only_when_nothing_is_timed():
    pool = warm.Pool(judge_config(device="cpu"), "cpu", {}, size=1)
    try:
        with spawn.start_gate("cpu").timing():
            pool.fill()
            slot = pool._slots[0]
            assert slot.imported.wait(120)   # its imports went on meanwhile
            time.sleep(0.5)
            assert not slot.ready.is_set()
        assert slot.ready.wait(120) and slot.started is not None
        assert slot.gate_wait_s >= 0.4
    finally:
        pool.close()


class _FreshRun:
    """The candidate's side of the fresh-input timing: answers each set with the reference's output at `ms`,
    noting whether a build was stopped at that moment."""

    def __init__(self, build: _Starting, outputs: list, ms: list[float], synced: Optional[list[float]] = None,
                 near_gaps: tuple[float, ...] = ()):
        self.build, self.outputs, self.ms = build, outputs, list(ms)
        self.synced = list(synced) if synced is not None else None   # each span to its synchronized end event
        self.near_gaps = near_gaps   # the gaps of the seen-set spans before each fresh one
        self.findings = findings.Found()
        self.phases: dict = {}   # seconds per phase, as CandidateRun keeps them
        self.build_stopped: list[bool] = []
        self.near: list = []   # the calls on a seen set asked for before each (None: the child's default)
        self.ahead: list = []  # the head start asked for each (the timing's: timer.measure)
        self.spans: list = []  # the calls asked for in each fresh span

    def time_fresh(self, input_set, l2_flush, sync, near=None, ahead_ms=0.0, span_calls=1):
        self.near.append(near)
        self.ahead.append(ahead_ms)
        self.spans.append(span_calls)
        self.build_stopped.append(self.build.log[-1:] == ["freeze"])
        synced = self.synced.pop(0) if self.synced is not None else None
        return (FreshTimed(self.ms.pop(0), calls=span_calls, synced_ms=synced, near_gaps_ms=self.near_gaps),
                self.outputs[len(self.build_stopped) - 1])


def test_fresh_input_calls_run_with_builds_stopped_and_two_slow_rounds_are_a_replay():
    # Its calls are held against the timed median, which ran with builds stopped: beside a compiler on 2 CPU cores
    # an honest C++ kernel read 1.2-3.4x slow on them (tests/judge/test_statuses.py: level0/2 judged input_replay).
    outputs = [[torch.full((2,), float(i))] for i in range(4)]
    truth = SimpleNamespace(fresh_inputs=[[torch.zeros(2)]] * 4, fresh_outputs=outputs)
    ref = SimpleNamespace(device="cpu", env=None, tolerance=Tolerance(), with_fresh_sets=lambda: truth,
                          fresh_in=True)
    config = judge_config(device="cpu", fresh_inputs=2)
    build = _Starting()
    build.is_build, build.settled = True, None
    spawn._LIVE.add(build)
    try:
        honest = _FreshRun(build, outputs, [1.1, 1.0])
        assert evaluate.time_fresh_inputs(honest, ref, config, rotating_ms=1.0, block_calls=7) == 1.05
        assert honest.build_stopped == [True, True] and "input_replay" not in honest.findings
        assert honest.near == [None, None]   # a first round: the child's few calls on a seen set before each
        replay = _FreshRun(build, outputs, [9.0, 9.0, 8.0, 8.0])
        assert evaluate.time_fresh_inputs(replay, ref, config, rotating_ms=1.0, block_calls=7, ahead_ms=0.4) == 8.0
        assert replay.ahead == [0.4] * 4   # every fresh call as the timed median's were: the same head start
        assert replay.build_stopped == [True] * 4 and "again on 2 other set(s)" in replay.findings["input_replay"]
        assert replay.near == [None, None, 7, 7]   # the second round: a block's worth of calls before each
        # a process slow only while it wakes up (first round), as fast as in its blocks once warmed (second)
        cold = _FreshRun(build, outputs, [6.0, 6.5, 1.1, 1.0])
        assert evaluate.time_fresh_inputs(cold, ref, config, rotating_ms=1.0, block_calls=7) == 1.05
        assert "input_replay" not in cold.findings
        # spans of several calls, as the timed ones held: the fresh call's time is its span less the others at the
        # rotating median. An honest 14-call span of a 1 ms call reads 14 ms; a replay's fresh call costs 8 ms more
        spanned = _FreshRun(build, outputs, [14.1, 14.0])
        assert evaluate.time_fresh_inputs(spanned, ref, config, rotating_ms=1.0, block_calls=7,
                                          span_calls=14) == pytest.approx(1.05)
        assert spanned.spans == [14, 14] and "input_replay" not in spanned.findings
        replay = _FreshRun(build, outputs, [21.0, 21.0, 20.0, 20.0])
        assert evaluate.time_fresh_inputs(replay, ref, config, rotating_ms=1.0, block_calls=7,
                                          span_calls=14) == pytest.approx(7.0)
        assert "input_replay" in replay.findings
        # a replay that computes the sets it has not seen on a side stream: its stream spans read as fast as its
        # blocks', its synchronized spans hold the work. Less the blocks' gap (0.03 ms a span) it is slow
        sidestream = _FreshRun(build, outputs, [1.0] * 4, synced=[9.03, 9.03, 8.03, 8.03])
        assert evaluate.time_fresh_inputs(sidestream, ref, config, rotating_ms=1.0, block_calls=7,
                                          span_gap_ms=0.03) == pytest.approx(8.0)
        assert "input_replay" in sidestream.findings
        honest = _FreshRun(build, outputs, [1.0, 1.0], synced=[1.04, 1.02])   # its gap about as in its blocks
        assert evaluate.time_fresh_inputs(honest, ref, config, rotating_ms=1.0, block_calls=7,
                                          span_gap_ms=0.03) == pytest.approx((1.01 + 1.0) / 2)
        assert "input_replay" not in honest.findings
        # an honest 2.5 us ReLU, 27 calls a span (H200): its process, woken for the fresh calls, waits 0.12 ms in the
        # synchronize where its blocks' median was 0.026 ms. Against the blocks' gap alone its fresh calls read 22x
        # (a replay); against the round trip its seen-set spans just before them showed, as fast as its blocks
        woken = dict(ms=[0.0685, 0.0674, 0.0681, 0.0672], synced=[0.1925, 0.1914, 0.1921, 0.1912])
        honest = _FreshRun(build, outputs, **woken)
        evaluate.time_fresh_inputs(honest, ref, config, rotating_ms=0.0025, block_calls=7, span_calls=27,
                                   span_gap_ms=0.0255)
        assert "input_replay" in honest.findings
        honest = _FreshRun(build, outputs, **woken, near_gaps=(0.118, 0.121, 0.124))
        fresh = evaluate.time_fresh_inputs(honest, ref, config, rotating_ms=0.0025, block_calls=7, span_calls=27,
                                           span_gap_ms=0.0255)
        assert "input_replay" not in honest.findings and fresh < 3 * 0.0025
        # the seen-set spans are the candidate's: gaps it made long there buy at most NEAR_GAP_SLACK_MS in a fresh one
        sidestream = _FreshRun(build, outputs, [0.0675] * 4, synced=[1.0925] * 4, near_gaps=(5.0,))
        evaluate.time_fresh_inputs(sidestream, ref, config, rotating_ms=0.0025, block_calls=7, span_calls=27,
                                   span_gap_ms=0.0255)
        assert "input_replay" in sidestream.findings
        assert build.log[-1] == "thaw"
    finally:
        spawn._LIVE.discard(build)


def test_on_a_gpu_the_second_fresh_round_runs_with_builds_stopped():
    # On a GPU builds run beside timings, fresh calls included; the second round, which decides input_replay, is
    # short and is timed on a quiet host (the zero-fill example, 0.018 ms a call, was judged input_replay beside
    # builds on an H200, 2026-11-26)
    outputs = [[torch.full((2,), float(i))] for i in range(4)]
    truth = SimpleNamespace(fresh_inputs=[[torch.zeros(2)]] * 4, fresh_outputs=outputs)
    ref = SimpleNamespace(device="cuda", env=None, tolerance=Tolerance(), with_fresh_sets=lambda: truth,
                          fresh_in=True)
    config = judge_config(device="cpu", fresh_inputs=2, compare_on_gpu=False)
    build = _Starting()
    build.is_build, build.settled = True, None
    spawn._LIVE.add(build)
    try:
        cold = _FreshRun(build, outputs, [6.0, 6.5, 1.1, 1.0])
        assert evaluate.time_fresh_inputs(cold, ref, config, rotating_ms=1.0, block_calls=7) == 1.05
        assert cold.build_stopped == [False, False, True, True] and "input_replay" not in cold.findings
        replay = _FreshRun(build, outputs, [9.0, 9.0, 8.0, 8.0])
        evaluate.time_fresh_inputs(replay, ref, config, rotating_ms=1.0, block_calls=7)
        assert "input_replay" in replay.findings   # a replay is as slow on a quiet host
        assert build.log[-1] == "thaw"
    finally:
        spawn._LIVE.discard(build)


class _UpAlready:
    """A slot whose process is up at once (no process at all): what Pool does with slots, without the imports."""

    def __init__(self, config, device, env):
        self.ready = threading.Event()
        self.ready.set()
        self.started = SimpleNamespace(child=SimpleNamespace(process=SimpleNamespace(poll=lambda: None)))

    def discard(self) -> None:
        self.started = None


def test_a_worker_s_last_evaluation_takes_its_process_without_starting_another():
    # a one-shot submit, or a batch's tail on a worker: the replacement would import for 3-5 CPU s beside that
    # evaluation and be ended unused
    pools = started_ahead.Pools(type("_Pool", (started_ahead.Pool,), {"slot": _UpAlready}), lambda config: 1)
    config = judge_config(device="cpu")
    mine, other = {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}
    pool, others = pools.pool_for(config, "cpu", mine), pools.pool_for(config, "cpu", other)
    assert pool.take() is not None and len(pool._slots) == 1   # replaced, as ever
    pools.stop_refilling(mine)
    assert pool.take() is not None and pool._slots == []        # the last one taken, nothing started after it
    assert pool.take() is None                                  # none left: the caller starts one on demand
    assert others.take() is not None and len(others._slots) == 1   # another worker's pool refills as before


def test_a_batch_stops_refilling_when_its_last_evaluation_is_taken(tmp_path, monkeypatch):
    stopped = []
    monkeypatch.setattr(warm, "stop_refilling", lambda env=None: stopped.append(env))
    problem = resolve_problem("level0/1")
    pure = FIXTURES / "integrity" / "01_pure_pytorch.py"
    folder = tmp_path / "subs"
    folder.mkdir()
    for name in ("a.py", "b.py"):
        (folder / name).write_text(pure.read_text())
    submissions = [from_file(folder / name, problem) for name in ("a.py", "b.py")]
    outcome = run_batch(submissions, pipeline_settings(device="cpu", check_grad=False), tmp_path / "run")
    assert [r.status.value for r in outcome.records] == ["rule_violation"] * 2
    assert len(stopped) == 1   # for the second evaluation only: the first had another queued or expected


def test_no_more_processes_are_started_ahead_than_takes_are_expected():
    # a batch's oracle processes: one reference start per problem and worker at most (a one-shot submit's
    # replacement oracle imported for nothing); a judge kept between calls has no bound
    pools = started_ahead.Pools(type("_Pool", (started_ahead.Pool,), {"slot": _UpAlready}), lambda config: 1)
    config = judge_config(device="cpu")
    pools.expect_takes(2)
    pool = pools.pool_for(config, "cpu", {})
    assert pool.take() is not None and len(pool._slots) == 1   # one take to come: replaced
    assert pool.take() is not None and pool._slots == []       # none to come: not replaced
    assert pool.take() is None
    pools.expect_takes(None)
    assert pool.take() is not None and len(pool._slots) == 1
