"""The extension builders as the candidate's process sees them (runs next to untrusted code).

`ExtensionWatch` wraps torch.utils.cpp_extension.load_inline / load before the submission executes: it counts the
builds, notices failures (even ones the submission swallows), refuses CUDA sources on a CPU evaluation, imports a
library the build pool already built for the same call (`call_key`) instead of compiling again, and wraps every
function of a built extension so that calls are counted and, while profiling, bracketed by `ext::` ranges
(harness/children/attribution.py tells the submission's kernels from library ones by them).

With `light` (the config's `light_cuda_headers`), a build with CUDA sources is first compiled with LIGHT_INCLUDE
ahead on nvcc's include path, where torch/extension.h is torch/types.h alone (no C++ frontend, no Python bindings:
about half of compiling a typical .cu, a third of the whole build's compiler time). With `pch_root` (the config's
`precompiled_headers`), the C++ compiler's include path (main.cpp of a CUDA build, every file of a C++ build) first
holds the folder of the judge's precompiled torch/extension.h for the build's -O level. If that first build fails in
any way, the call is built again exactly as written and only that build counts. What the light build can change: nothing
that compiles under both, except a name whose overloads or specializations torch/all.h or torch/python.h would
extend (docs/performance.md).
"""
from __future__ import annotations

import hashlib
import inspect
import sys
import types
from pathlib import Path
from typing import Any, Callable, Optional

import torch.utils.cpp_extension as cpp_extension
from torch.profiler import record_function

from harness.children.attribution import EXT_PREFIX
from harness.children.runtime import short_error
from harness.shared import pch

CUDA_SUFFIXES = (".cu", ".cuh")
BUILDER_FILE = cpp_extension.__file__
LIGHT_INCLUDE = Path(__file__).resolve().parent / "light_include"   # holds the light torch/extension.h
HEADERS = {"light": "light torch/extension.h", "pch": "precompiled torch/extension.h"}   # for the build log


class NeedsCuda(RuntimeError):
    """Raised instead of building CUDA sources when the evaluation device is not CUDA."""


def _tally() -> tuple[Callable[[], None], Callable[[], int]]:
    """A count and its reader, sharing a closure cell that no attribute path leads to."""
    count = [0]

    def add() -> None:
        count[0] += 1

    def read() -> int:
        return count[0]
    return add, read


