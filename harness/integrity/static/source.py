"""The indexed source the static checks read: names resolved through imports and aliases, string constants with C
comments removed, and the helpers that match them (see this package's docstring for the method and its limits).
"""
from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

from harness.shared import backends

MAX_SHOWN = 3  # occurrences quoted in a finding's evidence

_BUILTIN_NAMES = frozenset(dir(builtins)) | {"exit", "quit"}
_DYNAMIC_IMPORTS = {"builtins.__import__", "importlib.import_module", "importlib.__import__"}
_ATTR_BUILTINS = {"builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr"}


@dataclass(frozen=True)
class _Hit:
    line: Optional[int]  # None: the finding is about the file as a whole
    what: str


@dataclass(frozen=True)
class _Ref:
    """A maximal chain of names and attributes in the code, e.g. `torch.cuda.Stream` in `torch.cuda.Stream()`."""

    line: int
    name: Optional[str]  # dotted name with its root resolved; None when the root is a local value or unknown
    raw: str             # the chain as written
    node: ast.expr


@dataclass(frozen=True)
class _String:
    line: int
    end_line: int
    text: str
    code: str  # text with C comments blanked out (newlines kept, so line numbers still hold)

    def line_of(self, offset: int) -> int:
        return min(self.line + self.text.count("\n", 0, offset), self.end_line)


def _evidence(hits: list[_Hit]) -> str:
    unique = sorted(dict.fromkeys(hits), key=lambda hit: -1 if hit.line is None else hit.line)
    shown = "; ".join(hit.what if hit.line is None else f"line {hit.line}: {hit.what}" for hit in unique[:MAX_SHOWN])
    more = len(unique) - MAX_SHOWN
    return f"{shown} (+{more} more)" if more > 0 else shown


# --------------------------------------------------------------------------- the indexed source


class _Module:
    """What the checks need from one parsed source, computed once."""

    def __init__(self, tree: ast.Module, reference: Optional[ast.Module],
                 backend: backends.Backend = backends.CUDA):
        self.tree = tree
        self.reference = reference
        self.backend = backend   # the kernel language the submission is judged as (harness/shared/backends)
        self.nodes = list(ast.walk(tree))
        self.parents = {child: node for node in self.nodes for child in ast.iter_child_nodes(node)}
        self.bindings = _import_bindings(self.nodes)
        _add_assigned_aliases(self.nodes, self.bindings)
        self.rebound = _module_level_names(tree) - set(self.bindings)  # top-level names that hide builtins
        self.refs = list(self._maximal_chains())
        self.imports = _static_imports(self.nodes) + list(self._literal_dynamic_imports())
        self.strings = [_string(node) for node in self.nodes
                        if isinstance(node, ast.Constant) and isinstance(node.value, str)]

    def resolve(self, node: ast.AST) -> Optional[str]:
        """`t.cuda.Stream` -> "torch.cuda.Stream" after `import torch as t`; None for local values."""
        parts = _chain(node)
        if parts is None:
            return None
        root = parts[0]
        if root in self.bindings:
            base = self.bindings[root]
        elif root in _BUILTIN_NAMES and root not in self.rebound:
            base = f"builtins.{root}"
        else:
            return None
        return ".".join([base, *parts[1:]])

    def is_imported_root(self, node: ast.AST) -> bool:
        parts = _chain(node)
        return parts is not None and parts[0] in self.bindings

    def calls(self) -> Iterator[tuple[ast.Call, Optional[str]]]:
        for node in self.nodes:
            if isinstance(node, ast.Call):
                yield node, self.resolve(node.func)

    def _maximal_chains(self) -> Iterator[_Ref]:
        for node in self.nodes:
            if not isinstance(node, (ast.Name, ast.Attribute)):
                continue
            parent = self.parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue  # part of a longer chain
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                continue  # binding a bare name is not a use of what it was bound to
            parts = _chain(node)
            if parts is not None:
                yield _Ref(node.lineno, self.resolve(node), ".".join(parts), node)

    def _literal_dynamic_imports(self) -> Iterator[tuple[int, str]]:
        for call, name in self.calls():
            if name in _DYNAMIC_IMPORTS and call.args and _literal_str(call.args[0]) is not None:
                yield call.lineno, call.args[0].value


