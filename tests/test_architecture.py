"""The layout's rules, read from the harness's own source (AST only, nothing is imported). Where code runs is the
folder it is in, not a list kept here:

- harness/children/ runs only in child processes: the modules the parent starts as `python -m` are there, each
  child imports only harness/shared/ and its own side (the candidate's process never loads the oracle's code, nor
  the other way round), and the parent never imports anything under children/;
- harness/shared/ is what both sides load: it imports nothing outside itself, and every module in it is loaded by a
  child process and by the parent;
- each top-level package imports only the packages its docstring's "May import:" line names (so the docstrings
  stay true);
- no import cycle between modules, counting imports inside functions;
- the timing, integrity, isolation and pipeline parts take their narrow settings (harness/shared/settings.py), never
  the whole `Config`: no module under them imports harness/shared/config.py;
- the pipeline hands the `Config` its settings carry (`PipelineSettings.judge_config`) to the judging layer as it is:
  it is only ever an argument of a call to a function imported from outside harness/pipeline.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Optional

import pytest
from conftest import REPO

HARNESS = REPO / "harness"
PACKAGES = sorted(p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file())
SHARED, CHILDREN = "harness.shared", "harness.children"
CHILD_SIDES = ("harness.children.candidate", "harness.children.oracle")
CONFIG = "harness.shared.config"
PIPELINE = "harness.pipeline"
NARROWED = ("harness.timing", "harness.integrity", "harness.isolation", PIPELINE)   # take settings, not the Config
HANDED_ON = "judge_config"   # the PipelineSettings field that carries the whole Config for the judging layer


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


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _side(module: str) -> str:
    return SHARED if _under(module, SHARED) else CHILDREN if _under(module, CHILDREN) else "parent"


def _closure(roots) -> set[str]:
    """What importing `roots` loads: their imports, transitively, and the packages that hold each (Python runs a
    package's __init__ before any module in it)."""
    graph, seen, stack = _graph(), set(), list(roots)
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph.get(module, ()))
            stack.extend(module.rsplit(".", depth)[0] for depth in range(1, module.count(".")))
    return seen


def _child_entries() -> set[str]:
    from harness.shared import specs

    return {specs.CANDIDATE_MODULE, specs.ORACLE_MODULE, specs.BASELINE_MODULE, specs.PROBLEM_CHECK_MODULE}


def test_the_modules_started_as_children_live_under_children():
    entries = _child_entries()
    assert entries <= set(_modules()), f"a child entry point names no module: {sorted(entries - set(_modules()))}"
    assert all(_side(entry) == CHILDREN for entry in entries), sorted(entries)


def test_the_parent_never_imports_the_childrens_code():
    offenders = sorted(f"{module} -> {target}" for module, targets in _graph().items() if _side(module) == "parent"
                       for target in targets if _side(target) == CHILDREN)
    assert not offenders, f"the parent imports code that runs only in children: {offenders}"


def test_shared_code_imports_nothing_outside_shared():
    offenders = sorted(f"{module} -> {target}" for module, targets in _graph().items() if _side(module) == SHARED
                       for target in targets if _side(target) != SHARED)
    assert not offenders, f"harness/shared imports beyond itself: {offenders}"


def test_a_child_imports_only_shared_code_and_its_own_side():
    offenders = []
    for module, targets in _graph().items():
        if _side(module) != CHILDREN:
            continue
        mine = next((side for side in CHILD_SIDES if _under(module, side)), None)
        for target in targets:
            other = next((side for side in CHILD_SIDES if _under(target, side) and side != mine), None)
            if _side(target) == "parent" or other:
                offenders.append(f"{module} -> {target}")
    assert not offenders, f"child code imports beyond harness/shared and its own side: {sorted(offenders)}"


@pytest.mark.parametrize("entry", sorted(_child_entries()))
def test_a_child_process_loads_only_children_and_shared_code(entry):
    loaded = sorted(m for m in _closure([entry]) if _side(m) == "parent")
    assert not loaded, f"{entry} loads the parent's modules: {loaded}"


