"""Helpers for the child processes that execute problem or candidate modules (oracle, baseline, problem check,
candidate): precision settings, moving values between devices, the outputs' plain CPU form, and the loop that reads
a spec and answers the parent (`serve_once`)."""
from __future__ import annotations

import ctypes
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.shared import commands, handover, protocol, specs
from harness.shared.environment import CPU_THREADS
from harness.shared.messages import GRAD_DTYPES, Failed, Signal
from harness.shared.resources import JudgeShort, no_memory, no_room, ran_short, short_cause


def configure_precision(allow_tf32: bool, device: str) -> None:
    """TF32 for matmuls and cuDNN convolutions alike (cuDNN allows TF32 by default). On the CPU device both sides
    run single-threaded: thread pools that spin on a shared machine with few cores make timings swing by 100x, and with
    the heap kept (steady_heap). On a GPU torch keeps its default (the host only launches)."""
    if device == "cpu":
        torch.set_num_threads(CPU_THREADS)
        steady_heap()
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")


# glibc's malloc options (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
HEAP_KEPT = 1 << 30          # freed heap a CPU child keeps rather than gives back to the system
HEAP_MMAP_THRESHOLD = 32 << 20   # blocks from this size on are mapped apart (glibc's largest allowed threshold)


def steady_heap() -> None:
    """On the CPU device, tensors' memory comes from glibc's malloc, which by default maps and unmaps blocks of a few
    hundred kB and gives a freed heap top back to the system on its own heuristics (thresholds that move with what was
    freed before). A span of several calls of a small kernel then either touches newly mapped pages (a page fault every
    4 kB) or reuses pages, depending on the process's history: measured on the CPU machine, a ReLU of 64x1024 fp32 in
    spans of 8 calls read 0.038-0.050 ms a call with faults and 0.007 ms without, and the calls on a never-seen input
    set, after a load that moved the thresholds, read 5-40x the blocks' median. Fixed thresholds, far above such
    blocks, keep freed memory in the process: every span after the first at a new peak reuses pages, on both sides.
    Nothing where this C library has no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, HEAP_KEPT)


def fast_saves() -> None:
    """torch.save without a CRC32 of every record in this child: its files (outputs, gradients, feed, truth) are
    written once and read once by the judge, whose torch.load does not check it, and computing it took half of a
    save (a 256 MB list of tensors: 0.25-0.37 s with it, 0.09-0.22 s without, on the CPU machine). Not in the
    parent: a caller of the Python API keeps torch's default for its own saves."""
    set_crc32 = getattr(torch.serialization, "set_crc32_options", None)   # torch >= 2.6
    if set_crc32 is not None:
        set_crc32(False)


def to_device(values: list[Any], device: str, requires_grad: bool = False) -> list[Any]:
    moved = []
    for value in values:
        if isinstance(value, torch.Tensor):
            value = value.detach().to(device, copy=True)
            if requires_grad and value.is_floating_point():
                value.requires_grad_(True)
        moved.append(value)
    return moved


def flatten_outputs(output: Any, _type=type, _issubclass=issubclass, _list=list, _tuple_iter=tuple.__iter__,
                    _list_iter=list.__iter__) -> list[Any]:
    """A forward's result as a list: a tensor becomes [tensor]; a tuple or list keeps its items, read from the
    container itself (a subclass's own __iter__ or __getitem__, which could compute what is read only when read, is
    never called). The functions it calls are bound here, when the harness is imported, as are to_plain_cpu's: a
    submission that rebinds a builtin or a torch method does not change what the judge copies."""
    kind = _type(output)
    if _issubclass(kind, tuple):
        return _list(_tuple_iter(output))
    if _issubclass(kind, list):
        return _list(_list_iter(output))
    return [output]


def to_plain_cpu(value: Any, _isinstance=isinstance, _type=type, _tensor=torch.Tensor,
                 _plain_mode=torch._C.DisableTorchFunctionSubclass, _detach=torch.Tensor.detach,
                 _as_subclass=torch.Tensor.as_subclass, _to=torch.Tensor.to,
                 _contiguous=torch.Tensor.contiguous) -> Any:
    """A plain CPU torch.Tensor copy, or a description of a non-tensor.

    A subclass is stripped without running its __torch_function__ or any method it defines (torch.Tensor's own
    methods are called, bound at import), so a lazy tensor that would compute only when touched hands over whatever
    its storage holds."""
    if _isinstance(value, _tensor):
        with _plain_mode():
            plain = _detach(value)
            if _type(plain) is not _tensor:
                plain = _as_subclass(plain, _tensor)
            return _contiguous(_to(plain, "cpu", copy=True))
    return {"not_a_tensor": _type(value).__name__}


