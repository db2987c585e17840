"""The extension builders as the candidate's process sees them: keyed calls, CUDA refused on the CPU, counted calls.

The wrappers are installed on a stand-in for torch.utils.cpp_extension, never on torch's own module."""
import types

import pytest

from harness.children.candidate import extensions
from harness.children.candidate.extensions import (
    LIGHT_INCLUDE,
    ExtensionWatch,
    NeedsCuda,
    _source_texts,
    call_key,
)
from harness.judge.evaluate import _COMPILER_ERROR
from harness.shared import pch

LIGHT_FLAG = f"-I{LIGHT_INCLUDE}"


def test_call_key_is_stable_ignores_verbosity_and_follows_the_sources():
    key = call_key("load_inline", ("ext", "int f();"), {"functions": ["f"], "verbose": True})
    assert key == call_key("load_inline", ("ext", "int f();"), {"verbose": False, "functions": ["f"]})
    assert key != call_key("load_inline", ("ext", "int g();"), {"functions": ["f"]})
    assert key != call_key("load", ("ext", "int f();"), {"functions": ["f"]})
    assert len(key) == 32 and int(key, 16) >= 0


def test_source_texts_take_strings_as_they_are_and_read_files(tmp_path):
    kernel = tmp_path / "kernel.cu"
    kernel.write_text("__global__ void k() {}")
    assert _source_texts(("ext", "int f();", ["__global__ void g() {}"]), {}) == [
        "int f();", "__global__ void g() {}"]
    assert _source_texts(("ext",), {"sources": [str(kernel), str(tmp_path / "gone.cpp"), 3]}) == [
        "__global__ void k() {}", str(tmp_path / "gone.cpp")]


class StandIn:
    """torch.utils.cpp_extension as far as ExtensionWatch uses it; records what it was asked to build."""

    def __init__(self, fail: str = "", fail_light: bool = False, fail_pch: bool = False):
        self.compiled: list[tuple] = []
        self.imported: list[tuple] = []
        self.cuda_flags: list[list] = []   # each load_inline call's extra_cuda_cflags
        self.cflags: list[list] = []       # ... and extra_cflags

        def load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                        extra_cuda_cflags=None, **options):
            self.compiled.append((name, cpp_sources, cuda_sources))
            self.cuda_flags.append(extra_cuda_cflags)
            self.cflags.append(extra_cflags)
            if fail_pch and any(str(flag).startswith("-I") for flag in extra_cflags or []):
                raise RuntimeError("main.cpp:1:10: fatal error: extension.h.gch: bad file")
            if fail or (fail_light and LIGHT_FLAG in (extra_cuda_cflags or [])):
                raise RuntimeError(fail or "cuda.cu(3): error: namespace \"py\" has no member \"module\"")
            return _module(name)

        def load(name, sources, **options):
            self.compiled.append((name, sources))
            return _module(name)

        self.load_inline, self.load = load_inline, load

    def _import_module_from_library(self, module, path, is_python_module):
        self.imported.append((module, path, is_python_module))
        return _module(module)


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"/build/{name}/{name}.so"
    module.add = lambda a, b: a + b
    return module


@pytest.fixture
def stand_in(monkeypatch):
    def installed(device: str, fail: str = "", prebuilt=None, light: bool = False,
                  fail_light: bool = False, pch_root=None, fail_pch: bool = False) -> tuple[StandIn, ExtensionWatch]:
        builder = StandIn(fail, fail_light, fail_pch)
        monkeypatch.setattr(extensions, "cpp_extension", builder)
        watch = ExtensionWatch(device, prebuilt, light, pch_root)
        watch.install()
        return builder, watch
    return installed


def test_cuda_sources_on_the_cpu_device_are_refused_before_any_compile(stand_in):
    builder, watch = stand_in("cpu")
    with pytest.raises(NeedsCuda):
        builder.load_inline("ext", "int f();", cuda_sources="__global__ void k() {}", functions=["f"])
    with pytest.raises(NeedsCuda):
        builder.load("ext", ["kernel.cu"])
    with pytest.raises(NeedsCuda):
        builder.load_inline("ext", "int f();", with_cuda=True)
    assert watch.needs_cuda and builder.compiled == [] and watch.built == 0