class ExtensionWatch:
    """Wraps cpp_extension.load_inline / load to count builds and notice failures, even swallowed ones."""

    def __init__(self, device: str, prebuilt: Optional[dict] = None, light: bool = False,
                 pch_root: Optional[str] = None):
        self.device = device
        self.light = light and device == "cuda"   # try CUDA builds with the light torch/extension.h first
        self.pch_root = Path(pch_root) if pch_root else None   # the judge's precompiled headers (build/pch.py)
        self.pch_built = 0         # builds with a precompiled torch/extension.h's folder on the C++ include path
        self.pch_failed = 0        # ... that failed, then built as written
        self.prebuilt = prebuilt or {}     # call key -> {"module": name, "dir": folder holding <name>.so}
        self.products: dict[str, dict] = {}   # call key -> {"module", "file"} of each library built here
        self.reused = 0            # calls served from `prebuilt`
        self.built = 0
        self.failure: Optional[str] = None
        self.needs_cuda = False
        self.building = False      # the audit hook lets the builder start compilers while this is set
        self.sources: list[str] = []
        self.light_built = 0       # CUDA builds that compiled with the light torch/extension.h
        self.light_failed = 0      # ... that did not, and were built again as written
        # successful calls into built extensions (`calls`): counted in a closure that only the counting wrappers made
        # by `install` and the reader `own_calls` share, not in an attribute of this object, which the submission can
        # reach (the candidate's main program holds it in __main__.CONTEXT)
        self.own_calls: Callable[[], int] = lambda: 0
        self.profiling = False     # wrap those calls in ext:: profiler ranges

    @property
    def calls(self) -> int:
        return self.own_calls()

    def install(self) -> None:
        add_call, self.own_calls = _tally()
        cpp_extension.load_inline = self._wrap(cpp_extension.load_inline, _inline_cuda_sources, add_call)
        cpp_extension.load = self._wrap(cpp_extension.load, _load_cuda_sources, add_call)

    def _wrap(self, original, cuda_sources, add_call: Callable[[], None]):
        def wants_cuda(*args: Any, **kwargs: Any) -> bool:
            return cuda_sources(*args, **kwargs) or bool(kwargs.get("with_cuda"))

        def watched(*args: Any, **kwargs: Any):
            if wants_cuda(*args, **kwargs) and self.device != "cuda":
                self.needs_cuda = True
                raise NeedsCuda("the submission builds CUDA sources; the evaluation device is not CUDA")
            self.sources.extend(_source_texts(args, kwargs))
            key = call_key(original.__name__, args, kwargs)
            ready = self.prebuilt.get(key)
            self.building = True
            try:
                if ready is not None:   # the same call was built by the build pool: import its library
                    module = cpp_extension._import_module_from_library(ready["module"], ready["dir"], True)
                    self.reused += 1
                else:
                    module = self._light_first(original, cuda_sources(*args, **kwargs), args, kwargs)
            except BaseException as exc:
                self.failure = self.failure or _build_error_line(exc)
                raise
            finally:
                self.building = False
            self.built += 1
            if isinstance(module, types.ModuleType):
                if ready is None and getattr(module, "__file__", None):
                    self.products[key] = {"module": module.__name__, "file": module.__file__}
                self._count_calls(module, add_call)
            return module

        watched.__wrapped__ = original
        watched.__name__ = original.__name__
        return watched

    def _light_first(self, original, compiles_cuda: bool, args: tuple, kwargs: dict):
        """The build with the judge's lighter headers first where they apply (`_first_try`); any failure of it: the
        build as written (its outcome, failure or not, is the call's)."""
        first, kinds = self._first_try(original, compiles_cuda, args, kwargs)
        if first is None:
            return original(*args, **kwargs)
        try:
            module = original(*first.args, **first.kwargs)
        except Exception as exc:
            for kind in kinds:
                setattr(self, f"{kind}_failed", getattr(self, f"{kind}_failed") + 1)
            # the type alone: the log's first compiler diagnostic, which a record shows, is the as-written build's
            print(f"{' and '.join(HEADERS[kind] for kind in kinds)}: the build failed ({type(exc).__name__}); "
                  "building as written", file=sys.stderr, flush=True)
            return original(*args, **kwargs)
        for kind in kinds:
            setattr(self, f"{kind}_built", getattr(self, f"{kind}_built") + 1)
        return module

    def _first_try(self, original, compiles_cuda: bool, args: tuple,
                   kwargs: dict) -> tuple[Optional[inspect.BoundArguments], list[str]]:
        """The call's arguments for the first try and the headers it uses: LIGHT_INCLUDE first on nvcc's include
        path (CUDA sources to compile, `light` on), and the folder of the judge's precompiled torch/extension.h for
        its extra_cflags first on the C++ compiler's (harness/shared/pch.py; main.cpp of a CUDA build as much as a
        C++ build: nvcc does not get extra_cflags). (None, []) where neither applies or the call does not bind."""
        light = compiles_cuda and self.light
        if not light and self.pch_root is None:
            return None, []
        bound = _bound(original, args, kwargs)
        if bound is None:
            return None, []
        kinds = []
        folder = self._pch_folder(bound.arguments.get("extra_cflags"))
        if light and _add_include(bound, "extra_cuda_cflags", LIGHT_INCLUDE):
            kinds.append("light")
        if folder is not None and _add_include(bound, "extra_cflags", folder):
            kinds.append("pch")
        return (bound if kinds else None), kinds

    def _pch_folder(self, extra_cflags) -> Optional[Path]:
        """The folder of the precompiled header these extra_cflags fit; None where there is none (no folder of the
        judge's, other flags, not made yet)."""
        name = None if self.pch_root is None else pch.variant(extra_cflags)
        if name is None or not pch.header(self.pch_root, name).is_file():
            return None
        return self.pch_root / name

    def _count_calls(self, module: types.ModuleType, add_call: Callable[[], None]) -> None:
        """Replace the module's functions by counting wrappers (ext:: profiler ranges while profiling)."""
        for name in dir(module):
            function = getattr(module, name)
            if not name.startswith("_") and callable(function) and not isinstance(function, type):
                setattr(module, name, self._counted(name, function, add_call))

    def _counted(self, name: str, function, add_call: Callable[[], None]):
        watch = self

        def call(*args: Any, **kwargs: Any):
            if watch.profiling:
                with record_function(EXT_PREFIX + name):
                    result = function(*args, **kwargs)
            else:
                result = function(*args, **kwargs)
            add_call()
            return result

        call.__name__ = name
        call.__doc__ = getattr(function, "__doc__", None)
        return call


