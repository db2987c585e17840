import pytest
from conftest import SEED_PROBLEM

from harness.shared.problems import ProblemNotFound, list_problems, resolve_problem


def test_ids_and_resolution():
    problem = resolve_problem("level2/62")
    assert problem.id == "level2/62" and problem.path == SEED_PROBLEM and problem.level == 2
    assert resolve_problem(str(SEED_PROBLEM)).id == "level2/62"
    assert resolve_problem("level_2/problem_62").id == "level2/62"
    assert {"level0/1", "level0/4", "level2/62"} <= {p.id for p in list_problems()}


def test_kernelbench_checkout_layout(tmp_path):
    # KernelBench: KernelBench/level1/1_Square_matrix_multiplication_.py, numbers not zero-padded.
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "1_Square_matrix_multiplication_.py").write_text("x = 1\n")
    (tmp_path / "level1" / "19_ReLU.py").write_text("x = 1\n")
    assert [p.id for p in list_problems(tmp_path)] == ["level1/1", "level1/19"]
    assert resolve_problem("level1/19", tmp_path).name == "ReLU"


def test_unknown_problem_is_a_clear_error():
    with pytest.raises(ProblemNotFound, match="level9/1"):
        resolve_problem("level9/1")
    with pytest.raises(ProblemNotFound, match="expected levelN/NN"):
        resolve_problem("matmul")
