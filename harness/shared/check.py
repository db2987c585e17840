"""The verdict on outputs and gradients: pure functions over tensors, run in the parent.

The tensors arrive on the CPU (the candidate's result file, the oracle's truth); `on` (a CUDA device) moves each
chunk there first, so the arithmetic runs on the GPU (the config's `compare_on_gpu`). The figures are the same
either way: every step is an elementwise IEEE operation or a max.

Closeness is torch.allclose's rule, |candidate - reference| <= atol + rtol * |reference| elementwise, except that a
NaN or Inf on either side never passes: not in the candidate (whatever the reference holds), and not where the
reference holds one (as written, the rule lets any finite value pass against an infinite reference, since
inf <= atol + rtol * inf). Which atol and rtol: the config's when set,
else the problem's ATOL/RTOL, else the default of the output's dtype or of the run's precision, whichever is looser
(the defaults per precision are the config's `tolerances`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from harness.shared.config import DEFAULT_TOLERANCES, PrecisionTolerance
from harness.shared.precision import name_of
from harness.shared.record import Status

if TYPE_CHECKING:
    from harness.shared.messages import CandidateResult, Truth

def _table(tolerances: tuple[tuple[str, PrecisionTolerance], ...], gradients: bool) -> tuple:
    """((precision, atol, rtol), ...) for outputs or for gradients, from a config's `tolerances`."""
    return tuple((name, t.grad_atol, t.grad_rtol) if gradients else (name, t.atol, t.rtol) for name, t in tolerances)


@dataclass(frozen=True)
class Tolerance:
    atol: Optional[float] = None   # set (the config's, else the problem's): every output's, whatever its dtype
    rtol: Optional[float] = None
    defaults: tuple = _table(DEFAULT_TOLERANCES, gradients=False)   # (precision, atol, rtol) per precision
    precision: str = "fp32"        # the run's: no output's default is tighter than this precision's

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        """An fp16 output in an fp32 run gets fp16's default; an fp32 output in a bf16 run gets bf16's (its inputs
        and weights were rounded to bf16)."""
        table = {name: (atol, rtol) for name, atol, rtol in self.defaults}
        own, run = table[name_of(dtype)], table[self.precision]
        atol, rtol = max(own[0], run[0]), max(own[1], run[1])
        return (atol if self.atol is None else self.atol, rtol if self.rtol is None else self.rtol)

    def loosest(self, outputs: list[Any]) -> tuple[float, float]:
        """(atol, rtol) applied to the loosest of `outputs` (the reference's): what a record shows."""
        pairs = [self.for_dtype(t.dtype) for t in outputs if isinstance(t, torch.Tensor)] or [
            self.for_dtype(torch.float32)]
        return max(atol for atol, _ in pairs), max(rtol for _, rtol in pairs)

    @classmethod
    def for_outputs(cls, atol: Optional[float] = None, rtol: Optional[float] = None,
                    tolerances: tuple = DEFAULT_TOLERANCES, precision: str = "fp32") -> "Tolerance":
        return cls(atol, rtol, _table(tolerances, gradients=False), precision)

    @classmethod
    def for_gradients(cls, atol: Optional[float] = None, rtol: Optional[float] = None,
                      tolerances: tuple = DEFAULT_TOLERANCES, precision: str = "fp32") -> "Tolerance":
        return cls(atol, rtol, _table(tolerances, gradients=True), precision)


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_error: Optional[float]
    max_rel_error: Optional[float]
    tolerance_needed: float = 0.0   # smallest t with |c - r| <= t + t * |r| everywhere (inf: non-finite values)


@dataclass(frozen=True)
class OutputVerdict:
    status: Optional[Status]   # None: every trial within tolerance
    error: Optional[str]
    max_abs_error: Optional[float]
    max_rel_error: Optional[float]
    tolerance_needed: Optional[float] = None   # over every trial and output (None: shapes or types differ)


@dataclass(frozen=True)
class GradVerdict:
    correct: Optional[bool]              # None: nothing to compare (the reference has no gradients)
    error: Optional[str]
    max_abs_error: Optional[float]
    compared: int
    not_comparable: tuple[str, ...]      # candidate parameters with no reference counterpart (name and shape)


# torch's CPU threads in a process that judges (the parent: every comparison runs there). At the default, one per
# core, every operation of a comparison waits for its slowest thread, and on a GPU host whose cores also run the
# children (a candidate started ahead importing torch, the reference) one of 16 is always late, and a large
# output's comparison takes seconds with every thread busy all along.
HOST_THREADS = 4


def limit_host_threads() -> None:
    """At most HOST_THREADS torch CPU threads in this process (fewer stay as they are)."""
    if torch.get_num_threads() > HOST_THREADS:
        torch.set_num_threads(HOST_THREADS)


COMPARE_CHUNK = 1 << 20  # elements per step: temporaries of a few MB stay in the CPU's cache (16x larger chunks
                         # streamed each of the passes below from memory: 2x slower) and memory stays bounded
DEVICE_CHUNK = 1 << 22   # on a GPU: each chunk one copy there and a few kernels; its temporaries (about 100 MB)
                         # stay cached in this process on a GPU that candidates use too


