"""The candidate's process: everything in this file runs next to untrusted code (the `unsafe_` side).

Started by the parent as `python -m harness.candidate_child SPEC`, in its own process group, temp dir and
TORCH_EXTENSIONS_DIR. Stages: execute the module (extension builds) -> COMPILED; build ModelNew, load the
reference weights, run the trials, the repeat and the backward -> RESULT_FILE, CHECKED; on the parent's
command, time the forward -> TIMED. A stage that raises ends the process with FAILED and the stage's status.
The verdict is not computed here: the parent compares what this process saved with the oracle's truth.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.utils.cpp_extension as cpp_extension

from harness import protocol
from harness.child_runtime import (
    configure_precision,
    exec_source,
    flatten_outputs,
    log_exception,
    short_error,
    synchronize,
    to_device,
    to_plain_cpu,
)
from harness.timing import bench

CUDA_SUFFIXES = (".cu", ".cuh")


class StageFailure(Exception):
    def __init__(self, status: str, error: str, **fields: Any):
        super().__init__(error)
        self.status, self.error, self.fields = status, error, fields


class NeedsCuda(RuntimeError):
    """Raised instead of building CUDA sources when the evaluation device is not CUDA."""


class ExtensionWatch:
    """Wraps cpp_extension.load_inline / load to count builds and notice failures, even swallowed ones."""

    def __init__(self, device: str):
        self.device = device
        self.built = 0
        self.failure: Optional[str] = None
        self.needs_cuda = False

    def install(self) -> None:
        cpp_extension.load_inline = self._wrap(cpp_extension.load_inline, self._inline_wants_cuda)
        cpp_extension.load = self._wrap(cpp_extension.load, self._load_wants_cuda)

    @staticmethod
    def _inline_wants_cuda(*args: Any, **kwargs: Any) -> bool:
        cuda_sources = kwargs.get("cuda_sources", args[2] if len(args) > 2 else None)
        return bool(cuda_sources) or bool(kwargs.get("with_cuda"))

    @staticmethod
    def _load_wants_cuda(*args: Any, **kwargs: Any) -> bool:
        sources = kwargs.get("sources", args[1] if len(args) > 1 else [])
        sources = [sources] if isinstance(sources, str) else list(sources or [])
        return any(str(s).endswith(CUDA_SUFFIXES) for s in sources) or bool(kwargs.get("with_cuda"))

    def _wrap(self, original, wants_cuda):
        def watched(*args: Any, **kwargs: Any):
            if wants_cuda(*args, **kwargs) and self.device != "cuda":
                self.needs_cuda = True
                raise NeedsCuda("the submission builds CUDA sources; the evaluation device is not CUDA")
            try:
                module = original(*args, **kwargs)
            except BaseException as exc:
                self.failure = self.failure or _build_error_line(exc)
                raise
            self.built += 1
            return module

        watched.__wrapped__ = original
        watched.__name__ = original.__name__
        return watched


def _build_error_line(exc: BaseException) -> str:
    """The first compiler 'error' line of a build failure, for display; the full output is in the log."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines[1:]:
        if "error" in line.lower():
            return f"{type(exc).__name__}: {line[:280]}"
    return short_error(exc)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    channel = protocol.ChildChannel(spec["event_fd"], spec["command_fd"])
    try:
        unsafe_run(spec, channel)
    except StageFailure as failure:
        channel.send(protocol.FAILED, status=failure.status, error=failure.error, **failure.fields)
    except BaseException as exc:  # outside any stage (e.g. saving the result): still the candidate's run
        log_exception("harness step")
        channel.send(protocol.FAILED, status="runtime_error", error=short_error(exc))
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the candidate's atexit hooks and a CUDA teardown that can hang after a fault


