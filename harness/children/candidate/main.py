"""The candidate's process: everything in this file runs next to untrusted code (the `unsafe_` side).

Started by the parent as `python -m harness.children.candidate.main SPEC`, in its own process group, temp dir and
TORCH_EXTENSIONS_DIR, under the sandbox of harness/isolation/sandbox.py. With `build_only` in the spec it is a build
worker's child (harness/build/builder.py): no GPU visible, no feed; it executes the module, reports COMPILED with the
built extension files, and exits. With `prebuilt` in the spec, a load_inline / load call whose arguments match a
build from such a child imports that build's library instead of compiling again. Before the submission runs: CUDA is
initialised, the extension builders are wrapped, the integrity snapshot is taken and the audit hook
(harness/children/candidate/guard.py) goes in.
Stages: execute the module (extension builds) -> COMPILED; build ModelNew, load
the reference weights, run the trials, the repeat, the backward and one profiled forward -> RESULT_FILE, CHECKED;
then the timing dialogue with the parent (harness/shared/timer.py: blocks of calls on rotating inputs, some outputs
kept) -> SPOT_FILE, SPOTS. A stage that raises ends the process with FAILED and the stage's status. Findings travel
on the events as {"flags": {name: evidence}}. The verdict is not computed here: the parent compares what this process
saved with the oracle's truth.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.children.attribution import global_function_names, profile_forward, session
from harness.children.candidate import guard
from harness.children.candidate.construct import unsafe_fast_construct
from harness.children.candidate.extensions import BUILDER_FILE, ExtensionWatch
from harness.children.candidate.watch import sealed
from harness.children.runtime import (
    backward,
    configure_precision,
    draw_grad_outputs,
    fast_saves,
    flatten_outputs,
    log_exception,
    open_channel,
    short_error,
    synchronize,
    to_device,
    to_plain_cpu,
)
from harness.children.timing_server import placed_copies, serve_timing
from harness.shared import backends, commands, handover, protocol
from harness.shared.check import output_signature
from harness.shared.environment import exec_source
from harness.shared.findings import MUTATES_INPUTS, OUTPUT_SUBCLASS, Found
from harness.shared.messages import (
    Audit,
    Checked,
    Compiled,
    Failed,
    Feed,
    FirstTrial,
    FreshTimed,
    KernelCounts,
    Product,
    Signal,
    Spots,
)
from harness.shared.precision import cast_dtype
from harness.shared.sizes import tensor_bytes
from harness.shared.specs import CandidateSpec, from_fields, read_spec
from harness.shared.timer import Timer, same_bits, spin_cycles_per_ms, timing_sets


class StageFailure(Exception):
    def __init__(self, status: str, error: str, compile_s: Optional[float] = None):
        super().__init__(error)
        self.failed = Failed(status, error, compile_s)



def main(spec_path: str) -> None:
    CLOCK["main"] = time.time()   # interpreter, torch and the harness imported
    spec, wiring = read_spec(spec_path, CandidateSpec)
    CONTEXT.handover = wiring.handover
    CONTEXT.lend_fd = wiring.lend_fd
    channel = open_channel(wiring)
    try:
        if spec.ahead:
            spec = wait_for_submission(spec, channel)
            if spec is None:   # the parent closed the pool: no submission ever ran here
                channel.close()
                os._exit(0)
        prepare(spec, channel)
        CLOCK["prepared"] = time.time()   # CUDA initialised, the feed read, the guard installed
        unsafe_run(spec, channel)
    except StageFailure as failure:
        channel.send(failure.failed)
    except BaseException as exc:  # outside any stage (e.g. saving the result): still the candidate's run
        log_exception("harness step")
        channel.send(Failed("runtime_error", short_error(exc)))
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the candidate's atexit hooks and a CUDA teardown that can hang after a fault


class Context:
    """What the harness set up before the submission runs."""
    backend: backends.Backend
    watch: ExtensionWatch
    own_calls: Callable[[], int]   # successful calls into the submission's extensions so far (ExtensionWatch)
    feed: Optional[Feed] = None   # None in a build child (no feed)
    handover: Optional[dict] = None   # file name -> inherited memfd (harness/shared/handover.py)
    lend_fd: Optional[int] = None     # the socket the parent lends the feed's fd over
    warm = False   # warm_up() done (a process started ahead did it before its submission came)


CONTEXT = Context()
CLOCK: dict[str, float] = {}   # wall-clock times of the phases before the submission runs (the parent's `phases`)


# The integrity snapshot (harness/children/candidate/watch.py `sealed`) is reached only through the audit hook that
# holds it (guard.INTEGRITY_EVENT), by these two functions; they, and every function of this file that calls them,
# hold what they call in their default arguments, so that a name the submission rebinds reaches none of it.
def remember(_audit=sys.audit, _event=guard.INTEGRITY_EVENT) -> None:
    """Keep what differs now from the snapshot for `report`: called right before each step whose result the parent
    trusts (copying outputs, counting kernels, saving), so a replacement undone once used is still in place."""
    _audit(_event, None)


def report(_audit=sys.audit, _event=guard.INTEGRITY_EVENT, _error=RuntimeError) -> dict[str, str]:
    """Everything `remember` kept and what differs now (name -> evidence): the findings an event carries."""
    found: list = []
    _audit(_event, found)
    if not found:
        raise _error("the integrity snapshot did not answer (the audit hook holding it is not installed)")
    return found[0]


def warm_up(spec: CandidateSpec, libraries: bool = False) -> None:
    """What no submission decides: precision flags, CUDA's context, the profiler's first session; with `libraries`
    (a process started ahead, which has the time) also cuBLAS's and cuDNN's, whose first GEMM or convolution
    otherwise falls in the submission's first forward (bench/first_calls.py)."""
    configure_precision(spec.allow_tf32, spec.device)
    fast_saves()
    if spec.device == "cuda" and not spec.build_only:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        spin_cycles_per_ms()   # the head start's clock, read before any submission code can move it (watch.py)
        if libraries:   # their first calls take 65-375 ms each (bench/first_calls.py)
            small = torch.ones(8, 8, device="cuda")
            torch.nn.functional.linear(small, small, small[0])   # cuBLASLt (a GEMM with bias), as nn.Linear calls it
            torch.mm(small, small)                                # cuBLAS
            torch.nn.functional.conv2d(small.view(1, 1, 8, 8), small[:3, :3].reshape(1, 1, 3, 3))   # cuDNN
            torch.cuda.synchronize()
    with session(spec.device):
        pass
    CONTEXT.warm = True


