"""Checks on how the forward computes: reduced precision, work off the current stream, vendor libraries and ATen
operators, in the Python code and in the C++/CUDA source strings.
"""
from __future__ import annotations

import ast
import re
from typing import Callable, Optional

from harness.integrity.static.source import (
    _assignment_targets,
    _attr_calls,
    _Hit,
    _in_strings,
    _literal_str,
    _Module,
    _named,
    _words,
)
from harness.shared.findings import LIBRARY_CALLS, PRECISION_DOWNGRADE, SIDE_STREAM

_REDUCED_PRECISION_SWITCHES = {"allow_tf32", "allow_fp16_reduced_precision_reduction",
                               "allow_bf16_reduced_precision_reduction"}
_LOW_PRECISION_NAMES = ("torch.float16", "torch.half", "torch.bfloat16", "torch.autocast", "torch.amp",
                        "torch.cuda.amp", "torch.cpu.amp", "torch.set_autocast*", "torch.HalfTensor",
                        "torch.BFloat16Tensor", "torch.cuda.HalfTensor", "torch.cuda.BFloat16Tensor")
_LOW_PRECISION_SOURCE = _words(
    r"\b__half\w*", r"\bhalf2\b", r"\b__nv_bfloat16\w*", r"\bnv_bfloat16\w*", r"\b__float2half\w*",
    r"\b__float2bfloat16\w*", r"\b__bfloat162float\b", r"\bwmma::", r"\bmma\.sync", r"\bwgmma\b", r"\btf32\b",
    r"\b(?:at|c10)::(?:Half|BFloat16)\b", r"\bat::k(?:Half|BFloat16)\b", r"\btorch::k(?:Float16|Half|BFloat16)\b",
    r"\bCUBLAS_TF32\w*", r"\bCUBLAS_TENSOR_OP_MATH\b", r"\bCUBLAS_COMPUTE_(?:16F|32F_FAST_\w+)",
    r"\bCUDA_R_16BF?\b", r"\bcublasSetMathMode\b", r"\ballow_tf32\b", r"\bsetAllowTF32\w*")


def _keeps_full_precision(value: Optional[ast.expr]) -> bool:
    return isinstance(value, ast.Constant) and value.value is False


def _check_precision(module: _Module) -> list[_Hit]:
    hits = _named(module, _LOW_PRECISION_NAMES)
    for node in module.nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and not _keeps_full_precision(node.value):
            hits += [_Hit(t.lineno, f"{t.attr} = ...") for t in _assignment_targets(node)
                     if isinstance(t, ast.Attribute) and t.attr in _REDUCED_PRECISION_SWITCHES]
    for call, which, attr in _attr_calls(module):
        value = call.args[2] if len(call.args) >= 3 else None
        if which == "setattr" and attr in _REDUCED_PRECISION_SWITCHES and not _keeps_full_precision(value):
            hits.append(_Hit(call.lineno, f"setattr(..., {attr!r})"))
    for call, _ in module.calls():
        method = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)
        if isinstance(call.func, ast.Attribute) and method in ("half", "bfloat16"):
            hits.append(_Hit(call.lineno, f".{method}()"))
        elif method == "set_float32_matmul_precision":
            keywords = [k.value for k in call.keywords if k.arg == "precision"]
            value = call.args[0] if call.args else keywords[0] if keywords else None
            if _literal_str(value) != "highest":
                hits.append(_Hit(call.lineno, "set_float32_matmul_precision(...) below 'highest'"))
    hits += _in_strings(module, _LOW_PRECISION_SOURCE)
    return hits


_STREAM_NAMES = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.ExternalStream", "torch.cuda.set_stream",
                 "torch.cuda.StreamContext", "torch.cuda.streams.Stream", "torch.cuda.streams.ExternalStream",
                 "torch.Stream")
_STREAM_SOURCE = _words(
    r"\bcudaStreamCreate\w*", r"\bcudaStreamNonBlocking\b", r"\bgetStreamFromPool\b", r"\bcudaLaunchHostFunc\b",
    r"\bcudaStreamAddCallback\b", r"\bcudaStreamPerThread\b", r"default-stream[= ]per-thread",
    r"\bstd::thread\b(?!::)", r"\bstd::async\b", r"\bpthread_create\b")


def _check_side_stream(module: _Module) -> list[_Hit]:
    return _named(module, _STREAM_NAMES) + _in_strings(module, _STREAM_SOURCE)


_LIBRARY_SOURCE = _words(r"\bcublas\w*", r"\bcudnn\w*", r"\bcusparse\w*", r"\bcufft\w*", r"\bcurand\w*",
                         r"\bcutlass::", r"\bcute::", r"\bthrust::", r"\bcub::", r"\bat::native::\w+")
_ATEN_CALL = re.compile(r"\b(?:at|torch)::((?:\w+::)*)(\w+)\s*\(")
# at::/torch:: calls that allocate or describe tensors rather than compute with them.
_ATEN_HELPERS = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
                 "full_like", "from_blob", "Tensor", "IntArrayRef", "ArrayRef", "DimVector", "SmallVector",
                 "irange", "ScalarType", "Device", "DeviceGuard", "OptionalDeviceGuard", "TensorOptions",
                 "Scalar", "MemoryFormat", "make_tuple", "optional", "nullopt", "dtype", "device", "layout",
                 "requires_grad", "elementSize", "toString", "globalContext"}
_ATEN_HELPER_NAMESPACES = {"cuda", "indexing", "detail"}


def _is_aten_op(match: re.Match) -> bool:
    namespaces = match.group(1).split("::")[:-1]
    op = match.group(2)
    if namespaces[:1] == ["native"]:
        return False  # reported by the at::native:: pattern already
    if namespaces[:2] == ["cuda", "blas"]:
        return True
    if namespaces[:1] and namespaces[0] in _ATEN_HELPER_NAMESPACES:
        return False
    return op not in _ATEN_HELPERS and not re.fullmatch(r"k[A-Z]\w*", op)


def _check_library_calls(module: _Module) -> list[_Hit]:
    return _in_strings(module, _LIBRARY_SOURCE) + _in_strings(module, _ATEN_CALL, keep=_is_aten_op)


CHECKS: dict[str, Callable[[_Module], list[_Hit]]] = {
    PRECISION_DOWNGRADE: _check_precision,
    SIDE_STREAM: _check_side_stream,
    LIBRARY_CALLS: _check_library_calls,
}