def test_a_cpu_build_is_counted_and_its_functions_count_calls(stand_in):
    builder, watch = stand_in("cpu")
    module = builder.load_inline("ext", "int f();", functions=["f"], verbose=True)
    assert builder.compiled == [("ext", "int f();", None)] and watch.built == 1 and watch.sources == ["int f();"]
    key = call_key("load_inline", ("ext", "int f();"), {"functions": ["f"]})
    assert watch.products == {key: {"module": "ext", "file": "/build/ext/ext.so"}}
    assert module.add(2, 3) == 5 and module.add(1, 1) == 2 and watch.calls == 2


def test_the_call_count_is_not_an_attribute_the_submission_can_raise(stand_in):
    # a pure-PyTorch forward that added to a plain counter would read as its own kernel on the CPU device
    builder, watch = stand_in("cpu")
    module = builder.load_inline("ext", "int f();", functions=["f"])
    reader = watch.own_calls   # what the candidate's process holds (CONTEXT.own_calls)
    with pytest.raises(AttributeError):
        watch.calls += 5
    watch.own_calls = lambda: 99
    module.add(1, 2)
    assert reader() == 1


def test_a_swallowed_build_failure_is_still_noticed(stand_in):
    builder, watch = stand_in("cpu", fail="Error building extension 'ext'\nstep 1\nmain.cpp:3:1: error: expected ';'")
    try:
        builder.load_inline("ext", "int f()")
    except RuntimeError:
        pass   # what a submission that falls back to PyTorch does
    assert watch.failure == "RuntimeError: main.cpp:3:1: error: expected ';'" and not watch.building


def test_a_call_the_build_pool_already_built_is_imported_not_compiled(stand_in):
    key = call_key("load_inline", ("ext", "int f();"), {})
    builder, watch = stand_in("cuda", prebuilt={key: {"module": "ext", "dir": "/cache/abc"}})
    builder.load_inline("ext", "int f();")
    assert builder.imported == [("ext", "/cache/abc", True)] and builder.compiled == []
    assert (watch.reused, watch.built, watch.products) == (1, 1, {})


CUDA = "__global__ void k() {}"


def test_a_cuda_build_is_tried_with_the_light_header_first_and_keeps_the_callers_flags(stand_in):
    builder, watch = stand_in("cuda", light=True)
    builder.load_inline("ext", "int f();", CUDA, extra_cuda_cflags=["-O3"])
    builder.load_inline("ext2", "int f();", cuda_sources=CUDA, functions=["f"])
    assert builder.cuda_flags == [["-O3", LIGHT_FLAG], [LIGHT_FLAG]]
    assert (watch.light_built, watch.light_failed, watch.built, watch.failure) == (2, 0, 2, None)
    # the cache key is the call as written: the evaluation child finds the library whatever flags built it
    assert set(watch.products) == {call_key("load_inline", ("ext", "int f();", CUDA), {"extra_cuda_cflags": ["-O3"]}),
                                   call_key("load_inline", ("ext2", "int f();"),
                                            {"cuda_sources": CUDA, "functions": ["f"]})}


def test_a_failed_light_build_is_built_again_as_written_and_only_that_build_counts(stand_in, capfd):
    builder, watch = stand_in("cuda", light=True, fail_light=True)
    module = builder.load_inline("ext", "int f();", CUDA, extra_cuda_cflags=["-O3"])
    assert builder.cuda_flags == [["-O3", LIGHT_FLAG], ["-O3"]] and module.add(1, 2) == 3
    assert (watch.light_built, watch.light_failed, watch.built, watch.failure) == (0, 1, 1, None)
    assert "building as written" in capfd.readouterr().err


def test_a_source_that_fails_both_ways_fails_with_the_as_written_error(stand_in):
    builder, watch = stand_in("cuda", light=True, fail="Error building extension 'ext'\nmain.cpp:1:1: error: x")
    with pytest.raises(RuntimeError):
        builder.load_inline("ext", "int f();", CUDA)
    assert len(builder.compiled) == 2 and watch.light_failed == 1 and watch.built == 0
    assert watch.failure == "RuntimeError: main.cpp:1:1: error: x" and not watch.building