def wait_for_submission(ahead: CandidateSpec, channel: protocol.ChildChannel) -> Optional[CandidateSpec]:
    """A process started ahead (harness/judge/warm.py): report IMPORTED, warm up when told (never beside a timing),
    report IDLE and wait for the one submission this process will run. Its spec must keep what the warm-up fixed
    (device, TF32, folder); None: told to exit."""
    channel.send(Signal(protocol.IMPORTED))
    if commands.parse(channel.receive()) != commands.WARM_UP:
        return None
    warm_up(ahead, libraries=True)
    channel.send(Signal(protocol.IDLE))
    command = commands.parse(channel.receive())
    if not isinstance(command, commands.Run):
        return None
    CLOCK["main"] = time.time()   # the submission's own phases start here
    spec = from_fields(CandidateSpec, command.spec)
    if (spec.device, spec.allow_tf32, spec.out_dir) != (ahead.device, ahead.allow_tf32, ahead.out_dir):
        raise RuntimeError("the submission's spec does not match the process started ahead for it")
    return spec


def prepare(spec: CandidateSpec, channel: protocol.ChildChannel) -> None:
    """Everything before the first line of submission code: precision, CUDA, wrappers, snapshot, audit hook."""
    if not CONTEXT.warm:
        warm_up(spec)
    # mapped, not read: the weights and input sets are copied from the memfd's pages where they are used (the model,
    # each forward), not first into this process's memory (0.2-0.3 s for level2/62's 460 MB feed). The mapping is
    # private: what the process writes into it is its own copy; the memfd itself is sealed (handover.py)
    if not spec.build_only:
        CONTEXT.feed = Feed.from_file(torch.load(_feed_path(spec), weights_only=True, mmap=True))
    source = Path(spec.source_path).read_text()
    CONTEXT.backend = backends.select(spec.backend, source)   # harness/shared/backends: the kernel language
    CONTEXT.watch = ExtensionWatch(spec.device, spec.prebuilt, spec.light_headers, spec.pch_root)
    if CONTEXT.backend.python_kernels:   # kernels defined in the module: their names are its own kernels' names
        CONTEXT.watch.sources.append(source)
    CONTEXT.watch.install()
    CONTEXT.own_calls = CONTEXT.watch.own_calls   # its reader, held here: nothing set on the watch changes it
    source_path = str(Path(spec.source_path).resolve())
    guard.install(lambda event, detail, audit=Audit: channel.send(audit(event, detail)),
                  source_path, [spec.out_dir, "/dev/null"], _building, backends.toolchain_dirs(CONTEXT.backend),
                  integrity=sealed())


