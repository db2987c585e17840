"""The CuTe DSL backend (nvidia-cutlass-dsl 4.8, `import cutlass.cute as cute`): kernels are `@cute.kernel`
functions launched from a `@cute.jit` host function, compiled by `cute.compile` (or the host function's first call)
inside the sandboxed evaluation, with its cache in CUTE_DSL_CACHE_DIR inside the child's workdir. The DSL needs
NVIDIA's `cuda` bindings (cuda-bindings, cuda-pathfinder: a CUstream for the launch); both packages may start the
library lookups of ctypes (ldconfig, the C compiler's linker trace). In a profiler trace a kernel of function `f`
is `kernel_cutlass_f_<its arguments>_<n>` (TRACE_PREFIX; as of nvidia-cutlass-dsl 4.8).
"""
from __future__ import annotations

import ast
from typing import Optional

from harness.shared.backends.common import decorated, imports_package, parse

PACKAGE = "cutlass"
KERNEL = ("cutlass.cute.kernel",)
TRACE_PREFIX = "kernel_cutlass_"


def detect(tree: Optional[ast.Module], source: str) -> bool:
    return PACKAGE in source and imports_package(tree, source, PACKAGE)


def kernel_names(source: str) -> set[str]:
    """@cute.kernel functions (their trace names: TRACE_PREFIX + name + "_...", harness/children/attribution.py)."""
    if PACKAGE not in source:
        return set()
    return set(decorated(parse(source), KERNEL))
