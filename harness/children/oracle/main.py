"""The oracle process: runs the trusted reference Model and never sees candidate code.

Started by the parent as `python -m harness.children.oracle.main SPEC`. It writes FEED_FILE (what a candidate may see:
init inputs, reference weights, trial inputs, grad_outputs; weights and floating inputs in the run's precision,
harness/shared/precision.py) and TRUTH_FILE (what only the parent sees: reference outputs, whether they have an
autograd graph, and trial 0's outputs with each input swapped for another trial's, degenerate.py) into the memfds the
parent made for them (harness/shared/handover.py; files in its folder where there are none), measures the roofline,
reports READY with the problem's metadata, then stays up to time the reference in blocks interleaved with each
candidate's (harness/shared/timer.py) until the parent stops it. Its backward runs only when the parent asks for the
gradients (CMD_GRADIENTS: GRADIENTS_FILE), and the fresh input sets are drawn and run only when it asks for them
(CMD_FRESH_SETS: FRESH_SETS_FILE), each once per process.
On a GPU the input sets are drawn there (the feed and the truth get CPU copies); on the CPU device, on the host.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from harness.children.attribution import profile_forward
from harness.children.oracle.degenerate import swapped_outputs
from harness.children.oracle.pace import gpu_pace_ms
from harness.children.runtime import (
    backward,
    configure_precision,
    draw_grad_outputs,
    fast_saves,
    flatten_outputs,
    grad_output_specs,
    plain_copy,
    save_judged,
    serve_once,
    synchronize,
    to_device,
    to_plain_cpu,
)
from harness.children.timing_server import placed_copies, serve_timing
from harness.shared import commands, protocol
from harness.shared.environment import device_name, exec_source
from harness.shared.messages import (
    Feed,
    FreshSets,
    GpuDone,
    Gradients,
    Pace,
    Rates,
    ReferenceReady,
    Roofline,
    Signal,
    Spots,
)
from harness.shared.precision import cast_dtype, cast_floating
from harness.shared.problems import ProblemMetadata
from harness.shared.roofline import (
    count_flops,
    floor_ms,
    measure_rates,
    rates_key,
)
from harness.shared.sizes import fitting, tensor_bytes
from harness.shared.specs import OracleSpec
from harness.shared.timer import timing_sets

FRESH_OFFSET = 100   # fresh input sets are trials 100+ past the last fed one: seeds no fed set uses
FRESH_BYTES = 2**30  # fresh inputs and their outputs kept (in the parent's memory): up to this much beyond 2 sets
KEEP_SHARE = 0.3     # the truth waits on the GPU for its save while it fits in this share of its free memory


class Keeper:
    """Where the truth's tensors (the reference's outputs, the fresh sets, the swapped-input outputs) wait until the
    truth is saved. On a GPU, a copy of each stays there while the copies fit in KEEP_SHARE of the memory free when
    the keeper was made (`free_bytes`: that figure, for tests), so that the save copies it once, straight into the
    truth's pages (handover.save_in_place), instead of to the host and then again into the truth; beyond that room,
    and on the CPU, a plain CPU copy. A copy either way: a reference may hand out a buffer its next call rewrites."""

    def __init__(self, device: str, free_bytes: Optional[int] = None):
        self.device = device
        if device != "cuda":
            self.room = 0
        else:
            free = torch.cuda.mem_get_info()[0] if free_bytes is None else free_bytes
            self.room = int(free * KEEP_SHARE)
        self.on_device = 0   # bytes kept on the GPU

    def keep(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            size = value.numel() * value.element_size()
            if size <= self.room:
                self.room -= size
                self.on_device += size
                return plain_copy(value)
        return to_plain_cpu(value)

    def release(self) -> None:
        """After the save: the GPU memory the kept copies held back to the device (the candidates' share of it)."""
        if self.on_device and self.device == "cuda":
            torch.cuda.empty_cache()
        self.on_device = 0


def trial_seed(input_seed: int, trial: int) -> int:
    return input_seed + 1000 + trial


def fresh_kept(drawn: int, per_set: int) -> int:
    """How many of `drawn` fresh input sets (inputs and outputs `per_set` bytes each) are kept: as many as fit in
    FRESH_BYTES, but never fewer than two (one a round: a problem of GB-sized sets is where a replay saves the most),
    an even number (two rounds of equal size)."""
    return fitting(drawn, per_set, FRESH_BYTES, 2) // 2 * 2


def main(spec_path: str) -> None:
    state: dict = {}
    serve_once(spec_path, OracleSpec,
               lambda spec, channel, wiring: build_reference(spec, state, channel, wiring.handover), "oracle_error",
               then=lambda channel: serve_reference(channel, state), short_status=protocol.JUDGE_SHORT)


def serve_reference(channel, state: dict) -> None:
    """After READY: time the reference whenever the parent interleaves it with a candidate, until told to stop;
    between timings, measure the GPU's pace (CMD_PACE) or run the reference's backward (CMD_GRADIENTS: the parent
    asks once, when a candidate's outputs have an autograd graph or its config asks always, and keeps the answer).
    A backward that fails ends the process like a failed start (serve_once reports it)."""
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

    def gradients(command: commands.Command) -> bool:
        if command != commands.GRADIENTS:
            return False
        grad_outputs = draw_grad_outputs(state["grad_outputs"], state["seed"], state["device"])
        hand_asked(reference_gradients(model, state["grad_inputs"], grad_outputs, state["device"]).to_file(),
                   protocol.GRADIENTS_FILE, state["out_dir"], state["files"])
        channel.send(Signal(protocol.GRADIENTS))
        return True

    def fresh_sets(command: commands.Command) -> bool:
        if command != commands.FRESH_SETS:
            return False
        module, spec, dtype, kept = state["fresh"]
        keeper = Keeper(state["device"])   # the room free now: a candidate's process is alive on the GPU
        inputs, outputs = _fresh_sets(model, module, spec, dtype, kept, Steps(), keeper)
        hand_asked(FreshSets(inputs, outputs).to_file(), protocol.FRESH_SETS_FILE, state["out_dir"], state["files"])
        inputs = outputs = None
        keeper.release()
        channel.send(Signal(protocol.FRESH_SETS))
        return True

    placed = placed_copies(model, lambda: copy.deepcopy(model))   # config `timing_placements`

    while True:
        with torch.no_grad():
            timer = serve_timing(channel, lambda inputs: model(*inputs), state["input_sets"], state["device"],
                                 other=lambda command: pace(command) or gradients(command) or fresh_sets(command),
                                 placed=placed)
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
    """The CPU work first (the model made, the inputs drawn), then the GPU work with the files (the feed and the
    truth, copied out of the GPU), then the device's rates. A `gated` spec (a reference started beside evaluations:
    harness/oracle/reference.py) reports STAGED and waits for CMD_GPU before its first GPU work (the truth, which no
    other process's GPU work changes, and its files: the parent lets it run when no timing runs), reports GPU_DONE
    and waits for CMD_GPU again before measuring the device's rates (which another process's work would lower: the
    parent lets it run when no candidate process is alive on the GPU either), then GPU_DONE again. `files`: the
    memfds FEED_FILE and TRUTH_FILE are written into (None: files in spec.out_dir)."""
    steps = Steps()
    device, seed, dtype = spec.device, spec.seed, cast_dtype(spec.precision)
    configure_precision(spec.allow_tf32, spec.device)
    fast_saves()
    module, metadata, init_inputs, model, state_dict = load_reference(spec.problem_path, seed, "cpu", dtype)
    steps.done("load")
    check_grad = spec.check_grad and metadata.check_grad
    gated = spec.gated and channel is not None
    on_host = device == "cpu"   # on a GPU the input sets are drawn there, with the GPU work
    if on_host:
        drawn, other = _draw_fed(module, spec, dtype, device)
        steps.done("draw")
    keep_on_gpu = not gated   # a gated one's truth waits on the GPU only where the parent says no evaluation runs
    if gated:
        keep_on_gpu = _wait_for_gpu(channel, Signal(protocol.STAGED)).keep
        steps.done("gate")
    if device == "cuda":
        torch.cuda.init()
    model = model.to(device)
    steps.done("cuda_init")
    if on_host:
        trials = drawn
    else:   # the feed's sets are the drawn ones, copied from the GPU straight into the feed's pages when it is saved;
        # no call gets them until then, only copies of them (to_device), so they are as drawn
        drawn, other = _draw_fed(module, spec, dtype, device)
        trials = drawn
        steps.done("draw")

    # the truth waits on the GPU for its save where the parent let it (a gated start's GpuGo `keep`: no evaluation
    # runs on the GPU meanwhile, whose candidate could need that memory), else on the host
    keeper = Keeper(device if keep_on_gpu else "cpu")
    outputs = _run_all(model, drawn, device, steps, keeper)
    per_set = tensor_bytes(trials[0]) + tensor_bytes(outputs[0]) if trials else 0
    # the fresh sets are drawn and run only when the parent asks (CMD_FRESH_SETS: a candidate reached the fresh-input
    # check, which most never do), as many as fit (fresh_kept)
    fresh_wanted = (module, spec, dtype, fresh_kept(2 * spec.fresh_inputs, per_set))
    # The grad_outputs the candidate's backward is given; the reference's own backward runs only when the parent
    # asks (serve_reference: a candidate's outputs have a graph, or the config asks always).
    grad_outputs, has_graph = _grad_outputs(model, drawn[0], device) if check_grad else ([], False)
    steps.done("grad_outputs")
    swapped = swapped_outputs(model, drawn[0], other, device, keeper.keep)
    steps.done("swapped")

    timed = timing_sets(len(drawn), tensor_bytes(drawn[0]) if drawn else 0)   # the sets its timed calls rotate among
    input_sets = [to_device(inputs, device) if on_host else _on_device(inputs, device) for inputs in drawn[:timed]]
    probe = to_device(input_sets[0], device)   # a forward may change its inputs: never the feed's (trials)
    with torch.no_grad():
        kernels = profile_forward(lambda: model(*probe), device, set(), Path(spec.out_dir) / "trace.json")
        steps.done("profile")
        flops = count_flops(lambda: model(*probe))
    probe = []   # its memory back before the rates are measured
    nbytes = tensor_bytes(trials[0]) + tensor_bytes(state_dict) + tensor_bytes(outputs[0])
    synchronize(device)
    steps.done("roofline")   # the FLOPs counted (the rates below add to it)
    # the feed and the truth saved now, within the GPU work the parent let go (their copies from the GPU are part of
    # it), the feed first: the first file over the size limit is the feed where both are
    feed = Feed(init_inputs, state_dict, trials, grad_outputs, grad_seed=seed).to_file()
    save_judged(feed, protocol.FEED_FILE, files, Path(spec.out_dir), tensor_bytes(feed))
    feed = None
    steps.done("save_feed")
    truth = {"outputs": outputs, "has_graph": has_graph, "swapped": swapped}
    save_judged(truth, protocol.TRUTH_FILE, files, Path(spec.out_dir), tensor_bytes(truth))
    truth = outputs = swapped = None   # the copies the keeper held on the GPU: freed
    keeper.release()
    steps.done("save")
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

    # trial 0 as fed (plain CPU, never called on) kept for the backward, where there is one to run
    state.update(model=model, input_sets=input_sets, device=device, out_dir=Path(spec.out_dir), files=files,
                 grad_inputs=trials[0] if has_graph else [], grad_outputs=grad_outputs, seed=seed, fresh=fresh_wanted)
    return ReferenceReady(device_name=device_name(device), metadata=dataclasses.asdict(metadata),
                          check_grad=check_grad, ref_kernels=kernels.library,
                          roofline=Roofline(flops, nbytes, Rates(rates["bandwidth_gbps"], rates["fp32_tflops"])),
                          floor_ms=floor_ms(flops, nbytes, rates), began=steps.began, steps=steps.seconds,
                          rates_key=key, rates_measured=measured, timing_sets=timed)


def _run_all(model, input_sets: list, device: str, steps: Steps, keeper: Keeper) -> list:
    """The reference's outputs on each set, as `keeper` keeps them, each called on copies of its inputs: the calls
    counted in `steps` as "outputs", the copies as "copy"."""
    with torch.no_grad():
        results = []
        for inputs in input_sets:
            result = flatten_outputs(model(*to_device(inputs, device)))
            synchronize(device)
            steps.done("outputs")
            results.append([keeper.keep(v) for v in result])
            synchronize(device)
            steps.done("copy")
        return results


def _fresh_sets(model, module, spec: OracleSpec, dtype: Optional[torch.dtype], kept: int,
                steps: Steps, keeper: Keeper) -> tuple[list, list]:
    """The fresh input sets and the reference's outputs on them (plain CPU, or where `keeper` keeps them). Never in
    the feed: the parent hands them to a candidate one at a time, after its timing (the fresh-input check): two
    rounds' worth, the second for a first round that looks slow; only the `kept` ones drawn (fresh_kept), each drawn,
    run and kept in turn."""
    device, first = spec.device, spec.trials + FRESH_OFFSET
    fresh, outputs = [], []
    for trial in range(first, first + kept):
        inputs = draw_trials(module, spec.input_seed, 1, plain_cpu=device == "cpu", dtype=dtype, first=trial,
                             device=device)
        steps.done("draw")
        outputs += _run_all(model, inputs, device, steps, keeper)
        fresh += inputs if device == "cpu" else [[keeper.keep(v) if isinstance(v, torch.Tensor) else v for v in values]
                                                 for values in inputs]
        synchronize(device)
        steps.done("copy")
    return fresh, outputs


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
                dtype: Optional[torch.dtype] = None, first: int = 0, device: str = "cpu") -> list[list]:
    """`count` input sets from get_inputs, each under its own seed (trials `first`, `first` + 1, ...; as plain CPU
    values unless told otherwise), their floating-point tensors cast to `dtype` once drawn (None: as drawn). On a
    `device` other than the CPU, get_inputs runs with torch's default device set to it: a KernelBench problem's
    torch.randn(...) then draws there (GB-sized inputs take seconds on the host), from that device's generator."""
    trials = []
    with torch.device(device) if device != "cpu" else contextlib.nullcontext():
        for trial in range(first, first + count):
            torch.manual_seed(trial_seed(input_seed, trial))
            inputs = cast_floating(list(module.get_inputs()), dtype)
            trials.append([to_plain_cpu(v) if plain_cpu and isinstance(v, torch.Tensor) else v for v in inputs])
    return trials


