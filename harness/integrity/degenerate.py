"""Degenerate problems: a reference whose output does not depend on its inputs (a constant passes), or not on one of
them. A candidate there can skip the work it was asked to do and still be right, so its speedup says little about
its kernels (KernelBench level2/80 subtracts a mean over a single column: every output is 0).

The parent's half, pure, over the reference's outputs (CPU tensors) and the oracle's swapped-input outputs
(harness/children/oracle/degenerate.py) with the run's output tolerance: what `evidence` returns becomes the
`degenerate_problem` finding on every record judged against this reference. It is information about the problem,
never a verdict on the submission (no profile forbids it).
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from harness.shared.check import Tolerance, compare

EVIDENCE_CHARS = 300   # as messages.EVIDENCE_CHARS: what one finding's evidence may hold

def evidence(outputs: list[list], swapped: list[Optional[list]], tolerance: Tolerance) -> Optional[str]:
    """What makes the problem degenerate, or None. `outputs`: per trial, the reference's outputs; `swapped`: per
    input, the outputs of trial 0 with that input from another trial (None: not probed)."""
    if not outputs:
        return None
    first, trials = outputs[0], len(outputs)
    found: list[str] = []
    independent = 0
    for position, output in enumerate(first):
        if not _comparable(output):
            continue
        column = [trial[position] if position < len(trial) else None for trial in outputs]
        constant = _constant_like(output)
        if trials > 1 and all(_passes(constant, value, tolerance) for value in column):
            found.append(f"output {position}: the constant {_value(constant)} passes on all {trials} trials")
            independent += 1
        elif trials > 1 and all(_passes(output, value, tolerance) for value in column[1:]):
            found.append(f"output {position}: trial 0's output passes on all {trials} trials")
            independent += 1
        elif all(_comparable(value) and _passes(_constant_like(value), value, tolerance) for value in column):
            found.append(f"output {position}: one value repeated on every trial (a tensor of its mean passes)")
    tensors = [p for p, output in enumerate(first) if _comparable(output)]
    if tensors and independent < len(tensors):   # where no output depends on the inputs, each input says no more
        for index, probe in enumerate(swapped):
            if probe is not None and len(probe) == len(first) and all(
                    _passes(first[p], probe[p], tolerance) for p in tensors):
                found.append(f"no output depends on input {index}: taken from another trial, it changes none")
    if not found:
        return None
    text = "; ".join(found)
    return text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS - 3] + "..."


def _comparable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() > 0 and not value.is_complex()


def _constant_like(output: torch.Tensor) -> torch.Tensor:
    """The output's mean (floating point) or first element (anything else) everywhere."""
    if output.is_floating_point():
        return torch.full_like(output, float(output.double().mean()))
    return torch.full_like(output, output.flatten()[0].item())


def _passes(candidate: torch.Tensor, reference: Any, tolerance: Tolerance) -> bool:
    """`candidate` in place of `reference` would pass the output check."""
    return (isinstance(reference, torch.Tensor) and candidate.shape == reference.shape
            and candidate.dtype == reference.dtype and compare(candidate, reference, tolerance).ok)


def _value(constant: torch.Tensor) -> str:
    return f"{constant.flatten()[0].item():.4g}"
