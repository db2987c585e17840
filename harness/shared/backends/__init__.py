"""Kernel languages: what differs per backend, in one module each (cuda.py: C++/CUDA through load_inline / load;
triton.py: @triton.jit kernels; cute.py: the CuTe DSL's @cute.kernel; tilelang.py: TileLang's @T.prim_func). A
backend says how it is recognised in a source, whether its kernels need CUDA, whether the build stage compiles them
ahead, where its JIT caches live inside the sandbox, which packages it imports and whose code may start its
compilers in the candidate's process, which static checks apply only to it, and how its own kernels are named in a
profiler trace. docs/backends.md describes the seam.

A submission's backend is the config's `backend` (`--backend`), or with `auto` (the default) the one its source
imports (`detect`): triton, cutlass (CuTe DSL) or tilelang; anything else, load_inline / load or plain torch, is
cuda, the judge's original path.

Runs in: every process (the parent's static checks, builds and sandbox policy; the candidate's process for its
audit hook and its kernel names). Plain data and functions over source text: nothing here imports torch, a kernel
language or candidate code.
May import: harness/shared/ (config, parsing).
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from harness.shared import config
from harness.shared.backends import cuda, cute, tilelang, triton
from harness.shared.backends.common import parse


@dataclass(frozen=True)
class Backend:
    name: str
    needs_cuda: bool                    # its kernels run only on CUDA: a CPU evaluation is needs_cuda
    builds_ahead: bool                  # the build stage compiles its kernels (load_inline / load) before the GPU;
                                        # False: the first call JIT-compiles inside the sandboxed evaluation
    imports: frozenset[str]             # top-level packages it imports beyond torch and the standard library
                                        # (not imports_beyond_torch under this backend)
    toolchains: tuple[str, ...]         # packages whose own code may start processes (its compilers) in the
                                        # candidate's process (harness/children/candidate/guard.py)
    caches: tuple[tuple[str, str], ...]  # (environment variable, folder inside the child's workdir): JIT caches
    env_names: frozenset[str]           # variables of the parent's environment its children also get
    source_checks: tuple[str, ...]      # static findings (harness/integrity/static/) that apply only to it
    kernel_names: Callable[[str], set[str]]   # its own kernels' names in one source, as the profiler shows them
    detect: Callable[[Optional[ast.Module], str], bool]   # the source uses it (tree None: it does not parse)
    python_kernels: bool                # kernels are functions of the submission's module (named in its source)


CUDA = Backend("cuda", needs_cuda=False, builds_ahead=True, imports=frozenset(), toolchains=(),
               caches=(("TORCH_EXTENSIONS_DIR", "torch_extensions"),), env_names=frozenset(), source_checks=(),
               kernel_names=cuda.kernel_names, detect=cuda.detect, python_kernels=False)
TRITON = Backend("triton", needs_cuda=True, builds_ahead=False, imports=frozenset({"triton"}),
                 toolchains=("triton",), caches=(("TRITON_CACHE_DIR", "triton_cache"),),
                 env_names=triton.ENV_NAMES, source_checks=triton.SOURCE_CHECKS, kernel_names=triton.kernel_names,
                 detect=triton.detect, python_kernels=True)
CUTE = Backend("cute", needs_cuda=True, builds_ahead=False, imports=frozenset({"cutlass", "cuda"}),
               toolchains=("cutlass", "cuda"), caches=(("CUTE_DSL_CACHE_DIR", "cute_dsl_cache"),
                                                         ("CUTE_EXPERIMENTAL_DSL_CACHE_DIR", "cute_dsl_cache")),
               env_names=frozenset(), source_checks=(), kernel_names=cute.kernel_names, detect=cute.detect,
               python_kernels=True)
TILELANG = Backend("tilelang", needs_cuda=True, builds_ahead=False,
                   imports=frozenset({"tilelang", "tvm", "tvm_ffi"}), toolchains=("tilelang", "tvm", "tvm_ffi", "cuda"),
                   caches=(("TILELANG_CACHE_DIR", "tilelang_cache"),), env_names=frozenset(), source_checks=(),
                   kernel_names=tilelang.kernel_names, detect=tilelang.detect, python_kernels=True)

# Detection order: the first whose package the source imports; cuda (the default) last, as the fallback.
BACKENDS: dict[str, Backend] = {b.name: b for b in (TRITON, CUTE, TILELANG, CUDA)}
NAMES = config.BACKENDS   # the config's choices: auto and every backend's name
# Static findings that apply only under the backend that lists them.
BACKEND_CHECKS = frozenset(flag for b in BACKENDS.values() for flag in b.source_checks)


def detect(source: str) -> Backend:
    """The backend a source uses: the first (triton, cute, tilelang) whose package it imports, else cuda."""
    tree = parse(source)
    for backend in BACKENDS.values():
        if backend is not CUDA and backend.detect(tree, source):
            return backend
    return CUDA


def select(name: str, source: str) -> Backend:
    """The config's `backend` for this source: `auto` detects it; a name forces it. An unknown name is a
    ValueError (the config refuses it before any work)."""
    if name == "auto":
        return detect(source)
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(NAMES)})")
    return BACKENDS[name]


def needs_build(backend: Backend, source: str) -> bool:
    """Whether the build stage has anything to do: always for a backend that builds ahead; for the others only when
    the source also builds an extension (load_inline / load), which the build pool then compiles as usual."""
    return backend.builds_ahead or cuda.builds_extension(source)


def cache_environment(workdir: Path) -> dict[str, str]:
    """Every backend's JIT cache folders inside a child's workdir (set for every child: a cache folder that is
    never used costs nothing, and the parent need not know the backend before the child starts)."""
    return {variable: str(workdir / folder) for b in BACKENDS.values() for variable, folder in b.caches}


def passed_environment() -> frozenset[str]:
    """Variables of the parent's environment that children get for the backends' toolchains."""
    return frozenset(name for b in BACKENDS.values() for name in b.env_names)


def own_kernel_names(sources: list[str]) -> set[str]:
    """The submission's own kernels as a profiler names them, from its sources: `__global__` functions in the
    C++/CUDA sources it built, and the kernels a Python backend defines (@triton.jit functions, ...) in its
    module's source, which the candidate's process adds to them for such a backend (`python_kernels`)."""
    names: set[str] = set()
    for text in sources:
        names |= cuda.kernel_names(text)
        for backend in BACKENDS.values():
            if backend.python_kernels:
                names |= backend.kernel_names(text)
    return names


def toolchain_dirs(backend: Backend) -> tuple[str, ...]:
    """The folders of the backend's toolchain packages as installed here, found without importing them."""
    folders = []
    for package in backend.toolchains:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            folders += [str(folder), str(Path(folder).resolve())]   # as code objects spell it, and resolved
    return tuple(dict.fromkeys(folders))
