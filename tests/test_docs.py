"""The docs stay true where a list can drift from the code: config keys and their defaults, statuses, findings,
command-line commands, the modules of harness/, links between the docs. And no text narrates how the project was
made (work periods, issue numbers): the README, docs, code and tests describe the product as it is."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from harness.shared import findings
from harness.shared.config import Config
from harness.shared.record import Status

README = REPO / "README.md"
DOCS = REPO / "docs"

_ORDINALS = ("third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh", "twelfth",
             "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth", "nineteenth",
             "twentieth")
NARRATION = [
    re.compile(r"\b(?:" + "|".join(_ORDINALS) + r")\s+sessions?\b", re.IGNORECASE),
    re.compile(r"\b\d+(?:st|nd|rd|th)\s+sessions?\b", re.IGNORECASE),
    re.compile(r"\b(?:this|next|that|previous|last|same|earlier)\s+session\b", re.IGNORECASE),
    re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
]


def _texts():
    paths = [README, REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
    for folder in ("harness", "tests", "bench", "scripts", "examples"):
        paths += sorted(path for path in (REPO / folder).rglob("*") if path.suffix in (".py", ".sh", ".md"))
    paths += sorted((REPO / "configs").glob("*.yaml"))
    return paths


def _table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after `heading` (a line starting with it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows, inside = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            inside = True
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif inside:
            break
    return rows[1:]   # without the header row


def _first_cell_names(rows: list[list[str]]) -> set[str]:
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row[0])}


def test_no_text_narrates_how_the_project_was_made():
    found = []
    for path in _texts():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(pattern.search(line) for pattern in NARRATION):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not found, "work periods or issue numbers in the text:\n" + "\n".join(found)


def test_the_narration_patterns_catch_what_they_are_for():
    caught = ["in the thirteenth " + "session", "measured this " + "session", "as issue " + "16 asked",
              "see issues " + "15"]
    passed = ["the profiler's first session done", "its own session and process group", "start_new_session=True"]
    assert all(any(p.search(text) for p in NARRATION) for text in caught)
    assert not any(p.search(text) for p in NARRATION for text in passed)


def test_every_config_key_is_in_the_reference_with_its_default():
    rows = _table_rows((DOCS / "configuration.md").read_text(), "# Configuration reference")
    rows += _table_rows((DOCS / "configuration.md").read_text(), "## How a batch runs")
    documented = {row[0].strip("`"): row[1] for row in rows}
    fields = dataclasses.fields(Config)
    missing = [f.name for f in fields if f.name not in documented]
    assert not missing, f"config keys missing from docs/configuration.md: {missing}"
    unknown = sorted(set(documented) - {f.name for f in fields})
    assert not unknown, f"docs/configuration.md documents keys Config does not have: {unknown}"
    wrong = []
    for field in fields:
        default = field.default
        if isinstance(default, (bool, int, float, str)) or default is None:
            cell = documented[field.name]
            written = yaml.safe_load(cell.strip("`")) if cell.startswith("`") else cell
            if written != default or type(written) is bool is not type(default) is bool:
                wrong.append(f"{field.name}: docs say {cell}, Config has {default!r}")
    assert not wrong, "defaults in docs/configuration.md differ from Config:\n" + "\n".join(wrong)


def test_every_status_is_in_the_readme_status_table():
    names = _first_cell_names(_table_rows(README.read_text(), "## Statuses"))
    assert names == {status.value for status in Status}


def test_the_readme_status_table_is_in_pipeline_order():
    names = [re.findall(r"`([^`]+)`", row[0])[0] for row in _table_rows(README.read_text(), "## Statuses")]
    assert names == [status.value for status in Status]


def test_every_finding_is_in_the_judging_doc():
    names = _first_cell_names(_table_rows((DOCS / "judging.md").read_text(), "## Findings"))
    catalogued = {kind.name for kind in findings.CATALOGUE}
    assert catalogued - names == set(), f"findings missing from docs/judging.md: {sorted(catalogued - names)}"
    assert names - catalogued == set(), f"docs/judging.md lists findings not catalogued: {sorted(names - catalogued)}"


def test_every_command_is_in_the_readme_commands_table():
    help_text = subprocess.run([sys.executable, str(REPO / "run_eval.py"), "--help"], capture_output=True,
                               text=True, check=True, cwd=REPO).stdout
    commands = set(re.search(r"\{([a-z,]+)\}", help_text).group(1).split(","))
    rows = _table_rows(README.read_text(), "## Commands")
    documented = {re.findall(r"`([a-z]+)", row[0])[0] for row in rows}
    assert documented == commands


def test_the_readme_names_every_backend_the_cli_accepts():
    from harness.shared.config import BACKENDS

    assert "--backend " + "|".join(BACKENDS) in README.read_text()


def test_the_architecture_doc_lists_every_module():
    text = (DOCS / "architecture.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_/]+\.py)` \|", text, re.MULTILINE))
    harness = REPO / "harness"
    modules = {str(path.relative_to(harness)) for path in harness.rglob("*.py") if path.name != "__init__.py"}
    assert modules - listed == set(), f"modules missing from docs/architecture.md: {sorted(modules - listed)}"
    assert listed - modules == set(), f"docs/architecture.md lists missing modules: {sorted(listed - modules)}"


@pytest.mark.parametrize("path", [README, REPO / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_docs_named_in_the_text_exist(path):
    named = set(re.findall(r"\bdocs/[\w.-]+\.md\b", path.read_text()))
    missing = sorted(name for name in named if not (REPO / name).is_file())
    assert not missing, f"{path.name} names docs that do not exist: {missing}"
