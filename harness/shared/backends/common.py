"""What the backends read from a source: the packages it imports and the functions a decorator marks as kernels,
names resolved through imports (`import triton as tr` makes `@tr.jit` triton.jit). Parsed with `ast`, never run.
"""
from __future__ import annotations

import ast
import re
import warnings
from typing import Iterable, Optional

from harness.shared import parsing


def parse(source: str) -> Optional[ast.Module]:
    try:
        with warnings.catch_warnings():   # the candidate's invalid escape sequences are not our warnings
            warnings.simplefilter("ignore")
            return parsing.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def imports_package(tree: Optional[ast.Module], source: str, package: str) -> bool:
    """An import statement names `package` or a module of it (a source that does not parse: a line that does)."""
    if tree is None:
        return re.search(rf"^\s*(?:import|from)\s+{re.escape(package)}\b", source, re.MULTILINE) is not None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == package for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == package:
            return True
    return False


def bindings(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted name, for every import (`import triton.language as tl`: tl -> triton.language)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if alias.name != "*":
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def dotted(node: ast.AST, bound: dict[str, str]) -> Optional[str]:
    """`tr.jit` -> "triton.jit" after `import triton as tr`; a call's callee for `@tr.jit(...)`; None otherwise."""
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return None
    return ".".join([bound[node.id], *reversed(parts)])


def decorated(tree: Optional[ast.Module], decorators: Iterable[str]) -> dict[str, ast.FunctionDef]:
    """Functions (at any depth) with a decorator that resolves to one of `decorators`: name -> definition."""
    if tree is None:
        return {}
    wanted, bound = set(decorators), bindings(tree)
    return {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(dotted(d, bound) in wanted for d in node.decorator_list)}