def compare(candidate: torch.Tensor, reference: torch.Tensor, tolerance: Tolerance, figures: bool = True,
            on: Optional[torch.device] = None) -> Comparison:
    """Same shape and dtype assumed. Floating tensors of 32 bits or fewer are compared in float32 (the difference of
    two close floats is exact there), anything else in float64; chunked so memory stays bounded. `figures` False:
    the verdict and the largest absolute error only (max_rel_error None, tolerance_needed 0: two passes fewer, for
    comparisons whose other figures no record shows). `on`: the device the chunks are compared on (None: where
    they are). Complex tensors: their real and imaginary parts, each under the rule."""
    atol, rtol = tolerance.for_dtype(reference.dtype)
    if reference.is_complex():   # real and imaginary parts each (a cast to a real dtype would drop the imaginary)
        candidate, reference = torch.view_as_real(candidate), torch.view_as_real(reference)
    work = torch.float32 if reference.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float64
    cand_flat, ref_flat = candidate.reshape(-1), reference.reshape(-1)
    finite, within, max_abs, max_rel, needed = True, True, 0.0, None, 0.0
    step = COMPARE_CHUNK if on is None else DEVICE_CHUNK
    for start in range(0, cand_flat.numel(), step):
        cand = cand_flat[start:start + step].to(device=on, dtype=work)
        ref = ref_flat[start:start + step].to(device=on, dtype=work)
        chunk = _compare_finite(cand, ref, atol, rtol, figures)
        if chunk is None:   # a NaN or an infinity on either side: the exact rules below
            chunk = _compare_any(cand, ref, atol, rtol, figures)
        chunk_finite, chunk_within, chunk_abs, chunk_rel, chunk_needed = chunk
        finite, within = finite and chunk_finite, within and chunk_within
        max_abs, needed = max(max_abs, chunk_abs), max(needed, chunk_needed)
        if chunk_rel is not None:
            max_rel = chunk_rel if max_rel is None else max(max_rel, chunk_rel)
    return Comparison(finite and within, max_abs, max_rel, needed if finite else float("inf"))


def _compare_finite(cand: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float,
                    figures: bool = True) -> Optional[tuple]:
    """One chunk where both sides are finite everywhere (the usual case, in fewer passes), else None. A finite
    largest |cand - ref| proves it: a NaN or an infinity on either side makes that NaN or infinite."""
    diff = torch.sub(cand, ref).abs_()
    largest = float(diff.max()) if diff.numel() else 0.0
    if not math.isfinite(largest):
        return None
    ref_abs = ref.abs()
    within = bool(torch.le(diff, ref_abs.mul(rtol).add_(atol)).all())
    if not figures:
        return True, within, largest, None, 0.0
    needed = float(torch.div(diff, ref_abs.add(1.0)).max()) if diff.numel() else 0.0
    zero = ref_abs == 0
    rel = None
    if not bool(zero.all()):
        rel = float(torch.div(diff, ref_abs).masked_fill_(zero, 0.0).max())
    return True, within, largest, rel, needed


def _compare_any(cand: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, figures: bool = True) -> tuple:
    """One chunk, NaN and infinities included: a non-finite value on either side is an infinite difference that
    no tolerance covers."""
    cand_finite = torch.isfinite(cand)
    finite = bool(cand_finite.all())
    diff = torch.where(cand_finite, (cand - ref).abs(), torch.full_like(cand, float("inf")))
    diff = torch.nan_to_num(diff, nan=float("inf"), posinf=float("inf"))
    largest = float(diff.max())
    ref_abs = ref.abs()
    within = bool(((diff <= atol + rtol * ref_abs) & torch.isfinite(ref)).all())
    if not figures:
        return finite, within, largest, None, 0.0
    needed = float((diff / (1.0 + ref_abs)).max()) if diff.numel() else 0.0
    rel = None
    if bool((ref_abs > 0).any()):
        rel = float(torch.where(ref_abs > 0, diff / ref_abs, 0.0).max())
    return finite, within, largest, rel, needed


