"""In-process integrity checks: what a submission replaced, switched or left running is named."""
import functools
import sys
import threading
import time
import types

import torch

import harness.shared.timer as timer
from harness.children.candidate.watch import Watch


def test_nothing_changed_right_after_the_snapshot():
    assert Watch().changes() == {}


def test_replaced_functions_show_as_patched_runtime_until_put_back(monkeypatch):
    watch = Watch()
    monkeypatch.setattr(torch, "allclose", lambda *args, **kwargs: True)
    monkeypatch.setattr(timer, "_clock", lambda: 0.0)
    assert watch.changes() == {"patched_runtime": "replaced: torch.allclose, harness.shared.timer._clock"}
    monkeypatch.undo()
    assert watch.changes() == {}   # put back before the check: not seen (why the parent cross-checks too)


def test_a_raised_spin_clock_shows_as_patched_runtime(monkeypatch):
    # read before the submission runs: a figure raised after it would lengthen the candidate's head start alone
    monkeypatch.setattr(timer, "_cycles_per_ms", [1.98e6])
    watch = Watch()
    timer._cycles_per_ms[0] = 1e9
    assert watch.changes() == {"patched_runtime": "replaced: harness.shared.timer._cycles_per_ms (its contents)"}
    timer._cycles_per_ms[0] = 1.98e6
    assert watch.changes() == {}
    monkeypatch.setattr(timer, "_cycles_per_ms", [1.98e6, 1e9])   # a list of its own in the module's place
    assert "_cycles_per_ms (its contents)" in watch.changes()["patched_runtime"]
    monkeypatch.setattr(timer, "_spin", lambda cycles: None)
    assert "harness.shared.timer._spin" in watch.changes()["patched_runtime"]


def test_a_function_whose_code_was_swapped_in_place_shows_as_patched_runtime(monkeypatch):
    # the object the harness holds stays the same; what it runs does not
    watch = Watch()
    original = timer.Timer._timed.__code__

    def halved(self, inputs):
        return 0.5

    monkeypatch.setattr(timer.Timer._timed, "__code__", halved.__code__)
    assert watch.changes() == {"patched_runtime": "replaced: harness.shared.timer.Timer._timed (its code)"}
    monkeypatch.setattr(timer.Timer._one, "__defaults__", (object(),))
    assert "Timer._one (its code)" in watch.changes()["patched_runtime"]
    monkeypatch.undo()
    assert timer.Timer._timed.__code__ is original and watch.changes() == {}


def test_torchs_own_dynamo_wrapper_is_not_a_patch_and_a_look_alike_is(monkeypatch):
    # Importing torch._dynamo (a submission's torch.compile) wraps torch.manual_seed in torch._compile's wrapper.
    original = torch.manual_seed
    watch = Watch()
    monkeypatch.setattr(torch, "manual_seed", torch._compile._disable_dynamo(original))
    assert watch.changes() == {}
    monkeypatch.setattr(torch, "manual_seed", functools.wraps(original)(lambda *args: original(*args)))
    assert watch.changes() == {"patched_runtime": "replaced: torch.manual_seed"}


def test_a_replaced_module_shows_with_its_attributes(monkeypatch):
    watch = Watch()
    monkeypatch.setitem(sys.modules, "time", types.ModuleType("time"))
    assert watch.changes()["patched_runtime"].startswith("replaced: sys.modules['time'], time.perf_counter, ")


def test_switched_precision_settings_show_as_precision_changed(monkeypatch):
    watch = Watch()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", not tf32)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        changed = watch.changes()
    finally:
        torch.set_default_dtype(dtype)
    assert set(changed) == {"precision_changed"}
    assert f"cuda.matmul.allow_tf32: {tf32} -> {not tf32}" in changed["precision_changed"]
    assert "default_dtype: torch.float32 -> torch.float64" in changed["precision_changed"]


def test_a_thread_left_running_shows_and_a_finished_one_does_not():
    watch = Watch()
    release = threading.Event()
    done = threading.Thread(target=lambda: None, name="finished-helper")
    done.start()
    done.join()
    running = threading.Thread(target=release.wait, name="miner", daemon=True)
    running.start()
    try:
        assert watch.changes() == {"background_thread": "1 thread(s) alive after forward: miner"}
    finally:
        release.set()
        running.join()
    assert watch.changes() == {}


