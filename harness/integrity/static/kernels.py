"""Checks on the submission's own kernels, for the backends whose kernels are functions of the module (Triton):
none defined (`no_triton_kernel`), or none launched from ModelNew.forward (`forward_without_kernel`: torch ops do
the work, the static twin of the profiler's no_custom_kernel). They apply only under the backend that lists them
(harness/shared/backends `source_checks`).

Reach. From ModelNew.forward the check follows what the code names: module functions (called, or passed on as
values), methods called on `self` (any class's method of that name), `X.apply` of an autograd Function to its
forward, `self.<submodule>(...)` to every module class's forward, and `torch.ops.<namespace>.<name>` to the module
function of that name (a custom op it registered). A launch is `kernel[grid](...)` or
`kernel.run(...)` of a @triton.jit function, by its name or as an attribute (`self.kernel[grid](...)`). A launch
through a value the check cannot follow (a kernel kept in a dict) reads as none: the profiler's attribution is the
verdict, this is evidence.
"""
from __future__ import annotations

import ast
from typing import Callable, Iterator, Optional

from harness.integrity.static.source import _Hit, _Module
from harness.shared.backends.triton import jit_functions
from harness.shared.findings import FORWARD_WITHOUT_KERNEL, NO_TRITON_KERNEL

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _check_kernel_defined(module: _Module) -> list[_Hit]:
    if jit_functions(module.tree):
        return []
    return [_Hit(None, "no @triton.jit function in the module")]


def _check_forward_launches(module: _Module) -> list[_Hit]:
    kernels = jit_functions(module.tree)
    forward = _model_forward(module.tree)
    if not kernels or forward is None:
        return []   # no kernel at all is no_triton_kernel; no ModelNew.forward is a load_error at run time
    for function in _reached(module.tree, forward, set(kernels)):
        if any(_launches(node, set(kernels)) for node in ast.walk(function)):
            return []
    shown = ", ".join(sorted(kernels)[:4])
    return [_Hit(forward.lineno, f"ModelNew.forward reaches no launch of its kernels ({shown})")]


def _model_forward(tree: ast.Module) -> Optional[ast.FunctionDef]:
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ModelNew"]
    if not classes:
        return None
    methods = [node for node in classes[-1].body if isinstance(node, _FUNCTIONS) and node.name == "forward"]
    return methods[-1] if methods else None


def _launches(node: ast.AST, kernels: set[str]) -> bool:
    """`kernel[grid](...)`, `self.kernel[grid](...)` or `kernel.run(...)` of a @triton.jit function."""
    if not isinstance(node, ast.Call):
        return False
    callee = node.func
    if isinstance(callee, ast.Subscript):
        return _names_kernel(callee.value, kernels)
    return isinstance(callee, ast.Attribute) and callee.attr == "run" and _names_kernel(callee.value, kernels)


def _names_kernel(node: ast.AST, kernels: set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in kernels) or (isinstance(node, ast.Attribute)
                                                                     and node.attr in kernels)


def _reached(tree: ast.Module, forward: ast.FunctionDef, kernels: set[str]) -> Iterator[ast.AST]:
    """forward and every function of the module it reaches (the jit kernels themselves excluded)."""
    functions = {node.name: node for node in tree.body if isinstance(node, _FUNCTIONS) and node.name not in kernels}
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    methods: dict[str, list[ast.AST]] = {}
    for cls in classes.values():
        for node in cls.body:
            if isinstance(node, _FUNCTIONS):
                methods.setdefault(node.name, []).append(node)
    callables = [m for cls in classes.values() for m in cls.body
                 if isinstance(m, _FUNCTIONS) and m.name in ("forward", "__call__")]
    seen: set[int] = set()
    stack: list[ast.AST] = [forward]
    while stack:
        function = stack.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        yield function
        for node in ast.walk(function):
            stack.extend(_targets(node, functions, classes, methods, callables))


def _targets(node: ast.AST, functions: dict, classes: dict, methods: dict, callables: list) -> list[ast.AST]:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in functions:
        return [functions[node.id]]   # called, or handed on as a value (a callback, a custom op)
    if not isinstance(node, ast.Attribute):
        return []
    if node.attr == "apply" and isinstance(node.value, ast.Name) and node.value.id in classes:
        return [m for m in classes[node.value.id].body if isinstance(m, _FUNCTIONS) and m.name == "forward"]
    if node.attr in functions and _is_op(node.value):   # torch.ops.<ns>.<name> of a function it registered
        return [functions[node.attr]]
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        return methods.get(node.attr) or callables   # a method, else a submodule called through self
    return []


def _is_op(node: ast.AST) -> bool:
    """`torch.ops.<namespace>`: where a custom op the module registered is called."""
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "ops")


CHECKS: dict[str, Callable[[_Module], list[_Hit]]] = {
    NO_TRITON_KERNEL: _check_kernel_defined,
    FORWARD_WITHOUT_KERNEL: _check_forward_launches,
}