def unsafe_run(spec: dict, channel: protocol.ChildChannel) -> None:
    device = spec["device"]
    configure_precision(spec["allow_tf32"])
    model_class, watch, compile_s = unsafe_load(spec, device)
    channel.send(protocol.COMPILED, compile_s=compile_s, extensions_built=watch.built)

    feed = torch.load(spec["feed"], weights_only=True)
    model, weights_loaded = unsafe_build(model_class, feed, spec["seed"], device)
    result = unsafe_check(model, feed, device, spec["check_grad"])
    result["weights_loaded"] = weights_loaded
    torch.save(result, Path(spec["out_dir"]) / protocol.RESULT_FILE)
    channel.send(protocol.CHECKED)

    if channel.receive() == protocol.CMD_TIME:
        inputs = to_device(feed["trials"][0], device)
        try:
            with torch.no_grad():
                stats = bench(lambda: model(*inputs), device, **spec["timing"])
        except Exception as exc:
            log_exception("timing")
            raise StageFailure("runtime_error", short_error(exc)) from exc
        channel.send(protocol.TIMED, timing=stats.to_dict())


def unsafe_load(spec: dict, device: str):
    """Execute the submission's module (this runs its load_inline builds) and find ModelNew."""
    watch = ExtensionWatch(device)
    watch.install()
    start = time.perf_counter()
    error: Optional[BaseException] = None
    module = None
    try:
        module = exec_source(Path(spec["source_path"]).read_text(), spec["source_path"], "submission")
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


def unsafe_build(model_class, feed: dict, seed: int, device: str):
    """ModelNew(*init_inputs) under the reference's seed, then the reference weights where names and shapes match."""
    try:
        torch.manual_seed(seed)
        model = model_class(*feed["init_inputs"])
        own = model.state_dict()
        loaded = 0
        with torch.no_grad():
            for name, tensor in feed["state_dict"].items():
                if name in own and own[name].shape == tensor.shape:
                    own[name].copy_(tensor)
                    loaded += 1
        model = model.to(device)
        synchronize(device)
    except BaseException as exc:
        log_exception("ModelNew construction")
        raise StageFailure("init_error", short_error(exc)) from exc
    return model, loaded


def unsafe_check(model, feed: dict, device: str, check_grad: bool) -> dict:
    """Forward on every trial, trial 0 again (races), then one backward; everything returned as CPU tensors."""
    try:
        outputs = [_forward(model, inputs, device) for inputs in feed["trials"]]
        repeat = _forward(model, feed["trials"][0], device)
    except BaseException as exc:
        log_exception("forward")
        raise StageFailure("runtime_error", short_error(exc)) from exc
    result: dict[str, Any] = {"outputs": outputs, "repeat": repeat, "has_graph": None, "input_grads": None,
                              "param_grads": None, "grad_error": None}
    if check_grad:
        try:
            result.update(_backward(model, feed["trials"][0], feed["grad_outputs"], device))
        except Exception as exc:  # a failing backward is a gradient verdict, not the end of the run
            log_exception("backward")
            result["grad_error"] = short_error(exc)
    return result


def _forward(model, inputs: list, device: str) -> list:
    with torch.no_grad():
        results = flatten_outputs(model(*to_device(inputs, device)))
    synchronize(device)
    return [to_plain_cpu(v) for v in results]


def _backward(model, inputs: list, grad_outputs: list, device: str) -> dict:
    model.zero_grad(set_to_none=True)
    leaves = to_device(inputs, device, requires_grad=True)
    results = flatten_outputs(model(*leaves))
    pairs, has_graph = [], True
    for result, grad in zip(results, grad_outputs):
        if grad is None:
            continue
        if not isinstance(result, torch.Tensor) or not result.requires_grad:
            has_graph = False
            continue
        pairs.append((result, grad.to(device=device, dtype=result.dtype)))
    if not has_graph or not pairs:
        return {"has_graph": False}
    torch.autograd.backward([r for r, _ in pairs], [g for _, g in pairs])
    synchronize(device)
    input_grads = [to_plain_cpu(x.grad) if isinstance(x, torch.Tensor) and x.grad is not None else None
                   for x in leaves]
    param_grads = {name: (to_plain_cpu(p.grad) if p.grad is not None else None)
                   for name, p in model.named_parameters()}
    return {"has_graph": True, "input_grads": input_grads, "param_grads": param_grads}


if __name__ == "__main__":
    main(sys.argv[1])
