"""Every status that can arise on CPU, each from its own fixture, asserted exactly."""
from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, by_name, expected_status, run_folder

from harness.integrity.profiles import Profile, status_under
from harness.shared.config import load_config
from harness.shared.record import Status
from harness.shared.settings import IntegritySettings

CPU_FIXTURES = sorted(p.name for p in (FIXTURES / "cpu").iterdir() if p.name != "timeout_compile.py")


@pytest.mark.parametrize("name", CPU_FIXTURES)
def test_cpu_fixture_ends_in_its_status(cpu_fixture_batch, name):
    record = by_name(cpu_fixture_batch)[name]
    assert record.status.value == expected_status(FIXTURES / "cpu" / name), record.error


# Statuses no CPU submission can reach: a candidate is stopped (its cgroup frozen) while its reference is timed,
# so on CPU nothing of it runs then; work it queued on a GPU before it was stopped still can
# (tests/judge/test_drift.py drives the verdict itself; tests/fixtures/gpu_integrity/31_gpu_saboteur.py the GPU).
GPU_ONLY = {Status.TIMING_INTERFERENCE}
# The judge's own shortage is no submission's doing: tests/pipeline/test_judge_error.py makes it (a temporary folder
# too small for a feed) and asserts its record.
THE_JUDGES_OWN = {Status.JUDGE_ERROR}


def test_every_cpu_status_is_covered(cpu_fixture_batch, examples_batch_cpu):
    seen = {r.status for r in cpu_fixture_batch.records} | {r.status for r in examples_batch_cpu.records}
    assert seen == set(Status) - GPU_ONLY - THE_JUDGES_OWN


def test_batch_survives_crashes_and_timeouts(cpu_fixture_batch):
    # crash_exit, crash_segfault and timeout sit among the others; every submission still has its record.
    assert not cpu_fixture_batch.skipped, [(s.label, s.reason) for s in cpu_fixture_batch.skipped]
    assert len(cpu_fixture_batch.records) == len(CPU_FIXTURES)
    statuses = {r.status for r in cpu_fixture_batch.records}
    assert {Status.CRASH, Status.TIMEOUT} <= statuses


def test_crash_and_timeout_are_told_apart(cpu_fixture_batch):
    records = by_name(cpu_fixture_batch)
    assert "SIGSEGV" in records["crash_segfault.py"].error
    assert "exited with code 0" in records["crash_exit.py"].error
    assert "exceeded" in records["timeout.py"].error


def test_nan_never_passes(cpu_fixture_batch):
    record = by_name(cpu_fixture_batch)["incorrect_nan.py"]
    assert record.correct is False and record.max_abs_error == float("inf")


def test_swallowed_build_failure_is_a_compile_error(cpu_fixture_batch):
    record = by_name(cpu_fixture_batch)["compile_error_swallowed.py"]
    assert record.compiled is False and "nope" in record.error


def test_a_build_failed_in_init_did_not_compile(cpu_fixture_batch):
    record = by_name(cpu_fixture_batch)["compile_error_in_init.py"]
    assert record.status == "compile_error" and record.compiled is False   # the leaderboard's compile rate reads it


def test_booleans_tell_the_rest(cpu_fixture_batch):
    records = by_name(cpu_fixture_batch)
    rule = records["rule_violation.py"]
    assert (rule.compiled, rule.correct, rule.grad_correct, rule.extensions_built) == (True, True, True, 0)
    assert rule.speedup is not None and rule.runtime_ms > 0
    grad = records["grad_mismatch.py"]
    assert (grad.correct, grad.grad_correct) == (True, False)
    assert records["compile_error.py"].compile_s is not None
    error = records["compile_error.py"].error
    assert "undeclared_variable" in error and "building as written" not in error  # the compiler's own diagnostic


