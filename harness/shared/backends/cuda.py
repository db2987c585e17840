"""The C++/CUDA backend: torch.utils.cpp_extension.load_inline / load, the judge's original path.

Built ahead by the build stage (harness/build/builder.py) on CPU cores; its cache is TORCH_EXTENSIONS_DIR inside
the child's workdir; the extension builder's compilers may run while a build is under way
(harness/children/candidate/extensions.py wraps load_inline / load); its own kernels are the `__global__` functions
of the sources it built. Everything that is not another backend's is this one's (a pure-torch ModelNew included).
"""
from __future__ import annotations

import ast
import re
from typing import Optional

_GLOBAL = re.compile(r"__global__")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^<>]*>)?\s*$")
_EXTENSION_BUILD = re.compile(r"\bload_inline\b|\bcpp_extension\b")


def builds_extension(source: str) -> bool:
    """The source names torch's extension builder (a hint for the build stage: the build child decides)."""
    return _EXTENSION_BUILD.search(source) is not None


def detect(tree: Optional[ast.Module], source: str) -> bool:
    return builds_extension(source)


def kernel_names(source: str) -> set[str]:
    """Names of `__global__` functions in a C++/CUDA source."""
    names = set()
    for match in _GLOBAL.finditer(source):
        head = _LAUNCH_BOUNDS.sub(" ", source[match.end():match.end() + 600]).split("(", 1)[0]
        found = _IDENTIFIER.search(head)
        if found:
            names.add(found.group(1))
    return names
