"""Candidate processes started ahead (harness/judge/warm.py): one submission per process, the same confinement as one
started on demand, and never starting up while something is timed."""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

from conftest import judge_config

from harness.isolation import spawn
from harness.judge import warm


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
            assert not _alive(started.child.process.pid)
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
    nice = 0
    ended = None

    def __init__(self):
        self.settled = threading.Event()
        self.log: list[str] = []
        self.freezer = SimpleNamespace(freeze=lambda: self.log.append("freeze"), thaw=lambda: self.log.append("thaw"))


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


def test_a_gpu_timing_waits_for_processes_still_starting():
    starting = _Starting()
    spawn._LIVE.add(starting)
    try:
        threading.Timer(0.3, starting.settled.set).start()
        began = time.perf_counter()
        with spawn.builds_paused("cuda"):
            assert starting.settled.is_set()
        assert time.perf_counter() - began >= 0.25
    finally:
        spawn._LIVE.discard(starting)
