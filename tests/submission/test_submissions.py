import json

from conftest import REPO

from harness.shared.problems import resolve_problem
from harness.submission.submissions import discover

PROBLEMS = REPO / "problems"


def test_folder_per_problem_and_kernelbench_names(tmp_path):
    (tmp_path / "level2" / "62_Anything").mkdir(parents=True)
    (tmp_path / "level2" / "62_Anything" / "a.py").write_text("x")
    (tmp_path / "level_2_problem_62_sample_3_kernel.py").write_text("y")
    (tmp_path / "level_0").mkdir()
    (tmp_path / "level_0" / "problem_1.py").write_text("z")
    (tmp_path / "README.md").write_text("ignored")
    (tmp_path / "stray.py").write_text("no problem")
    found, skipped = discover(tmp_path, None, PROBLEMS, run="r")
    ids = sorted((s.problem_id, s.sample_id) for s in found)
    assert ids == [("level0/1", "problem_1"), ("level2/62", "3"), ("level2/62", "a")]  # file stem unless named
    assert [s.label for s in skipped] == [str(tmp_path / "stray.py")]


def test_problem_flag_applies_to_all(tmp_path):
    (tmp_path / "one.md").write_text("x")
    (tmp_path / "two.txt").write_text("y")
    found, _ = discover(tmp_path, resolve_problem("level0/1"), PROBLEMS)
    assert {s.problem_id for s in found} == {"level0/1"} and not any(s.is_python for s in found)


def test_jsonl_generations(tmp_path):
    path = tmp_path / "gen.jsonl"
    rows = [{"problem": "level0/1", "completion": "```python\n```", "model": "m1", "sample_id": 0},
            {"problem": "level2/62", "completion": "text", "model": "m2", "sample_id": "b"},
            {"problem": "level7/7", "completion": "text"}, {"completion": 3}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    found, skipped = discover(path, None, PROBLEMS, run="r")
    assert [(s.problem_id, s.model, s.sample_id, s.label) for s in found] == [
        ("level0/1", "m1", "0", f"{path}:1"), ("level2/62", "m2", "b", f"{path}:2")]
    assert len(skipped) == 3
