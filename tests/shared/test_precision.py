"""Precision modes: which dtype a precision casts to, and what it casts."""
import torch

from harness.shared.precision import cast_dtype, cast_floating, name_of


def test_fp32_casts_nothing_and_half_precisions_cast_floating_tensors_only():
    values = [torch.ones(2, dtype=torch.float64), torch.ones(2), torch.arange(3), 0.5, "x"]
    assert cast_dtype("fp32") is None
    assert all(a is b for a, b in zip(cast_floating(values, cast_dtype("fp32")), values))   # fp64 stays fp64
    cast = cast_floating(values, cast_dtype("bf16"))
    assert [v.dtype for v in cast[:3]] == [torch.bfloat16, torch.bfloat16, torch.int64]
    assert cast[3:] == [0.5, "x"]
    assert cast_floating([torch.full((1,), 1.0 + 2 ** -9)], torch.float16)[0].item() == 1.0 + 2 ** -9  # exact in fp16
    assert cast_floating([torch.full((1,), 1.0 + 2 ** -9)], torch.bfloat16)[0].item() == 1.0   # rounded in bf16


def test_each_dtype_takes_the_default_tolerance_of_its_precision():
    assert [name_of(d) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64)] == [
        "fp16", "bf16", "fp32", "fp32", "fp32"]
