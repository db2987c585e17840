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
        constant = _constant_like(output) if _a_constant_may_fit(output, tolerance) else None
        if trials > 1 and constant is not None and all(_passes(constant, value, tolerance) for value in column):
            found.append(f"output {position}: the constant {_value(constant)} passes on all {trials} trials")
            independent += 1
        elif trials > 1 and all(_passes(output, value, tolerance) for value in column[1:]):
            found.append(f"output {position}: trial 0's output passes on all {trials} trials")
            independent += 1
        elif all(_comparable(value) and _a_constant_may_fit(value, tolerance)
                 and _passes(_constant_like(value), value, tolerance) for value in column):
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


# Outputs larger than this are first compared on an evenly spaced sample of this many elements: the check passes
# only where every element is within tolerance, so a sample that fails settles it (the usual answer: a problem's
# output depends on its inputs), and only a sample that passes is followed by the whole comparison. A level-2
# problem's five 2 GB outputs took over 20 s compared whole on the judge's CPU threads.
SAMPLE_ELEMENTS = 1 << 16


def _constant_like(output: torch.Tensor) -> torch.Tensor:
    """The output's mean (floating point, summed in float64 without a float64 copy) or first element (anything
    else), as a 0-dim tensor of the output's dtype: `_passes` spreads it to the shape it compares."""
    if output.is_floating_point():
        return torch.tensor(float(output.mean(dtype=torch.float64)), dtype=output.dtype)
    return output.flatten()[0].clone()


def _a_constant_may_fit(value: torch.Tensor, tolerance: Tolerance) -> bool:
    """False where no constant can pass against `value`, as its sample shows: the check asks |c - r| <= atol +
    rtol * |r| of every element r, so each sampled r allows c only within its own interval, and intervals that do not
    meet leave none (with a margin of float32 rounding: a constant that fits is never ruled out). Spares the mean of
    a large output whose values spread (nearly every problem's)."""
    if not value.is_floating_point() or value.is_complex():
        return True
    atol, rtol = tolerance.for_dtype(value.dtype)
    sample = _sample(value, max(1, value.numel() // SAMPLE_ELEMENTS)).double()
    allowed = sample.abs() * rtol + atol
    lowest_top, highest_bottom = float((sample + allowed).min()), float((sample - allowed).max())
    slack = 1e-6 * float(sample.abs().max()) + 1e-3 * atol
    return not highest_bottom > lowest_top + slack   # NaN (a non-finite sample) leaves it to the whole check


def _sample(value: torch.Tensor, step: int) -> torch.Tensor:
    return value.reshape(-1)[::step]


def _passes(candidate: torch.Tensor, reference: Any, tolerance: Tolerance) -> bool:
    """`candidate` (a tensor, or a 0-dim constant from `_constant_like` standing for one of every element) in place
    of `reference` would pass the output check."""
    if not isinstance(reference, torch.Tensor) or candidate.dtype != reference.dtype:
        return False
    constant = candidate.dim() == 0
    if not constant and candidate.shape != reference.shape:
        return False
    step = max(1, reference.numel() // SAMPLE_ELEMENTS)
    if step > 1:
        sample = _sample(reference, step)
        spread = candidate.expand(sample.shape) if constant else _sample(candidate, step)
        if not compare(spread, sample, tolerance, figures=False).ok:
            return False
    whole = torch.full_like(reference, candidate.item()) if constant else candidate
    return compare(whole, reference, tolerance, figures=False).ok


def _value(constant: torch.Tensor) -> str:
    return f"{constant.reshape(-1)[0].item():.4g}"
