"""CUDA paths, run on the device machine (skipped without a GPU)."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES, FIXTURES, by_name, expected_status, run_folder

from harness.shared.record import Status

pytestmark = pytest.mark.gpu


def test_cuda_fault_in_the_middle_of_a_batch(tmp_path):
    # a (pass) -> b (illegal memory access) -> c (device-side assert) -> d (pass, same extension name)
    outcome = run_folder(FIXTURES / "gpu", tmp_path / "gpu", "cuda", problem="level0/1")
    records = by_name(outcome)
    assert sorted(records) == sorted(p.name for p in (FIXTURES / "gpu").iterdir())
    for name, record in records.items():
        assert record.status.value == expected_status(FIXTURES / "gpu" / name), (
            name, record.error, record.flag_evidence, record.runtime_ms, record.fresh_runtime_ms)
    assert "illegal memory access" in records["b_illegal_access.py"].error
    assert records["d_relu_cuda_same_name.py"].grad_correct is True
    assert records["d_relu_cuda_same_name.py"].speedup is not None
    # CUDA sources are compiled first with the light torch/extension.h; one that needs the Python bindings in its
    # .cu is compiled again as written, and passes the same
    assert records["a_relu_cuda.py"].light_headers is True
    assert records["e_relu_cuda_bindings_in_cu.py"].light_headers is False


def test_cuda_example_for_the_seed_problem(tmp_path):
    folder = EXAMPLES / "level2"
    outcome = run_folder(folder, tmp_path / "level2", "cuda", grad_failure_fails=True)
    for record in outcome.records:
        # the flags' evidence too: a timing verdict on a GPU is known to go wrong now and then (docs/timing.md)
        assert record.status.value == expected_status(Path(record.submission)), (
            record.submission, record.error, record.flag_evidence, record.runtime_ms, record.fresh_runtime_ms)
    fused = by_name(outcome)["fused_cuda.py"]
    assert fused.status == Status.PASS and fused.grad_correct is True
    assert fused.grads_compared == 5  # x, fc.weight, fc.bias, gn.weight, gn.bias
    assert fused.speedup is not None and fused.ref_runtime_ms > 0
    # its own kernel fuses GroupNorm + LeakyReLU + sum; the GEMM is cuBLAS (a library kernel, allowed by default)
    assert fused.own_kernels >= 1 and fused.library_kernels >= 1 and fused.ref_kernels >= 3
    assert "library_kernels" in fused.flags and "no_fusion" not in fused.flags


def test_cpu_fixtures_on_cuda(tmp_path):
    folder = tmp_path / "fixtures"
    folder.mkdir()
    for path in (FIXTURES / "cpu").iterdir():
        if path.name != "timeout_compile.py":
            (folder / path.name).write_text(path.read_text())
    outcome = run_folder(folder, tmp_path / "cpu_on_cuda", "cuda", problem="level0/1")
    for name, record in by_name(outcome).items():
        # needs_cuda.py builds on CUDA; its forward has no backward, and gradients are required in tests
        expected = "no_grad" if name == "needs_cuda.py" else expected_status(FIXTURES / "cpu" / name)
        assert record.status.value == expected, (name, record.error)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_cuda_kernel_passes_in_its_precision_and_fp32_is_refused(tmp_path, precision):
    # the kernel takes fp16/bf16 only: a pass shows the harness handed it the run's dtype on the GPU
    folder = FIXTURES / "precision_cuda"
    judged = run_folder(folder, tmp_path / precision, "cuda", "level0/5", precision=precision, check_grad=False)
    record = by_name(judged)["half_relu_cuda.py"]
    assert record.status == Status.PASS and record.precision == precision, (
        record.status, record.error, record.flag_evidence, record.runtime_ms, record.calls_per_span)
    assert record.speedup is not None and record.own_kernels >= 1
    if precision == "bf16":
        judged = run_folder(folder, tmp_path / "fp32", "cuda", "level0/5", check_grad=False)
        fp32 = by_name(judged)["half_relu_cuda.py"]
        assert fp32.status == Status.RUNTIME_ERROR and "fp16 or bf16 only" in fp32.error, (fp32.status, fp32.error)


def test_placements_and_the_blocks_evidence_on_cuda(tmp_path):
    """timing_placements on a GPU: both sides timed over three copies of their weights (the seed problem's 268 MB
    GEMM weight), the verdict as with one; timing.json beside the log holds every block and says so too."""
    import json

    folder = tmp_path / "one"
    folder.mkdir()
    source = EXAMPLES / "level2" / "62_Matmul_GroupNorm_LeakyReLU_Sum" / "fused_cuda.py"
    (folder / source.name).write_text(source.read_text())
    (record,) = run_folder(folder, tmp_path / "run", "cuda", problem="level2/62", timing_placements=3).records
    assert record.status == Status.PASS, (record.error, record.flag_evidence)
    assert "3 placements" in record.timing_method
    evidence = json.loads((Path(record.log_path).parent / "timing.json").read_text())
    assert all("3 placements" in side["method"] for side in evidence["sides"].values())
    assert len(evidence["sides"]["candidate"]["blocks"]) == record.timing_blocks