def _hand_over(value: Any, name: str, out_dir: Path) -> None:
    """Save `value` for the parent under `name` (handover.save, looked up on the module at each call), then close
    this process's fd of its memfd: each is written once, and once the parent has read it and closed its own fd the
    pages go (a level-1 problem's outputs of every trial are gigabytes, held through the timing otherwise)."""
    handover.save(value, name, CONTEXT.handover, out_dir)
    fd = CONTEXT.handover.pop(name, None) if CONTEXT.handover is not None else None
    if fd is not None:
        os.close(fd)


def _feed_path(spec: CandidateSpec) -> str:
    """The feed's file, or (an evaluation's spec names none) the read-only fd of its sealed memfd that the parent
    lends over the lend socket (it comes with the spec for a process started ahead: harness/judge/candidate_run.py)."""
    if spec.feed is not None:
        return spec.feed
    lent = handover.receive(CONTEXT.lend_fd) if CONTEXT.lend_fd is not None else []
    if len(lent) != 1:
        raise RuntimeError(f"the judge lent {len(lent)} fds for the feed, not one")
    return f"/proc/self/fd/{lent[0]}"


def _building() -> bool:
    """An extension build is under way: the flag is set and torch's builder is really on the calling stack (the
    flag alone is a plain attribute that submission code could set)."""
    if not CONTEXT.watch.building:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == BUILDER_FILE:
            return True
        frame = frame.f_back
    return False


