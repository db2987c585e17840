"""The findings catalogue: one entry per finding, groups for profiles, canonical order, helpful errors; findings
recorded only through its constants and checked as they are recorded."""
import ast
import glob

import pytest
from conftest import REPO

from harness.integrity.static import _CHECKS, _FAMILIES
from harness.shared import findings
from harness.shared.config import ConfigError, load_config
from harness.shared.messages import reported_findings


def test_every_finding_is_catalogued_once_with_a_known_category_and_detector():
    names = [kind.name for kind in findings.CATALOGUE]
    assert len(names) == len(set(names))
    categories = {findings.KERNELS, findings.TAMPERING, findings.SIDE_EFFECTS, findings.CORRECTNESS, findings.EVIDENCE,
                  findings.SOURCE}
    seen_by = {findings.SEEN_IN_SOURCE, findings.SEEN_IN_CANDIDATE, findings.SEEN_BY_PARENT}
    assert all(k.category in categories and k.seen_by in seen_by and k.meaning for k in findings.CATALOGUE)


def test_the_static_findings_are_exactly_those_the_static_checks_detect():
    detected = [flag for family in _FAMILIES for flag in family.CHECKS]  # each finding in one family only
    assert sorted(detected) == sorted(findings.STATIC)
    assert list(_CHECKS) == list(findings.STATIC)


def test_groups_expand_in_catalogue_order_and_duplicates_collapse():
    assert findings.expand(["gaming", "tampering"]) == findings.members("gaming")
    assert set(findings.members("tampering")) < set(findings.members("gaming"))
    assert findings.expand(["timer_mismatch", "no_custom_kernel"]) == ("no_custom_kernel", "timer_mismatch")
    assert set(findings.members("source")) == set(findings.STATIC)


def test_the_default_profile_forbids_the_catalogue_defaults():
    assert load_config(None).forbid == findings.DEFAULT_FORBID
    assert load_config(REPO / "configs" / "default.yaml").forbid == findings.DEFAULT_FORBID
    assert findings.DEFAULT_FORBID == ("no_custom_kernel", *findings.members("gaming"))


def test_written_order_does_not_change_the_config_hash(tmp_path):
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text("forbid: [timer_mismatch, no_custom_kernel]\n")
    two.write_text("forbid: [no_custom_kernel, timer_mismatch, timer_mismatch]\n")
    assert load_config(one).hash() == load_config(two).hash()


def test_an_unknown_name_suggests_the_closest(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("forbid: [timer_mismatc]\n")
    with pytest.raises(ConfigError, match="did you mean timer_mismatch"):
        load_config(path)


@pytest.mark.parametrize("path", sorted(glob.glob(str(REPO / "configs" / "*.yaml"))))
def test_bundled_profiles_load(path):
    assert set(load_config(path).forbid) <= set(findings.BY_NAME)


def test_the_candidate_may_report_only_what_its_own_side_detects():
    assert "patched_runtime" in findings.IN_CANDIDATE and "background_thread" in findings.IN_CANDIDATE
    for parent_side in ("degenerate_problem", "input_replay", "timer_mismatch", "beyond_reference_roofline",
                        "spawned_processes", "no_custom_kernel"):
        assert parent_side in findings.DYNAMIC and parent_side not in findings.IN_CANDIDATE


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def test_no_finding_name_is_written_outside_the_catalogue():
    """Detectors record findings through the catalogue's constants: a literal could be a typo that no profile ever
    forbids (and that a rename of the finding would leave behind)."""
    written = []
    for path in sorted((REPO / "harness").rglob("*.py")):
        if path == REPO / "harness" / "shared" / "findings.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        written += [f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and node.value in findings.BY_NAME and id(node) not in docstrings]
    assert written == []


def test_every_finding_has_its_constant():
    assert all(getattr(findings, kind.name.upper()) == kind.name for kind in findings.CATALOGUE)


def test_recording_an_unknown_finding_raises():
    found = findings.Found({findings.TIMER_MISMATCH: "1 ms apart"})
    found[findings.INPUT_REPLAY] = "12x"
    assert found == {"timer_mismatch": "1 ms apart", "input_replay": "12x"}
    with pytest.raises(findings.UnknownFinding, match="did you mean input_replay"):
        found["input_replya"] = "12x"
    for record in (lambda: found.update({"timer_mismatch": "x", "no_such_finding": "y"}),
                   lambda: found.update(no_such_finding="y"), lambda: found.setdefault("no_such_finding", "y"),
                   lambda: findings.Found({"no_such_finding": "y"})):
        with pytest.raises(findings.UnknownFinding):
            record()
    assert "no_such_finding" not in found


def test_the_parent_drops_unknown_names_the_candidate_reports():
    """The candidate's process is untrusted: a name it reports that is no finding (or one it may not speak for) is
    dropped, never an error that would end the parent's evaluation."""
    event = {"event": "checked", "flags": {"no_such_finding": "x", findings.PATCHED_RUNTIME: "torch.mm",
                                           findings.DEGENERATE_PROBLEM: "forged"}}
    found = findings.Found()
    found.update(reported_findings(event, findings.IN_CANDIDATE))
    assert found == {findings.PATCHED_RUNTIME: "torch.mm"}
