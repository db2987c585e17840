"""The Python API (harness/api.py) on the CPU device: evaluate, evaluate_many, bad arguments, calls from several
threads at once, records written when asked, close and Ctrl-C leaving no process.

One judge serves the module, with the session's build cache (conftest.TEST_SETTINGS). The one extension here is
tests/fixtures/fastkernel.py's (a second to compile, where one including torch/extension.h takes 20 s or more),
built once for every call that uses it."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, TEST_SETTINGS, make

from harness import Judge, JudgeClosed
from harness.build import builder as builds
from harness.judge import warm
from harness.shared.config import ConfigError, load_config
from harness.shared.problems import ProblemNotFound
from harness.shared.record import Record, Status

NO_CODE = "I would write a fused kernel here, but I ran out of time."
RELU = """# expected: pass
# ReLU: forward in a C++ extension that builds in about a second, backward in PyTorch. (Its source file lies in
# the temp folder, another one in each process: the evaluation builds it again instead of importing the build's.)
import torch
import torch.nn as nn

from tests.fixtures import fastkernel

ext = fastkernel.build()


class ReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return fastkernel.relu(ext, x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x > 0)


class ModelNew(nn.Module):
    def forward(self, x):
        return ReLU.apply(x)
"""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _as_model_output(source: str) -> str:
    """The source as a model writes it: prose, a <think> block, one fenced block."""
    return f"<think>ReLU is elementwise.</think>\nHere is a C++ ReLU.\n\n```python\n{source}```\n\nDone.\n"


def _children() -> set[int]:
    """Live (not zombie) processes whose parent is this one: every child a judge starts is one."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == os.getpid():
            found.add(int(pid))
    return found


@pytest.fixture(scope="module")
def older_children() -> set[int]:
    """Children of this process from before the module's judge (none, unless another test left some)."""
    return _children()


@pytest.fixture(scope="module")
def judge(older_children):
    with Judge(device="cpu", config="default", overrides=TEST_SETTINGS) as judge:
        yield judge


def test_bad_arguments_raise_and_start_nothing(judge, tmp_path):
    before = judge.builds
    with pytest.raises(ProblemNotFound, match="level0/99"):
        judge.evaluate("level0/99", NO_CODE)
    with pytest.raises(ProblemNotFound, match="not found"):
        judge.evaluate(tmp_path / "no_such_problem.py", NO_CODE)
    with pytest.raises(FileNotFoundError, match="missing.py"):
        judge.evaluate("level0/1", str(tmp_path / "missing.py"))      # a str naming a file is a path
    with pytest.raises(FileNotFoundError):
        judge.evaluate("level0/1", tmp_path)                          # a folder is not a submission
    with pytest.raises(TypeError):
        judge.evaluate("level0/1", b"bytes are neither text nor a path")
    with pytest.raises(ProblemNotFound, match="level7/1"):            # checked before any item starts
        judge.evaluate_many([("level0/1", RELU), ("level7/1", NO_CODE)])
    assert judge.builds == before and judge.warm_problems == []
    with pytest.raises(ConfigError, match="did you mean strict"):
        Judge(device="cpu", config="strictt")
    with pytest.raises(ConfigError, match="trails"):
        Judge(device="cpu", overrides={"trails": 2})
    with pytest.raises(ConfigError, match="device"):
        Judge(device="tpu")


def test_calls_from_several_threads_at_once(judge, tmp_path):
    key = builds.cache_key(RELU, builds.Target("cpu"))
    fresh = not (Path(TEST_SETTINGS["build_cache_dir"]) / key).exists()
    # The same source twice (a file, and model output around it) and a reply without code, all at once.
    (tmp_path / "relu.py").write_text(RELU)
    asked = {"file": tmp_path / "relu.py", "text": _as_model_output(RELU), "no code": NO_CODE}
    start, records, errors = threading.Barrier(len(asked)), {}, []

    def call(name: str) -> None:
        start.wait()
        try:
            records[name] = judge.evaluate("level0/1", asked[name], sample_id=name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(name,)) for name in asked]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert {name: r.status for name, r in records.items()} == {"file": Status.PASS, "text": Status.PASS,
                                                                "no code": Status.NO_CODE}
    for name, record in records.items():   # each thread got its own submission's record
        text = asked[name].read_text() if isinstance(asked[name], Path) else asked[name]
        assert record.sample_id == name and record.submission_hash == _sha(text) and record.problem == "level0/1"
    assert records["file"].submission == str(tmp_path / "relu.py") and records["text"].submission == "<text>"
    passed = [records["file"], records["text"]]
    assert Path(records["text"].source_path).read_text() == RELU and records["text"].explanation_path
    assert all(r.correct and r.grad_correct and r.extensions_built == 1 and r.speedup > 0 for r in passed)
    assert passed[0].log_path != passed[1].log_path       # each call has its own artifacts
    # One source, two calls at once: compiled once (here, unless an earlier test built it), then found cached.
    assert judge.builds == ({"built": 1, "cached": 1} if fresh else {"cached": 2}), judge.builds
    assert judge.warm_problems == ["level0/1"]           # the reference stays up for the next call


