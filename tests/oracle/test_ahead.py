"""Oracle processes started ahead (harness/oracle/ahead.py): the next reference start takes one that has already
imported, and gets the same reference as a process started on demand."""
import contextlib
import fcntl
import os
import subprocess
import time

import pytest
import torch
from conftest import judge_config

from harness.isolation.spawn import wait_until_ready
from harness.oracle import ahead, reference
from harness.oracle.reference import run_oracle
from harness.shared import handover, protocol
from harness.shared.problems import resolve_problem
from harness.shared.specs import OracleSpec

ENV = {"JUDGE_TEST_WORKER": "ahead"}   # a worker environment of this file's own: its pool is apart from others'


def _oracles_alive() -> int:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return sum("harness.children.oracle.main" in line for line in listing.splitlines())


@pytest.fixture
def pool():
    yield
    ahead.close_all(ENV)


def test_a_reference_started_in_a_process_started_ahead_is_the_one_started_on_demand(tmp_path, pool):
    problem = resolve_problem("level0/2")
    # the inputs drawn from the config's seed (not a secret one), so that the three draw the same
    cold = run_oracle(problem, judge_config(device="cpu", warm_oracles=0, secret_inputs=False), "cpu",
                      tmp_path / "cold", env=ENV)
    config = judge_config(device="cpu", secret_inputs=False)
    first = run_oracle(problem, config, "cpu", tmp_path / "first", env=ENV)   # none ahead yet: one starts now
    second = run_oracle(problem, config, "cpu", tmp_path / "second", env=ENV)
    try:
        up = [r.start_steps["ref_take"] + r.start_steps["ref_process"] for r in (first, second)]
        assert up[1] < 0.5 * up[0]   # the second's process had imported while the first started
        assert first.start_steps["ref_take"] > second.start_steps["ref_take"]   # the first waited for its imports
        for reference in (first, second):
            # the feed a sealed memfd, the truth mapped from another: neither is a file in the reference's folder
            assert reference.feed_path is None and fcntl.fcntl(reference.feed_fd, fcntl.F_GET_SEALS) == handover.SEALS
            assert not {protocol.FEED_FILE, protocol.TRUTH_FILE} & set(os.listdir(reference.workdir))
            assert [torch.equal(a[0], b[0]) for a, b in zip(reference.truth.outputs, cold.truth.outputs)] == \
                [True] * len(cold.truth.outputs)
        assert (tmp_path / "second" / "oracle-level0_2.log").is_file()   # its log went where the reference's goes
    finally:
        for reference in (cold, first, second):
            reference.close()
    before = _oracles_alive()
    ahead.close_all(ENV)   # the one started for the next reference start ends with the worker
    assert _oracles_alive() == before - 1


def test_a_spec_that_does_not_match_how_the_process_was_started_fails_it(tmp_path, pool):
    config = judge_config(device="cpu")
    ahead.fill(config, "cpu", ENV)
    pool = ahead._POOLS.pool_for(config, "cpu", ENV)
    pool._slots[0].ready.wait()
    started = ahead.take(config, "cpu", ENV)
    assert started is not None
    waiting = pool._slots
    assert waiting == []   # taken up: its replacement starts once it has its work (starts go one at a time)
    wrong = OracleSpec.from_config(config, resolve_problem("level0/2").path, "cpu", tmp_path, 0)   # another folder
    ahead.run(started, wrong, tmp_path / "oracle.log", config, "cpu", ENV)
    assert len(waiting) == 1
    outcome = wait_until_ready(started.child, 60.0)
    assert outcome.ready is None and "does not match" in outcome.error