def plain_copy(value: torch.Tensor) -> torch.Tensor:
    """A plain torch.Tensor copy of `value` (a trusted process's tensor) where it is, compact and contiguous."""
    with torch._C.DisableTorchFunctionSubclass():
        plain = value.detach()
        if type(plain) is not torch.Tensor:
            plain = plain.as_subclass(torch.Tensor)
        return plain.clone(memory_format=torch.contiguous_format)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def backward(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Backpropagate each (output, grad_output) pair: as torch.autograd.backward(outputs, grads), through the sum of
    output * grad, whose gradient at each output is 1 * grad (exact in every dtype). torch's own call checks the given
    grads with a module that imports sympy first: 0.9 CPU s in every process that runs a backward."""
    sum((output * grad).sum() for output, grad in pairs).backward()


GRAD_SEED_OFFSET = 7   # the grad_outputs' generator: the run's weight seed plus this


def grad_output_specs(results: list[Any]) -> list[Optional[dict]]:
    """Per output of a forward run with its inputs' gradients asked: the shape and dtype of the grad_output its
    backward gets where it is a floating-point tensor with an autograd graph, else None (the feed's `grad_outputs`:
    a description, drawn where a backward runs, draw_grad_outputs)."""
    def spec(result: Any) -> Optional[dict]:
        dtype = str(result.dtype).removeprefix("torch.") if isinstance(result, torch.Tensor) else None
        return {"shape": list(result.shape), "dtype": dtype} if dtype in GRAD_DTYPES and result.requires_grad else None

    return [spec(result) for result in results]


def draw_grad_outputs(specs: list[Optional[dict]], seed: int, device: str) -> list[Optional[torch.Tensor]]:
    """The grad_outputs `specs` describe, drawn on `device` in order from one generator seeded `seed` +
    GRAD_SEED_OFFSET: the same tensors in the oracle (the reference's backward) and in a candidate's process (its
    backward), each drawing them only when a backward runs."""
    generator = torch.Generator(device=device).manual_seed(seed + GRAD_SEED_OFFSET)
    return [None if spec is None else torch.randn(spec["shape"], dtype=getattr(torch, spec["dtype"]),
                                                  generator=generator, device=device) for spec in specs]


def short_error(exc: BaseException, limit: int = 300) -> str:
    """Exception type and its first meaningful line: what a results table can show."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def log_exception(stage: str) -> None:
    """Full traceback to the child's log (stderr); the parent keeps the log file."""
    print(f"[harness] {stage} raised:", file=sys.stderr)
    traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()


def _spec_when_told(ahead: Any, channel: protocol.ChildChannel) -> Optional[Any]:
    """A process started ahead: IMPORTED, then the spec CMD_RUN carries, which must keep its device and folder."""
    channel.send(Signal(protocol.IMPORTED))
    command = commands.parse(channel.receive())
    if not isinstance(command, commands.Run):
        return None
    spec = specs.from_fields(type(ahead), command.spec)
    if (spec.device, spec.out_dir, spec.ahead) != (ahead.device, ahead.out_dir, False):
        raise RuntimeError("the spec sent to a process started ahead does not match how it was started")
    return spec


def open_channel(wiring: specs.Wiring) -> protocol.ChildChannel:
    return protocol.ChildChannel(wiring.event_fd, wiring.command_fd, token=wiring.token)


def save_judged(value: Any, name: str, fds: Optional[dict], folder: Path, needed: int) -> None:
    """A file the judge needs (an oracle's feed, truth and gradients), its tensors wherever they are, saved in place
    (handover.save_in_place) into the memfd the parent made for `name`, or into `folder / name` where there is none.
    JudgeShort when it cannot hold its `needed` bytes (the host's memory for a memfd, the folder's free space for a
    file), checked first (a write that exhausts either hurts every other process of the machine) and again after a
    failed save (torch reports a write refused as its zip writer's RuntimeError; the OSError, where there is one, is
    only its context)."""
    fd = (fds or {}).get(name)
    room = (lambda: no_memory(needed)) if fd is not None else (lambda: no_room(folder, needed))
    why = room()
    if why is not None:
        raise JudgeShort(why)
    try:
        handover.save_in_place(value, name, fds, folder)
    except Exception as exc:
        if fd is not None:   # the torn file's pages back before the check, as before the save
            os.ftruncate(fd, 0)
        else:
            (folder / name).unlink(missing_ok=True)
        cause = short_cause(exc)
        why = room() or (short_error(cause) if cause is not None else None)
        if why is not None:
            raise JudgeShort(f"writing {name}: {why}") from exc
        raise


def serve_once(spec_path: str, kind: type, work: Callable[[Any, protocol.ChildChannel, specs.Wiring], Any],
               failure_status: str,
               then: Optional[Callable[[protocol.ChildChannel], None]] = None,
               short_status: Optional[str] = None) -> None:
    """Read the spec (a `kind` from harness/shared/specs.py), run `work(spec, channel, wiring)` and send the READY
    message it returns (harness/shared/messages.py), or FAILED; then `then(channel)` (a process that serves commands
    after READY) and exit without interpreter teardown. A spec marked `ahead` (a process started ahead:
    harness/oracle/ahead.py) is only where the process stands: it reports IMPORTED and takes its real spec from CMD_RUN
    (anything else: it exits). `short_status`: the FAILED status of a failure where the machine ran short
    (harness/shared/resources.py; trusted processes only: a candidate's MemoryError is its own)."""
    spec, wiring = specs.read_spec(spec_path, kind)
    channel = open_channel(wiring)
    try:
        if getattr(spec, "ahead", False):
            spec = _spec_when_told(spec, channel)
            if spec is None:
                channel.close()
                os._exit(0)
        channel.send(work(spec, channel, wiring))
        if then is not None:
            then(channel)
    except Exception as exc:  # the process boundary: report and exit
        status = short_status if short_status is not None and ran_short(exc) else failure_status
        log_exception(status)
        channel.send(Failed(status, short_error(exc)))
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
