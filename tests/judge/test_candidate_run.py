"""The parent's handle on the candidate's process (harness/judge/candidate_run.py), against a scripted child: what each
phase makes of the events and files a candidate sends (all of them untrusted), its deadlines' statuses, and what its
process left behind. tests/judge/test_statuses.py runs real candidates end to end."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import judge_config

from harness.judge import candidate_run
from harness.judge.candidate_run import CandidateRun, Stop
from harness.shared import commands, findings, handover, protocol
from harness.shared.messages import CandidateResult, Compiled, FreshTimed, KernelCounts
from harness.shared.record import Status
from harness.timing.interleave import SideStopped


class FakeHandover:
    """The files the candidate wrote, by name: a value, or an exception its load raises."""

    def __init__(self, files: dict):
        self.files = files
        self.released: list[str] = []   # names whose fd the parent closed once read

    def release(self, name: str) -> None:
        self.released.append(name)

    def load(self, name: str):
        value = self.files.get(name, FileNotFoundError(name))
        if isinstance(value, Exception):
            raise value
        return value


class FakeChild:
    """The candidate's process as CandidateRun drives it: scripted events, then the end `ended` describes."""
    made: list["FakeChild"] = []

    def __init__(self, module, spec, workdir, log_path, with_commands=False, handover=None, **options):
        self.module, self.spec, self.workdir, self.with_commands = module, spec, Path(workdir), with_commands
        self.options = options
        self.events: list[dict] = []
        self.files: dict = {}
        self.handover = FakeHandover(self.files)
        self.ended = SimpleNamespace(timed_out=False, memory_exceeded=False, detail="exit code 1")
        self.sent: list[tuple[str, dict, bool]] = []   # command, arguments, whether a FRESH command's file was there
        self.alive = ["4242 python -c spin"]
        self.forged: list[str] = []
        self.output = SimpleNamespace(flooded=False, total=100)
        self.killed = self.finished = False
        self.handed: list[str] = []
        FakeChild.made.append(self)

    def next_event(self, timeout_s: float):
        return self.events.pop(0) if self.events else None

    def send(self, command) -> None:   # a command dataclass (harness/shared/commands.py), as spawn.Child takes
        arguments = command.to_command()
        path = Path(arguments.get("path") or self.workdir / protocol.FRESH_FILE)
        self.sent.append((arguments.pop("cmd"), arguments, path.exists()))

    def leftovers(self) -> list[str]:
        return list(self.alive)

    def lend_fds(self, fds: list[int], mapped_bytes: int = 0) -> None:   # what each fd lent is, as the child gets it
        self.lent = [(os.fstat(fd).st_ino, fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) for fd in fds]
        self.lent_bytes = mapped_bytes

    def hand_over(self, path: Path) -> None:   # what the parent put in the child's folder, made readable to it
        self.handed.append(Path(path).name)

    def kill(self) -> None:
        self.killed, self.alive = True, []

    def finish(self, grace_s: float = 10.0) -> None:
        self.finished = True
        self.grace_s = grace_s


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A CandidateRun on the CPU device whose child is a FakeChild (nothing is started or compiled)."""
    monkeypatch.setattr(candidate_run, "Child", FakeChild)
    source = tmp_path / "source.py"
    source.write_text("class ModelNew: pass\n")
    ref = SimpleNamespace(device="cpu", env=None, feed_fd=None, feed_path=tmp_path / "feed.pt", check_grad=False,
                          truth=SimpleNamespace(outputs=[[torch.ones(2)], [torch.zeros(2)]]))
    config = judge_config(device="cpu", warm_candidates=0, compile_timeout_s=5.0, run_timeout_s=7.0, fresh_inputs=2)
    with CandidateRun(source, ref, config, tmp_path / "log.txt") as started:
        yield started


def test_the_feed_is_lent_as_a_read_only_fd_of_the_sealed_memfd_and_no_path(tmp_path, monkeypatch):
    monkeypatch.setattr(candidate_run, "Child", FakeChild)
    source = tmp_path / "source.py"
    source.write_text("class ModelNew: pass\n")
    files = handover.Handover((protocol.FEED_FILE,), tmp_path)
    handover.save({"trials": [[torch.ones(3)]]}, protocol.FEED_FILE, files.fds, tmp_path)
    assert files.seal(protocol.FEED_FILE)
    feed = files.fds[protocol.FEED_FILE]
    ref = SimpleNamespace(device="cpu", env=None, feed_fd=feed, feed_path=None, feed_bytes=os.fstat(feed).st_size,
                          check_grad=False, truth=SimpleNamespace(outputs=[[torch.ones(3)]]))
    config = judge_config(device="cpu", warm_candidates=0)
    try:
        with CandidateRun(source, ref, config, tmp_path / "log.txt") as run:
            assert run.child.spec.feed is None and run.child.options["lend"]
            assert run.child.lent == [(os.fstat(feed).st_ino, os.O_RDONLY)]   # the same memfd, opened read-only
            assert run.child.lent_bytes == ref.feed_bytes   # its pages the child maps count beside its own
    finally:
        files.close()


def _flags(**found) -> dict:
    return {"flags": found}


def test_the_submission_is_copied_into_its_own_folder_and_the_child_started_with_commands(run):
    child = run.child
    assert child.module == candidate_run.CANDIDATE_MODULE and child.with_commands
    assert (run.workdir / "submission.py").read_text() == "class ModelNew: pass\n"
    assert child.spec.source_path == str(run.workdir / "submission.py") and child.spec.device == "cpu"
    assert run.phase == "compile" and run.trials == 2 and "candidate_start" in run.phases


def test_compiled_with_the_childs_clock_as_diagnostics(run):
    run.child.events = [{"event": protocol.COMPILED, "compile_s": 1.5, "reused": 2, "extensions_built": 1,
                         "clock": {"main": run._spawned + 0.25, "prepared": run._spawned + 1.0}}]
    compiled = run.until_compiled()
    assert isinstance(compiled, Compiled) and compiled.extensions_built == 1 and run.reused == 2
    assert run.phases["load"] == 1.5 and run.phases["spawn_import"] == pytest.approx(0.25)
    assert run.phases["cuda_init"] == pytest.approx(0.75)


def test_a_malformed_compiled_event_is_a_protocol_violation(run):
    run.child.events = [{"event": protocol.COMPILED, "extensions_built": -1}]
    assert run.until_compiled() == Stop(Status.CRASH,
                                        "protocol violation during compile: malformed extensions_built: -1")


def test_a_failed_stage_keeps_its_status_and_an_unknown_status_is_a_crash(run):
    run.child.events = [{"event": protocol.FAILED, "status": "compile_error", "error": "nvcc: no", "compile_s": 3.0},
                        {"event": protocol.FAILED, "status": "no such status", "error": "x", "compile_s": "forged"}]
    assert run.until_compiled() == Stop(Status.COMPILE_ERROR, "nvcc: no", 3.0)
    assert run.until_compiled() == Stop(Status.CRASH, "x", None)


@pytest.mark.parametrize("claim", ["pass", "incorrect", "rule_violation", "timing_interference", "crash"])
def test_a_failed_stage_cannot_claim_a_verdict_its_stages_never_meet(run, claim):
    run.child.events = [{"event": protocol.FAILED, "status": claim, "error": "forged"}]
    assert run.until_compiled() == Stop(Status.CRASH, "forged", None)


def test_an_event_out_of_turn_is_a_protocol_violation(run):
    run.child.events = [{"event": protocol.CHECKED}]
    assert run.until_compiled() == Stop(Status.CRASH, "protocol violation during compile: got 'checked'")


def test_a_child_that_goes_quiet_ends_by_how_it_ended(run):
    run.child.ended.timed_out = True
    assert run.until_compiled() == Stop(Status.TIMEOUT, "compile exceeded 5 s")
    run.child.ended = SimpleNamespace(timed_out=False, memory_exceeded=True, detail="host memory above 8 GB")
    assert run.until_checked() == Stop(Status.RUNTIME_ERROR, "host memory above 8 GB during checks")
    run.child.ended = SimpleNamespace(timed_out=False, memory_exceeded=False, detail="killed by signal 11")
    assert run.until_checked() == Stop(Status.CRASH, "killed by signal 11 during checks")


def test_the_child_speaks_only_for_its_own_detectors_and_an_unknown_name_is_dropped(run):
    run.child.events = [{"event": protocol.COMPILED, **_flags(patched_runtime="torch.mm", degenerate_problem="forged",
                                                              no_such_finding="x", input_replay="forged")}]
    assert isinstance(run.until_compiled(), Compiled)
    assert run.findings == {findings.PATCHED_RUNTIME: "torch.mm"}


def test_blocked_operations_and_what_the_process_left_become_findings_at_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(candidate_run, "Child", FakeChild)
    source = tmp_path / "source.py"
    source.write_text("x = 1\n")
    ref = SimpleNamespace(device="cpu", env=None, feed_fd=None, feed_path=tmp_path / "feed.pt", check_grad=False,
                          truth=SimpleNamespace(outputs=[[torch.ones(1)]]))
    config = judge_config(device="cpu", warm_candidates=0)
    with CandidateRun(source, ref, config, tmp_path / "log.txt") as run:
        child = run.child
        child.events = [{"event": protocol.AUDIT, "what": "socket.connect", "detail": "('1.2.3.4', 80)"},
                        {"event": protocol.COMPILED}]
        child.forged = ["{\"event\": \"compiled\"}"]
        child.output.flooded, child.output.total = True, 3 * 2**20
        assert isinstance(run.until_compiled(), Compiled)   # an audit event is collected, not an answer
        assert not run.findings   # complete only once the run is over
    assert child.finished and not run.workdir.exists() and "teardown" in run.phases
    assert child.grace_s == 0   # killed at once: everything it hands over is the parent's by then
    assert set(run.findings) == {findings.SPAWNED_PROCESSES, findings.FORGED_EVENTS, findings.OUTPUT_FLOOD,
                                 findings.SANDBOX_BLOCKED}
    assert run.findings[findings.SANDBOX_BLOCKED] == "socket.connect: ('1.2.3.4', 80)"
    assert "4242 python -c spin" in run.findings[findings.SPAWNED_PROCESSES]


def test_ended_early_its_leftovers_are_those_seen_before_the_kill(run):
    run.end_now()
    assert run.child.killed and run.child.alive == []
    run.__exit__(None, None, None)
    assert "4242 python -c spin" in run.findings[findings.SPAWNED_PROCESSES]


def _result(trials=2) -> dict:
    return {"outputs": [[torch.ones(2)]] * trials, "repeat": [torch.ones(2)], "weights_loaded": 3}


def test_checked_reads_the_result_file_and_the_kernel_counts(run):
    run.child.events = [{"event": protocol.CHECKED, "kernels": {"own": 2, "library": 1, "library_summary": "mm x1"},
                         "seconds": {"model": 0.5, "correctness": "forged", "not_a_phase": 1.0}}]
    run.child.files[protocol.RESULT_FILE] = _result()
    result = run.until_checked()
    assert isinstance(result, CandidateResult) and result.weights_loaded == 3 and run.phase == "checks"
    assert run.kernels == KernelCounts(own=2, library=1, own_share=None, library_summary="mm x1", side_streams=())
    assert run.phases["model"] == 0.5 and "correctness" not in run.phases and "not_a_phase" not in run.phases
    assert "result_read" in run.phases
    assert run.child.handover.released == [protocol.RESULT_FILE]   # read once: its fd closed at once


def test_malformed_kernel_counts_are_not_reported_and_a_bad_result_is_a_runtime_error(run):
    run.child.events = [{"event": protocol.CHECKED, "kernels": {"own": -1, "library": 0}}] * 3
    run.child.files[protocol.RESULT_FILE] = OSError("bad file")
    assert run.until_checked() == Stop(Status.RUNTIME_ERROR, "unreadable result: OSError: bad file")
    assert run.kernels is None
    run.child.files[protocol.RESULT_FILE] = _result(trials=1)   # one trial of two
    assert run.until_checked() == Stop(Status.RUNTIME_ERROR, "unreadable result: the result holds no outputs for "
                                                             "the 2 trials")
    run.child.files[protocol.RESULT_FILE] = ["not", "a", "mapping"]
    assert run.until_checked() == Stop(Status.RUNTIME_ERROR, "unreadable result: the result is not a mapping")


def test_in_the_timing_dialogue_a_stop_ends_the_side(run):
    run.child.events = [{"event": protocol.WARM, "per_call_ms": 1.0}]
    assert run.expect(protocol.WARM, 1.0)["per_call_ms"] == 1.0
    run.child.ended.timed_out = True
    with pytest.raises(SideStopped) as stopped:
        run.expect(protocol.BLOCK, 2.0)
    assert stopped.value.side == "candidate" and stopped.value.cause == Stop(Status.TIMEOUT, "compile exceeded 2 s")


@pytest.mark.parametrize("in_memory", [True, False], ids=["memory", "no_room_in_memory"])
def test_a_fresh_input_set_is_written_only_for_its_call_and_its_outputs_read_apart(run, tmp_path, monkeypatch,
                                                                                  in_memory):
    memory = tmp_path / "shm"
    memory.mkdir()
    asked = []

    def memory_folder(needed):
        asked.append(needed)
        return memory if in_memory else None

    monkeypatch.setattr(candidate_run.resources, "memory_folder", memory_folder)
    child = run.child
    child.events = [{"event": protocol.FRESH, "ms": 0.5, "near_ms": [0.4]},
                    {"event": protocol.FRESH, "ms": 0.6, "calls": 4}]
    child.files[handover.fresh_out_file(0)] = [torch.ones(2)]
    child.files[handover.fresh_out_file(1)] = [torch.zeros(2)]
    timed, outputs = run.time_fresh([torch.ones(2)], l2_flush=True, sync="event")
    assert timed == FreshTimed(0.5, (0.4,)) and torch.equal(outputs[0], torch.ones(2))
    timed, outputs = run.time_fresh([torch.ones(2)], l2_flush=False, sync="event", near=7, ahead_ms=0.3,
                                    span_calls=4)
    assert timed == FreshTimed(0.6, calls=4) and torch.equal(outputs[0], torch.zeros(2))
    assert asked == [8, 8]   # each set's bytes
    # in memory where there is room (a folder made for the run, passable but not writable by the candidate's
    # user), else in the candidate's own folder
    folders = list(memory.iterdir())
    if in_memory:
        assert len(folders) == 1 and folders[0].name.startswith(f"fresh-{os.getpid()}-")
        assert folders[0].stat().st_mode & 0o777 == 0o711
        path = folders[0] / protocol.FRESH_FILE
    else:
        assert folders == []
        path = run.workdir / protocol.FRESH_FILE
    assert child.sent == [(protocol.CMD_FRESH, {"l2_flush": True, "sync": "event", "ahead_ms": 0.0,
                                                "near": commands.FRESH_NEAR, "span_calls": 1, "path": str(path)},
                           True),
                          (protocol.CMD_FRESH, {"l2_flush": False, "sync": "event", "ahead_ms": 0.3, "near": 7,
                                                "span_calls": 4, "path": str(path)}, True)]
    assert child.handed == [protocol.FRESH_FILE] * 2   # made readable to the candidate's user
    assert not path.exists()   # gone once answered: the next set is written apart
    assert run.fresh_calls == 2 and {"fresh_write", "fresh_call", "fresh_read"} <= set(run.phases)
    run.__exit__(None, None, None)
    assert list(memory.iterdir()) == []   # the run's folder in memory removed with it


def test_a_fresh_span_of_other_calls_than_asked_is_a_protocol_violation(run):
    run.child.events = [{"event": protocol.FRESH, "ms": 0.05, "calls": 1}]
    stop = run.time_fresh([torch.ones(2)], l2_flush=True, sync="event", span_calls=14)
    assert stop.status == Status.CRASH and "a fresh span of 1 call(s) where 14 were asked" in stop.error


def test_a_fresh_call_with_bad_times_or_unreadable_outputs_stops(run):
    run.child.events = [{"event": protocol.FRESH, "ms": -1.0}, {"event": protocol.FRESH, "ms": 1.0}]
    assert run.time_fresh([torch.ones(2)], True, "event") == Stop(
        Status.CRASH, "protocol violation during compile: malformed fresh-input time: -1.0")
    assert run.time_fresh([torch.ones(2)], True, "event") == Stop(
        Status.RUNTIME_ERROR, "unreadable outputs of a fresh input set: FileNotFoundError")


def test_spot_checks_that_are_missing_or_not_a_list_are_none(run):
    assert run.spot_checks() is None
    run.child.files[protocol.SPOT_FILE] = {"call": 1}
    assert run.spot_checks() is None
    run.child.files[protocol.SPOT_FILE] = [{"call": 1, "input_set": 0, "outputs": []}]
    assert run.spot_checks() == [{"call": 1, "input_set": 0, "outputs": []}] and "spot_read" in run.phases