def test_a_timed_evaluation_leaves_every_block_beside_its_log(cpu_fixture_batch):
    """timing.json: both sides' blocks in the order they ran, the figures the record's times are the medians of."""
    records = by_name(cpu_fixture_batch)
    timed = records["rule_violation.py"]
    evidence = json.loads((Path(timed.log_path).parent / "timing.json").read_text())
    assert evidence["interleaved"] is True and list(evidence["sides"]) == ["reference", "candidate"]
    mine, theirs = evidence["sides"]["candidate"], evidence["sides"]["reference"]
    assert len(mine["blocks"]) == timed.timing_blocks and len(theirs["blocks"]) == len(mine["blocks"])
    assert sum(b["calls"] for b in mine["blocks"]) == timed.runtime_reps
    # the calls each side's spans held: its report, in the record, the method and timing.json alike
    assert (timed.calls_per_span, timed.ref_calls_per_span) == (mine["calls_per_span"], theirs["calls_per_span"])
    assert timed.calls_per_span >= 1 and timed.ref_calls_per_span >= 1
    assert (f", {timed.calls_per_span} calls a span" in timed.timing_method) == (timed.calls_per_span > 1)
    assert mine["calls_per_span_read"] >= 1
    assert mine["median_ms"] == pytest.approx(timed.runtime_ms, rel=1e-4)
    # timed again alone after its candidate was killed (a drift), the reference's faster time is what the speedup
    # rests on, and where the machine changed the alone time is its clean time from then on
    alone = evidence.get("reference_alone")
    credited = alone is not None and alone["outcome"] in ("drift", "machine_changed")
    against = min(theirs["median_ms"], alone["median_ms"]) if credited else theirs["median_ms"]
    assert against == pytest.approx(timed.ref_runtime_ms, rel=1e-4)
    # the blocks' own medians bracket the side's median over all its calls
    medians = [b["median_ms"] for b in mine["blocks"]]
    assert min(medians) <= mine["median_ms"] <= max(medians) and statistics.median(medians) > 0
    clean = alone if alone is not None and alone["outcome"] == "machine_changed" else evidence["reference_clean"]
    assert clean["median_ms"] == pytest.approx(timed.ref_clean_ms, rel=1e-4)
    # when each block began (to line up with readings taken beside it): A B B A ..., each side's in order
    began = {side: [b["began_s"] for b in data["blocks"]] for side, data in evidence["sides"].items()}
    assert all(time.time() - 3600 < t < time.time() for side in began for t in began[side])
    if not any(data["remeasured"] for data in evidence["sides"].values()):   # a block timed again takes its place
        assert began["reference"][0] < began["candidate"][0] < began["candidate"][1] < began["reference"][1]
        assert all(began[side] == sorted(began[side]) for side in began)
    # the host's time inside the spans is a CUDA figure (the head start's evidence): zero on the CPU device
    assert all(b["launch_ms"] == 0 for data in evidence["sides"].values() for b in data["blocks"])
    assert "ahead" not in timed.timing_method
    # nothing timed, nothing written
    assert not (Path(records["incorrect.py"].log_path).parent / "timing.json").exists()


def test_with_placements_each_side_is_timed_over_copies_of_its_weights(tmp_path):
    """config `timing_placements`: the candidate's timed calls rotate among as many ModelNew instances (each built
    as the first, the reference's weights in), the reference's among copies of its own; the verdict is unchanged."""
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "linear_relu.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, in_features, out_features):\n        super().__init__()\n"
        "        self.linear = nn.Linear(in_features, out_features)\n        print('[built]', flush=True)\n\n"
        "    def forward(self, x):\n        return torch.relu(self.linear(x))\n")
    (record,) = run_folder(folder, tmp_path / "run", "cpu", problem="level0/2", timing_placements=3).records
    assert record.status == Status.RULE_VIOLATION and record.correct is True   # pure PyTorch: correct, timed
    assert "3 placements" in record.timing_method and record.speedup is not None
    assert Path(record.log_path).read_text().count("[built]") == 3   # the instance checked, then two more
    evidence = json.loads((Path(record.log_path).parent / "timing.json").read_text())
    assert [side["method"] for side in evidence["sides"].values()] == ["perf_counter, 3 placements"] * 2


RENAMED_LINEAR = """import torch
import torch.nn as nn


class LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight, WEIGHT_GRAD, grad.sum(0)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        layer = nn.Linear(in_features, out_features)   # the reference's layer, in its order: the same values
        self.w, self.b = layer.weight, layer.bias        # under other names than linear.weight / linear.bias

    def forward(self, x):
        return torch.relu(LinearFn.apply(x, self.w, self.b))
"""


