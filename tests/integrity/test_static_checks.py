"""Static checks: each flag fires on a small source that does the thing and stays quiet on its near miss."""
from __future__ import annotations

import logging
import textwrap

import pytest

from harness.integrity.static import FLAGS, Finding, analyze

REFERENCE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """y = relu(x) * scale."""

    def __init__(self, scale: float, inplace: bool = False):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return [2.0]
'''

CLEAN = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// One thread per element; no library calls, no side streams.
__global__ void scaled_relu_kernel(const float* __restrict__ x, float* __restrict__ y, float scale, int64_t n) {
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f) * scale;
}

torch::Tensor scaled_relu(torch::Tensor x, double scale) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    scaled_relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), static_cast<float>(scale), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor scaled_relu(torch::Tensor x, double scale);"

ext = load_inline(name="scaled_relu", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["scaled_relu"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale: float, inplace: bool = True):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.scaled_relu(x, self.scale)
'''

# (flag, a source that should raise it, a near miss that should not)
CASES = [
    ("imports_beyond_torch", "import numpy as np\n", "import torch.nn.functional as F\nfrom os import path\n"),
    ("process_spawn", "import os\nos.system('nvidia-smi')\n", "import os\nos.path.join('a', 'b')\n"),
    ("threads", "from concurrent.futures import ThreadPoolExecutor\n", "import concurrent.futures\n"),
    ("network", "import urllib.request\n", "import json\n"),
    ("native_access", "import torch\ntorch.ops.load_library('x.so')\n", "import torch\nf = torch.ops.aten.relu\n"),
    ("introspection", "import sys\nframe = sys._getframe(1)\n", "def f():\n    return locals(), vars()\n"),
    ("sys_modules", "import sys\nmod = sys.modules['torch']\n", "import sys\nprint(sys.version)\n"),
    ("monkeypatch", "import time\ntime.perf_counter = lambda: 0.0\n",
     "from time import perf_counter\nperf_counter = lambda: 0.0\nclass A:\n    def f(self):\n        self.t = 1\n"),
    ("exits", "raise SystemExit(0)\n", "try:\n    pass\nexcept SystemExit:\n    raise\n"),
    ("env_access", "from os import environ\nflag = environ.get('X')\n", "environ = {}\nflag = environ.get('X')\n"),
    ("file_io", "from pathlib import Path\nPath('out.txt').write_text('x')\n",
     "from pathlib import Path\nok = Path('out.txt').exists()\n"),
    ("seed_control", "import torch\ng = torch.Generator(device='cuda')\n", "import torch\nx = torch.randn(3)\n"),
    ("precision_downgrade", "import torch\ny = x.to(dtype=torch.bfloat16)\n",
     "import torch\ny = x.to(dtype=torch.float32)\ntorch.set_float32_matmul_precision('highest')\n"
     "torch.backends.cuda.matmul.allow_tf32 = False\nhalf = n // 2\n"),
    ("side_stream", 'src = "cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);"\n',
     'import torch\ns = torch.cuda.current_stream()\nsrc = "f<<<g, b, 0, at::cuda::getCurrentCUDAStream()>>>();"\n'),
    ("library_calls", 'src = "return at::matmul(a, b);"\n',
     'src = """auto y = torch::empty({n}, x.options());  // cublas would be slower here\n"""\n'),
    ("exception_fallback", "try:\n    y = ext.f(x)\nexcept Exception:\n    y = x.relu()\n",
     "try:\n    y = ext.f(x)\nexcept RuntimeError as e:\n    raise ValueError('bad') from e\nfinally:\n    pass\n"),
    ("uses_reference_model", "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
     "        return Model()(x)\n", "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"),
    ("init_signature_mismatch", "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self, s, inplace):"
     "\n        pass\n", "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self, scale, inplace):"
     "\n        pass\n"),
    ("identity_keyed_state", "cache = {}\ndef f(x):\n    key = (x.data_ptr(), x.shape)\n    if key in cache:\n"
     "        return cache[key]\n", "def f(x):\n    assert x.data_ptr() % 16 == 0\n"
     "    return ext.relu(x.data_ptr(), x.numel())\n"),
    ("obfuscation", "import torch\nfn = getattr(torch, 'rel' + 'u')\n", "import torch\nfn = getattr(torch, 'relu')\n"),
    # Triton only (importing triton selects the backend); tests/shared/backends/test_backends.py has the variants
    ("no_triton_kernel", "import triton\nimport torch\ny = torch.relu(x)\n",
     "import triton\n@triton.jit\ndef k(x_ptr):\n    pass\n"),
    ("forward_without_kernel", "import torch, triton\n@triton.jit\ndef k(x_ptr):\n    pass\n"
     "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n",
     "import torch, triton\n@triton.jit\ndef k(x_ptr):\n    pass\ndef launch(x):\n    k[(1,)](x)\n"
     "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return launch(x)\n"),
]


