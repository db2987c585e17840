"""The judge's precompiled torch/extension.h: which builds may read one, how it is made, and a real build reading it.

Most of this compiles a few-line header; the last test makes the real header for the test session's build cache
(so that the session's later C++ builds read it too) and proves a build used it."""
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import TEST_SETTINGS, judge_config

from harness.build import builder, pch
from harness.shared.pch import header, variant


def test_a_build_fits_a_variant_by_its_optimisation_level_alone():
    assert variant(None) == variant([]) == variant(["-O0"]) == "O0"
    assert variant(["-O3"]) == variant("-O3") == variant([" -O3 "]) == "O3"
    assert variant(["-O2", "-O3"]) == "O3"   # the last level given is the one the compiler takes
    for other in (["-O3", "-fopenmp"], ["-DNDEBUG"], ["-march=native"], ["-Os"], ["-O3", 3], ["-include", "x.h"]):
        assert variant(other) is None, other


def test_what_a_source_looks_like_it_will_want_made():
    one = 'ext = load_inline(name="a", cpp_sources=s, extra_cflags=["-O3"])\n'
    assert pch.wanted(one) == {"O3"}
    assert pch.wanted(one + 'other = load_inline(name="b", cpp_sources=s)\n') == {"O3", "O0"}
    assert pch.wanted('ext = load_inline(name="a", cpp_sources=s, extra_cflags=["-O3", "-fopenmp"])') == set()
    assert pch.wanted("import torch\nclass ModelNew: ...\n") == set()


def test_the_standard_is_the_one_torchs_builder_gives_every_build_not_a_docstrings():
    builder_source = """
    Example:
        >>> load(extra_compile_args={'cxx': ['-g', '-std=c++20', '-fPIC']})
    ...
    common_cflags += ['-std=c++17', '-fPIC']
    cuda_flags = cuda_flags + ['-std=c++17']
    """
    assert pch.builder_standard(builder_source) == "c++17"
    assert pch.builder_standard(builder_source.replace("c++17", "c++20")) == "c++20"
    assert pch.builder_standard("cflags = ['-std=c++17']") is None   # not the line it always was: no header
    two = builder_source + "    common_cflags += ['-std=c++20', '-fPIC']\n"
    assert pch.builder_standard(two) is None


def test_torchs_builder_here_names_one_standard():
    from torch.utils import cpp_extension
    assert pch.builder_standard(Path(cpp_extension.__file__).read_text()) in {"c++17", "c++20", "c++23"}


@pytest.fixture
def small_toolchain(tmp_path):
    """A toolchain as _toolchain gives one, whose "torch/extension.h" is a line of C++ (compiled in a blink)."""
    source = tmp_path / "include" / "torch" / "extension.h"
    source.parent.mkdir(parents=True)
    source.write_text("#pragma once\ninline int judge_probe() { return 7; }\n")
    return {"compiler": "c++", "header": str(source), "flags": ["-fPIC", "-std=c++17"], "key": "small"}


def test_a_variant_is_made_once_with_torchs_header_beside_it(tmp_path, small_toolchain):
    target = header(tmp_path / "root", "O2")
    assert pch.make(target, "O2", small_toolchain)
    made = target.stat()
    assert target.read_bytes()[:4] == b"gpch" and made.st_mode & 0o777 == 0o644
    assert target.with_suffix("").read_text() == f'#include "{small_toolchain["header"]}"\n'
    assert pch.make(target, "O2", small_toolchain) and target.stat().st_mtime_ns == made.st_mtime_ns
    assert sorted(p.name for p in target.parent.iterdir()) == ["extension.h", "extension.h.gch"]   # no partial left


def test_a_variant_that_does_not_compile_leaves_nothing_and_a_killed_makers_partial_goes(tmp_path, small_toolchain):
    broken = {**small_toolchain, "flags": ["-std=no-such-standard"]}
    target = header(tmp_path / "root", "O0")
    target.parent.mkdir(parents=True)
    target.with_name(f".{target.name}.999999").write_bytes(b"half a header")
    assert not pch.make(target, "O0", broken)
    assert list(target.parent.iterdir()) == []
    assert "no-such-standard" in pch.failed(tmp_path / "root", "O0").read_text()   # not tried again: see below


