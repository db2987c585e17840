"""CuTe DSL and TileLang end to end on a GPU (marked gpu; each part skipped where its package is not installed:
nvidia-cutlass-dsl, tilelang; docs/backends.md says how they were taken to the GPU machine).

    bash scripts/test.sh -m gpu tests/shared/backends/test_dsl_gpu.py

Judged against level0/5 (ReLU over 4M floats, as the Triton tests): each language's ReLU example passes with its
own kernel found in the profile, its JIT inside the sandbox with nothing blocked; a CuTe module whose forward
computes with torch is `no_custom_kernel`; a TileLang kernel with wrong values is `incorrect`.
"""
from __future__ import annotations

import importlib.util
import shutil

import pytest
from conftest import (
    EXAMPLES,
    FIXTURES,
    by_name,
    expected_flags,
    expected_status,
    run_folder,
)

pytestmark = pytest.mark.gpu

RELU = EXAMPLES / "level1" / "16_ReLU"
LANGUAGES = {"cute": ("cutlass", RELU / "relu_cute.py", FIXTURES / "dsl" / "cute_torch_fallback.py"),
             "tilelang": ("tilelang", RELU / "relu_tilelang.py", FIXTURES / "dsl" / "tilelang_wrong_values.py")}


@pytest.mark.parametrize("backend", sorted(LANGUAGES))
def test_a_dsl_example_passes_and_its_fixture_ends_in_its_status(tmp_path, backend):
    package, example, fixture = LANGUAGES[backend]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    folder = tmp_path / backend
    folder.mkdir()
    for path in (example, fixture):
        shutil.copy(path, folder / path.name)
    records = by_name(run_folder(folder, tmp_path / "run", "cuda", problem="level0/5"))
    passing = records[example.name]
    print(f"{backend}: {passing.status.value} speedup {passing.speedup} ({passing.runtime_ms} ms vs reference "
          f"{passing.ref_runtime_ms} ms), own kernels {passing.own_kernels}, flags {passing.flags}")
    assert passing.backend == backend and passing.status.value == "pass", (passing.status, passing.error,
                                                                            passing.flag_evidence)
    assert passing.own_kernels >= 1 and passing.own_kernel_share > 0.9, passing.flag_evidence
    assert passing.grad_correct is True and passing.speedup is not None and passing.speedup > 0
    assert not {"sandbox_blocked", "imports_beyond_torch", "no_custom_kernel"} & set(passing.flags)
    record = records[fixture.name]
    assert record.backend == backend
    assert record.status.value == expected_status(fixture), (record.status, record.error)
    assert expected_flags(fixture) <= set(record.flags or ()), record.flags