def unsafe_run(spec: CandidateSpec, channel: protocol.ChildChannel, _remember=remember, _report=report) -> None:
    device = spec.device
    model_class, watch, compile_s = unsafe_load(spec, device)
    if spec.build_only:
        used = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        products = {call: Product(**product) for call, product in watch.products.items()}
        channel.send(Compiled(compile_s, watch.built, products=products,
                              cpu_s=sum(u.ru_utime + u.ru_stime for u in used), light_built=watch.light_built,
                              light_failed=watch.light_failed))
        return
    channel.send(Compiled(compile_s, watch.built, reused=watch.reused, flags=_report(),
                          clock=dict(CLOCK), light_built=watch.light_built, light_failed=watch.light_failed))

    feed = CONTEXT.feed
    began = time.perf_counter()
    model, weights_loaded, renamed = unsafe_build(model_class, feed, spec.seed, device, cast_dtype(spec.precision))
    _remember()   # what ModelNew's construction replaced, before the harness looks up what it calls next
    flags = Found()
    started = time.perf_counter()
    first = _resident(feed.trials[0], device)

    def hand_first(outputs: list) -> None:   # trial 0's outputs, checked by the parent while the others run
        _remember()
        _hand_over(outputs, protocol.FIRST_FILE, Path(spec.out_dir))
        channel.send(FirstTrial({**flags, **_report()}))

    result = unsafe_check(model, feed, device, spec.check_grad, flags, renamed, first, spec.expected, hand_first)
    result["weights_loaded"] = weights_loaded
    checked = time.perf_counter()
    _remember()   # what the forwards left replaced, before the harness counts their kernels
    kernels = unsafe_profile(model, first, device, Path(spec.out_dir))
    del first
    spent = {"model": started - began, "checks": checked - started, "gradients": result.pop("gradients_s", 0.0),
             "profile": time.perf_counter() - checked}
    spent["correctness"] = spent.pop("checks") - spent["gradients"]
    flags.update(_report())   # after the last submission code, before the save
    saving = time.perf_counter()
    _hand_over(result, protocol.RESULT_FILE, Path(spec.out_dir))
    del result   # its host copies of every trial's outputs, in the memfd now: not held through the timing as well
    spent["result_save"] = time.perf_counter() - saving
    channel.send(Checked(kernels, spent, flags))

    # the sets the parent's timed calls rotate among, as the reference holds them (the others not copied over)
    timed = timing_sets(len(feed.trials), tensor_bytes(feed.trials[0]) if feed.trials else 0)
    input_sets = [to_device(inputs, device) for inputs in feed.trials[:timed]]
    synchronize(device)
    # config `timing_placements`: more instances of ModelNew, each built as the checked one was (the reference's
    # weights in): the same module on other memory
    placed = placed_copies(model, lambda: unsafe_build(model_class, feed, spec.seed, device,
                                                       cast_dtype(spec.precision))[0])
    try:
        with torch.no_grad():
            timer = serve_timing(channel, lambda inputs: model(*inputs), input_sets, device,
                                 keep=kept_outputs, flags=_report, placed=placed)
    except Exception as exc:
        log_exception("timing")
        raise StageFailure("runtime_error", short_error(exc)) from exc
    if timer is None:
        return
    flags = _report()
    changed = [k["call"] for k in timer.kept if k["inputs_changed"]]
    if changed:
        flags[MUTATES_INPUTS] = f"inputs differed after timed call(s) {changed[:5]}"
    _hand_over(timer.kept, protocol.SPOT_FILE, Path(spec.out_dir))
    channel.send(Spots(flags))
    unsafe_fresh(channel, model, device, Path(spec.out_dir), input_sets[0])


def kept_outputs(out, _flatten=flatten_outputs, _plain=to_plain_cpu, _remember=remember) -> list:
    """A timed call's outputs as the parent checks them (the timer's `keep`): the snapshot first, so that a
    replacement the forward made (of this copy's path or of anything else the parent trusts) is seen while it is
    still in place, even one that would undo itself once used; then plain CPU copies, through functions bound when
    this module was imported (rebinding this module's or runtime's names changes nothing here)."""
    _remember()
    return [_plain(v) for v in _flatten(out)]


def unsafe_fresh(channel: protocol.ChildChannel, model, device: str, out_dir: Path, known: list,
                 _report=report) -> None:
    """After the timing: for each input set the parent hands over (one at a time, never seen before), one timed
    span whose last call is on it, of as many calls as the timed spans held (commands.FreshCall's `span_calls`; the
    others on a set it has seen, `known`), its outputs saved for the parent's check; until the parent sends anything
    else or closes the pipe. A span of one call would hold the host's enqueue wherever it outlasts one call's head
    start, as a block's spans of several do not. Each is preceded, on the same timer, by as many such spans all on
    the seen set as the command asks (`near`), as a block's spans follow one another: a process woken from its pipe
    runs its first calls cold (a launch-bound kernel can read 3x slow). Their times per call go back with the fresh
    span's (`near_ms`, the last FreshTimed.NEAR_MAX), for the parent's evidence, and under sync "checked" each one's
    gap to its synchronized end (`near_gaps_ms`): the host's round trip of that moment."""
    timer: Optional[Timer] = None
    calls = 0
    while True:
        command = commands.parse(channel.receive())
        if not isinstance(command, commands.FreshCall):
            return
        try:
            path = Path(command.path) if command.path else out_dir / protocol.FRESH_FILE
            inputs = to_device(torch.load(path, weights_only=True), device)
            synchronize(device)
            with torch.no_grad():
                if timer is None:
                    timer = Timer(lambda values: model(*values), [known], device, l2_flush=command.l2_flush,
                                  sync=command.sync, keep=kept_outputs)
                timer.ahead_ms = command.ahead_ms
                span = command.span_calls
                near, gaps = [], []
                for _ in range(command.near):
                    seen_ms = timer.once(keep=False, calls=span)
                    near.append(seen_ms / span)
                    if timer._synced is not None:
                        gaps.append(max(0.0, timer._synced - seen_ms))
                ms = timer.once(inputs, calls=span)
                synced = timer._synced   # the same span to its end event after a device-wide synchronize, or None
            flags = _report()   # before the save: a replacement on its path is still in place
            _hand_over(timer.kept.pop()["outputs"], handover.fresh_out_file(calls), out_dir)
            calls += 1
        except Exception as exc:
            log_exception("timing on a fresh input set")
            raise StageFailure("runtime_error", f"on a fresh input set: {short_error(exc)}") from exc
        channel.send(FreshTimed(ms, tuple(near[-FreshTimed.NEAR_MAX:]), flags, span, synced,
                                tuple(gaps[-FreshTimed.NEAR_MAX:])))