def test_every_name_of_the_judges_modules_is_watched(monkeypatch):
    # what the candidate's process calls after submission code: its saves, its timer's construction, a builtin
    # shadowed in a harness module, an object a module holds
    import harness.shared.handover as handover

    watch = Watch()
    monkeypatch.setattr(handover, "save", lambda *args, **kwargs: None)
    monkeypatch.setattr(timer.Timer, "__init__", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(timer, "len", lambda value: 0, raising=False)
    monkeypatch.setattr(timer.Timer, "_timed_fast", lambda self, inputs: 0.0, raising=False)
    assert watch.changes()["patched_runtime"] == (
        "replaced: harness.shared.handover.save, harness.shared.timer.len (added), "
        "harness.shared.timer.Timer.__init__, harness.shared.timer.Timer._timed_fast (added)")
    monkeypatch.undo()
    assert watch.changes() == {}


def test_an_object_a_harness_module_holds_is_watched_by_its_attributes(monkeypatch):
    # the candidate's CONTEXT holds the reader of its own-call count: swapped, the count would be the submission's
    from harness.children.candidate import main

    monkeypatch.setattr(main.CONTEXT, "own_calls", lambda: 0, raising=False)
    watch = Watch()
    monkeypatch.setattr(main.CONTEXT, "own_calls", lambda: 99)
    replaced = "harness.children.candidate.main.CONTEXT.own_calls"
    assert watch.changes() == {"patched_runtime": f"replaced: {replaced}"}


def test_a_replacement_undone_after_it_was_remembered_is_still_reported(monkeypatch):
    # the candidate's process remembers right before each step the parent trusts (a copy, a save): a replacement the
    # forward made and undid once used was in place then
    watch = Watch()
    monkeypatch.setattr(timer, "_clock", lambda: 0.0)
    watch.remember()
    monkeypatch.undo()
    assert watch.changes() == {}
    assert watch.report() == {"patched_runtime": "replaced: harness.shared.timer._clock"}


def test_the_sealed_snapshot_still_reports_once_the_watch_and_its_module_are_switched_off(monkeypatch):
    # what the candidate's process calls (through the audit hook that holds it): rebinding Watch's methods, this
    # module's functions, the builtins and the threading function it calls reaches none of it, and is reported
    import builtins

    import harness.children.candidate.watch as watch_module
    from harness.children.candidate.watch import sealed

    check = sealed()
    answer: list = []
    check(answer)
    assert answer == [{}]
    release = threading.Event()
    miner = threading.Thread(target=release.wait, name="miner", daemon=True)
    monkeypatch.setattr(Watch, "changes", lambda self: {})
    monkeypatch.setattr(Watch, "report", lambda self: {})
    monkeypatch.setattr(watch_module, "_same", lambda now, then: True)
    monkeypatch.setattr(watch_module, "harness_modules", dict)
    monkeypatch.setattr(builtins, "all", lambda values: True)
    monkeypatch.setattr(timer, "_clock", lambda: 0.0)
    check(None)   # remembered while in place ...
    monkeypatch.setattr(timer, "_clock", time.perf_counter)   # ... and undone
    miner.start()
    monkeypatch.setattr(threading, "enumerate", list)
    answer = []
    try:
        check(answer)
    finally:
        release.set()
        miner.join()
    assert Watch().report() == {}   # the one anyone can reach is off
    (found,) = answer
    assert found["background_thread"] == "1 thread(s) alive after forward: miner"
    replaced = found["patched_runtime"].split("; ")
    assert replaced[0].startswith("replaced: harness.shared.timer._clock, ")   # remembered, though undone since
    assert "harness.shared.timer._clock" not in replaced[1]
    for name in ("watch._same", "watch.harness_modules", "watch.Watch.changes", "watch.Watch.report"):
        assert f"harness.children.candidate.{name}" in replaced[1]
    answer = []
    check("anything else")   # neither None nor a list: nothing answered
    assert answer == []
