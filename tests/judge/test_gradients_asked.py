"""The reference's gradients are asked of its oracle (Reference.with_gradients) only where they can be compared: a
candidate whose outputs have an autograd graph, or the config's `ref_grads_always`; once per reference, kept for
every later submission. The records say what they always said (tests/judge/test_statuses.py: the fixtures' status)."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES, judge_config

from harness.judge import evaluate
from harness.oracle.reference import OracleError, run_oracle
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import Submission

PROBLEM = resolve_problem("level0/1")
RELU = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"


def _judge(ref, config, name: str, text: str, folder: Path):
    submission = Submission(label=name, text=text, is_python=True, problem=PROBLEM)
    return evaluate.evaluate(submission, lambda: ref, config, "cpu", folder / name)


def _fixture(name: str) -> str:
    return (FIXTURES / "cpu" / name).read_text()


@pytest.fixture
def reference(tmp_path, request):
    config = judge_config(device="cpu", time_candidates=False, **getattr(request, "param", {}))
    ref = run_oracle(PROBLEM, config, "cpu", tmp_path / "logs")
    yield ref, config
    ref.close()


def test_gradients_are_asked_for_by_the_first_candidate_with_a_graph_and_kept(reference, tmp_path):
    ref, config = reference
    assert ref.truth.has_graph and ref.truth.input_grads == []
    detached = _judge(ref, config, "no_grad.py", _fixture("no_grad.py"), tmp_path)
    assert detached.status == Status.NO_GRAD and detached.grad_correct is False and detached.grads_compared == 0
    assert "reference_gradients" not in detached.phases and not ref.gradients_in   # its backward never ran

    wrong = _judge(ref, config, "grad_mismatch.py", _fixture("grad_mismatch.py"), tmp_path)
    assert wrong.status == Status.GRAD_MISMATCH and wrong.grad_correct is False and wrong.grads_compared == 1
    assert wrong.phases["reference_gradients"] > 0 and ref.gradients_in
    assert len(ref.truth.input_grads) == 1 and ref.truth.input_grads[0].shape == ref.truth.outputs[0][0].shape

    right = _judge(ref, config, "relu.py", RELU, tmp_path)
    assert right.grad_correct is True and right.grads_compared == 1 and right.grad_failure is None
    assert "reference_gradients" not in right.phases   # asked once: the second with a graph used the kept ones


@pytest.mark.parametrize("reference", [{"ref_grads_always": True}], indirect=True)
def test_the_config_asks_for_them_whatever_the_candidate_did(reference, tmp_path):
    ref, config = reference
    detached = _judge(ref, config, "no_grad.py", _fixture("no_grad.py"), tmp_path)
    assert detached.phases["reference_gradients"] > 0 and ref.gradients_in
    assert (detached.status, detached.grad_correct, detached.grads_compared, detached.error) == (
        Status.NO_GRAD, False, 0, "gradients: the output has no autograd graph")   # the record says the same


def test_a_reference_whose_backward_fails_fails_only_where_its_gradients_are_asked_for(tmp_path):
    """Its start no longer runs the backward: candidates that need no gradients get their records; the first that
    does gets the reference's failure (an OracleError: the problem's, as a failed start is)."""
    problem_file = tmp_path / "backward_raises.py"
    problem_file.write_text(PROBLEM.path.read_text().replace("import torch\n", (
        "import torch\n\n\nclass NoBackward(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x):\n        return x.clone()\n\n"
        "    @staticmethod\n    def backward(ctx, grad):\n        raise RuntimeError('no backward in this reference')\n"
    ), 1).replace("return torch.relu(x)", "return torch.relu(NoBackward.apply(x))"))
    problem = resolve_problem(str(problem_file))
    config = judge_config(device="cpu", time_candidates=False)
    ref = run_oracle(problem, config, "cpu", tmp_path / "logs")
    try:
        detached = evaluate.evaluate(Submission(label="d", text=_fixture("no_grad.py"), is_python=True,
                                                problem=problem), lambda: ref, config, "cpu", tmp_path / "d")
        assert detached.status == Status.NO_GRAD
        with pytest.raises(OracleError, match="no backward in this reference"):
            evaluate.evaluate(Submission(label="r", text=RELU, is_python=True, problem=problem), lambda: ref,
                              config, "cpu", tmp_path / "r")
    finally:
        ref.close()