def unsafe_load(spec: CandidateSpec, device: str):
    """Execute the submission's module (this runs its load_inline builds) and find ModelNew."""
    watch = CONTEXT.watch
    if CONTEXT.backend.needs_cuda and device != "cuda":
        raise StageFailure("needs_cuda", f"the submission's {CONTEXT.backend.name} kernels need CUDA")
    start = time.perf_counter()
    error: Optional[BaseException] = None
    module = None
    try:
        module = exec_source(Path(spec.source_path).read_text(), spec.source_path, "submission")
    except BaseException as exc:  # SystemExit too: a submission that exits on import has failed to load
        log_exception("module execution")
        error = exc
    compile_s = time.perf_counter() - start
    if watch.needs_cuda:
        raise StageFailure("needs_cuda", "the submission builds CUDA sources and the device is not CUDA")
    if watch.failure is not None:
        raise StageFailure("compile_error", watch.failure, compile_s=compile_s)
    if error is not None:
        raise StageFailure("load_error", short_error(error), compile_s=compile_s)
    model_class = getattr(module, "ModelNew", None)
    if not isinstance(model_class, type) or not issubclass(model_class, torch.nn.Module):
        raise StageFailure("load_error", "the module defines no ModelNew class deriving from torch.nn.Module")
    return model_class, watch, compile_s


def unsafe_build(model_class, feed: Feed, seed: int, device: str, dtype: Optional[torch.dtype] = None):
    """ModelNew(*init_inputs) under the reference's seed, cast to the run's `dtype` as the reference was (None: fp32,
    nothing cast), then the reference weights where names and shapes match. Built first with the standard layers'
    random initialisation skipped (harness/children/candidate/construct.py), kept if the reference's weights
    overwrote every skipped tensor, else built again normally. An extension build that ModelNew's __init__ runs is
    judged as one the module runs: a failed one (raised or swallowed) is compile_error, CUDA sources on another
    device needs_cuda."""
    try:
        try:
            fast = unsafe_fast_construct(model_class, feed.init_inputs, seed)
        except Exception:   # the normal build below says whether ModelNew can be built at all
            fast = None
            _built_in_init()   # a build that failed there fails again: not tried twice
        if fast is not None:
            model, skipped = fast
            model, loaded, written, renamed = _with_weights(model, feed.state_dict, dtype, by_value=False)
            if not all(t.numel() == 0 or written.get(t.data_ptr()) == t.numel() for t in skipped):
                print("[harness] ModelNew built again with its layers' own initialisation: the reference's weights "
                      "do not overwrite every skipped one", file=sys.stderr)
                fast = model = skipped = None   # freed before the second build (a large model is not held twice)
        if fast is None:
            torch.manual_seed(seed)
            model, loaded, _, renamed = _with_weights(model_class(*feed.init_inputs), feed.state_dict, dtype)
        model = model.to(device)
        synchronize(device)
    except StageFailure:   # a build in __init__ failed (_built_in_init): said already
        raise
    except BaseException as exc:
        log_exception("ModelNew construction")
        _built_in_init()
        raise StageFailure("init_error", short_error(exc)) from exc
    _built_in_init()
    return model, loaded, renamed


