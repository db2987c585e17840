"""The Triton backend: `@triton.jit` kernels launched from ModelNew.forward (`kernel[grid](...)`).

Nothing to build ahead: a kernel's signature is known only at its first call, which JIT-compiles it inside the
sandboxed evaluation (the correctness trials run first, so compilation and autotuning never fall in a timed
block). Its cache is TRITON_CACHE_DIR inside the child's workdir; triton's own code may start its compilers
(ptxas, the C compiler of its launcher, ldconfig) in the candidate's process; the submission's own kernels are its
@triton.jit functions, whose names are the kernel names in the profiler trace. Static checks only for it: a module
without a @triton.jit kernel (`no_triton_kernel`) and a forward that launches none (`forward_without_kernel`,
harness/integrity/static/kernels.py).
"""
from __future__ import annotations

import ast
from typing import Optional

from harness.shared.backends.common import decorated, imports_package, parse
from harness.shared.findings import FORWARD_WITHOUT_KERNEL, NO_TRITON_KERNEL

PACKAGE = "triton"
JIT = ("triton.jit", "triton.runtime.jit.jit", "triton.runtime.jit")
SOURCE_CHECKS = (NO_TRITON_KERNEL, FORWARD_WITHOUT_KERNEL)
# Where the operator's machine keeps Triton's tools (the child's environment is an allowlist).
ENV_NAMES = frozenset({"TRITON_PTXAS_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH"})


def detect(tree: Optional[ast.Module], source: str) -> bool:
    return PACKAGE in source and imports_package(tree, source, PACKAGE)


def jit_functions(tree: Optional[ast.Module]) -> dict[str, ast.FunctionDef]:
    """The module's @triton.jit functions (with or without arguments, under @triton.autotune and the like)."""
    return decorated(tree, JIT)


def kernel_names(source: str) -> set[str]:
    if PACKAGE not in source:
        return set()
    return set(jit_functions(parse(source)))
