"""The TileLang backend (tilelang 0.1.15, `import tilelang`, `import tilelang.language as T`): kernels are
`@T.prim_func` functions, compiled by `tilelang.compile` / `@tilelang.jit` (TVM lowering, then nvcc started from
tilelang's own code) on first use inside the sandboxed evaluation, with the cache in TILELANG_CACHE_DIR inside the
child's workdir. In a profiler trace a prim_func `f`'s kernel is `f_kernel` (as of tilelang 0.1.15).
"""
from __future__ import annotations

import ast
from typing import Optional

from harness.shared.backends.common import decorated, imports_package, parse

PACKAGE = "tilelang"
KERNEL = ("tilelang.language.prim_func", "tvm.script.tir.prim_func", "tilelang.prim_func")


def detect(tree: Optional[ast.Module], source: str) -> bool:
    return PACKAGE in source and imports_package(tree, source, PACKAGE)


def kernel_names(source: str) -> set[str]:
    """@T.prim_func names and `<name>_kernel`, the name TileLang's CUDA code generator gives a prim_func's kernel."""
    if PACKAGE not in source:
        return set()
    names = set(decorated(parse(source), KERNEL))
    return names | {f"{name}_kernel" for name in names}
