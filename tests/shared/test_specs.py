"""Child specs: built from the config in one place, round-tripped through the spec file, which the child deletes."""
import dataclasses

from conftest import judge_config

from harness.shared.specs import (
    BaselineSpec,
    CandidateSpec,
    OracleSpec,
    ProblemCheckSpec,
    Wiring,
    read_spec,
    write_spec,
)


def test_each_spec_takes_its_settings_from_the_config(tmp_path):
    config = judge_config(seed=7, trials=3, allow_tf32=True, warmup_ms=2.0, l2_flush=False)
    candidate = CandidateSpec.for_evaluation(config, tmp_path / "s.py", tmp_path, "cpu", tmp_path / "feed.pt", True, {})
    assert (candidate.seed, candidate.allow_tf32, candidate.check_grad, candidate.build_only) == (7, True, True, False)
    build = CandidateSpec.for_build(config, tmp_path / "s.py", tmp_path, "cuda")
    assert build.build_only and build.feed is None and build.device == "cuda"
    oracle = OracleSpec.from_config(config, tmp_path / "p.py", "cpu", tmp_path, input_seed=99)
    assert (oracle.trials, oracle.input_seed, oracle.check_grad) == (3, 99, config.check_grad)
    peaks = BaselineSpec.from_config(config, "cpu", tmp_path)
    timed = BaselineSpec.from_config(config, "cpu", tmp_path, tmp_path / "p.py", ("eager", "compile"))
    assert peaks.peaks and not timed.peaks and timed.modes == ("eager", "compile")
    assert timed.rule["warmup_ms"] == 2.0 and timed.l2_flush is False
    check = ProblemCheckSpec.from_config(config, tmp_path / "p.py", "cpu")
    assert check.rule == timed.rule and check.seed == 7


def test_a_spec_round_trips_and_the_file_is_gone_after_reading(tmp_path):
    spec = BaselineSpec.from_config(judge_config(), "cpu", tmp_path, tmp_path / "p.py", ("eager",))
    path = tmp_path / "spec.json"
    write_spec(path, spec, Wiring(event_fd=5, command_fd=None, token="t0k", handover={"result.pt": 7}, lend_fd=9))
    read, wiring = read_spec(path, BaselineSpec)
    assert read == spec and dataclasses.asdict(wiring) == {"event_fd": 5, "command_fd": None, "token": "t0k",
                                                           "handover": {"result.pt": 7}, "lend_fd": 9}
    assert not path.exists()


def test_the_precision_reaches_every_child_that_runs_the_reference_or_the_candidate(tmp_path):
    config = judge_config(precision="bf16", tolerances={"bf16": {"atol": 0.05}})
    candidate = CandidateSpec.for_evaluation(config, tmp_path / "s.py", tmp_path, "cpu", tmp_path / "feed.pt", True, {})
    oracle = OracleSpec.from_config(config, tmp_path / "p.py", "cpu", tmp_path, input_seed=99)
    timed = BaselineSpec.from_config(config, "cpu", tmp_path, tmp_path / "p.py", ("eager",))
    check = ProblemCheckSpec.from_config(config, tmp_path / "p.py", "cpu")
    assert {candidate.precision, oracle.precision, timed.precision, check.precision} == {"bf16"}
    assert ("bf16", 0.05, 0.01) in check.tolerances and ("fp32", 1e-4, 1e-4) in check.tolerances
    path = tmp_path / "spec.json"
    write_spec(path, check, Wiring(event_fd=5, command_fd=None, token="t0k"))
    assert read_spec(path, ProblemCheckSpec)[0] == check   # the table comes back as tuples, not lists
    assert OracleSpec.from_config(judge_config(), tmp_path / "p.py", "cpu", tmp_path, 1).precision == "fp32"
