"""Bytes of tensors, however nested: light enough for the candidate's process (no profiler or FLOP counter)."""
from __future__ import annotations

from typing import Any

import torch


def tensor_bytes(values: Any) -> int:
    """The bytes of every tensor in `values` (a tensor, or lists, tuples and dicts of them; anything else is 0)."""
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(tensor_bytes(v) for v in values)
    if isinstance(values, dict):
        return sum(tensor_bytes(v) for v in values.values())
    return 0
