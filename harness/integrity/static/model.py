"""Checks on ModelNew against the reference Model: exception fallbacks, the reference Model used, subclassed or
copied, and a constructor that takes other parameters.
"""
from __future__ import annotations

import ast
from typing import Callable, Optional

from harness.integrity.static.source import (
    _chain,
    _Hit,
    _literal_str,
    _matches,
    _Module,
)
from harness.shared.findings import EXCEPTION_FALLBACK, INIT_SIGNATURE_MISMATCH, USES_REFERENCE_MODEL

_NN_MODULE = {"torch.nn.Module", "torch.nn.modules.module.Module", "torch.nn.modules.Module"}
_NN_MODULE_AS_WRITTEN = {"nn.Module", "torch.nn.Module", "Module"}  # when the import is not resolvable
_TRY_NODES = (ast.Try, ast.TryStar)


def _check_exception_fallback(module: _Module) -> list[_Hit]:
    hits = []
    for node in module.nodes:
        if not isinstance(node, _TRY_NODES):
            continue
        keyword = "except*" if isinstance(node, ast.TryStar) else "except"
        for handler in node.handlers:
            if len(handler.body) == 1 and isinstance(handler.body[0], ast.Raise):
                continue  # re-raises, or raises a new exception: no fallback
            caught = f" {ast.unparse(handler.type)}" if handler.type is not None else ""
            hits.append(_Hit(handler.lineno, f"{keyword}{caught}:"))
    hits += [_Hit(ref.line, ref.name) for ref in module.refs if _matches(ref.name, ("contextlib.suppress",))]
    return hits


def _classes(tree: ast.Module, name: str) -> list[ast.ClassDef]:
    found = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name]
    return sorted(found, key=lambda node: node.lineno)


def _body_key(cls: ast.ClassDef) -> str:
    """The class body without line numbers or docstring, for comparing two classes."""
    body = cls.body
    if body and isinstance(body[0], ast.Expr) and _literal_str(body[0].value) is not None:
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


def _reference_copies(module: _Module) -> dict[str, int]:
    """Classes of the submission whose body is the reference Model's: name -> line."""
    references = _classes(module.reference, "Model") if module.reference is not None else []
    if not references:
        return {}
    key = _body_key(references[-1])
    if not key:
        return {}
    return {node.name: node.lineno for node in module.nodes
            if isinstance(node, ast.ClassDef) and _body_key(node) == key}


def _is_nn_module(module: _Module, base: ast.expr) -> bool:
    parts = _chain(base)
    return module.resolve(base) in _NN_MODULE or (parts is not None and ".".join(parts) in _NN_MODULE_AS_WRITTEN)


def _check_reference_model(module: _Module) -> list[_Hit]:
    hits = []
    for node in module.nodes:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            hits.append(_Hit(node.lineno, "class Model defined"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any("Model" in (alias.name.split(".")[-1], alias.asname) for alias in node.names):
                hits.append(_Hit(node.lineno, "Model imported"))
        elif isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            hits.append(_Hit(node.lineno, "Model referenced"))
        elif isinstance(node, ast.Attribute) and node.attr == "Model" and isinstance(node.ctx, ast.Load):
            hits.append(_Hit(node.lineno, f"{'.'.join(_chain(node) or ['', 'Model'])} referenced"))
    copies = _reference_copies(module)
    hits += [_Hit(line, f"copies the reference Model as {name}") for name, line in copies.items()]
    for cls in _classes(module.tree, "ModelNew"):
        for base in cls.bases:
            if _is_nn_module(module, base):
                continue
            written = ast.unparse(base)
            copy = ", a copy of the reference Model" if written in copies else ""
            hits.append(_Hit(cls.lineno, f"ModelNew subclasses {written}{copy}"))
    return hits


_Params = list[tuple[str, str]]  # (name, kind) after self


def _params(function: ast.FunctionDef) -> _Params:
    args = function.args
    positional = [(a.arg, "positional-only") for a in args.posonlyargs] + [(a.arg, "positional") for a in args.args]
    params = positional[1:]  # self
    if args.vararg is not None:
        params.append((args.vararg.arg, "var-positional"))
    params += [(a.arg, "keyword-only") for a in args.kwonlyargs]
    if args.kwarg is not None:
        params.append((args.kwarg.arg, "var-keyword"))
    return params


def _init_params(module: _Module, cls: ast.ClassDef, tree: ast.Module, depth: int = 0) -> Optional[_Params]:
    """The parameters cls(...) takes; None when they come from a class this file does not define."""
    inits = [s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "__init__"]
    if inits:
        return _params(inits[-1])
    for base in cls.bases:
        if _is_nn_module(module, base):
            continue
        parents = _classes(tree, base.id) if isinstance(base, ast.Name) else []
        if not parents or depth > 10:
            return None
        return _init_params(module, parents[-1], tree, depth + 1)
    return []


def _signature(params: _Params) -> str:
    shown = []
    for i, (name, kind) in enumerate(params):
        before = params[i - 1][1] if i else None
        if kind == "keyword-only" and before not in ("keyword-only", "var-positional"):
            shown.append("*")
        shown.append({"var-positional": "*", "var-keyword": "**"}.get(kind, "") + name)
        after = params[i + 1][1] if i + 1 < len(params) else None
        if kind == "positional-only" and after != "positional-only":
            shown.append("/")
    return ", ".join(shown)


def _check_init_signature(module: _Module) -> list[_Hit]:
    if module.reference is None:
        return []
    references, candidates = _classes(module.reference, "Model"), _classes(module.tree, "ModelNew")
    if not references or not candidates:
        return []
    inits = [s for s in references[-1].body if isinstance(s, ast.FunctionDef) and s.name == "__init__"]
    expected = _params(inits[-1]) if inits else []
    actual = _init_params(module, candidates[-1], module.tree)
    if actual is None or actual == expected:
        return []
    return [_Hit(None, f"ModelNew({_signature(actual)}) vs Model({_signature(expected)})")]


CHECKS: dict[str, Callable[[_Module], list[_Hit]]] = {
    EXCEPTION_FALLBACK: _check_exception_fallback,
    USES_REFERENCE_MODEL: _check_reference_model,
    INIT_SIGNATURE_MISMATCH: _check_init_signature,
}
