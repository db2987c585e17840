"""The backend seam on the CPU (no GPU, no triton needed: sources are read as text): which backend a source gets,
what each backend lets its candidates import and run, the JIT caches' environment, the build stage's shortcut,
kernel names for attribution, the static checks that apply only under Triton, and the backend on records."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, make

from harness.build import builder
from harness.children import attribution
from harness.cli import _config, _parser
from harness.integrity.static import analyze
from harness.isolation import policy
from harness.report.scoring import records_table
from harness.shared import backends
from harness.shared import config as config_module
from harness.shared.config import load_config
from harness.shared.record import Record
from harness.shared.specs import CandidateSpec

TRITON_RELU = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.maximum(tl.load(x_ptr + offsets, mask=mask), 0.0), mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y
''')
TORCH_FORWARD = TRITON_RELU.replace(
    "y = torch.empty_like(x)\n        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)\n"
    "        return y", "return torch.relu(x)")
LOAD_INLINE = "import torch\nfrom torch.utils.cpp_extension import load_inline\next = load_inline('e', '', '')\n"


def static_flags(source: str, **kwargs) -> set[str]:
    return {finding.flag for finding in analyze(source, **kwargs)}


# --------------------------------------------------------------------------- selection


@pytest.mark.parametrize("source, expected", [
    (TRITON_RELU, "triton"),
    ("from triton import jit\n", "triton"),
    ("import triton.language as tl\n", "triton"),
    ("import triton\ndef broken(:\n", "triton"),          # does not parse: an import line still says it
    (LOAD_INLINE, "cuda"),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n", "cuda"),   # pure torch: the default path
    ("src = 'import triton'\n", "cuda"),                   # a string that mentions it is not an import
    ("import cutlass\nimport cutlass.cute as cute\n", "cute"),
    ("import tilelang.language as T\n", "tilelang"),
])
def test_a_source_gets_the_backend_it_imports_else_cuda(source, expected):
    assert backends.detect(source).name == expected
    assert backends.select("auto", source).name == expected


def test_the_config_forces_a_backend_and_refuses_unknown_names():
    assert backends.select("cuda", TRITON_RELU) is backends.CUDA
    assert backends.select("triton", LOAD_INLINE) is backends.TRITON
    with pytest.raises(ValueError, match="unknown backend"):
        backends.select("opencl", LOAD_INLINE)
    assert set(config_module.BACKENDS) == {"auto", *backends.BACKENDS} and backends.NAMES == config_module.BACKENDS


def test_backend_key_and_flag_keep_the_default_config_hash():
    # ADDED_LATER: `backend: auto` leaves the hash of existing records (tests/shared/test_config.py pins it) alone
    assert load_config().backend == "auto" and load_config().hash() == "4cf815972092"
    assert load_config(None, {"backend": "triton"}).hash() != load_config().hash()
    with pytest.raises(config_module.ConfigError, match="key 'backend' must be auto"):
        load_config(None, {"backend": "opencl"})
    args = _parser().parse_args(["submit", "--problem", "level1/16", "--submission", "s.py", "--backend", "triton"])
    assert _config(args).backend == "triton"
    with pytest.raises(SystemExit):
        _parser().parse_args(["batch", "x", "--backend", "opencl"])


def test_the_candidate_spec_carries_the_configured_backend(tmp_path):
    config = load_config(None, {"backend": "triton"})
    assert CandidateSpec.for_build(config, tmp_path / "s.py", tmp_path, "cuda").backend == "triton"
    assert CandidateSpec.for_evaluation(config, tmp_path / "s.py", tmp_path, "cuda", tmp_path / "f.pt", True,
                                        {}).backend == "triton"


# --------------------------------------------------------------------------- the candidate's process


def test_jit_caches_live_in_the_childs_folder_and_toolchain_variables_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/ptxas")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/shared/cache")        # the parent's cache is never the child's
    env = policy.child_environment(tmp_path)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "triton_cache")
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions")
    assert env["TRITON_PTXAS_PATH"] == "/opt/ptxas"
    for backend in backends.BACKENDS.values():
        for variable, _ in backend.caches:
            assert Path(env[variable]).parent == tmp_path


def test_only_a_backend_with_a_toolchain_may_start_processes():
    assert backends.toolchain_dirs(backends.CUDA) == ()          # load_inline's compilers: the build flag instead
    assert backends.TRITON.toolchains == ("triton",)
    fake = dataclasses.replace(backends.TRITON, toolchains=("json", "no_such_package_here"))
    assert backends.toolchain_dirs(fake) == (str(Path(json.__file__).parent),)


_GUARD_SCRIPT = '''
import sys, subprocess
sys.path[:0] = [{tools!r}, {repo!r}]
from harness.children.candidate import guard
guard.install(lambda event, detail: print("refusal:", detail), {submission!r}, [{tmp!r}], lambda: False,
              [{toolchain!r}])
import faketool
namespace = {{}}
exec(compile(open({submission!r}).read(), {submission!r}, "exec"), namespace)
for name in ("direct", "through_the_tool", "through_the_tools_import"):
    try:
        namespace[name]()
        print(name, "allowed")
    except PermissionError:
        print(name, "refused")
'''


def test_the_guard_lets_the_backends_toolchain_start_processes_and_nothing_else(tmp_path):
    # A child process: an audit hook cannot be removed once installed.
    toolchain = tmp_path / "tools" / "faketool"
    toolchain.mkdir(parents=True)
    (toolchain / "__init__.py").write_text("import subprocess\ndef compile():\n    subprocess.run(['true'])\n")
    submission = tmp_path / "submission.py"
    submission.write_text("import subprocess, faketool\n"
                          "def direct():\n    subprocess.run(['true'])\n"
                          "def through_the_tool():\n    faketool.compile()\n"
                          "def through_the_tools_import():\n    faketool.subprocess.run(['true'])\n")
    script = _GUARD_SCRIPT.format(tools=str(tmp_path / "tools"), repo=str(REPO), submission=str(submission),
                                  tmp=str(tmp_path), toolchain=str(toolchain))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if not line.startswith("refusal:")] == [
        "direct refused", "through_the_tool allowed", "through_the_tools_import refused"]
    refusals = [line for line in lines if line.startswith("refusal:")]
    assert len(refusals) == 2 and all("(from the submission)" in line for line in refusals), refusals


# --------------------------------------------------------------------------- build stage


def test_the_build_stage_starts_no_child_for_triton(tmp_path):
    config = load_config()
    on_cpu = builder.build(TRITON_RELU, config, builder.Target("cpu"), tmp_path / "cache", tmp_path / "log")
    assert (on_cpu.outcome, on_cpu.status.value) == ("needs_cuda", "needs_cuda")
    on_gpu = builder.build(TRITON_RELU, config, builder.Target("cuda", "9.0"), tmp_path / "cache", tmp_path / "log")
    assert (on_gpu.outcome, on_gpu.status, on_gpu.libraries) == ("none", None, {})
    assert not (tmp_path / "cache").exists()   # nothing cached: nothing was built
    # a Triton module that also builds an extension goes to the build pool as usual
    assert backends.needs_build(backends.TRITON, TRITON_RELU + LOAD_INLINE)
    assert not backends.needs_build(backends.TRITON, TRITON_RELU) and backends.needs_build(backends.CUDA, "x = 1")


# --------------------------------------------------------------------------- kernel attribution


def test_own_kernel_names_come_from_each_backends_sources():
    cuda_source = "__global__ void __launch_bounds__(256) relu_fwd(float* x) {}\ntemplate <int N> __global__ void g(){}"
    aliased = ("import triton as tr\nfrom triton import jit\n@tr.autotune(configs=[], key=['n'])\n@tr.jit\n"
               "def tuned(x):\n    pass\n@jit(do_not_specialize=['n'])\ndef plain(x, n):\n    pass\n"
               "def helper():\n    pass\n")
    assert attribution.global_function_names([cuda_source]) == {"relu_fwd", "g"}
    assert attribution.global_function_names([cuda_source, aliased]) == {"relu_fwd", "g", "tuned", "plain"}
    assert attribution.global_function_names(["// triton in a comment of C++ source\n"]) == set()


def _event(name: str, ts: int, cat: str = "kernel", **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": 10, "tid": 1, "args": {"stream": 7, **args}}


def test_triton_kernels_launched_outside_extension_calls_count_as_the_submissions_own():
    events = [_event("void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 0),   # the marker
              _event("cuLaunchKernelEx", 10, cat="cuda_driver", correlation=1),
              _event("relu_kernel", 20, correlation=1),
              _event("triton_poi_fused_relu_0", 40, correlation=2),        # torch.compile's, not the submission's
              _event("void at::native::vectorized_elementwise_kernel<4, relu>", 60, correlation=3)]
    profile = attribution._attribute_cuda(events, backends.TRITON.kernel_names(TRITON_RELU))
    assert (profile.own, profile.library) == (1, 2)
    assert attribution._attribute_cuda(events, backends.TRITON.kernel_names(TORCH_FORWARD)).own == 1  # defined
    assert attribution._attribute_cuda(events, set()).own == 0


CUTE_RELU = textwrap.dedent('''
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def relu_kernel(x: cute.Tensor, y: cute.Tensor):
        pass
''')


def test_cute_dsl_kernels_count_by_the_dsls_trace_name_and_library_cutlass_kernels_do_not():
    """The CuTe DSL's name for a kernel of @cute.kernel `relu_kernel` (as seen on an H100, nvidia-cutlass-dsl 4.8.1):
    the submission's own although it says cutlass; cuBLAS's CUTLASS kernels and another DSL function's are not."""
    names = backends.CUTE.kernel_names(CUTE_RELU)
    assert names == {"relu_kernel"} and backends.own_kernel_names([CUTE_RELU]) >= names
    events = [_event("void at::native::vectorized_elementwise_kernel<4, FillFunctor>", 0),   # the marker
              _event("kernel_cutlass_relu_kernel_tensorptrf32gmemalign16o3003207681_tensorptrf32gmemalign16o3_0", 20),
              _event("cutlass_80_tensorop_s1688gemm_relu_kernel_128x128_32x3_nn_align4", 40),
              _event("kernel_cutlass_other_relu_kernel_tensorptrf32_0", 60),
              _event("kernel_cutlass_relu_kernelx_tensorptrf32_0", 80)]
    profile = attribution._attribute_cuda(events, names)
    assert (profile.own, profile.library) == (1, 3)


