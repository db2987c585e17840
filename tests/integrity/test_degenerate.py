"""Degenerate problems (harness/integrity/degenerate.py, harness/children/oracle/degenerate.py): outputs that
ignore the inputs, or one of them, found at the reference's start and carried as the finding `degenerate_problem`.
The end-to-end pass of a constant-output problem's correct answer is in tests/judge/test_statuses.py (it rides
on the examples batch)."""
from __future__ import annotations

import glob
import textwrap

import pytest
import torch
from conftest import REPO, judge_config

from harness.children.oracle.degenerate import swapped_outputs
from harness.integrity.degenerate import evidence
from harness.oracle.reference import run_oracle
from harness.shared import findings
from harness.shared.check import Tolerance
from harness.shared.config import load_config
from harness.shared.problems import list_problems


class IgnoresY(torch.nn.Module):
    def forward(self, x, y):
        return torch.relu(x)


class UsesBoth(torch.nn.Module):
    def forward(self, x, y):
        return x * y


class MeanBroadcast(torch.nn.Module):   # one value, but the inputs decide which
    def forward(self, x):
        return x.mean().expand(4, 5)


class WeightsOnly(torch.nn.Module):     # not constant, but the same whatever the input
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 5))

    def forward(self, x):
        return self.weight * 2 + 0 * x.sum()


def _probe(model, trials: list[list]) -> str | None:
    """What the oracle does at start: every trial, one forward per input with that input from trial 1."""
    with torch.no_grad():
        outputs = [[model(*inputs)] for inputs in trials]
    return evidence(outputs, swapped_outputs(model, trials[0], trials[1], "cpu"), Tolerance())


def _trials(*shapes, count: int = 3) -> list[list]:
    generator = torch.Generator().manual_seed(0)
    return [[torch.randn(*shape, generator=generator) for shape in shapes] for _ in range(count)]


def test_an_input_no_output_depends_on_is_named():
    found = _probe(IgnoresY(), _trials((4, 5), (4, 5)))
    assert found == "no output depends on input 1: taken from another trial, it changes none"
    assert _probe(UsesBoth(), _trials((4, 5), (4, 5))) is None


def test_constant_and_input_independent_outputs():
    zeros = _probe(lambda x: torch.zeros(3, 2) * x.sum(), _trials((3, 2)))
    assert zeros == "output 0: the constant 0 passes on all 3 trials"   # said once, not again per input
    assert _probe(WeightsOnly(), _trials((3,))) == "output 0: trial 0's output passes on all 3 trials"
    assert _probe(MeanBroadcast(), _trials((8,))) == (
        "output 0: one value repeated on every trial (a tensor of its mean passes)")


def test_the_tolerance_decides_and_inputs_that_never_change_are_not_probed():
    trials = _trials((4, 5), (4, 5))
    slight = lambda x, y: x + 1e-6 * y   # noqa: E731  (y moves the output far less than the fp32 tolerance)
    assert "input 1" in _probe(slight, trials)
    with torch.no_grad():
        outputs = [[slight(*inputs)] for inputs in trials]
    tight = Tolerance(atol=1e-9, rtol=0.0)
    assert evidence(outputs, swapped_outputs(slight, trials[0], trials[1], "cpu"), tight) is None
    same = [[x, torch.arange(5.0)] for x, _ in trials]   # a deterministic input: nothing to swap
    assert swapped_outputs(IgnoresY(), same[0], same[1], "cpu")[1] is None


def test_the_oracle_reports_an_ignored_input(tmp_path):
    problem_file = tmp_path / "level1" / "1_Ignores_Y.py"
    problem_file.parent.mkdir()
    problem_file.write_text(textwrap.dedent("""\
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, x, y):
                return torch.relu(x)


        def get_inputs():
            return [torch.randn(8, 16), torch.randn(8, 16)]


        def get_init_inputs():
            return []
        """))
    (problem,) = list_problems(tmp_path)
    reference = run_oracle(problem, judge_config(device="cpu"), "cpu", tmp_path / "logs")
    try:
        assert reference.degenerate == "no output depends on input 1: taken from another trial, it changes none"
        assert reference.truth.swapped == []   # the probe's outputs are not kept
    finally:
        reference.close()


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "configs" / "*.yaml"))))
def test_it_is_information_no_bundled_profile_forbids(path):
    assert findings.BY_NAME["degenerate_problem"].category == findings.EVIDENCE
    assert not any("degenerate_problem" in findings.members(group) for group in findings.GROUPS)
    assert "degenerate_problem" not in load_config(path).forbid


def test_fresh_input_sets_are_kept_for_problems_of_any_size():
    """Up to 1 GB of fresh sets and outputs, two rounds of equal size, and never none: on the H100, level1/17's 2 GB
    sets left no fresh set under a plain 1 GB cap, and a content-keyed replay (GPU fixture 14) went unseen."""
    from harness.children.oracle.main import FRESH_BYTES, fresh_kept

    assert fresh_kept(8, 1 << 20) == 8                     # small sets: all of them
    assert fresh_kept(8, FRESH_BYTES // 3) == 2            # three fit: an even number of them
    assert fresh_kept(8, 2 * FRESH_BYTES) == 2             # none fits: still one a round
    assert fresh_kept(0, 2 * FRESH_BYTES) == 0             # fresh inputs off (fresh_inputs: 0)


def test_a_large_output_is_judged_whole_where_its_sample_passes_and_settled_by_the_sample_where_it_fails():
    """Outputs over SAMPLE_ELEMENTS are compared on a sample first: a sample that fails settles it (no constant, no
    repeat), but one that passes is only a hint. A constant output with one far-off element between the sampled
    ones is not degenerate; the same output without it is; outputs that spread pass neither test."""
    from harness.integrity.degenerate import SAMPLE_ELEMENTS

    tolerance = Tolerance.for_outputs(1e-4, 1e-4)
    size = SAMPLE_ELEMENTS * 8
    flat = [torch.full((size,), 0.25) for _ in range(3)]
    assert "the constant 0.25 passes" in evidence([[t] for t in flat], [None], tolerance)
    for t in flat:
        t[size // 2 + 3] = 9.0   # not on the sample's stride of 8 (a multiple of 8 plus 3)
    found = evidence([[t] for t in flat], [None], tolerance)
    assert found is None or "constant" not in found
    torch.manual_seed(0)
    spread = [[torch.randn(size)] for _ in range(3)]
    assert evidence(spread, [[torch.randn(size)]], tolerance) is None
    repeated = torch.randn(size)
    changed = repeated.clone()
    changed[5] += 1.0    # off the stride too: trial 0's output does not pass on this trial
    assert evidence([[repeated], [changed]], [None], tolerance) is None
    assert "trial 0's output passes" in evidence([[repeated], [repeated.clone()]], [None], tolerance)