def test_prepare_makes_what_the_source_wants_in_the_background_and_refuses_a_folder_others_can_write(
        tmp_path, small_toolchain, monkeypatch):
    monkeypatch.setattr(pch, "_toolchain", lambda: small_toolchain)
    cache = tmp_path / "cache"
    root = pch.prepare(cache, 'ext = load_inline(name="a", cpp_sources=s, extra_cflags=["-O1"])')
    assert root == tmp_path / "cache-pch" / "small"
    deadline = time.monotonic() + 60   # made by a process of its own, detached from this one
    while not header(root, "O1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert header(root, "O1").is_file() and not header(root, "O0").exists()
    assert root.stat().st_mode & 0o777 == root.parent.stat().st_mode & 0o777 == 0o755
    # a variant that could not be made is not tried again on this toolchain
    pch.failed(root, "O2").write_text("error")
    started = []
    monkeypatch.setattr(pch.subprocess, "Popen", lambda command, **options: started.append(command))
    pch.prepare(cache, 'ext = load_inline(name="a", cpp_sources=s, extra_cflags=["-O2"])')
    pch.prepare(cache, 'ext = load_inline(name="a", cpp_sources=s, extra_cflags=["-O3"])')
    assert [command[-2] for command in started] == ["O3"]
    root.parent.chmod(0o777)   # another user could plant a header there: not used
    assert pch.prepare(cache, "") is None


PROBE = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="pch_probe", cpp_sources="torch::Tensor twice(torch::Tensor x) { return x * 2; }",
                  functions=["twice"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.twice(x)
'''


CUDA_PROBE = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KERNEL = r"""
__global__ void twice_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
torch::Tensor twice(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    twice_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="pch_cuda_probe", cpp_sources="torch::Tensor twice(torch::Tensor x);", cuda_sources=KERNEL,
                  functions=["twice"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.twice(x)
'''


def _a_build_reads_the_precompiled_header(source: str, device: str) -> None:
    toolchain = pch._toolchain()
    if toolchain is None:
        from torch.utils import cpp_extension
        compiler = shutil.which(cpp_extension.get_cxx_compiler())
        version = subprocess.run([compiler, "-v"], capture_output=True, text=True,
                                 env={**os.environ, "LC_ALL": "C"}).stderr if compiler else ""
        assert "gcc version" not in version, "GCC is the compiler here, yet the judge found no toolchain for headers"
        pytest.skip("the C++ compiler is not GCC: no precompiled headers")
    sessions = Path(TEST_SETTINGS["build_cache_dir"] + pch.SUFFIX) / toolchain["key"]   # the session's later builds
    assert pch.make(header(sessions, "O0"), "O0", toolchain)                            # read it too
    # a private copy whose torch/extension.h beside it stops any compile that reads it: the build goes through only
    # where GCC took the precompiled header
    cache = Path(tempfile.mkdtemp(prefix="judge-test-pch-", dir=Path(TEST_SETTINGS["build_cache_dir"]).parent))
    cache.chmod(0o755)
    probe = header(cache.with_name(cache.name + pch.SUFFIX) / toolchain["key"], "O0")
    probe.parent.mkdir(parents=True)
    for folder in (probe.parent, probe.parent.parent, probe.parent.parent.parent, probe.parent.parent.parent.parent):
        folder.chmod(0o755)
    os.link(header(sessions, "O0"), probe)
    probe.with_suffix("").write_text('#error "the precompiled torch/extension.h was not used"\n')
    log = cache / "build.log"
    built = builder.build(source, judge_config(), builder.describe_target(device), cache, log)
    text = log.read_text() if log.exists() else ""
    assert built.outcome == "built", (built, text[-2000:])
    assert "precompiled torch/extension.h: the build failed" not in text, text[-2000:]


def test_a_real_cpp_build_reads_the_judges_precompiled_header():
    _a_build_reads_the_precompiled_header(PROBE, "cpu")


@pytest.mark.gpu
def test_a_real_cuda_builds_main_cpp_reads_the_judges_precompiled_header():
    # main.cpp (load_inline's bindings and cpp_sources) goes to GCC with the header; cuda.cu to nvcc without it
    _a_build_reads_the_precompiled_header(CUDA_PROBE, "cuda")