def test_tilelang_kernels_are_named_after_their_prim_func():
    source = ("import tilelang\nimport tilelang.language as T\n\n"
              "@T.prim_func\ndef relu(x: T.Tensor((4,), 'float32')):\n    pass\n")
    assert backends.TILELANG.kernel_names(source) == {"relu", "relu_kernel"}
    profile = attribution._attribute_cuda([_event("void at::native::FillFunctor", 0), _event("relu_kernel", 20)],
                                          backends.TILELANG.kernel_names(source))
    assert (profile.own, profile.library) == (1, 0)


# --------------------------------------------------------------------------- static checks


def test_triton_is_not_an_import_beyond_torch_under_triton_only():
    assert "imports_beyond_torch" not in static_flags(TRITON_RELU)
    assert "imports_beyond_torch" in static_flags(TRITON_RELU, backend="cuda")
    assert "imports_beyond_torch" in static_flags("import cutlass\nimport triton\n")   # cute's allowance only


def test_a_triton_forward_that_only_calls_torch_is_flagged():
    assert static_flags(TRITON_RELU) == set()
    assert static_flags(TORCH_FORWARD) == {"forward_without_kernel"}
    no_kernel = "import torch, triton\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    assert static_flags(no_kernel) == {"no_triton_kernel"}
    # the same sources judged as cuda: the Triton-only checks do not apply
    assert static_flags(TORCH_FORWARD, backend="cuda") == {"imports_beyond_torch"}