def test_a_reference_started_beside_evaluations_does_its_device_work_only_when_allowed(tmp_path, pool):
    """A gated start (a reference started in the background, harness/pipeline/driver.py) makes its model and
    inputs at once; computes its truth only when no timing runs (spawn.start_gate) and measures the device's rates
    only when no evaluation runs on its worker either (`gate`); until READY it is stopped while anything is timed.
    Same truth as a start without a gate."""
    from concurrent.futures import ThreadPoolExecutor

    from harness.isolation import spawn

    def wait_for(condition) -> None:
        deadline = time.monotonic() + 60
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert condition()

    problem = resolve_problem("level0/2")
    config = judge_config(device="cpu", secret_inputs=False)
    gate = spawn.StartGate()
    plain = run_oracle(problem, config, "cpu", tmp_path / "plain", env=ENV)
    reference._RATES.clear()   # the rates the plain start measured would be handed over (the next test)
    with ThreadPoolExecutor(1) as threads:
        with gate.timing():                      # an evaluation under way on its worker ...
            with spawn.start_gate("cpu", ENV).timing():      # ... timing its candidate
                started = threads.submit(run_oracle, problem, config, "cpu", tmp_path / "gated", ENV, gate)
                wait_for(lambda: spawn.start_gate("cpu", ENV)._starting == 1)   # staged: asks for its truth's stage
                time.sleep(0.6)
                staged = [c for c in list(spawn._LIVE) if c.pause_beside_timing and not c.settled.is_set()]
                assert len(staged) == 1 and not started.done()      # spawn.builds_paused stops it on any device
            wait_for(lambda: gate._starting == 1)                   # its truth done, it asks for the rates' stage
            time.sleep(0.6)
            assert not started.done()          # no rates measured while a candidate process may be alive
        gated = started.result(timeout=120)
    try:
        assert gated.start_steps["ref_gate"] >= 0.5 and gated.start_steps["ref_quiet"] >= 0.5
        assert "ref_gate" not in plain.start_steps and "ref_quiet" not in plain.start_steps
        assert [torch.equal(a[0], b[0]) for a, b in zip(gated.truth.outputs, plain.truth.outputs)] == \
            [True] * len(plain.truth.outputs)
        assert gated.child.settled.is_set() and gated.floor_ms is not None
        # the device's rates are the device's: a second gated start of this size class is handed the first one's,
        # and does not wait for a moment with no evaluation on its worker to measure them again
        with gate.timing(), ThreadPoolExecutor(1) as threads:
            again = threads.submit(run_oracle, problem, config, "cpu", tmp_path / "again", ENV, gate).result(120)
        try:
            assert again.floor_ms == gated.floor_ms and again.roofline.rates == gated.roofline.rates
            assert again.start_steps["ref_quiet"] < 0.5
        finally:
            again.close()
    finally:
        plain.close()
        gated.close()


def test_a_reference_start_ended_by_an_interrupted_batch_leaves_nothing_in_the_temporary_folder(
        tmp_path, pool, monkeypatch):
    """Ctrl-C kills the oracle process importing ahead and refuses new children: the reference start fails, and
    neither the folder nor the log of the process started ahead, nor the folder of the start on demand, is left."""
    import tempfile
    import threading

    from harness.isolation import spawn

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    config = judge_config(device="cpu")
    ahead.fill(config, "cpu", ENV)   # an oracle process importing, its folder and log in the temporary folder
    assert sorted(p.name.split("-")[0] for p in scratch.iterdir()) == ["oracle", "oracle"]
    stopped = threading.Event()
    stopped.set()
    monkeypatch.setattr(spawn, "_STOPPED", stopped)   # as spawn.stop_all, for this file's children only
    for child in [c for c in list(spawn._LIVE) if scratch in c.workdir.parents]:
        child.kill()
    with pytest.raises(spawn.ShuttingDown):
        run_oracle(resolve_problem("level0/2"), config, "cpu", tmp_path / "logs", env=ENV)
    ahead.close_all(ENV)
    assert not list(scratch.iterdir())


def test_a_gated_truth_waits_on_the_gpu_only_where_no_evaluation_runs_on_its_worker():
    """The truth's stage of a gated start tells the oracle whether its truth may wait on the GPU (GpuGo `keep`):
    only where its worker evaluates nothing at that moment, and then the stage holds the worker's gate, so that an
    evaluation starting meanwhile waits for it; beside an evaluation it holds nothing of the worker's."""
    from harness.isolation import spawn
    from harness.shared.commands import GpuGo, parse

    class Child:   # the oracle's side of the dialogue: staged, then done with each stage
        def __init__(self, gate):
            self.gate, self.sent, self.held = gate, [], []
            self.events = [{"event": protocol.STAGED}, {"event": protocol.GPU_DONE, "rates_key": "k"},
                           {"event": protocol.GPU_DONE}]

        def next_event(self, timeout_s):
            return self.events.pop(0)

        def send(self, command):
            self.sent.append(parse(command.to_command()))
            self.held.append(self.gate._starting)

    rates = {"bandwidth_gbps": 3000.0, "fp32_tflops": 50.0}   # known: the rates' stage waits for no one
    for busy in (False, True):
        gate = spawn.StartGate()
        child = Child(gate)
        with gate.timing() if busy else contextlib.nullcontext():   # an evaluation under way on its worker, or none
            assert reference._gated_gpu_work(child, gate, spawn.StartGate(), 5.0, lambda key: rates) is None
        assert child.sent == [GpuGo(keep=not busy), GpuGo(rates)]
        assert child.held[0] == (0 if busy else 1)   # the worker's gate held through the truth's stage when idle
        assert gate._starting == 0
