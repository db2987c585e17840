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


def test_a_problem_files_stem_is_its_id_too_and_typos_get_a_suggestion():
    assert resolve_problem("level1/16_ReLU").id == "level1/16"
    assert resolve_problem("level2/62_Matmul_GroupNorm_LeakyReLU_Sum.py").id == "level2/62"
    with pytest.raises(ProblemNotFound, match=r"'levl0/1'; did you mean level0/1\?"):
        resolve_problem("levl0/1")
    with pytest.raises(ProblemNotFound, match=r"level1/16 is 16_ReLU; did you mean level1/16\?"):
        resolve_problem("level1/16_Relu")   # the number names another file than the stem given
    with pytest.raises(ProblemNotFound, match=r"did you mean level1/17\?"):
        resolve_problem("level1/16_GELU")   # 17_GELU: the stem is closer than the number