def _bound(original, args: tuple, kwargs: dict) -> Optional[inspect.BoundArguments]:
    """The call's arguments bound to torch's builder; None where they do not bind (torch raises its own error for
    the call: the build as written does so)."""
    try:
        return inspect.signature(original).bind(*args, **kwargs)
    except TypeError:
        return None


def _add_include(bound: inspect.BoundArguments, parameter: str, folder: Path) -> bool:
    """Add -I `folder` to the flags `parameter` of a bound call, keeping the caller's; False where the builder takes
    no such flags (not torch's builder as we know it)."""
    if parameter not in bound.signature.parameters:
        return False
    bound.arguments[parameter] = _listed(bound.arguments.get(parameter)) + [f"-I{folder}"]
    return True


def _listed(flags) -> list:
    """A builder's flags argument as a list (torch takes a string, a list or nothing)."""
    return [flags] if isinstance(flags, str) else list(flags or [])


def _inline_cuda_sources(*args: Any, **kwargs: Any) -> bool:
    """load_inline is given CUDA sources."""
    return bool(kwargs.get("cuda_sources", args[2] if len(args) > 2 else None))


def _load_cuda_sources(*args: Any, **kwargs: Any) -> bool:
    """load is given CUDA source files."""
    sources = kwargs.get("sources", args[1] if len(args) > 1 else [])
    sources = [sources] if isinstance(sources, str) else list(sources or [])
    return any(str(s).endswith(CUDA_SUFFIXES) for s in sources)


def call_key(function: str, args: tuple, kwargs: dict) -> str:
    """Names one extension build by everything it was given (verbosity aside). Arguments whose repr is not stable
    (objects) give a key that never matches again, so that call is simply built where it runs."""
    described = repr((function, args, sorted((k, v) for k, v in kwargs.items() if k != "verbose")))
    return hashlib.sha256(described.encode()).hexdigest()[:32]


def _source_texts(args: tuple, kwargs: dict) -> list[str]:
    """C++/CUDA source text handed to load_inline (strings) or load (file paths), for the kernel names."""
    texts: list[str] = []
    for value in list(args[1:3]) + [kwargs.get(k) for k in ("cpp_sources", "cuda_sources", "sources")]:
        for item in [value] if isinstance(value, str) else list(value or []):
            if not isinstance(item, str):
                continue
            path = Path(item)
            try:
                texts.append(path.read_text() if "\n" not in item and path.suffix and path.is_file() else item)
            except OSError:
                texts.append(item)
    return texts


def _build_error_line(exc: BaseException) -> str:
    """The first compiler 'error' line of a build failure, for display; the full output is in the log."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines[1:]:
        if "error" in line.lower():
            return f"{type(exc).__name__}: {line[:280]}"
    return short_error(exc)