def _built_in_init() -> None:
    """StageFailure where an extension build run by ModelNew's __init__ failed (compile_error, even swallowed) or
    asked for CUDA on another device (needs_cuda), as the module's own builds are judged (unsafe_load)."""
    watch = getattr(CONTEXT, "watch", None)   # none where the builders were never watched (a direct call)
    if watch is None:
        return
    if watch.needs_cuda:
        raise StageFailure("needs_cuda", "ModelNew builds CUDA sources and the device is not CUDA")
    if watch.failure is not None:
        raise StageFailure("compile_error", watch.failure)


def _with_weights(model, state_dict: dict, dtype: Optional[torch.dtype], by_value: bool = True):
    """The model cast to `dtype`, the reference weights copied in where names and shapes match; with how many were,
    where they were written (data pointer -> elements) and which of ModelNew's entries were matched by value instead
    (`renamed`: its name -> the reference's, see _matched_by_value; not `by_value` after the fast construction, whose
    skipped tensors hold whatever the memory held)."""
    if dtype is not None:
        model = model.to(dtype)
    own = model.state_dict()
    try:
        renamed = _matched_by_value(own, state_dict) if by_value else {}
    except Exception:   # an entry it cannot compare (a quantized tensor ...): matched by name alone, as before
        log_exception("matching ModelNew's entries to the reference's by value")
        renamed = {}
    pairs = [(name, name) for name in state_dict if name in own and own[name].shape == state_dict[name].shape]
    pairs += [(reference, mine) for mine, reference in renamed.items()]
    loaded, written = 0, {}
    with torch.no_grad():
        for name, mine in pairs:
            own[mine].copy_(state_dict[name])
            written[own[mine].data_ptr()] = own[mine].numel()
            loaded += 1
    if renamed:
        print("[harness] ModelNew's entries matched to the reference's by value (loaded and gradient-checked under "
              "those names): " + ", ".join(f"{mine} -> {ref}" for mine, ref in sorted(renamed.items())),
              file=sys.stderr)
    return model, loaded, written, renamed


def _matched_by_value(own: dict, state_dict: dict) -> dict[str, str]:
    """ModelNew's state_dict entries that hold one of the reference's under another name: an entry of neither name
    in the other, of the same shape, dtype and bits as exactly one such reference entry, which in turn has no other
    such twin among ModelNew's (ModelNew built its layers in the reference's order under the reference's seed, and
    named them otherwise). Only entries of at least two distinct values: a constant one (a zero bias, a unit norm
    weight, memory never initialised) says nothing of which it is."""
    def varied(t) -> bool:
        return isinstance(t, torch.Tensor) and t.numel() > 1 and not bool((t == t.flatten()[0]).all())

    def fingerprint(t) -> tuple:   # shape, dtype and the first bytes: full comparisons only within one
        return t.shape, t.dtype, tuple(t.detach().flatten()[:8].contiguous().view(torch.uint8).tolist())

    def by_fingerprint(entries: dict) -> dict[tuple, list[str]]:
        groups: dict[tuple, list[str]] = {}
        for name, t in entries.items():
            groups.setdefault(fingerprint(t), []).append(name)
        return groups

    mine = {name: t for name, t in own.items() if name not in state_dict and varied(t)}
    theirs = {name: t for name, t in state_dict.items() if name not in own and varied(t)}
    my_groups, their_groups = by_fingerprint(mine), by_fingerprint(theirs)

    def twins(tensor, among: dict, groups: dict) -> list[str]:
        return [name for name in groups.get(fingerprint(tensor), []) if among[name].device == tensor.device
                and same_bits(among[name], tensor)]

    matched = {}
    for name, tensor in theirs.items():
        found = twins(tensor, mine, my_groups)
        if len(found) == 1 and twins(mine[found[0]], theirs, their_groups) == [name]:
            matched[found[0]] = name
    return matched


