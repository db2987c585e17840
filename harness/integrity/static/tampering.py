"""Checks on reaching into the interpreter or the judge: introspection, the import machinery and builtins,
monkeypatching, code or names built at run time, and state keyed by object identity (a result cache).
"""
from __future__ import annotations

import ast
import re
from typing import Callable, Iterator, Optional

from harness.integrity.static.source import (
    _assignment_targets,
    _attr_calls,
    _chain,
    _Hit,
    _matches,
    _Module,
    _named,
)
from harness.shared.findings import IDENTITY_KEYED_STATE, INTROSPECTION, MONKEYPATCH, OBFUSCATION, SYS_MODULES


def _check_introspection(module: _Module) -> list[_Hit]:
    frame_attrs = {"f_back", "f_locals", "f_globals", "f_code", "gi_frame", "tb_frame", "tb_next",
                   "__subclasses__", "__globals__", "__closure__", "__code__"}
    hits = _named(module, ("gc", "inspect", "sys._getframe", "sys._current_frames", "sys.settrace",
                           "sys.setprofile", "threading.settrace", "threading.setprofile", "builtins.globals"))
    hits += [_Hit(node.lineno, f".{node.attr}") for node in module.nodes
             if isinstance(node, ast.Attribute) and node.attr in frame_attrs]
    hits += [_Hit(call.lineno, f"{which}(..., {attr!r})") for call, which, attr in _attr_calls(module)
             if attr in frame_attrs]
    # vars() with no argument is locals(), which is harmless; vars(obj) exposes another namespace.
    hits += [_Hit(call.lineno, "vars(...)") for call, name in module.calls()
             if name == "builtins.vars" and (call.args or call.keywords)]
    return hits


def _check_sys_modules(module: _Module) -> list[_Hit]:
    hits = _named(module, ("sys.modules", "importlib.reload"), import_patterns=("builtins", "__builtin__"))
    for node in module.nodes:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name == "__builtins__":
            hits.append(_Hit(node.lineno, "__builtins__"))
        elif name == "__import__" and isinstance(node.ctx, ast.Store):
            hits.append(_Hit(node.lineno, "__import__ assigned"))
    return hits


_DECODING_MODULES = ("base64", "binascii", "codecs", "marshal", "pickle", "zlib", "lzma", "bz2", "gzip")
_DECODING_NAME = re.compile(r"decode|decompress|unhexlify|a2b_|Unpickler|^loads?$")


def _check_obfuscation(module: _Module) -> list[_Hit]:
    hits = _named(module, ("builtins.eval", "builtins.exec", "builtins.compile", "builtins.__import__",
                           "importlib.import_module", "importlib.__import__", "types.CodeType",
                           "types.FunctionType", "types.LambdaType"))
    hits += [_Hit(call.lineno, f"{which} with a computed name") for call, which, attr in _attr_calls(module)
             if attr is None]
    hits += [_Hit(ref.line, ref.name) for ref in module.refs
             if _matches(ref.name, _DECODING_MODULES) and _DECODING_NAME.search(ref.name.rsplit(".", 1)[-1])]
    return hits


# --------------------------------------------------------------------------- monkeypatching


def _patched_name(module: _Module, target: ast.expr) -> Optional[str]:
    """The dotted name an assignment target patches, if it is rooted at an imported name."""
    subscripted = False
    while isinstance(target, ast.Subscript):  # torch.nn.functional.__dict__["relu"] = f
        target, subscripted = target.value, True
    if not (isinstance(target, ast.Attribute) or subscripted) or not module.is_imported_root(target):
        return None
    return module.resolve(target)


def _is_exempt_patch(name: str) -> bool:
    # torch.backends switches belong to precision_downgrade, os.environ writes to env_access
    return _matches(name, ("torch.backends", "os.environ"))


