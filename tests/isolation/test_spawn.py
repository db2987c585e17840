"""Parent side of a child process: the capped log, finding a child's processes, and `Child` end to end."""
import io
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from echo_child import EchoSpec

from harness.isolation import spawn
from harness.isolation.spawn import (
    MARK_VARIABLE,
    CappedLog,
    Child,
    Ended,
    group_rss_bytes,
    groups_rss_bytes,
    related_processes,
)
from harness.shared.commands import TimeBlock

SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"]


class Trickle:
    """A stream without read1 that hands out `size` bytes a read, as a pipe under a slow writer does."""

    def __init__(self, data: bytes, size: int):
        self.data, self.size = data, size

    def read(self, _limit: int) -> bytes:
        chunk, self.data = self.data[:self.size], self.data[self.size:]
        return chunk


def _drained(tmp_path, stream, max_bytes: int) -> tuple[CappedLog, bytes]:
    log = CappedLog(tmp_path / "child.log", max_bytes)
    log.drain(stream)
    log.close()
    return log, (tmp_path / "child.log").read_bytes()


def test_a_flood_keeps_its_head_and_tail_and_says_how_much_was_cut(tmp_path):
    log, text = _drained(tmp_path, io.BytesIO(b"0123456789abcdefghij"), max_bytes=10)
    assert text == b"01234\n[harness] ... 10 bytes of output cut ...\nfghij"
    assert log.flooded and log.total == 20


def test_a_flood_in_small_reads_keeps_the_same_tail(tmp_path):
    log, text = _drained(tmp_path, Trickle(b"HEAD-" + b"x" * 1000 + b"-TAIL", 3), max_bytes=10)
    assert text == b"HEAD-\n[harness] ... 1000 bytes of output cut ...\n-TAIL"


def test_output_within_the_cap_is_kept_whole(tmp_path):
    log, text = _drained(tmp_path, io.BytesIO(b"all of it\n"), max_bytes=100)
    assert text == b"all of it\n" and not log.flooded


