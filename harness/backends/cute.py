"""The CuTe DSL backend (nvidia-cutlass-dsl, `import cutlass.cute as cute`): declared, not yet judged on a GPU
(docs/backends.md says why). Kernels are `@cute.kernel` functions launched from a `@cute.jit` host function; the
DSL JIT-compiles on the first call, with its cache in CUTE_DSL_CACHE_DIR inside the child's workdir.
"""
from __future__ import annotations

import ast
from typing import Optional

from harness.backends.common import decorated, imports_package, parse

PACKAGE = "cutlass"
KERNEL = ("cutlass.cute.kernel",)


def detect(tree: Optional[ast.Module], source: str) -> bool:
    return PACKAGE in source and imports_package(tree, source, PACKAGE)


def kernel_names(source: str) -> set[str]:
    """@cute.kernel functions (untested: how the DSL names them in a profiler trace is not verified)."""
    if PACKAGE not in source:
        return set()
    return set(decorated(parse(source), KERNEL))