def unsafe_check(model, feed: Feed, device: str, check_grad: bool, flags: dict[str, str],
                 renamed: Optional[dict[str, str]] = None, first: Optional[list] = None,
                 expected: Optional[tuple] = None, hand_first: Optional[Callable[[list], None]] = None) -> dict:
    """Forward on every trial, trial 0 again (races), then one backward; everything returned as CPU tensors, the
    parameters' gradients under the reference's names where `renamed` maps ModelNew's to them. `first`: trial 0's
    inputs as its calls copy them (_resident; None: the feed's). `expected`: the reference's trial-0 outputs'
    output_signature; where trial 0's outputs differ from it in count, type, shape or dtype, that trial alone
    decides the status (check.check_outputs), so nothing more runs: the result holds trial 0 only, `stopped`.
    `hand_first`: where given, trial 0's outputs go to it as soon as they are made (the parent checks them while
    the other trials run, and ends the run where they fail) and the result holds the other trials' (`first_apart`)."""
    first = feed.trials[0] if first is None else first
    try:
        outputs = [_forward(model, first, device, flags)]
        if expected is not None and output_signature(outputs[0]) != expected:
            return {"outputs": outputs, "repeat": [], "stopped": True, "has_graph": None, "input_grads": None,
                    "param_grads": None, "grad_error": None}
        if hand_first is not None:
            hand_first(outputs.pop())
        outputs += [_forward(model, inputs, device, flags) for inputs in feed.trials[1:]]
        repeat = _forward(model, first, device, flags)
    except BaseException as exc:
        log_exception("forward")
        raise StageFailure("runtime_error", short_error(exc)) from exc
    result: dict[str, Any] = {"outputs": outputs, "repeat": repeat, "has_graph": None, "input_grads": None,
                              "param_grads": None, "grad_error": None, "first_apart": hand_first is not None}
    if check_grad:
        started = time.perf_counter()
        try:
            result.update(_backward(model, first, feed.grad_outputs, feed.grad_seed, device, renamed or {}))
        except Exception as exc:  # a failing backward is a gradient verdict, not the end of the run
            log_exception("backward")
            result["grad_error"] = short_error(exc)
        result["gradients_s"] = time.perf_counter() - started
    return result


def _forward(model, inputs: list, device: str, flags: dict[str, str], _remember=remember) -> list:
    """One forward on copies of `inputs`; notes inputs changed by the call and outputs that are not plain tensors."""
    handed = to_device(inputs, device)
    before = _as_handed(handed, inputs, device)
    with torch.no_grad():
        results = flatten_outputs(model(*handed))
    synchronize(device)
    changed = _changed(handed, inputs, before)
    del before
    if changed:
        flags[MUTATES_INPUTS] = f"forward changed input(s) {changed}"
    odd = sorted({type(v).__name__ for v in results
                  if isinstance(v, torch.Tensor) and type(v) not in (torch.Tensor, torch.nn.Parameter)})
    if odd:
        flags[OUTPUT_SUBCLASS] = f"forward returned {', '.join(odd)}"
    _remember()   # what the forward replaced is still in place before its outputs are copied
    return [to_plain_cpu(v) for v in results]


# A copy of inputs kept on the GPU for the checked forwards (_as_handed, _resident) needs this many times their bytes
# free there (the caching allocator's unused blocks count): the forward's own memory is left the rest.
ROOM_FOR_COPY = 2


def _as_handed(handed: list, inputs: list, device: str) -> Optional[list]:
    """What the inputs handed to a forward are compared with after it, on the device it ran on: the tensors they were
    copied from where those are there already (the feed's own on the CPU, trial 0's resident copy on a GPU); else, on
    a GPU, a copy made there before the call, where the device has room for it (a device-to-device copy instead of
    every input copied back to the host after each forward and compared there, as long as the outputs' own copy for
    a level-2 problem). None: compared on the host after the call."""
    if all(t.device == handed_t.device for t, handed_t in zip(inputs, handed) if isinstance(t, torch.Tensor)):
        return inputs
    try:
        if not _room_for(handed):
            return None
        copies = [t.clone() if isinstance(t, torch.Tensor) else None for t in handed]
    except torch.OutOfMemoryError:   # the judge's copy, not the submission's doing
        return None
    synchronize(device)   # done before any submission code runs, whatever stream it works on
    return copies