def _chain(node: ast.AST) -> Optional[list[str]]:
    """["torch", "cuda", "Stream"] for `torch.cuda.Stream`; None when the chain starts at anything but a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _from_name(node: ast.ImportFrom, name: str) -> str:
    base = "." * node.level + (node.module or "")
    return f"{base}.{name}" if node.module else base + name


def _import_bindings(nodes: list[ast.AST]) -> dict[str, str]:
    bindings = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bindings[alias.asname] = alias.name
                else:  # `import torch.nn.functional` binds only `torch`
                    root = alias.name.split(".")[0]
                    bindings[root] = root
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    bindings[alias.asname or alias.name] = _from_name(node, alias.name)
    return bindings


def _add_assigned_aliases(nodes: list[ast.AST], bindings: dict[str, str]) -> None:
    """`cuda = torch.cuda` makes `cuda` an alias of torch.cuda (repeated, so aliases of aliases resolve too)."""
    candidates = [(node.targets[0].id, _chain(node.value)) for node in nodes
                  if isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name) and isinstance(node.value, (ast.Name, ast.Attribute))]
    changed = True
    while changed:
        changed = False
        for name, parts in candidates:
            if name not in bindings and parts and parts[0] in bindings:
                bindings[name] = ".".join([bindings[parts[0]], *parts[1:]])
                changed = True


def _module_level_names(tree: ast.Module) -> set[str]:
    """Names the module binds outside functions, classes and comprehensions (those shadow builtins)."""
    names: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return names


def _static_imports(nodes: list[ast.AST]) -> list[tuple[int, str]]:
    """(line, dotted name) of everything an import statement names: "os.environ" for `from os import environ`."""
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, _from_name(node, alias.name)) for alias in node.names]
    return found


_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def _string(node: ast.Constant) -> _String:
    line = getattr(node, "lineno", 1)
    end_line = getattr(node, "end_lineno", None) or line
    code = _C_COMMENT.sub(lambda match: "\n" * match.group(0).count("\n"), node.value)
    return _String(line, end_line, node.value, code)


def _literal_str(node: Optional[ast.AST]) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


# --------------------------------------------------------------------------- matching helpers


def _matches(name: Optional[str], patterns: Iterable[str]) -> bool:
    """Pattern `a.b` matches the names a.b and a.b.c; a pattern ending in `*` is a plain prefix (`os.exec*`)."""
    if name is None:
        return False
    for pattern in patterns:
        if pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern or name.startswith(pattern + "."):
            return True
    return False


def _shown(name: str) -> str:
    return name.removeprefix("builtins.")


def _named(module: _Module, patterns: Iterable[str], import_patterns: Iterable[str] = ()) -> list[_Hit]:
    """Imports and uses of the given dotted names; import_patterns apply to import statements only."""
    patterns, import_patterns = tuple(patterns), tuple(import_patterns)
    hits = [_Hit(line, f"import {name}") for line, name in module.imports
            if _matches(name, patterns) or _matches(name, import_patterns)]
    hits += [_Hit(ref.line, _shown(ref.name)) for ref in module.refs if _matches(ref.name, patterns)]
    return hits


def _in_strings(module: _Module, pattern: re.Pattern, keep: Callable[[re.Match], bool] = lambda m: True,
                raw: bool = False) -> list[_Hit]:
    """Matches of pattern in the string constants (C comments removed unless raw)."""
    hits = []
    for string in module.strings:
        for match in pattern.finditer(string.text if raw else string.code):
            if keep(match):
                found = match.group(0).rstrip("(").strip()  # "at::matmul (" -> "at::matmul"
                hits.append(_Hit(string.line_of(match.start()), f"{found} in a source string"))
    return hits


def _words(*alternatives: str) -> re.Pattern:
    return re.compile("|".join(alternatives))


def _attr_calls(module: _Module) -> Iterator[tuple[ast.Call, str, Optional[str]]]:
    """getattr/setattr/delattr/hasattr calls: (call, which builtin, literal attribute name or None)."""
    for call, name in module.calls():
        if name in _ATTR_BUILTINS:
            attr = _literal_str(call.args[1]) if len(call.args) >= 2 else None
            yield call, _shown(name), attr


def _assignment_targets(node: ast.AST) -> list[ast.expr]:
    """Targets an assignment or `del` writes, with tuple unpacking flattened."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    else:
        return []
    flat = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        else:
            flat.append(target)
    return flat
