"""The layout's rules, read from the harness's own source (AST only, nothing is imported):

- each subpackage imports only the packages its docstring's "May import:" line names (so the docstrings stay true);
- no import cycle between modules, counting imports inside functions;
- nothing outside harness/candidate/ imports it (the untrusted process's code is never loaded by the parent);
- the modules that run as child processes never import, even indirectly, the parent's machinery.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from conftest import REPO

HARNESS = REPO / "harness"
PACKAGES = sorted(p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file())
# Modules started as `python -m <module>` by the parent: their whole import closure runs in the child.
CHILD_ENTRIES = ("harness.candidate.child", "harness.oracle.child", "harness.oracle.baseline_child",
                 "harness.oracle.problem_check_child")
# What only the parent may run: starting and confining children, judging, batches, reports, builds.
PARENT_ONLY = ("harness.isolation.spawn", "harness.isolation.sandbox", "harness.isolation.policy", "harness.judge",
               "harness.pipeline", "harness.report", "harness.build", "harness.cli", "harness.api", "harness.serve",
               "harness.oracle.reference", "harness.oracle.baselines", "harness.oracle.problem_check",
               "harness.oracle.ahead", "harness.isolation.started_ahead",
               "harness.submission")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in HARNESS.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Harness modules `path` imports anywhere (top level or inside functions), resolved to modules in `known`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("harness"):
                found.add(name)
    return found


@functools.lru_cache(maxsize=None)
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, known) - {name, "harness"} for name, path in modules.items()}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _allowed(package: str) -> set[str]:
    doc = ast.get_docstring(ast.parse((HARNESS / package / "__init__.py").read_text())) or ""
    match = re.search(r"^May import: (.+)$", doc, re.MULTILINE)
    assert match, f"harness/{package}/__init__.py must say what it may import ('May import: ...')"
    listed = match.group(1).strip().rstrip(".")
    return set() if listed.startswith("nothing") else {name.strip() for name in listed.split(",")}


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_what_its_docstring_allows(package):
    allowed = _allowed(package) | {package}
    assert allowed - {package} <= set(PACKAGES), f"{package} names an unknown package"
    wrong = sorted(f"{module} -> {target}" for module, targets in _graph().items() if _package(module) == package
                   for target in targets if _package(target) not in allowed)
    assert not wrong, f"harness/{package} imports beyond its docstring's 'May import:' line: {wrong}"


def test_package_imports_form_no_cycle():
    order, state = [], {}

    def visit(package: str, path: list[str]) -> None:
        if state.get(package) == "done":
            return
        assert state.get(package) != "open", f"package import cycle: {' -> '.join(path + [package])}"
        state[package] = "open"
        for target in sorted(_allowed(package)):
            visit(target, path + [package])
        state[package] = "done"
        order.append(package)

    for package in PACKAGES:
        visit(package, [])
    assert set(order) == set(PACKAGES)


def test_modules_form_no_import_cycle():
    graph = _graph()
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", f"import cycle: {' -> '.join(path + [module])}"
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_nothing_trusted_imports_the_candidate_package():
    offenders = sorted(f"{module} -> {target}" for module, targets in _graph().items()
                       if _package(module) != "candidate" for target in targets if _package(target) == "candidate")
    assert not offenders, f"code outside harness/candidate imports it: {offenders}"


@pytest.mark.parametrize("entry", CHILD_ENTRIES)
def test_child_processes_never_load_the_parents_machinery(entry):
    graph = _graph()
    seen, stack = set(), [entry]
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph.get(module, ()))
    loaded = sorted(m for m in seen if any(m == p or m.startswith(p + ".") for p in PARENT_ONLY))
    assert not loaded, f"{entry} loads parent-only modules: {loaded}"


def test_the_child_entry_points_are_the_modules_the_parent_starts():
    from harness.isolation import specs

    started = {specs.CANDIDATE_MODULE, specs.ORACLE_MODULE, specs.BASELINE_MODULE, specs.PROBLEM_CHECK_MODULE}
    assert started == set(CHILD_ENTRIES) and started <= set(_modules())