def test_parameters_under_other_names_are_loaded_and_gradient_checked_by_value(tmp_path):
    """ModelNew's parameters named otherwise than the reference's, holding the same values (built in the same order
    under the same seed), are matched by value: loaded, and their gradients compared under the reference's names,
    so a backward that leaves the weight's gradient out is a grad_mismatch, not a pass."""
    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "renamed_right.py").write_text(RENAMED_LINEAR.replace("WEIGHT_GRAD", "grad.t() @ x"))
    (folder / "renamed_no_weight_grad.py").write_text(RENAMED_LINEAR.replace("WEIGHT_GRAD", "None"))
    records = by_name(run_folder(folder, tmp_path / "run", "cpu", problem="level0/2"))
    right, wrong = records["renamed_right.py"], records["renamed_no_weight_grad.py"]
    assert right.weights_loaded == 2 and right.grads_compared == 3 and not right.grads_not_comparable
    assert right.status == Status.RULE_VIOLATION and right.grad_correct is True   # pure PyTorch, right gradients
    assert "w -> linear.weight" in Path(right.log_path).read_text()
    assert wrong.status == Status.GRAD_MISMATCH and wrong.grad_correct is False
    assert "parameter linear.weight" in wrong.error


def test_compile_timeout(tmp_path):
    folder = tmp_path / "subs"
    folder.mkdir()
    shutil.copy(FIXTURES / "cpu" / "timeout_compile.py", folder)
    outcome = run_folder(folder, tmp_path / "run", "cpu", problem="level0/1", compile_timeout_s=3.0)
    (record,) = outcome.records
    assert record.status == Status.TIMEOUT and "compile" in record.error


def test_examples_end_in_their_expected_status(examples_batch_cpu):
    for record in examples_batch_cpu.records:
        path = Path(record.submission)
        expected = expected_status(path)
        if any(kind in path.name for kind in ("_cuda", "_triton", "_cute", "_tilelang")) or \
                path.parent.parent.name == "level2":
            expected = "needs_cuda"  # CUDA and GPU-language examples on a CPU device (no build child for those)
        assert record.status.value == expected, (path, record.error)


def test_examples_headers_hold_under_the_default_config(examples_batch_cpu):
    """A user runs the examples with configs/default.yaml: each header must be its status there. The shared batch
    runs with the tests' settings (no_grad a status too), so the default profile is applied to its measurements."""
    default = Profile.from_settings(IntegritySettings.from_config(load_config()))
    for record in examples_batch_cpu.records:
        path = Path(record.submission)
        if record.status == Status.NEEDS_CUDA:
            continue   # GPU examples on a CPU device: test_examples_end_in_their_expected_status
        assert status_under(record, default).value == expected_status(path), (path, record.error)
    wrong_backward = [r for r in examples_batch_cpu.records if Path(r.submission).name == "wrong_backward.py"]
    assert len(wrong_backward) == 2 and all(status_under(r, default) == Status.GRAD_MISMATCH for r in wrong_backward)


def test_same_extension_name_never_collides(examples_batch_cpu):
    # Every level0 example builds an extension called "ext" with different code; each must get its own.
    level0 = [r for r in examples_batch_cpu.records if "/level0/" in r.submission]
    assert len(level0) >= 6
    assert all(r.extensions_built == 1 for r in level0)
    passing = [r for r in level0 if r.status == Status.PASS]
    assert {r.problem for r in passing} == {"level0/1", "level0/2", "level0/3", "level0/4", "level0/6"}


def test_a_constant_output_problem_passes_its_correct_answer_and_says_it_is_degenerate(examples_batch_cpu):
    # level0/6 always returns zeros (tests/integrity/test_degenerate.py has the detection itself); the answer that
    # writes zeros is right and passes, and its record carries the oracle's evidence. No other example's does.
    record = next(r for r in examples_batch_cpu.records if r.problem == "level0/6")
    assert record.status == Status.PASS and record.speedup is not None, record.error
    assert record.flag_evidence["degenerate_problem"] == "output 0: the constant 0 passes on all 5 trials"
    assert not any("degenerate_problem" in (r.flags or ()) for r in examples_batch_cpu.records if r is not record)


def test_examples_pass_with_gradients(examples_batch_cpu):
    for record in examples_batch_cpu.records:
        if record.status == Status.PASS:
            assert record.grad_correct is True and record.grads_compared >= 1
            assert record.speedup is not None and record.runtime_ms > 0 and record.ref_runtime_ms > 0