@pytest.fixture(autouse=True)
def no_check_crashes(caplog):
    """A check that raises is logged and skipped by analyze(); in tests that is a bug."""
    caplog.set_level(logging.WARNING, logger="harness.integrity.static")
    yield
    assert not [record for record in caplog.records if record.name == "harness.integrity.static"]


def flags(source: str, **kwargs) -> set[str]:
    return {finding.flag for finding in analyze(textwrap.dedent(source), **kwargs)}


def test_every_flag_has_a_case():
    assert [flag for flag, _, _ in CASES] == list(FLAGS)


@pytest.mark.parametrize("flag, positive, negative", CASES, ids=[case[0] for case in CASES])
def test_flag_fires_on_positive_not_on_near_miss(flag, positive, negative):
    assert flag in flags(positive, reference_source=REFERENCE)
    assert flag not in flags(negative, reference_source=REFERENCE)


@pytest.mark.parametrize("source", [
    "import torch\ntorch.cuda.Event.elapsed_time = f\n",
    "import torch\ntorch.allclose = f\n",
    "import torch\nsetattr(torch.cuda, 'synchronize', f)\n",
    "import torch.testing as tt\ntt.assert_close = f\n",
    "from torch import cuda\ncuda.synchronize = f\n",
    "from torch.cuda import Event\nEvent.elapsed_time = f\n",
    "import torch\ntorch.Tensor.__eq__ = f\n",
    "import torch\nc = torch.cuda\nc.synchronize = f\n",
    "import torch\ndel torch.cuda.synchronize\n",
    "import torch.nn.functional as F\nF.__dict__['relu'] = f\n",
])
def test_monkeypatch_variants(source):
    assert "monkeypatch" in flags(source)


def test_monkeypatch_leaves_backends_and_environ_to_their_flags():
    found = flags("import os, torch\ntorch.backends.cuda.matmul.allow_tf32 = True\nos.environ['X'] = '1'\n")
    assert found == {"precision_downgrade", "env_access"}


def test_aliases_resolve_to_module_names():
    findings = analyze("import torch as t\nfrom torch import cuda as c\ns = c.Stream()\nt.manual_seed(0)\n")
    assert findings == [Finding("seed_control", "line 4: torch.manual_seed"),
                        Finding("side_stream", "line 3: torch.cuda.Stream")]
    assert flags("import os as o\nhome = o.environ['HOME']\n") == {"env_access"}
    assert flags("from os import _exit as quit_now\nquit_now(0)\n") == {"exits"}


def test_library_calls_allow_allocation_and_metadata_helpers():
    helpers = ('src = """auto y = torch::zeros({n}, torch::dtype(torch::kFloat32));\n'
               'auto s = at::cuda::getCurrentCUDAStream(); auto o = at::TensorOptions();"""\n')
    assert analyze(helpers) == []
    ops = ('src = """#include <cublas_v2.h>\ncublasSgemm(h);\ny = torch::nn::functional::relu(x);\n'
           'cutlass::gemm::device::Gemm g;"""\n')
    [finding] = analyze(ops)
    assert finding.evidence == ("line 1: cublas_v2 in a source string; line 2: cublasSgemm in a source string; "
                                "line 3: torch::nn::functional::relu in a source string (+1 more)")


def test_precision_only_matters_for_float32_problems():
    source = 'y = x.half()\nsrc = "__half2 v = __float2half2_rn(a);"\n'
    assert flags(source) == {"precision_downgrade"}
    assert flags(source, reference_is_float32=False) == set()
    assert "precision_downgrade" in flags("import torch\nwith torch.autocast('cuda'):\n    pass\n")
    assert "precision_downgrade" in flags("import torch\ntorch.set_float32_matmul_precision('high')\n")


def test_python_checks_ignore_strings_and_c_checks_ignore_comments():
    source = 'note = "import subprocess; os.system(cmd)"\nsrc = "/* cudaStreamCreate */ // std::thread t;\\n"\n'
    assert analyze(source) == []
    assert flags('path = "/proc/self/fd/1"\n') == {"file_io"}


def test_identity_keys_in_all_their_forms():
    assert flags("seen = {id(x): 1}\n") == {"identity_keyed_state"}
    assert flags("y = cache.get((x.untyped_storage().data_ptr(), n))\n") == {"identity_keyed_state"}
    assert flags("same = a._cdata is b._cdata\n") == {"identity_keyed_state"}
    assert flags("class A:\n    def f(self, x):\n        self.key = f'{id(x)}'\n        return self.c[self.key]\n"
                 ) == {"identity_keyed_state"}