@pytest.mark.parametrize("device, light, cuda", [("cuda", False, CUDA), ("cuda", True, None), ("cpu", True, None)])
def test_no_light_attempt_when_off_without_cuda_sources_or_on_the_cpu(stand_in, device, light, cuda):
    builder, watch = stand_in(device, light=light)
    builder.load_inline("ext", "int f();", cuda, extra_cuda_cflags=["-O3"])
    if device == "cuda":   # with_cuda alone links CUDA but compiles no CUDA source: nothing to lighten
        builder.load_inline("ext", "int f();", cuda, extra_cuda_cflags=["-O3"], with_cuda=True)
    assert set(map(tuple, builder.cuda_flags)) == {("-O3",)} and (watch.light_built, watch.light_failed) == (0, 0)


def test_the_light_header_is_torch_types_alone(tmp_path):
    """The shim, compiled as nvcc's host compiler would see it: torch/extension.h resolves to it (torch's types
    are there, the Python bindings are not); without it, the same include brings them in."""
    import shutil
    import subprocess
    import sysconfig

    import torch.utils.cpp_extension as cpp_extension
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    probe = tmp_path / "probe.cpp"
    probe.write_text("#include <torch/extension.h>\n"
                     "#ifdef PYBIND11_VERSION_MAJOR\n#error python bindings came in\n#endif\n"
                     "#ifdef TORCH_API_INCLUDE_EXTENSION_H\n#endif\n"
                     "torch::Tensor twice(const torch::Tensor& x) { return x + x; }\n")
    includes = [f"-isystem{path}" for path in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    done = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", f"-I{LIGHT_INCLUDE}", *includes, str(probe)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    undone = subprocess.run([compiler, "-std=c++17", "-E", "-o", "/dev/null", *includes, str(probe)],
                            capture_output=True, text=True)
    assert undone.returncode != 0 and "python bindings came in" in undone.stderr


def test_the_light_include_joins_torchs_own_signatures_however_the_flags_are_passed():
    """Against torch's real load_inline / load signatures (bound, never called): keyword or positional
    extra_cuda_cflags, a string or none, keep the caller's flags and add the folder once."""
    import torch.utils.cpp_extension as cpp_extension

    def add(original, args, kwargs):
        bound = extensions._bound(original, args, kwargs)
        if bound is None or not extensions._add_include(bound, "extra_cuda_cflags", LIGHT_INCLUDE):
            return None
        return bound
    inline = add(cpp_extension.load_inline, ("ext", "int f();", CUDA), {"extra_cuda_cflags": ["-O3"]})
    assert inline.arguments["extra_cuda_cflags"] == ["-O3", LIGHT_FLAG] and inline.args[:3] == ("ext", "int f();", CUDA)
    bare = add(cpp_extension.load_inline, ("ext", "int f();"), {"cuda_sources": CUDA})
    assert bare.arguments["extra_cuda_cflags"] == [LIGHT_FLAG]
    positional = add(cpp_extension.load, ("ext", ["k.cu"], None, ["-O3", "--use_fast_math"]), {})
    assert positional.arguments["extra_cuda_cflags"] == ["-O3", "--use_fast_math", LIGHT_FLAG]
    assert "extra_cuda_cflags" in positional.signature.parameters
    as_string = add(cpp_extension.load, ("ext", "k.cu"), {"extra_cuda_cflags": "-O3"})
    assert as_string.arguments["extra_cuda_cflags"] == ["-O3", LIGHT_FLAG]
    assert add(cpp_extension.load_inline, ("ext",), {"no_such_option": 1}) is None   # torch's own error, as written


def _precompiled(root, *names):
    for name in names:
        header = pch.header(root, name)
        header.parent.mkdir(parents=True)
        header.write_bytes(b"gch")
    return str(root)


