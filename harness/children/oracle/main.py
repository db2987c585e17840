"""The oracle process: runs the trusted reference Model and never sees candidate code.

Started by the parent as `python -m harness.children.oracle.main SPEC`. It writes FEED_FILE (what a candidate may see:
init inputs, reference weights, trial inputs, grad_outputs; weights and floating inputs in the run's precision,
harness/shared/precision.py) and TRUTH_FILE (what only the parent sees: reference outputs and gradients, and trial 0's
outputs with each input swapped for another trial's, degenerate.py) into the memfds the parent made for them
(harness/shared/handover.py; files in its folder where there are none), measures the roofline, reports READY with the
problem's metadata, then stays up to time the reference in blocks interleaved with each candidate's
(harness/shared/timer.py) until the parent stops it.
"""
from __future__ import annotations

import copy
import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from harness.children.attribution import profile_forward
from harness.children.oracle.degenerate import swapped_outputs
from harness.children.oracle.pace import gpu_pace_ms
from harness.children.runtime import (
    backward,
    configure_precision,
    fast_saves,
    flatten_outputs,
    save_judged,
    serve_once,
    synchronize,
    to_device,
    to_plain_cpu,
)
from harness.children.timing_server import placed_copies, serve_timing
from harness.shared import commands, protocol
from harness.shared.environment import device_name, exec_source
from harness.shared.messages import Feed, GpuDone, Pace, Rates, ReferenceReady, Roofline, Signal, Spots
from harness.shared.precision import cast_dtype, cast_floating
from harness.shared.problems import ProblemMetadata
from harness.shared.roofline import (
    count_flops,
    floor_ms,
    measure_rates,
    rates_key,
    tensor_bytes,
)
from harness.shared.specs import OracleSpec

FRESH_OFFSET = 100   # fresh input sets are trials 100+ past the last fed one: seeds no fed set uses
FRESH_BYTES = 2**30  # fresh inputs and their outputs kept (in the parent's memory): up to this much beyond 2 sets


def trial_seed(input_seed: int, trial: int) -> int:
    return input_seed + 1000 + trial