def _wait_for_state(pid: int, state: str, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if stat[stat.rfind(")") + 2] == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {state}")


def test_the_mark_is_looked_for_only_in_processes_started_since_the_child():
    # One with the mark older than the child cannot be one of its processes: its start time leaves it unread, and
    # the escapee started after the child is found all the same.
    older = subprocess.Popen(SLEEPER, start_new_session=True, stdout=subprocess.DEVNULL,
                             env={**os.environ, MARK_VARIABLE: "m4rk"})
    time.sleep(0.1)   # start times are in clock ticks (10 ms)
    root = subprocess.Popen(SLEEPER, start_new_session=True, stdout=subprocess.DEVNULL)
    escapee = subprocess.Popen(SLEEPER, start_new_session=True, stdout=subprocess.DEVNULL,
                               env={**os.environ, MARK_VARIABLE: "m4rk"})
    try:
        born = spawn.start_ticks(root.pid)
        assert born is not None and spawn.start_ticks(older.pid) < born <= spawn.start_ticks(escapee.pid)
        assert [pid for pid, _ in related_processes(root.pid, "m4rk")] == sorted([older.pid, root.pid, escapee.pid])
        assert [pid for pid, _ in related_processes(root.pid, "m4rk", born=born)] == sorted([root.pid, escapee.pid])
    finally:
        for process in (older, root, escapee):
            process.kill()
            process.wait()


def test_related_processes_find_the_group_and_marked_escapees_and_skip_zombies():
    root = subprocess.Popen(SLEEPER, start_new_session=True, stdout=subprocess.PIPE)
    # Another session, not a descendant: found only by the run's environment marker (a setsid escapee)
    escapee = subprocess.Popen(SLEEPER, start_new_session=True, stdout=subprocess.DEVNULL,
                               env={**os.environ, MARK_VARIABLE: "m4rk"})
    try:
        assert root.stdout.readline() == b"up\n"   # the interpreter is up: its memory is resident
        found = [pid for pid, _ in related_processes(root.pid, "m4rk")]
        assert found == sorted([root.pid, escapee.pid])
        assert [pid for pid, _ in related_processes(root.pid, "")] == [root.pid]
        assert group_rss_bytes(root.pid) > 1 << 20   # a Python interpreter holds megabytes
        root.send_signal(signal.SIGKILL)
        _wait_for_state(root.pid, "Z")               # dead, not yet reaped
        assert related_processes(root.pid, "") == [] and group_rss_bytes(root.pid) == 0
    finally:
        for process in (root, escapee):
            process.kill()
            process.wait()
        root.stdout.close()


# ---------------------------------------------------------------- Child end to end
# The child is tests/isolation/echo_child.py; its spec is EchoSpec (adapt here if Child's `spec` changes).

CHILD_MODULE = "tests.isolation.echo_child"


@pytest.fixture
def start(tmp_path):
    children = []

    def started(mode: str, **options) -> Child:
        workdir = tmp_path / f"{mode}-{len(children)}"
        workdir.mkdir()
        child = Child(CHILD_MODULE, EchoSpec(mode), workdir, tmp_path / f"{mode}.log", with_commands=True,
                      **options)
        children.append(child)
        return child

    yield started
    for child in children:
        child.finish()


def test_a_child_sees_only_the_passed_environment_and_answers_commands(start, monkeypatch, tmp_path):
    monkeypatch.setenv("JUDGE_TEST_SECRET", "s3cr3t")
    child = start("echo", env={"JUDGE_TEST_EXTRA": "1"})
    ready = child.next_event(10.0)
    assert ready["event"] == "ready" and "token" not in ready
    assert "JUDGE_TEST_SECRET" not in ready["env"] and {"JUDGE_TEST_EXTRA", MARK_VARIABLE} <= set(ready["env"])
    assert ready["home"] == str(child.workdir) and ready["spec_left"] is False
    child.send(TimeBlock(reps=3, keep=(1,)))
    assert child.next_event(10.0) == {"event": "echo", "command": {"cmd": "block", "reps": 3, "keep": [1],
                                                                   "ahead_ms": 0.0}}
    child.finish()
    assert child.process.returncode == 0 and child.leftovers() == [] and child.forged == []
    assert "echo child started in mode echo" in (tmp_path / "echo.log").read_text()


def test_a_child_given_cores_runs_there_with_every_process_it_starts(start):
    core = max(os.sched_getaffinity(0))
    child = start("echo", cpus=(core,), caged=True)
    assert child.next_event(10.0)["event"] == "ready"
    assert os.sched_getaffinity(child.process.pid) == {core}
    if child.cage is not None:   # the cage says whether it holds the core too
        assert any("cpuset.cpus" in phrase for phrase in child.cage.held + child.cage.missing)
    unpinned = start("echo")
    assert unpinned.next_event(10.0)["event"] == "ready"
    assert os.sched_getaffinity(unpinned.process.pid) == os.sched_getaffinity(0)


def test_a_build_started_while_a_cpu_timing_runs_waits_for_its_end(start):
    # the batch's first builds run at normal priority: a build is stopped beside a CPU timing for what it is, not
    # for its niceness, from the moment its process exists; a process that is no build (a candidate started on
    # demand for the evaluation itself) runs on
    with spawn.builds_paused("cpu"):
        build = start("echo", build=True)
        evaluation = start("echo")
        assert evaluation.next_event(10.0)["event"] == "ready"
        assert select.select([build._events], [], [], 1.5)[0] == []   # no word from it while the timing runs
    assert build.next_event(10.0)["event"] == "ready"


def test_an_event_without_the_token_is_ignored_and_recorded_as_forged(start):
    child = start("forge")
    assert child.next_event(10.0)["event"] == "ready"
    assert child.forged == ['{"event": "ready", "token": "guessed"}', "not json at all"]


def test_a_child_that_exits_without_an_event_ends_with_its_exit_code(start):
    child = start("exit")
    assert child.next_event(10.0) is None
    assert child.ended == Ended(timed_out=False, returncode=3, detail="exited with code 3")


def test_an_event_sent_right_before_the_exit_is_read_however_late_the_reader_wakes(start, monkeypatch):
    # A judge thread that woke from its select after the child had written its last event and exited found the
    # child gone and left the event unread: a build's result was lost so, and the build retried on a GPU worker
    child = start("last")
    real = select.select

    def slow_to_wake(readers, writers, errors, timeout=None):
        ready = real(readers, writers, errors, timeout)
        if timeout and not ready[0]:   # the silent second: by the time this thread runs again the child is gone
            child.process.wait(10.0)
        return ready

    monkeypatch.setattr(spawn.select, "select", slow_to_wake)
    assert child.next_event(10.0)["event"] == "ready"
    assert child.next_event(10.0) is None and child.ended.detail == "exited with code 0"


def test_a_segfault_is_a_signal_not_a_timeout(start):
    child = start("segfault")
    assert child.next_event(10.0) is None
    assert child.ended == Ended(timed_out=False, returncode=-signal.SIGSEGV, detail="killed by SIGSEGV")


def test_a_child_past_its_deadline_is_killed_as_timed_out(start):
    child = start("sleep")
    began = time.monotonic()
    assert child.next_event(0.5) is None
    assert child.ended.timed_out and child.ended.returncode is None and "0.5 s" in child.ended.detail
    assert child.process.returncode == -signal.SIGKILL and time.monotonic() - began < 3.0


def test_one_memory_watch_pass_measures_every_child_with_a_limit(monkeypatch):
    """The resident memory of every watched child comes from one pass over /proc every POLL_S, however many
    children wait: a pass per waiting child made dozens of builds in flight starve the judge's own threads."""
    passes = []
    table = spawn._process_table
    monkeypatch.setattr(spawn, "_process_table", lambda: passes.append(1) or table())
    roots = [subprocess.Popen(SLEEPER, start_new_session=True, stdout=subprocess.PIPE) for _ in range(12)]
    watch = spawn._MemoryWatch()
    try:
        for root in roots:
            assert root.stdout.readline() == b"up\n"
            watch.watch(root.pid)
        time.sleep(0.3)
        passes.clear()
        time.sleep(4 * spawn.POLL_S)
        assert 2 <= len(passes) <= 6, passes   # 12 children, each POLL_S: one pass for all of them
        alone = groups_rss_bytes([root.pid for root in roots])
        for root in roots:
            assert watch.rss_bytes(root.pid) > 1 << 20   # a Python interpreter holds megabytes
            assert abs(watch.rss_bytes(root.pid) - group_rss_bytes(root.pid)) < 8 << 20
            assert abs(alone[root.pid] - group_rss_bytes(root.pid)) < 8 << 20
        watch.forget(roots[0].pid)
        assert watch.rss_bytes(roots[0].pid) == 0
    finally:
        for root in roots:
            root.kill()
            root.wait()
            root.stdout.close()


def test_children_waited_on_at_once_share_the_memory_watchs_passes_and_a_child_over_its_limit_is_killed(
        start, monkeypatch):
    passes = []
    table = spawn._process_table
    monkeypatch.setattr(spawn, "_process_table", lambda: passes.append(time.monotonic()) or table())
    silent = [start("sleep", max_rss_bytes=8 << 30) for _ in range(8)]
    hog = start("sleep", max_rss_bytes=1 << 20)   # an interpreter holds more than 1 MB
    ended = {}

    def wait(child: Child, timeout_s: float) -> None:
        ended[child] = child.next_event(timeout_s)

    began = time.monotonic()
    threads = [threading.Thread(target=wait, args=(child, 3.0)) for child in silent]
    threads.append(threading.Thread(target=wait, args=(hog, 30.0)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ended == dict.fromkeys(silent + [hog])
    assert hog.ended.memory_exceeded and "above the" in hog.ended.detail, hog.ended
    assert all(child.ended.timed_out and not child.ended.memory_exceeded for child in silent)
    waiting = [t for t in passes if began + 0.5 < t < began + 2.5]   # while all nine waited, before any was killed
    assert len(waiting) <= 8, len(waiting)   # about 2 s / POLL_S passes, not one per child per POLL_S (36)
