"""The extension builders as the candidate's process sees them: keyed calls, CUDA refused on the CPU, counted calls.

The wrappers are installed on a stand-in for torch.utils.cpp_extension, never on torch's own module."""
import types

import pytest

from harness.candidate import extensions
from harness.candidate.extensions import ExtensionWatch, NeedsCuda, _source_texts, call_key


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

    def __init__(self, fail: str = ""):
        self.compiled: list[tuple] = []
        self.imported: list[tuple] = []

        def load_inline(name, cpp_sources, cuda_sources=None, functions=None, **options):
            self.compiled.append((name, cpp_sources, cuda_sources))
            if fail:
                raise RuntimeError(fail)
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
    def installed(device: str, fail: str = "", prebuilt=None) -> tuple[StandIn, ExtensionWatch]:
        builder = StandIn(fail)
        monkeypatch.setattr(extensions, "cpp_extension", builder)
        watch = ExtensionWatch(device, prebuilt)
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