def fresh_kept(drawn: int, per_set: int) -> int:
    """How many of `drawn` fresh input sets (inputs and outputs `per_set` bytes each) are kept: as many as fit in
    FRESH_BYTES, but never fewer than two (one a round: a problem of GB-sized sets is where a replay saves the most),
    an even number (two rounds of equal size)."""
    return min(drawn, max(FRESH_BYTES // max(per_set, 1), 2)) // 2 * 2


def main(spec_path: str) -> None:
    state: dict = {}
    serve_once(spec_path, OracleSpec,
               lambda spec, channel, wiring: build_reference(spec, state, channel, wiring.handover), "oracle_error",
               then=lambda channel: serve_reference(channel, state), short_status=protocol.JUDGE_SHORT)


def serve_reference(channel, state: dict) -> None:
    """After READY: time the reference whenever the parent interleaves it with a candidate, until told to stop."""
    model = state["model"]

    def pace(command: commands.Command) -> bool:
        if command != commands.PACE:
            return False
        try:
            ms = gpu_pace_ms() if state["device"] == "cuda" else None
        except Exception as exc:   # evidence only: the drift verdict then stays strict, the reference serves on
            print(f"the GPU pace could not be measured: {exc!r}", file=sys.stderr, flush=True)
            ms = None
        channel.send(Pace(ms))
        return True

    placed = placed_copies(model, lambda: copy.deepcopy(model))   # config `timing_placements`

    while True:
        with torch.no_grad():
            timer = serve_timing(channel, lambda inputs: model(*inputs), state["input_sets"], state["device"],
                                 other=pace, placed=placed)
        if timer is None:
            return
        channel.send(Spots())


class Steps:
    """Seconds per step of the reference's start, reported on READY (the record's `ref_*` phases)."""

    def __init__(self):
        self.began = time.time()   # wall clock: the parent sets it against the moment it started the process
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 4)
        self._last = now


def build_reference(spec: OracleSpec, state: dict, channel: Optional[protocol.ChildChannel] = None,
                    files: Optional[dict] = None) -> ReferenceReady:
    """The CPU work first (the model made, the inputs drawn), then the GPU work, then the files. A `gated` spec
    (a reference started beside evaluations: harness/oracle/reference.py) reports STAGED and waits for CMD_GPU
    before its first GPU work (the truth, which no other process's GPU work changes: the parent lets it run when no
    timing runs), reports GPU_DONE and waits for CMD_GPU again before measuring the device's rates (which another
    process's work would lower: the parent lets it run when no candidate process is alive on the GPU either), then
    GPU_DONE again. `files`: the memfds FEED_FILE and TRUTH_FILE are written into (None: files in spec.out_dir)."""
    steps = Steps()
    device, seed, dtype = spec.device, spec.seed, cast_dtype(spec.precision)
    configure_precision(spec.allow_tf32, spec.device)
    fast_saves()
    module, metadata, init_inputs, model, state_dict = load_reference(spec.problem_path, seed, "cpu", dtype)
    steps.done("load")
    check_grad = spec.check_grad and metadata.check_grad
    trials = draw_trials(module, spec.input_seed, spec.trials, dtype=dtype)
    # Never in the feed: the parent hands them to a candidate one at a time, after its timing (fresh-input check):
    # two rounds' worth, the second for a first round that looks slow (fresh_kept says how many are kept).
    fresh = draw_trials(module, spec.input_seed, 2 * spec.fresh_inputs, dtype=dtype, first=spec.trials + FRESH_OFFSET)
    # Does the output depend on each input? Trial 0 once more per input, that input from another set (degenerate.py).
    other = trials[1] if len(trials) > 1 else draw_trials(module, spec.input_seed, 1, dtype=dtype, first=1)[0]
    steps.done("draw")
    gated = spec.gated and channel is not None
    if gated:
        _wait_for_gpu(channel, Signal(protocol.STAGED))
        steps.done("gate")
    if device == "cuda":
        torch.cuda.init()
    model = model.to(device)
    steps.done("cuda_init")

    def run_all(input_sets: list) -> list:
        with torch.no_grad():
            results = []
            for inputs in input_sets:
                result = flatten_outputs(model(*to_device(inputs, device)))
                synchronize(device)
                results.append([to_plain_cpu(v) for v in result])
            return results

    outputs = run_all(trials)
    per_set = tensor_bytes(trials[0]) + tensor_bytes(outputs[0]) if trials else 0
    fresh = fresh[:fresh_kept(len(fresh), per_set)]
    fresh_outputs = run_all(fresh)
    steps.done("outputs")

    grad_outputs, input_grads, param_grads, has_graph = [], [], {}, False
    if check_grad:
        grad_outputs, input_grads, param_grads, has_graph = _gradients(model, trials[0], device, seed)
    steps.done("gradients")
    swapped = swapped_outputs(model, trials[0], other, device)
    steps.done("swapped")

    input_sets = [to_device(inputs, device) for inputs in trials]
    with torch.no_grad():
        kernels = profile_forward(lambda: model(*input_sets[0]), device, set(), Path(spec.out_dir) / "trace.json")
        steps.done("profile")
        flops = count_flops(lambda: model(*input_sets[0]))
    nbytes = tensor_bytes(trials[0]) + tensor_bytes(state_dict) + tensor_bytes(outputs[0])
    synchronize(device)
    key, rates = rates_key(nbytes, dtype), None
    if gated:   # the parent hands over the rates it measured on this GPU for this size class, if it has them
        rates = _wait_for_gpu(channel, GpuDone(rates_key=key)).rates
        steps.done("quiet")
    measured = rates is None
    if measured:
        rates = measure_rates(device, nbytes, dtype)
    synchronize(device)
    steps.done("roofline")
    if gated:
        channel.send(GpuDone())

    feed = Feed(init_inputs, state_dict, trials, grad_outputs).to_file()
    save_judged(feed, protocol.FEED_FILE, files, Path(spec.out_dir), tensor_bytes(feed))
    truth = {"outputs": outputs, "input_grads": input_grads, "param_grads": param_grads, "has_graph": has_graph,
             "fresh_inputs": fresh, "fresh_outputs": fresh_outputs, "swapped": swapped}
    save_judged(truth, protocol.TRUTH_FILE, files, Path(spec.out_dir), tensor_bytes(truth))
    steps.done("save")

    state.update(model=model, input_sets=input_sets, device=device)
    return ReferenceReady(device_name=device_name(device), metadata=dataclasses.asdict(metadata),
                          check_grad=check_grad, ref_kernels=kernels.library,
                          roofline=Roofline(flops, nbytes, Rates(rates["bandwidth_gbps"], rates["fp32_tflops"])),
                          floor_ms=floor_ms(flops, nbytes, rates), began=steps.began, steps=steps.seconds,
                          rates_key=key, rates_measured=measured)


def _wait_for_gpu(channel: protocol.ChildChannel, event) -> commands.GpuGo:
    """Send `event` and wait for CMD_GPU; the command."""
    channel.send(event)
    command = commands.parse(channel.receive())
    if not isinstance(command, commands.GpuGo):
        raise RuntimeError("the judge did not let the reference's GPU work go on")
    return command


def load_reference(problem_path: str, seed: int, device: str, dtype: Optional[torch.dtype] = None):
    """(module, metadata, init_inputs, model on `device`, CPU state_dict) with weights seeded by `seed`, then cast to
    `dtype` (floating-point parameters and buffers; None: as the problem builds them)."""
    module = exec_source(Path(problem_path).read_text(), problem_path, "reference_problem")
    metadata = ProblemMetadata.from_module(module, problem_path)
    torch.manual_seed(seed)
    init_inputs = list(module.get_init_inputs())
    torch.manual_seed(seed)
    model = module.Model(*init_inputs)
    if dtype is not None:
        model = model.to(dtype)
    state_dict = {k: to_plain_cpu(v) for k, v in model.state_dict().items()}
    return module, metadata, init_inputs, model.to(device), state_dict


def draw_trials(module, input_seed: int, count: int, plain_cpu: bool = True,
                dtype: Optional[torch.dtype] = None, first: int = 0) -> list[list]:
    """`count` input sets from get_inputs, each under its own seed (trials `first`, `first` + 1, ...; as plain CPU
    values unless told otherwise), their floating-point tensors cast to `dtype` once drawn (None: as drawn)."""
    trials = []
    for trial in range(first, first + count):
        torch.manual_seed(trial_seed(input_seed, trial))
        inputs = cast_floating(list(module.get_inputs()), dtype)
        trials.append([to_plain_cpu(v) if plain_cpu and isinstance(v, torch.Tensor) else v for v in inputs])
    return trials


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
    backward(pairs)
    synchronize(device)
    input_grads = [to_plain_cpu(x.grad) if isinstance(x, torch.Tensor) and x.grad is not None else None
                   for x in leaves]
    param_grads = {name: to_plain_cpu(p.grad) for name, p in model.named_parameters() if p.grad is not None}
    return grad_outputs, input_grads, param_grads, True


if __name__ == "__main__":
    main(sys.argv[1])
