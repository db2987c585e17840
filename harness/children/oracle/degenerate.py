"""Degenerate problems, the oracle's half: the reference once more per input tensor, with that input taken from another
trial and the others as in trial 0 (one forward per input), at the reference's start. The parent's half,
harness/integrity/degenerate.py, reads what these outputs say about the problem.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from harness.children.runtime import (
    flatten_outputs,
    synchronize,
    to_device,
    to_plain_cpu,
)


def swapped_outputs(model, trial: list[Any], other: list[Any], device: str,
                    keep: Callable[[Any], Any] = to_plain_cpu) -> list[Optional[list]]:
    """Per input of `trial`: the reference's outputs (plain CPU, or as `keep` keeps them) with that input replaced by
    `other`'s, the rest unchanged; None where the input is not a tensor, or `other` holds the same value (nothing to
    tell)."""
    probes: list[Optional[list]] = []
    for index, (mine, theirs) in enumerate(zip(trial, other)):
        if not (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor)) or mine.shape != theirs.shape \
                or mine.dtype != theirs.dtype or torch.equal(mine, theirs):
            probes.append(None)
            continue
        inputs = list(trial)
        inputs[index] = theirs
        try:
            with torch.no_grad():
                result = flatten_outputs(model(*to_device(inputs, device)))
            synchronize(device)
        except (RuntimeError, ValueError, IndexError):   # a probe only: a reference may refuse mixed trials
            probes.append(None)
            continue
        probes.append([keep(value) for value in result])
    return probes
