"""Stopping a child's processes while the other side is timed: a cgroup freezer, else SIGSTOP (real processes)."""
import subprocess
import sys
import time

import pytest

from harness.isolation import freeze
from harness.isolation.freeze import Cage, Freezer, join_in_child, stopped
from harness.isolation.spawn import related_processes

# A child whose thread counts as fast as it can and prints the count on every line it reads; with `fork`, a
# grandchild in a session of its own that ignores the signals it can ignore and burns a core.
CHILD = r"""
import os, signal, sys, threading
count = [0]
def spin():
    while True:
        count[0] += 1
threading.Thread(target=spin, daemon=True).start()
if sys.argv[1] == "fork" and os.fork() == 0:
    os.setsid()
    for sig in (signal.SIGTSTP, signal.SIGCONT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        pass
for line in sys.stdin:
    print(count[0], flush=True)
"""


def _start(mode: str, cage=None) -> subprocess.Popen:
    joins = cage.join_paths() if cage is not None else ()
    return subprocess.Popen([sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=(lambda: join_in_child(joins)) if joins else None)


def _count(process: subprocess.Popen) -> int:
    process.stdin.write("\n")
    process.stdin.flush()
    return int(process.stdout.readline())


def _stops_and_resumes(process: subprocess.Popen, freezer: Freezer) -> None:
    time.sleep(0.3)
    before = _count(process)
    freezer.freeze()
    time.sleep(0.3)
    if freezer.cage is None:
        assert all(stopped(pid) for pid, _ in related_processes(process.pid, ""))
    freezer.thaw()
    while_frozen = _count(process) - before   # counting happened only just before the freeze and after the thaw
    time.sleep(0.3)
    while_running = _count(process) - before - while_frozen
    assert while_frozen * 5 < while_running, (while_frozen, while_running)
    assert freezer.costs_ms and freezer.costs_ms[0] < 1000


def test_a_cage_freezes_every_thread_and_caps_processes():
    cage, why = Cage.create(max_processes=64)
    if cage is None:
        pytest.skip(f"no cgroup here: {why}")
    process = _start("plain", cage)
    try:
        assert cage.members() == {process.pid}
        freezer = Freezer(process.pid, lambda: related_processes(process.pid, ""), cage)
        _stops_and_resumes(process, freezer)
        assert freezer.mechanism == "cgroup v2 freezer" and not freezer.escaped and not freezer.stragglers
        assert "cgroup v2 freezer" in cage.describe()
        assert "pids.max 64" in cage.describe() or "pids.max (no pids controller)" in cage.describe()
        # its CPU accounting: the spinning thread's time while running (however small a share of a core a loaded
        # machine gives it), none while frozen
        before, deadline = freezer.cpu_ms(), time.monotonic() + 10
        while freezer.cpu_ms() - before <= 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        running = freezer.cpu_ms() - before
        freezer.freeze()
        before = freezer.cpu_ms()
        time.sleep(0.3)
        frozen = freezer.cpu_ms() - before
        freezer.thaw()
        assert running > 100 and frozen < 5, (running, frozen)
        assert freezer.freezes == 2
    finally:
        cage.kill()
        process.wait(timeout=10)
        cage.remove()
    assert not cage.path.exists()


def test_a_fork_beyond_the_cage_process_cap_fails():
    cage, why = Cage.create(max_processes=8)
    if cage is None or cage.pids_path is None:
        pytest.skip(f"no pids controller here: {why or cage.describe()}")
    try:
        done = subprocess.run([sys.executable, "-c", "import os, time\nmade = 0\nfor _ in range(20):\n    try:\n"
                               "        if os.fork() == 0:\n            time.sleep(2)\n            os._exit(0)\n"
                               "        made += 1\n    except OSError:\n        break\nprint(made)"],
                              capture_output=True, text=True, timeout=30,
                              preexec_fn=lambda: join_in_child(cage.join_paths()))
        assert 0 < int(done.stdout) < 8, done
    finally:
        cage.kill()
        cage.remove()


def test_without_a_cage_sigstop_reaches_a_child_that_left_the_process_group(monkeypatch):
    monkeypatch.setenv(freeze.DISABLE_VARIABLE, "off")
    cage, why = Cage.create(max_processes=64)
    assert cage is None and "JUDGE_CGROUPS=off" in why
    process = _start("fork")
    try:
        time.sleep(0.5)
        freezer = Freezer(process.pid, lambda: related_processes(process.pid, ""))
        _stops_and_resumes(process, freezer)
        assert freezer.mechanism.startswith("SIGSTOP") and len(freezer.escaped) == 1, freezer.escaped
        escapee = int(freezer.escaped[0].split()[0])
        freezer.freeze()
        assert stopped(escapee) and stopped(process.pid)
        freezer.thaw()
        assert not stopped(escapee)
    finally:
        for pid, _ in related_processes(process.pid, ""):
            subprocess.run(["kill", "-9", str(pid)])
        process.wait(timeout=10)


def test_a_hold_while_it_starts_does_not_spare_an_escapee_from_its_own_first_freeze(monkeypatch):
    # A process started ahead is stopped beside other timings while it imports (spawn._stopped); its submission
    # forks its escapee only later, when loaded. The freeze of its own timing must still look for it.
    monkeypatch.setenv(freeze.DISABLE_VARIABLE, "off")
    process = _start("fork")
    escaped = [False]   # the escapee exists from the start here; the scan is told of it only once "it forked"
    try:
        time.sleep(0.5)
        freezer = Freezer(process.pid, lambda: [(pid, name) for pid, name in related_processes(process.pid, "")
                                                if escaped[0] or pid == process.pid])
        freezer.freeze(hold=True)
        freezer.thaw()
        assert freezer.escaped == []
        escaped[0] = True
        freezer.freeze()   # its own timing's first freeze
        assert len(freezer.escaped) == 1, freezer.escaped
        assert stopped(int(freezer.escaped[0].split()[0]))
        freezer.thaw()
    finally:
        for pid, _ in related_processes(process.pid, ""):
            subprocess.run(["kill", "-9", str(pid)])
        process.wait(timeout=10)


def test_stopping_a_child_that_already_ended_is_a_no_op():
    # A build that finishes while the CPU device starts timing: its cage is gone by the time it is frozen.
    cage, why = Cage.create(max_processes=64)
    if cage is None:
        pytest.skip(f"no cgroup here: {why}")
    process = _start("plain", cage)
    freezer = Freezer(process.pid, lambda: related_processes(process.pid, ""), cage)
    cage.kill()
    process.wait(timeout=10)
    cage.remove()
    freezer.freeze()
    freezer.thaw()
    assert freezer.stragglers == [] and len(freezer.costs_ms) == 1