def _draw_fed(module, spec: OracleSpec, dtype: Optional[torch.dtype], device: str) -> tuple[list[list], list]:
    """The trial input sets (plain CPU on the CPU device, else drawn on `device`), and the set whose inputs the
    degenerate-problem probe swaps in (degenerate.py): trial 1, drawn on its own when there is only trial 0."""
    on_host = device == "cpu"
    drawn = draw_trials(module, spec.input_seed, spec.trials, plain_cpu=on_host, dtype=dtype, device=device)
    other = drawn[1] if len(drawn) > 1 else draw_trials(module, spec.input_seed, 1, plain_cpu=on_host, dtype=dtype,
                                                        first=1, device=device)[0]
    return drawn, other


def _on_device(inputs: list, device: str) -> list:
    """The set as to_device hands it to the timed calls (detached copies on `device`), but for a tensor drawn there
    that owns its storage and asks no gradient: that one as it is, not a second copy of every set on the GPU."""
    return [v if isinstance(v, torch.Tensor) and v.device.type == device and v._base is None and not v.requires_grad
            else to_device([v], device)[0] for v in inputs]


def _grad_outputs(model, inputs, device) -> tuple[list, bool]:
    """The feed's grad_outputs: per output of trial 0, the shape and dtype of a floating-point output that has an
    autograd graph (None for every other output), from one forward with the inputs' gradients asked; no backward,
    and nothing drawn: the candidate's backward and the reference's (reference_gradients) draw the same seeded
    tensors where they run (runtime.draw_grad_outputs). Also: whether any output has a graph."""
    with torch.enable_grad():
        results = flatten_outputs(model(*to_device(inputs, device, requires_grad=True)))
        specs = grad_output_specs(results)
    results = []   # the graph's saved activations freed before the next step
    synchronize(device)
    return specs, any(spec is not None for spec in specs)


