"""Precision modes (config `precision`, `--precision`): the dtype a run casts the reference's parameters and
floating-point inputs to, on both sides of the comparison.

`fp32` keeps every dtype as the problem file writes it (the behaviour before precision modes existed); `fp16` and
`bf16` cast floating-point parameters, buffers and inputs to that dtype after they were drawn in float32 under the
run's seeds, so both sides start from the same values, rounded once. The names are config.PRECISIONS.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def cast_dtype(precision: str) -> Optional[torch.dtype]:
    """The dtype floating-point tensors are cast to; None for fp32, which leaves the problem's dtypes alone."""
    return None if precision == "fp32" else DTYPES[precision]


def name_of(dtype: torch.dtype) -> str:
    """The precision whose default tolerance a tensor of `dtype` gets: fp16 and bf16 their own, anything else
    (float32, float64, integers, bool) fp32's."""
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")


def cast_floating(values: list[Any], dtype: Optional[torch.dtype]) -> list[Any]:
    """`values` with every floating-point tensor cast to `dtype` (None: unchanged); other values as they are."""
    if dtype is None:
        return list(values)
    return [v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]