@pytest.mark.parametrize("forward", [
    "return Relu.apply(x)",                        # an autograd Function whose forward launches
    "return self.run(x)",                          # a method of its own
    "return self.op(x)",                           # a submodule whose forward launches
    "return torch.ops.judge.relu(x)",              # a custom op it registered
    "return launch(x)",                            # a module function ...
    "return helper(x)",                            # ... through another
])
def test_launches_reached_through_functions_methods_and_autograd_count(forward):
    source = TRITON_RELU.split("class ModelNew")[0] + textwrap.dedent('''
        def launch(x):
            y = torch.empty_like(x)
            relu_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
            return y

        def helper(x):
            return launch(x)

        def relu(x):
            return launch(x)

        class Relu(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return launch(x)

        class Op(nn.Module):
            def forward(self, x):
                return launch(x)

        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.op = Op()

            def run(self, x):
                return launch(x)

            def forward(self, x):
                FORWARD
    ''').replace("FORWARD", forward)
    assert "forward_without_kernel" not in static_flags(source)
    unreached = source.replace(forward, "return torch.relu(x)")
    assert "forward_without_kernel" in static_flags(unreached)


# --------------------------------------------------------------------------- records


def test_records_and_results_csv_carry_the_backend():
    record = make(backend="triton")
    assert Record.from_dict(record.to_dict()).backend == "triton"
    older = {k: v for k, v in record.to_dict().items() if k != "backend"}
    assert Record.from_dict(older).backend == "cuda"   # written before backends: the load_inline path
    assert list(records_table([record])["backend"]) == ["triton"]
