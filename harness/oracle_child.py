"""The oracle process: runs the trusted reference Model and never sees candidate code.

Started by the parent as `python -m harness.oracle_child SPEC`. It writes FEED_FILE (what a candidate may see:
init inputs, reference weights, trial inputs, grad_outputs) and TRUTH_FILE (what only the parent sees: reference
outputs and gradients), times the reference if asked, then reports READY with the problem's metadata.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from harness import protocol
from harness.child_runtime import (
    configure_precision,
    device_name,
    exec_source,
    flatten_outputs,
    serve_once,
    synchronize,
    to_device,
    to_plain_cpu,
)
from harness.kernels import profile_forward
from harness.problems import ProblemMetadata
from harness.roofline import count_flops, floor_ms, measure_rates, tensor_bytes
from harness.timing import bench


def trial_seed(input_seed: int, trial: int) -> int:
    return input_seed + 1000 + trial


def main(spec_path: str) -> None:
    serve_once(spec_path, build_reference, "oracle_error")


def build_reference(spec: dict) -> dict:
    device, seed = spec["device"], spec["seed"]
    configure_precision(spec["allow_tf32"], spec["device"])
    source = Path(spec["problem_path"]).read_text()
    module = exec_source(source, spec["problem_path"], "reference_problem")
    metadata = ProblemMetadata.from_module(module, spec["problem_path"])
    check_grad = spec["check_grad"] and metadata.check_grad

    torch.manual_seed(seed)
    init_inputs = list(module.get_init_inputs())
    torch.manual_seed(seed)
    model = module.Model(*init_inputs)
    state_dict = {k: to_plain_cpu(v) for k, v in model.state_dict().items()}
    model = model.to(device)

    trials = []
    for trial in range(spec["trials"]):
        torch.manual_seed(trial_seed(spec["input_seed"], trial))
        trials.append([to_plain_cpu(v) if isinstance(v, torch.Tensor) else v for v in module.get_inputs()])

    outputs = []
    with torch.no_grad():
        for inputs in trials:
            result = flatten_outputs(model(*to_device(inputs, device)))
            synchronize(device)
            outputs.append([to_plain_cpu(v) for v in result])

    grad_outputs, input_grads, param_grads, has_graph = [], [], {}, False
    if check_grad:
        grad_outputs, input_grads, param_grads, has_graph = _gradients(model, trials[0], device, seed)

    torch.save({"init_inputs": init_inputs, "state_dict": state_dict, "trials": trials,
                "grad_outputs": grad_outputs}, Path(spec["out_dir"]) / protocol.FEED_FILE)
    torch.save({"outputs": outputs, "input_grads": input_grads, "param_grads": param_grads,
                "has_graph": has_graph}, Path(spec["out_dir"]) / protocol.TRUTH_FILE)

    input_sets = [to_device(inputs, device) for inputs in trials]
    with torch.no_grad():
        kernels = profile_forward(lambda: model(*input_sets[0]), device, set(), Path(spec["out_dir"]) / "trace.json")
        flops = count_flops(lambda: model(*input_sets[0]))
    nbytes = tensor_bytes(trials[0]) + tensor_bytes(state_dict) + tensor_bytes(outputs[0])
    rates = measure_rates(device, nbytes)

    timing = None
    if spec["time"]:
        with torch.no_grad():
            timing = bench(lambda inputs: model(*inputs), input_sets, device, **spec["timing"]).to_dict()

    floor = floor_ms(flops, nbytes, rates)
    if timing is not None and floor > timing["median_ms"]:
        floor = None   # the reference beat the floor: the rates were mismeasured, and no floor beats a wrong one
    return {"device_name": device_name(device), "timing": timing, "metadata": dataclasses.asdict(metadata),
            "check_grad": check_grad, "ref_kernels": kernels.library, "flops": flops, "bytes": nbytes,
            "rates": rates, "floor_ms": floor}


def _gradients(model, inputs, device, seed):
    """Backward once on trial 0 with a seeded random grad_output per floating-point output."""
    model.zero_grad(set_to_none=True)
    leaves = to_device(inputs, device, requires_grad=True)
    results = flatten_outputs(model(*leaves))
    generator = torch.Generator().manual_seed(seed + 7)
    grad_outputs, pairs = [], []
    for result in results:
        if isinstance(result, torch.Tensor) and result.is_floating_point() and result.requires_grad:
            grad = torch.randn(result.shape, dtype=result.dtype, generator=generator)
            grad_outputs.append(grad)
            pairs.append((result, grad.to(device)))
        else:
            grad_outputs.append(None)
    if not pairs:
        return grad_outputs, [], {}, False
    torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
    synchronize(device)
    input_grads = [to_plain_cpu(x.grad) if isinstance(x, torch.Tensor) and x.grad is not None else None
                   for x in leaves]
    param_grads = {name: to_plain_cpu(p.grad) for name, p in model.named_parameters() if p.grad is not None}
    return grad_outputs, input_grads, param_grads, True


if __name__ == "__main__":
    main(sys.argv[1])