def output_signature(outputs: list) -> tuple:
    """Per output, (shape, dtype name) of a tensor and None for anything else: what check_outputs looks at before
    the values. A candidate's first trial whose signature differs from the reference's is decided by that trial
    alone (its count, type, shape or dtype), so its process stops its checks there."""
    return tuple((tuple(int(d) for d in v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else None
                 for v in outputs)


def check_outputs(trials: list[list[Any]], references: list[list[Any]], tolerance: Tolerance,
                  figures: bool = True, on: Optional[torch.device] = None) -> OutputVerdict:
    """Every trial's outputs against the reference's: count, type, shape, dtype, then values (`figures`, `on`: as
    for compare)."""
    worst_abs: Optional[float] = None
    worst_rel: Optional[float] = None
    for index, (outputs, expected) in enumerate(zip(trials, references)):
        if len(outputs) != len(expected):
            return OutputVerdict(Status.SHAPE_MISMATCH, f"{len(outputs)} outputs, expected {len(expected)}",
                                 None, None)
        for position, (out, ref) in enumerate(zip(outputs, expected)):
            if not isinstance(out, torch.Tensor):
                kind = out.get("not_a_tensor", "?") if isinstance(out, dict) else type(out).__name__
                return OutputVerdict(Status.SHAPE_MISMATCH, f"output {position} is a {kind}, not a tensor",
                                     None, None)
            if out.shape != ref.shape:
                return OutputVerdict(Status.SHAPE_MISMATCH,
                                     f"output {position} shape {tuple(out.shape)}, expected {tuple(ref.shape)}",
                                     None, None)
            if out.dtype != ref.dtype:
                return OutputVerdict(Status.DTYPE_MISMATCH, f"output {position} dtype {out.dtype}, expected "
                                     f"{ref.dtype}", None, None)
    error: Optional[str] = None
    error_abs = -1.0
    needed = 0.0
    for index, (outputs, expected) in enumerate(zip(trials, references)):
        for position, (out, ref) in enumerate(zip(outputs, expected)):
            result = compare(out, ref, tolerance, figures, on)
            worst_abs = _worst(worst_abs, result.max_abs_error)
            worst_rel = _worst(worst_rel, result.max_rel_error)
            needed = max(needed, result.tolerance_needed)
            if not result.ok and result.max_abs_error > error_abs:   # the worst failing one: the record's figure
                error_abs = result.max_abs_error
                atol, rtol = tolerance.for_dtype(ref.dtype)
                problem = "non-finite values" if result.max_abs_error == float("inf") else (
                    f"max abs error {result.max_abs_error:.3g}")
                error = f"trial {index} output {position}: {problem} (atol {atol:g}, rtol {rtol:g})"
    return OutputVerdict(Status.INCORRECT if error else None, error, worst_abs, worst_rel, needed)


def check_repeat(first: list[torch.Tensor], repeat: list[Any], tolerance: Tolerance,
                 on: Optional[torch.device] = None) -> Optional[str]:
    """The same input twice must agree within tolerance; returns what differs, or None."""
    if len(repeat) != len(first):   # the result file is the candidate's: a short list must not skip the check
        return f"the repeated input gave {len(repeat)} outputs, the first run {len(first)}"
    for position, (a, b) in enumerate(zip(first, repeat)):
        if not isinstance(b, torch.Tensor) or b.shape != a.shape or b.dtype != a.dtype:
            return f"output {position} changed type, shape or dtype on the repeated input"
        result = compare(b, a, tolerance, figures=False, on=on)
        if not result.ok:
            return f"output {position} differs by {result.max_abs_error:.3g} on the repeated input"
    return None


def check_grads(candidate: "CandidateResult", truth: "Truth", tolerance: Tolerance,
                on: Optional[torch.device] = None) -> GradVerdict:
    """Gradients of the floating-point inputs, and of parameters whose name and shape match the reference's. When
    none of them could be compared (parameters all renamed, no input gradient), `correct` is None: not measured."""
    if not truth.has_graph:
        return GradVerdict(None, None, None, 0, ())
    cand_params = candidate.param_grads or {}
    not_comparable = tuple(sorted(name for name, grad in cand_params.items()
                                  if name not in truth.param_grads
                                  or (isinstance(grad, torch.Tensor) and grad.shape != truth.param_grads[name].shape)))
    if candidate.grad_error:
        return GradVerdict(False, f"backward raised {candidate.grad_error}", None, 0, not_comparable)
    if not candidate.has_graph:
        return GradVerdict(False, "the output has no autograd graph", None, 0, not_comparable)
    given = list(candidate.input_grads or [])   # one per input; a short list leaves the rest missing, not skipped
    given += [None] * (len(truth.input_grads) - len(given))
    pairs = [(f"input {i}", c, r) for i, (c, r) in enumerate(zip(given, truth.input_grads))
             if c is not None or r is not None]
    pairs += [(f"parameter {name}", cand_params.get(name), ref) for name, ref in truth.param_grads.items()
              if name in cand_params and name not in not_comparable]
    worst: Optional[float] = None
    failure: Optional[str] = None
    for label, cand, ref in pairs:
        if cand is None or ref is None:
            failure = failure or f"{label}: gradient {'missing' if cand is None else 'unexpected'}"
            continue
        if not isinstance(cand, torch.Tensor):   # the candidate's result file is untrusted
            failure = failure or f"{label}: gradient is not a tensor"
            continue
        if cand.shape != ref.shape:
            failure = failure or f"{label}: gradient shape {tuple(cand.shape)}, expected {tuple(ref.shape)}"
            continue
        result = compare(cand, ref, tolerance, figures=False, on=on)
        worst = _worst(worst, result.max_abs_error)
        if not result.ok and failure is None:
            failure = f"{label}: max abs error {result.max_abs_error:.3g}"
    if not pairs:   # nothing the reference has a gradient for was given under its name: not measured, not correct
        return GradVerdict(None, None, None, 0, not_comparable)
    return GradVerdict(failure is None, failure, worst, len(pairs), not_comparable)


def _worst(current: Optional[float], new: Optional[float]) -> Optional[float]:
    if new is None:
        return current
    return new if current is None else max(current, new)