def test_exception_fallback_evidence_and_suppress():
    [finding] = analyze("try:\n    pass\nexcept (ValueError, RuntimeError):\n    pass\nexcept:\n    y = 0\n")
    assert finding == Finding("exception_fallback", "line 3: except (ValueError, RuntimeError):; line 5: except:")
    assert flags("import contextlib\nwith contextlib.suppress(Exception):\n    pass\n") == {"exception_fallback"}


def test_obfuscation_and_dynamic_imports():
    assert flags("m = __import__('ctypes')\n") == {"obfuscation", "native_access"}
    assert flags("import base64\ncode = base64.b64decode(s)\n") == {"obfuscation"}
    assert flags("import re, torch\np = re.compile('x')\nf = torch.compile(g)\n") == set()


def test_evidence_lists_three_occurrences_then_counts_the_rest():
    source = "import sys\n" + "".join(f"sys.exit({i})\n" for i in range(5))
    assert analyze(source) == [
        Finding("exits", "line 2: sys.exit; line 3: sys.exit; line 4: sys.exit (+2 more)")]


def test_findings_are_sorted_by_flag():
    found = [finding.flag for finding in analyze("import signal, socket, numpy\n")]
    assert found == sorted(found) == ["exits", "imports_beyond_torch", "network"]


def test_init_signature_evidence_and_inheritance():
    [finding] = analyze("import torch.nn as nn\nclass ModelNew(nn.Module):\n    def __init__(self, a, *b):\n"
                        "        pass\n", reference_source=REFERENCE)
    assert finding == Finding("init_signature_mismatch", "ModelNew(a, *b) vs Model(scale, inplace)")
    no_init = flags("import torch.nn as nn\nclass ModelNew(nn.Module):\n    pass\n", reference_source=REFERENCE)
    assert no_init == {"init_signature_mismatch"}
    inherited = ("import torch.nn as nn\nclass Base(nn.Module):\n    def __init__(self, scale, inplace=True):\n"
                 "        pass\nclass ModelNew(Base):\n    pass\n")
    assert flags(inherited, reference_source=REFERENCE) == {"uses_reference_model"}  # base is not nn.Module
    assert flags("x = 1\n", reference_source=REFERENCE) == set()  # no ModelNew: nothing to compare


def test_copy_of_the_reference_model_is_found_under_another_name():
    body = REFERENCE.split('"""y = relu(x) * scale."""')[1].split("def get_inputs")[0]
    source = f"import torch\nimport torch.nn as nn\n\nclass Ref(nn.Module):\n    '''Other doc.'''\n{body}" \
             "class ModelNew(Ref):\n    pass\n"
    [finding] = [f for f in analyze(source, reference_source=REFERENCE) if f.flag == "uses_reference_model"]
    assert finding.evidence == ("line 4: copies the reference Model as Ref; "
                                "line 16: ModelNew subclasses Ref, a copy of the reference Model")


def test_clean_load_inline_submission_has_no_findings():
    assert analyze(CLEAN, reference_source=REFERENCE) == []


def test_unparsable_source_has_no_findings():
    assert analyze("class ModelNew(:\n") == []


ODD_SOURCES = [
    "",
    "# only a comment\n# and another\n",
    "f = " + "lambda: " * 60 + "0\n",
    "x = " + "[" * 90 + "1" + "]" * 90 + "\n",
    "if (n := 10) > 5:\n    print(n)\n",
    "match cmd:\n    case {'op': op, **rest}:\n        pass\n    case [first, *others]:\n        pass\n"
    "    case Point(x=0) | None:\n        pass\n    case _:\n        pass\n",
    "async def f():\n    async with a as b:\n        await b\n    async for x in y:\n        yield x\n",
    "from torch import *\ns = cuda.Stream()\n",
    "from . import x\nfrom .. import *\nimport a.b.c\n",
    "try:\n    pass\nexcept* ValueError:\n    raise\n",
    "def f(a, /, b, *, c, **k):\n    global g\n    del a\n    x: int\n    return {**k}\n",
    "getattr()\nsetattr()\nid()\nvars()\nx = [].data_ptr()[id(y)]\nraise\n",
    'w = 3\ns = f"{x!r:>{w}}" "plain" f"{id(x)}"\n',
    "@decorator\nclass ModelNew:\n    def __init__(*args):\n        pass\n",
    "class ModelNew(ModelNew):\n    pass\n",
    "ModelNew = lambda: None\nModel = 1\n",
]


@pytest.mark.parametrize("source", ODD_SOURCES)
def test_analyze_never_raises_on_odd_valid_sources(source):
    for reference in (None, REFERENCE, "def (", "class Model:\n    '''only a docstring'''\n"):
        findings = analyze(source, reference_source=reference)
        assert all(isinstance(f, Finding) and f.flag in FLAGS and f.evidence for f in findings)