def test_every_child_module_runs_in_a_child_and_every_shared_one_on_both_sides():
    in_children = _closure(_child_entries())
    in_parent = _closure(m for m in _modules() if _side(m) == "parent" and m != "harness")
    modules = set(_modules())
    dead = sorted(m for m in modules if _side(m) == CHILDREN and m not in in_children)
    one_sided = sorted(m for m in modules if _side(m) == SHARED and not (m in in_children and m in in_parent))
    assert not dead, f"modules under harness/children that no child process loads: {dead}"
    assert not one_sided, f"modules under harness/shared that only one side loads (move them): {one_sided}"


def test_the_timing_integrity_isolation_and_pipeline_parts_never_take_the_whole_config():
    narrowed = sorted(m for m in _modules() if any(_under(m, package) for package in NARROWED))
    assert {"harness.timing.interleave", "harness.isolation.policy", "harness.pipeline.driver"} <= set(narrowed)
    offenders = sorted(module for module in narrowed if CONFIG in _graph()[module])
    assert not offenders, f"these take the Config; give them settings from harness/shared/settings.py: {offenders}"


def _bound(tree: ast.AST) -> dict[str, str]:
    """Each name an import binds (anywhere in the module) -> what it names: a module, or a module's attribute."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.partition(".")[0]] = \
                    alias.name if alias.asname else alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _root(node: ast.AST) -> Optional[str]:
    """The name an attribute chain (a.b.c) starts from; None where it starts from anything else (a call, self ...)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def config_uses(source: str) -> list[str]:
    """Where `source` does anything with the Config that PipelineSettings carries other than hand it on as it is:
    reading it (`settings.judge_config.device`), keeping it under a name, handing it to a function of its own
    package (which could read it), or naming the field in a string (getattr). Handing it on is passing
    `<x>.judge_config` itself as an argument of a call to a function imported from outside harness/pipeline."""
    tree = ast.parse(source)
    bound = _bound(tree)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == HANDED_ON:
            found.append(f"line {node.lineno}: {HANDED_ON!r} named in a string")
        if not (isinstance(node, ast.Attribute) and node.attr == HANDED_ON):
            continue
        holder = parents.get(node)
        if isinstance(holder, ast.keyword):
            holder = parents.get(holder)
        handed = isinstance(holder, ast.Call) and holder.func is not node and (
            node in holder.args or any(keyword.value is node for keyword in holder.keywords))
        callee = bound.get(_root(holder.func) or "") if handed else None
        if callee is None or _under(callee, PIPELINE):
            found.append(f"line {node.lineno}: {ast.unparse(holder if handed else parents.get(node, node))}")
    return found


def test_the_pipeline_hands_the_config_on_without_reading_it():
    """The pipeline reads its own settings (PipelineSettings' other fields); the whole Config goes unread to the
    evaluation, the oracle, the builder and the warm pools, which derive their settings from it. Together with the
    pipeline importing no Config (above), its code cannot name one to read it."""
    sources = {m: path.read_text() for m, path in _modules().items() if _under(m, PIPELINE)}
    assert f".{HANDED_ON}" in sources["harness.pipeline.driver"]   # the check below has something to look at
    offenders = {m: uses for m, source in sources.items() if (uses := config_uses(source))}
    assert not offenders, f"pipeline code reads the Config it should only hand on: {offenders}"


@pytest.mark.parametrize("source", [
    "settings.judge_config.device",                                                    # read
    "config = settings.judge_config",                                                  # kept under a name
    "def helper(c):\n    return c.gpus\nhelper(settings.judge_config)",                # handed to its own code
    "from harness.pipeline.engines import visible_gpus\nvisible_gpus(settings.judge_config)",
    "self.engine.build(settings.judge_config)",                                        # not an imported function
    "getattr(settings, 'judge_config')",
    "from harness.judge import warm\nwarm.pool_for(*settings.judge_config)",
])
def test_the_check_finds_the_config_read_or_kept(source):
    assert config_uses(source), source


def test_the_check_lets_the_config_be_handed_to_the_judging_layer():
    source = ("from harness.judge import evaluate as evaluation\nfrom harness.oracle.reference import run_oracle\n"
              "def task(settings, reference):\n"
              "    evaluation.time_clean(reference, settings.judge_config)\n"
              "    return run_oracle(reference.problem, config=settings.judge_config, device=settings.device)\n")
    assert config_uses(source) == []
