"""The extraction stage: the verdicts the text alone decides, the record every later stage starts from, and the
profile's word on a status. No torch needed by the code under test, nothing compiled."""
from __future__ import annotations

from conftest import judge_config

from harness.judge import extraction
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import Submission

GOOD = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def _submission(text: str, is_python: bool = True, not_text=None) -> Submission:
    return Submission(label="s.py", text=text, is_python=is_python, problem=resolve_problem("level0/1"),
                      not_text=not_text)


def test_the_text_alone_decides_too_large_not_text_no_code_and_syntax_errors():
    config = judge_config(max_submission_bytes=100)
    assert extraction.extract_submission(_submission("x" * 101), config).status == Status.TOO_LARGE
    config = judge_config()
    assert extraction.extract_submission(_submission("x", not_text="not UTF-8"), config).status == Status.SYNTAX_ERROR
    assert extraction.extract_submission(_submission("no code here", is_python=False), config).status == Status.NO_CODE
    broken = extraction.extract_submission(_submission("class ModelNew(:\n"), config)
    assert broken.status == Status.SYNTAX_ERROR and broken.error
    fine = extraction.extract_submission(_submission(GOOD), config)
    assert fine.status is None and fine.extraction.source == GOOD


def test_prepare_writes_the_source_and_prose_and_returns_the_record_so_far(tmp_path):
    config = judge_config(device="cpu")
    answer = "Here is my kernel.\n```python\n" + GOOD + "```\n"
    record, source = extraction.prepare(_submission(answer, is_python=False), config, "cpu", tmp_path / "a")
    assert source == GOOD and (tmp_path / "a" / "source.py").read_text() == GOOD
    assert record.explanation_path and "my kernel" in (tmp_path / "a" / "explanation.md").read_text()
    assert record.problem == "level0/1" and record.config_hash == config.hash() and record.device == "cpu"
    final = extraction.prepare(_submission("no code", is_python=False), config, "cpu", tmp_path / "b")
    assert final.status == Status.NO_CODE and final.check_status == Status.NO_CODE and final.source_path is None


def test_a_forbidden_finding_turns_a_pass_into_rule_violation_and_never_hides_a_wrong_answer():
    config = judge_config(device="cpu")
    blank = extraction.blank_record(_submission(GOOD), config, "cpu")
    passed = extraction.apply_profile(blank.__class__(**{**blank.__dict__, "status": Status.PASS}),
                                      {"patched_runtime": "x"}, config)
    assert passed.status == Status.RULE_VIOLATION and passed.check_status == Status.PASS
    wrong = extraction.apply_profile(blank.__class__(**{**blank.__dict__, "status": Status.INCORRECT}),
                                     {"patched_runtime": "x"}, config)
    assert wrong.status == Status.INCORRECT and wrong.flags == ("patched_runtime",)


def test_torch_versions_are_read_without_loading_torch_the_same_as_torch_says():
    import torch

    assert extraction.installed_torch_build() == (torch.__version__, torch.version.cuda)
    assert extraction.torch_versions() == (torch.__version__, torch.version.cuda)
