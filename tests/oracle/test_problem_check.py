"""`problems` and `problems --check`, on our suite's tiny problems and on a KernelBench-layout folder of weak ones."""
from __future__ import annotations

import pytest
from conftest import FIXTURES, REPO, judge_config

from harness.oracle.problem_check import check_problem, list_problem, weak_flags
from harness.shared.messages import ProblemCheckReady, ReferenceGrad, ReferenceOutput
from harness.shared.problems import list_problems

WEAK = FIXTURES / "weak_problems"


@pytest.fixture(scope="module")
def weak_reports(tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    return {p.id: check_problem(p, judge_config(), "cpu", logs) for p in list_problems(WEAK)}


def test_each_weakness_is_flagged(weak_reports):
    flags = {pid: " | ".join(r.flags) for pid, r in weak_reports.items()}
    assert "a zero tensor passes output 0" in flags["level1/1"]
    assert "differs between two runs" in flags["level1/2"]
    assert "NaN/Inf" in flags["level1/3"]
    assert flags["level1/4"] == ""  # integer argmax with CHECK_GRAD = False is a fine problem
    assert "no gradient" in flags["level1/5"]


def test_report_numbers(weak_reports):
    info = weak_reports["level1/4"].info
    assert info.outputs[0].shape == (128,) and info.outputs[0].dtype == "int64"
    assert info.eager_ms > 0 and info.tensor_mb > 0 and info.peak_mb is None
    assert info.grad == ReferenceGrad(checked=False) and info.metadata["description"] == "argmax over dim 1"


def test_tiny_suite_problems_are_not_weak(tmp_path):
    for problem in list_problems(REPO / "problems"):
        if problem.id.startswith("level0/"):
            report = check_problem(problem, judge_config(), "cpu", tmp_path)
            # level0/6 is degenerate on purpose (its output is always zero): the example of degenerate_problem.
            expected = ("a zero tensor passes output 0",) if problem.id == "level0/6" else ()
            assert report.flags == expected, (problem.id, report.flags)


def test_listing_allocates_nothing_and_reads_metadata():
    problems = {p.id: p for p in list_problems(REPO / "problems")}
    listing = list_problem(problems["level2/62"])
    assert listing.inputs == ("(1024, 8192) float32",) and listing.error is None
    assert list_problem(list_problems(WEAK)[3]).description == "argmax over dim 1"


def test_flags_are_pure():
    info = ProblemCheckReady(device_name="x", metadata={}, inputs=(), eager_iqr_ms=0.0,
                             outputs=(ReferenceOutput((4,), "float32", finite=True, zero_passes=False,
                                                      constant_passes=True, repeat_agrees=True),),
                             grad=ReferenceGrad(True, True), peak_mb=30000.0, tensor_mb=1.0, eager_ms=0.1)
    assert weak_flags(info, "cuda") == ["a constant tensor passes output 0", "needs 29.3 GB (> 24 GB)",
                                        "eager 0.100 ms < 0.5 ms: launch overhead dominates"]
    assert weak_flags(info, "cpu") == ["a constant tensor passes output 0", "needs 29.3 GB (> 24 GB)"]


def test_check_grad_false_skips_the_gradient_verdict(tmp_path):
    from conftest import run_folder

    folder = tmp_path / "subs"
    folder.mkdir()
    (folder / "argmax.py").write_text(
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.argmax(dim=1)\n")
    outcome = run_folder(folder, tmp_path / "run", "cpu", problem=str(WEAK / "level1" / "4_Argmax_No_Grad.py"))
    (record,) = outcome.records
    assert record.correct is True and record.grad_correct is None and record.grads_compared is None