def test_a_cpp_build_reads_the_precompiled_header_its_flags_fit_and_nothing_else(stand_in, tmp_path):
    root = _precompiled(tmp_path / "pch", "O0", "O3")
    builder, watch = stand_in("cpu", pch_root=root)
    builder.load_inline("a", "int f();", functions=["f"])
    builder.load_inline("b", "int f();", functions=["f"], extra_cflags=["-O3"])
    builder.load_inline("c", "int f();", functions=["f"], extra_cflags=["-O2"])          # none made for -O2
    builder.load_inline("d", "int f();", functions=["f"], extra_cflags=["-O3", "-fopenmp"])  # more than a level
    assert builder.cflags == [[f"-I{tmp_path / 'pch' / 'O0'}"], ["-O3", f"-I{tmp_path / 'pch' / 'O3'}"], ["-O2"],
                              ["-O3", "-fopenmp"]]
    assert watch.pch_built == 2 and watch.pch_failed == 0 and watch.built == 4
    # the call keys (what the build pool's libraries are found by) are those of the calls as written
    assert set(watch.products) == {call_key("load_inline", (name, "int f();"), {"functions": ["f"], **extra})
                                   for name, extra in (("a", {}), ("b", {"extra_cflags": ["-O3"]}),
                                                       ("c", {"extra_cflags": ["-O2"]}),
                                                       ("d", {"extra_cflags": ["-O3", "-fopenmp"]}))}


def test_a_build_that_fails_with_the_precompiled_header_is_built_again_as_written(stand_in, tmp_path, capfd):
    builder, watch = stand_in("cpu", pch_root=_precompiled(tmp_path / "pch", "O0"), fail_pch=True)
    module = builder.load_inline("a", "int f();", functions=["f"])
    assert module.add(1, 2) == 3 and builder.cflags == [[f"-I{tmp_path / 'pch' / 'O0'}"], None]
    assert watch.pch_failed == 1 and watch.pch_built == 0 and watch.failure is None
    said = capfd.readouterr().err
    assert "precompiled torch/extension.h: the build failed (RuntimeError); building as written" in said
    assert _COMPILER_ERROR.search(said) is None   # a record's error is the as-written build's first diagnostic


def test_without_the_judges_folder_or_its_header_a_build_is_as_written(stand_in, tmp_path):
    builder, watch = stand_in("cpu", pch_root=str(tmp_path / "empty"))
    builder.load_inline("a", "int f();", functions=["f"])
    builder_without, _ = stand_in("cpu")
    builder_without.load_inline("a", "int f();", functions=["f"])
    assert builder.cflags == builder_without.cflags == [None] and watch.pch_built == 0


def test_a_cuda_builds_main_cpp_reads_the_precompiled_header_beside_the_light_cuda_header(stand_in, tmp_path):
    # extra_cflags reach only the C++ compiler (main.cpp); nvcc gets extra_cuda_cflags
    root = _precompiled(tmp_path / "pch", "O3")
    builder, watch = stand_in("cuda", light=True, pch_root=root)
    builder.load_inline("a", "int f();", CUDA, extra_cflags=["-O3"], extra_cuda_cflags=["-O3"])
    builder.load_inline("b", "int f();", CUDA, extra_cflags=["-O2"])   # no -O2 header: the light one alone
    assert builder.cflags == [["-O3", f"-I{tmp_path / 'pch' / 'O3'}"], ["-O2"]]
    assert builder.cuda_flags == [["-O3", LIGHT_FLAG], [LIGHT_FLAG]]
    assert (watch.pch_built, watch.light_built, watch.pch_failed, watch.light_failed) == (1, 2, 0, 0)
    builder, watch = stand_in("cuda", light=False, pch_root=root)
    builder.load_inline("a", "int f();", CUDA, extra_cflags=["-O3"])
    assert builder.cflags == [["-O3", f"-I{tmp_path / 'pch' / 'O3'}"]] and builder.cuda_flags == [None]
    assert (watch.pch_built, watch.light_built) == (1, 0)


def test_a_cuda_build_that_fails_with_both_headers_is_built_again_as_written(stand_in, tmp_path, capfd):
    builder, watch = stand_in("cuda", light=True, pch_root=_precompiled(tmp_path / "pch", "O0"), fail_pch=True)
    module = builder.load_inline("a", "int f();", CUDA)
    assert module.add(1, 2) == 3 and builder.cflags == [[f"-I{tmp_path / 'pch' / 'O0'}"], None]
    assert builder.cuda_flags == [[LIGHT_FLAG], None]
    assert (watch.pch_failed, watch.light_failed, watch.pch_built, watch.light_built, watch.built) == (1, 1, 0, 0, 1)
    said = capfd.readouterr().err
    assert ("light torch/extension.h and precompiled torch/extension.h: the build failed (RuntimeError); "
            "building as written") in said
