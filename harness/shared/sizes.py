"""Bytes of tensors, however nested, and how many of them fit a budget: light enough for the candidate's process (no
profiler or FLOP counter)."""
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


def fitting(count: int, each_bytes: int, budget_bytes: int, least: int) -> int:
    """How many of `count` items of `each_bytes` to keep: as many as fit in `budget_bytes`, never fewer than `least`
    nor more than `count` (all of them where their size is unknown, 0)."""
    if each_bytes <= 0:
        return count
    return min(count, max(budget_bytes // each_bytes, least))