def _resident(inputs: list, device: str) -> list:
    """Trial 0's inputs as its four calls (trial, repeat, backward, profiled forward) get their copies from: on a GPU
    with room for them, copied there once (each call's copy is then a device-to-device one, not another copy from the
    host); else the feed's own."""
    if device == "cpu":
        return inputs
    try:
        if not _room_for(inputs):
            return inputs
        resident = to_device(inputs, device)
    except torch.OutOfMemoryError:   # the judge's copy, not the submission's doing
        return inputs
    synchronize(device)
    return resident


def _room_for(values: list) -> bool:
    """The GPU has ROOM_FOR_COPY times the tensors' bytes free (the caching allocator's unused blocks count)."""
    size = sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))
    free, _ = torch.cuda.mem_get_info()
    unused = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return size * ROOM_FOR_COPY <= free + unused


def _changed(handed: list, inputs: list, before: Optional[list]) -> list[int]:
    """The positions of the handed inputs whose bits differ from `before` (_as_handed), or, where there is none, from
    the feed's `inputs` once copied back to the host."""
    if before is None:
        return [i for i, (a, b) in enumerate(zip(handed, inputs))
                if isinstance(a, torch.Tensor) and not same_bits(a.cpu(), b)]
    return [i for i, (a, b) in enumerate(zip(handed, before)) if isinstance(a, torch.Tensor) and not same_bits(a, b)]


def unsafe_profile(model, first: list, device: str, workdir: Path) -> KernelCounts:
    """One profiled forward on (a copy of) trial 0's inputs `first`: own kernels vs library kernels
    (harness/children/attribution.py)."""
    inputs = to_device(first, device)
    watch = CONTEXT.watch
    watch.profiling = True
    try:
        with torch.no_grad():
            profile = profile_forward(lambda: model(*inputs), device, global_function_names(watch.sources),
                                      workdir / "trace.json", own_calls=CONTEXT.own_calls)
    except Exception as exc:
        log_exception("profiled forward")
        raise StageFailure("runtime_error", short_error(exc)) from exc
    finally:
        watch.profiling = False
    return profile.counts()


def _backward(model, inputs: list, grad_outputs: list, grad_seed: int, device: str, renamed: dict[str, str],
              _remember=remember) -> dict:
    """One backward on trial 0 with the feed's grad_outputs, drawn here only when every output that has a graph in
    the reference has one in ModelNew's forward too (a forward-only kernel, the common case, draws nothing)."""
    model.zero_grad(set_to_none=True)
    leaves = to_device(inputs, device, requires_grad=True)
    results = flatten_outputs(model(*leaves))
    asked = [(result, spec) for result, spec in zip(results, grad_outputs) if spec is not None]
    if not asked or not all(isinstance(result, torch.Tensor) and result.requires_grad for result, _ in asked):
        return {"has_graph": False}
    grads = [grad for grad in draw_grad_outputs(grad_outputs, grad_seed, device) if grad is not None]
    pairs = [(result, grad.to(dtype=result.dtype)) for (result, _), grad in zip(asked, grads)]
    backward(pairs)
    synchronize(device)
    _remember()   # the submission's backward ran: its replacements, before the gradients are copied
    input_grads = [to_plain_cpu(x.grad) if isinstance(x, torch.Tensor) and x.grad is not None else None
                   for x in leaves]
    param_grads = {renamed.get(name, name): (to_plain_cpu(p.grad) if p.grad is not None else None)
                   for name, p in model.named_parameters()}
    return {"has_graph": True, "input_grads": input_grads, "param_grads": param_grads}


if __name__ == "__main__":
    main(sys.argv[1])