def reference_gradients(model, inputs: list, grad_outputs: list, device: str) -> Gradients:
    """Backward once on trial 0 (what the feed holds) with the grad_outputs the feed describes (drawn); the gradients
    as plain CPU tensors, the model's own dropped again (its GPU memory back for the timing)."""
    model.zero_grad(set_to_none=True)
    leaves = to_device(inputs, device, requires_grad=True)
    with torch.enable_grad():
        results = flatten_outputs(model(*leaves))
        pairs = [(result, grad.to(device)) for result, grad in zip(results, grad_outputs) if grad is not None]
        if pairs:
            backward(pairs)
    synchronize(device)
    input_grads = [to_plain_cpu(x.grad) if isinstance(x, torch.Tensor) and x.grad is not None else None
                   for x in leaves]
    param_grads = {name: to_plain_cpu(p.grad) for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return Gradients(input_grads, param_grads)


def hand_asked(value: dict, name: str, out_dir: Path, files: Optional[dict] = None) -> None:
    """A file the parent asked for after READY (GRADIENTS_FILE, FRESH_SETS_FILE) into the memfd the parent made for
    it (harness/shared/handover.py), which it seals and maps (harness/oracle/reference.py read_asked); where there is
    none, a file in the oracle's folder readable by this user only (candidates may run while it exists; the parent
    reads and unlinks it)."""
    if (files or {}).get(name) is None:
        path = out_dir / name
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
    save_judged(value, name, files, out_dir, tensor_bytes(value))

if __name__ == "__main__":
    main(sys.argv[1])
