"""Inspects one reference problem in its own process (trusted problem code only; no candidate ever runs here).

Started by the parent as `python -m harness.children.oracle.problem_check SPEC`. Runs the reference once (forward twice
on the same input, one backward), times the eager forward and reports plain numbers with READY (a ProblemCheckReady,
harness/shared/messages.py): what each output looks like, whether a zero or constant tensor would pass the tolerance,
whether two runs agree, memory, eager time. The reference is cast to the run's precision as in the oracle
(harness/shared/precision.py), and judged by its tolerance.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import replace
from pathlib import Path

import torch

from harness.children.runtime import (
    configure_precision,
    flatten_outputs,
    serve_once,
    synchronize,
    to_device,
)
from harness.shared.check import Tolerance, compare
from harness.shared.environment import device_name, exec_source
from harness.shared.messages import ProblemCheckReady, ReferenceGrad, ReferenceOutput
from harness.shared.precision import cast_dtype, cast_floating
from harness.shared.problems import ProblemMetadata
from harness.shared.rule import Rule
from harness.shared.specs import ProblemCheckSpec
from harness.shared.timer import bench


def main(spec_path: str) -> None:
    serve_once(spec_path, ProblemCheckSpec, lambda spec, channel, wiring: inspect_problem(spec), "problem_error")


def inspect_problem(spec: ProblemCheckSpec) -> ProblemCheckReady:
    device, seed, dtype = spec.device, spec.seed, cast_dtype(spec.precision)
    configure_precision(spec.allow_tf32, spec.device)
    module = exec_source(Path(spec.problem_path).read_text(), spec.problem_path, "reference_problem")
    metadata = ProblemMetadata.from_module(module, spec.problem_path)
    tolerance = Tolerance(metadata.atol, metadata.rtol, spec.tolerances, spec.precision)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(seed)
    model = module.Model(*module.get_init_inputs())
    model = (model.to(dtype) if dtype is not None else model).to(device)
    torch.manual_seed(seed + 1000)
    inputs = to_device(cast_floating(list(module.get_inputs()), dtype), device)

    with torch.no_grad():
        first = flatten_outputs(model(*inputs))
        second = flatten_outputs(model(*inputs))
    synchronize(device)
    outputs = [_describe(a, b, tolerance) for a, b in zip(first, second)]
    del second

    grad = ReferenceGrad(metadata.check_grad)
    tensor_bytes = sum(_nbytes(t) for t in [*inputs, *first, *model.parameters(), *model.buffers()])
    del first
    if metadata.check_grad:
        model.zero_grad(set_to_none=True)
        leaves = to_device(inputs, device, requires_grad=True)
        results = [r for r in flatten_outputs(model(*leaves)) if isinstance(r, torch.Tensor)]
        graph = [r for r in results if r.requires_grad]
        grad = ReferenceGrad(True, bool(graph) and len(graph) == len([r for r in results if r.is_floating_point()]))
        if graph:
            torch.autograd.backward(graph, [torch.randn_like(r) for r in graph])
            synchronize(device)
            grad = replace(grad, params_without_grad=tuple(n for n, p in model.named_parameters() if p.grad is None))
            tensor_bytes += sum(_nbytes(p.grad) for p in model.parameters() if p.grad is not None)
            tensor_bytes += sum(_nbytes(x.grad) for x in leaves if isinstance(x, torch.Tensor) and x.grad is not None)
        del leaves, results, graph

    with torch.no_grad():
        timing = bench(lambda values: model(*values), [inputs], device, Rule(**spec.rule), l2_flush=spec.l2_flush,
                       host_ahead=spec.host_ahead)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return ProblemCheckReady(device_name=device_name(device), metadata=dataclasses.asdict(metadata),
                             inputs=tuple(_shape(v) for v in inputs), outputs=tuple(outputs),
                             eager_ms=timing.median_ms, eager_iqr_ms=timing.iqr_ms, tensor_mb=tensor_bytes / 2**20,
                             peak_mb=peak / 2**20 if peak is not None else None, grad=grad)


def _describe(output, again, tolerance: Tolerance) -> ReferenceOutput:
    if not isinstance(output, torch.Tensor):
        return ReferenceOutput(shape=None, dtype=type(output).__name__)
    shape, dtype = tuple(output.shape), str(output.dtype).removeprefix("torch.")
    if not output.is_floating_point():
        same = isinstance(again, torch.Tensor) and torch.equal(output, again)
        return ReferenceOutput(shape, dtype, finite=True, zero_passes=bool((output == 0).all()),
                               constant_passes=bool((output == output.flatten()[0]).all()), repeat_agrees=same,
                               repeat_bitwise=same, std=None)
    reference = output.float() if output.dtype in (torch.float16, torch.bfloat16) else output
    constant = torch.full_like(output, float(reference.double().mean()) if output.numel() else 0.0)
    repeat = compare(again, output, tolerance) if isinstance(again, torch.Tensor) else None
    return ReferenceOutput(shape, dtype, finite=bool(torch.isfinite(output).all()),
                           zero_passes=compare(torch.zeros_like(output), output, tolerance).ok,
                           constant_passes=compare(constant, output, tolerance).ok,
                           repeat_agrees=bool(repeat and repeat.ok),
                           repeat_bitwise=bool(isinstance(again, torch.Tensor) and torch.equal(again, output)),
                           std=float(reference.double().std()) if output.numel() > 1 else 0.0)


def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return repr(value)


def _nbytes(value) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


if __name__ == "__main__":
    main(sys.argv[1])