def test_evaluate_many_yields_records_as_they_finish(judge):
    syntax_error = (FIXTURES / "cpu" / "syntax_error.md").read_text()
    problem_file = REPO / "problems" / "level0" / "1_Tiny_ReLU.py"
    records = list(judge.evaluate_many([("level0/1", RELU), ("level0/1", NO_CODE),
                                        (problem_file, syntax_error, "mine")]))
    # The two that end at extraction come back (in either order) while the passing one is still being judged.
    assert {(r.sample_id, r.status) for r in records[:2]} == {("1", Status.NO_CODE), ("mine", Status.SYNTAX_ERROR)}
    assert (records[2].sample_id, records[2].status) == ("0", Status.PASS)
    assert records[2].grad_correct and records[2].own_kernels >= 1 and records[2].speedup > 0
    assert judge.warm_problems == ["level0/1"]


def test_a_judge_keeps_two_candidate_processes_started_ahead_and_a_batch_one(judge):
    """Calls to a judge come one after another: with `warm_candidates` unset it keeps two processes started ahead,
    so a call right after another finds one up even where imports take longer than an evaluation; a batch keeps
    one; a value set in the config is kept."""
    assert judge.config.warm_candidates == 2 and load_config(None).warm_candidates is None
    assert warm._POOLS._size(load_config(None)) == 1 and warm._POOLS._size(judge.config) == 2
    pools = [pool for key, pool in warm._POOLS._pools.items() if key[2].warm_candidates == 2]
    assert pools and all(len(pool._slots) == 2 for pool in pools)   # the judge's evaluations above took from it
    with Judge(device="cpu", overrides={**TEST_SETTINGS, "warm_candidates": 1}) as one:
        assert one.config.warm_candidates == 1


def test_records_are_written_when_asked(tmp_path):
    with Judge(device="cpu", overrides=TEST_SETTINGS, results_dir=tmp_path, run="rl", model="policy") as judge:
        record = judge.evaluate("level0/1", NO_CODE, sample_id="7")
    assert isinstance(record, Record) and record.status == Status.NO_CODE and record.error
    assert (record.model, record.run, record.sample_id) == ("policy", "rl", "7")
    lines = (tmp_path / "rl" / "records.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [record.to_dict()]
    assert record.to_dict()["status"] == "no_code" and Record.from_dict(record.to_dict()) == record


def test_close_stops_every_process_and_refuses_calls(judge, older_children):
    assert judge.warm_problems == ["level0/1"] and _children() - older_children   # the reference's process
    run_dir = judge.run_dir
    judge.close()
    assert not _children() - older_children and not run_dir.exists()
    with pytest.raises(JudgeClosed):
        judge.evaluate("level0/1", NO_CODE)


def test_ctrl_c_stops_every_process(tmp_path):
    """Ctrl-C while a call runs: KeyboardInterrupt reaches the caller, no child is left, the judge is closed.
    (Last in the module: Ctrl-C kills every child this process started, as an interrupted batch does.)"""
    main = threading.main_thread().ident
    before = _children()

    def interrupt_once_a_child_runs() -> None:
        deadline = time.monotonic() + 120
        while not _children() - before and time.monotonic() < deadline:
            time.sleep(0.1)
        if _children() - before:
            time.sleep(0.5)
            signal.pthread_kill(main, signal.SIGINT)   # what a terminal's Ctrl-C delivers

    # A suite started in the background inherits SIGINT ignored; Python raises KeyboardInterrupt only if handled.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        judge = Judge(device="cpu", overrides=TEST_SETTINGS)
        helper = threading.Thread(target=interrupt_once_a_child_runs)
        helper.start()
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            judge.evaluate("level0/1", FIXTURES / "cpu" / "timeout.py")   # its forward never returns
        helper.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - began < TEST_SETTINGS["run_timeout_s"]   # stopped, not timed out
    assert not _children() - before and not judge.run_dir.exists()
    with pytest.raises(JudgeClosed):
        judge.evaluate("level0/1", NO_CODE)


def _reward_module():
    spec = importlib.util.spec_from_file_location("rl_reward", REPO / "examples" / "rl_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_reward_orders_outcomes():
    reward = _reward_module().reward
    assert reward(make(Status.NO_CODE)) == reward(make(Status.COMPILE_ERROR)) == 0.0
    assert reward(make(Status.RULE_VIOLATION, speedup=5.0)) == 0.0           # gamed: nothing
    wrong = reward(make(Status.INCORRECT))
    assert 0 < wrong == reward(make(Status.TIMEOUT)) < reward(make(Status.PASS, speedup=0.1))
    assert reward(make(Status.PASS, speedup=1.0)) == reward(make(Status.PASS)) == 1.0   # None: not timed
    assert reward(make(Status.PASS, speedup=2.0)) > 1.0
    assert reward(make(Status.PASS, speedup=100.0)) == reward(make(Status.PASS, speedup=1e6))   # capped
    assert all(math.isfinite(reward(make(Status.PASS, speedup=s))) for s in (1e-9, 1e9))