def _check_monkeypatch(module: _Module) -> list[_Hit]:
    hits = []
    for node in module.nodes:
        for target in _assignment_targets(node):
            name = _patched_name(module, target)
            if name is not None and not _is_exempt_patch(name):
                verb = "deleted" if isinstance(node, ast.Delete) else "assigned"
                hits.append(_Hit(target.lineno, f"{name} {verb}"))
    for call, which, attr in _attr_calls(module):
        if which in ("setattr", "delattr") and call.args and module.is_imported_root(call.args[0]):
            name = f"{module.resolve(call.args[0])}.{attr or '<computed>'}"
            if not _is_exempt_patch(name):
                hits.append(_Hit(call.lineno, f"{which}({module.resolve(call.args[0])}, {attr!r})"))
    return hits


# --------------------------------------------------------------------------- identity-keyed state

_IDENTITY_METHODS = {"data_ptr", "untyped_storage", "storage"}
_KEY_WRAPPERS = {"str", "hash", "tuple", "repr", "int", "frozenset"}
_EQUALITY_OPS = (ast.In, ast.NotIn, ast.Eq, ast.NotEq, ast.Is, ast.IsNot)


def _identity_values(module: _Module) -> Iterator[tuple[ast.expr, str]]:
    for node in module.nodes:
        if isinstance(node, ast.Call) and module.resolve(node.func) == "builtins.id":
            yield node, "id(...)"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in _IDENTITY_METHODS):
            yield node, f".{node.func.attr}()"
        elif isinstance(node, ast.Attribute) and node.attr == "_cdata":
            yield node, "._cdata"


def _enclosing_key(module: _Module, node: ast.expr) -> ast.expr:
    """The largest expression node is part of as a key: (id(x), n), f"{id(x)}", str(id(x)), a + (id(x),)."""
    while True:
        parent = module.parents.get(node)
        if isinstance(parent, (ast.Tuple, ast.List, ast.Set, ast.Starred, ast.FormattedValue, ast.JoinedStr)):
            node = parent
        elif isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add):
            node = parent
        elif isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and (
                parent.func.id in _KEY_WRAPPERS and any(arg is node for arg in parent.args)):
            node = parent
        else:
            return node


def _key_use(module: _Module, node: ast.expr) -> Optional[str]:
    """How node is used as a key, if it is."""
    parent = module.parents.get(node)
    if isinstance(parent, ast.Dict) and any(key is node for key in parent.keys) or (
            isinstance(parent, ast.DictComp) and parent.key is node):
        return "as a dict key"
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return "as a subscript index"
    if isinstance(parent, ast.Compare) and any(isinstance(op, _EQUALITY_OPS) for op in parent.ops):
        return "in a comparison"
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and (
            parent.func.attr in ("get", "setdefault") and any(arg is node for arg in parent.args)):
        return f"as a .{parent.func.attr}() argument"
    return None


def _check_identity_keys(module: _Module) -> list[_Hit]:
    hits, holders = [], {}
    for node, label in _identity_values(module):
        key = _enclosing_key(module, node)
        use = _key_use(module, key)
        if use is not None:
            hits.append(_Hit(node.lineno, f"{label} {use}"))
        parent = module.parents.get(key)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is key:  # key = (x.data_ptr(), n)
            for target in _assignment_targets(parent):
                parts = _chain(target)
                if parts is not None:
                    holders[".".join(parts)] = label
    for ref in module.refs:
        if ref.raw in holders and isinstance(ref.node.ctx, ast.Load):
            use = _key_use(module, _enclosing_key(module, ref.node))
            if use is not None:
                hits.append(_Hit(ref.line, f"{ref.raw} (holds {holders[ref.raw]}) {use}"))
    return hits


CHECKS: dict[str, Callable[[_Module], list[_Hit]]] = {
    INTROSPECTION: _check_introspection,
    SYS_MODULES: _check_sys_modules,
    MONKEYPATCH: _check_monkeypatch,
    IDENTITY_KEYED_STATE: _check_identity_keys,
    OBFUSCATION: _check_obfuscation,
}
