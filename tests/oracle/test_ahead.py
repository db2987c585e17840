"""Oracle processes started ahead (harness/oracle/ahead.py): the next reference start takes one that has already
imported, and gets the same reference as a process started on demand."""
import subprocess

import pytest
import torch

from conftest import judge_config
from harness.core.problems import resolve_problem
from harness.isolation.spawn import wait_until_ready
from harness.isolation.specs import OracleSpec
from harness.oracle import ahead
from harness.oracle.reference import run_oracle

ENV = {"JUDGE_TEST_WORKER": "ahead"}   # a worker environment of this file's own: its pool is apart from others'


def _oracles_alive() -> int:
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return sum("harness.oracle.child" in line for line in listing.splitlines())


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
        assert second.start_steps["ref_process"] < 0.5 * first.start_steps["ref_process"]
        for reference in (first, second):
            assert reference.feed_path.parent == reference.workdir and reference.feed_path.is_file()
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
    started = ahead.take(config, "cpu", ENV)
    assert started is not None
    wrong = OracleSpec.from_config(config, resolve_problem("level0/2").path, "cpu", tmp_path, 0)   # another folder
    ahead.run(started, wrong, tmp_path / "oracle.log")
    outcome = wait_until_ready(started.child, 60.0)
    assert outcome.ready is None and "does not match" in outcome.error
