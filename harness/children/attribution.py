"""Who did the work in one forward: the submission's own kernels or library ones, from a torch.profiler trace.

Used by the oracle (counting the reference's operators) and by the candidate's process. The harness wraps every
function of an extension the submission builds in a `record_function("ext::<name>")` range while profiling.

- CUDA: a kernel is the submission's own when its name is one of its own kernels' names and it was launched inside
  an `ext::` range or is not named like a library kernel; its own kernels' names come from its backend
  (harness/shared/backends: the `__global__` functions of the C++/CUDA sources it built; the @triton.jit functions of
  its module, which Triton launches outside any extension call; TileLang names a prim_func's kernel `<name>_kernel`;
  the CuTe DSL names a @cute.kernel function's kernel `kernel_cutlass_<name>_<its arguments>_<n>`, which counts as
  own despite the library word in it). Every other kernel, memcpy and memset is library work.
  Durations are GPU time. Kernels on a stream other than the harness's (found with a marker kernel launched just
  before the forward) are reported as side-stream kernels.
- CPU: each successful call into the extension is one own kernel, and so is each call of an operator registered
  after torch's own with a kernel in native code (the submission's TORCH_LIBRARY; one registered from Python, by
  torch.library, is looked through to the operators it runs); library work is every other top-level operator (not
  nested in another operator) that computes or copies, inside or outside an extension call, torch's operators
  outside aten (prims, quantized, mkldnn, ...) included; views, allocations and metadata queries are not work.
  Durations are host time.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.autograd import profiler
from torch.profiler import record_function

from harness.shared.backends import own_kernel_names
from harness.shared.backends.cute import TRACE_PREFIX as CUTE_PREFIX
from harness.shared.messages import KernelCounts

EXT_PREFIX = "ext::"
MARKER = "harness::marker"

# Every operator torch had registered when this module was imported, in any namespace (aten, prims, quantized,
# mkldnn, ...), by name without its overload: torch's own, imported before any submission code runs in the process.
# On CPU only an operator registered later (the submission's TORCH_LIBRARY) counts as its own.
_get_op_names = getattr(torch._C, "_dispatch_get_all_op_names", lambda: [])
TORCH_OPS = frozenset(name.split(".", 1)[0] for name in _get_op_names())
_dispatch_dump = getattr(torch._C, "_dispatch_dump", lambda name: "")
_REGISTERED_AT = re.compile(r"^(?!debug:|schema:|name:)[^:\n]+: registered at (?P<where>.+?):\d+(?: ::|$)",
                            re.MULTILINE)


@functools.lru_cache(maxsize=None)
def python_operator(name: str) -> bool:
    """Whether every kernel of the registered operator `name` was registered from Python (torch.library's
    custom_op or Library.impl, in a .py file or exec'd source): its body is torch's operators, looked through as an
    autograd.Function is. False for one with a kernel from native code (TORCH_LIBRARY in C++) or unknown."""
    places = [m.group("where") for m in _REGISTERED_AT.finditer(_dispatch_dump(name))]
    return bool(places) and all(place.endswith(".py") or place.startswith("<") for place in places)

# ATen operators that move no data and compute nothing (an op that nests real work, e.g. contiguous -> clone,
# counts through its child).
METADATA_OPS = {
    "aten::" + name for name in (
        "empty", "empty_like", "empty_strided", "view", "reshape", "_reshape_alias", "_unsafe_view", "as_strided",
        "t", "transpose", "permute", "expand", "expand_as", "unsqueeze", "squeeze", "select", "slice", "narrow",
        "split", "chunk", "unbind", "flatten", "unflatten", "view_as", "movedim", "swapaxes", "diagonal", "detach",
        "alias", "resolve_conj", "resolve_neg", "contiguous", "to", "size", "stride", "numel", "dim", "item",
        "_local_scalar_dense", "lift", "lift_fresh", "set_", "resize_", "result_type", "is_nonzero", "_to_dense",
        "stride", "sym_size", "sym_stride", "sym_numel", "is_same_size", "record_stream")
}
_LIBRARY_HINT = re.compile(r"at::|native::|cutlass|cublas|cudnn|xmma|cute::|thrust::|cub::|sm\d+_", re.IGNORECASE)
_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
             "cudaLaunchCooperativeKernel"}


def global_function_names(sources: list[str]) -> set[str]:
    """The submission's own kernel names in its sources: `__global__` functions of C++/CUDA sources, and the
    kernels a Python backend's module source defines (harness/shared/backends.own_kernel_names)."""
    return own_kernel_names(sources)


@dataclass
class KernelProfile:
    own: int = 0                   # launches (CUDA) or extension calls (CPU) of the submission's own kernels
    library: int = 0               # library kernels, memcpys and memsets (CUDA) or top-level ATen work ops (CPU)
    own_ms: float = 0.0
    library_ms: float = 0.0
    library_names: dict[str, int] = field(default_factory=dict)
    side_streams: set[int] = field(default_factory=set)

    @property
    def own_share(self) -> Optional[float]:
        total = self.own_ms + self.library_ms
        return self.own_ms / total if total > 0 else None

    def add_library(self, name: str, ms: float) -> None:
        self.library += 1
        self.library_ms += ms
        self.library_names[name] = self.library_names.get(name, 0) + 1

    def library_summary(self, limit: int = 4) -> str:
        top = sorted(self.library_names.items(), key=lambda item: -item[1])[:limit]
        return ", ".join(f"{name[:60]} x{count}" for name, count in top)

    def counts(self) -> KernelCounts:
        """What the candidate's CHECKED carries of it (harness/shared/messages.py)."""
        return KernelCounts(self.own, self.library, self.own_share, self.library_summary(),
                            tuple(sorted(self.side_streams)))


def session(device: str) -> profiler.profile:
    """A profiler session: host operators, and the GPU's kernels on CUDA. The Kineto profiler torch.profiler.profile
    wraps, without the wrapper: its first session imports torch._inductor (over a CPU second per
    process), which every candidate and reference process would pay for nothing."""
    return profiler.profile(use_kineto=True, use_cpu=True,
                            use_device="cuda" if device == "cuda" and torch.cuda.is_available() else None)


def profile_forward(forward: Callable[[], Any], device: str, own_names: set[str], trace_path: Path,
                    own_calls: Optional[Callable[[], int]] = None) -> KernelProfile:
    """Profile one call of `forward`; `own_calls` (CPU) counts successful extension calls so far."""
    calls_before = own_calls() if own_calls else 0
    marker = torch.zeros(1, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
    with session(device) as prof:
        with record_function(MARKER):
            marker.fill_(1.0)
        forward()
        if device == "cuda":
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    events = [e for e in json.loads(trace_path.read_text()).get("traceEvents", []) if e.get("ph") == "X"]
    trace_path.unlink()
    if device == "cuda":
        return _attribute_cuda(events, own_names)
    result = _attribute_cpu(events)
    result.own += (own_calls() - calls_before) if own_calls else 0
    return result


def _inside(event: dict, ranges: list[dict]) -> bool:
    start, end = event["ts"], event["ts"] + event.get("dur", 0)
    return any(r.get("tid") == event.get("tid") and r["ts"] <= start and end <= r["ts"] + r.get("dur", 0)
               for r in ranges)


def _attribute_cuda(events: list[dict], own_names: set[str]) -> KernelProfile:
    ext_ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(EXT_PREFIX)]
    from_ext = {e["args"].get("correlation") for e in events
                if e.get("cat") == "cuda_runtime" and e["name"] in _LAUNCHES and _inside(e, ext_ranges)}
    work = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: e["ts"])
    result = KernelProfile()
    if not work:
        return result
    marker, work = work[0], work[1:]   # the harness's fill_ launched just before forward
    harness_stream = marker.get("args", {}).get("stream")
    own_pattern = _own_pattern(own_names)
    for event in work:
        ms = event.get("dur", 0) / 1e3
        args = event.get("args", {})
        # Launched from an extension call, or at least not named like a library kernel (registered operators
        # launch outside the ext:: ranges); a CuTe DSL kernel of one of its own @cute.kernel functions.
        match = own_pattern.search(event["name"]) if own_pattern is not None and event.get("cat") == "kernel" \
            else None
        is_own = match is not None and (match.group("cute") is not None or args.get("correlation") in from_ext
                                        or not _LIBRARY_HINT.search(event["name"]))
        if is_own:
            result.own += 1
            result.own_ms += ms
        else:
            result.add_library(event["name"], ms)
        if args.get("stream") is not None and args.get("stream") != harness_stream:
            result.side_streams.add(args["stream"])
    return result


def _own_pattern(own_names: set[str]) -> Optional[re.Pattern]:
    """A trace name that is one of `own_names` as a word, or the CuTe DSL's name for a kernel of that name (group
    `cute`)."""
    if not own_names:
        return None
    names = "|".join(map(re.escape, sorted(own_names)))
    return re.compile(rf"^(?P<cute>{re.escape(CUTE_PREFIX)}(?:{names})_)|\b(?:{names})\b")


def _attribute_cpu(events: list[dict]) -> KernelProfile:
    markers = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == MARKER]
    # An op without a namespace is Python's (a torch.autograd.Function's forward, named after its class): looked
    # through, so that the operators it runs are counted as what they are; a pure-PyTorch forward wrapped in one is no
    # operator of the submission's own. Registered operators (TORCH_LIBRARY) are named `namespace::op`.
    # An operator registered from Python (torch.library) is looked through the same way.
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and "::" in e["name"] and not _inside(e, markers)
                  and (e["name"] in TORCH_OPS or not python_operator(e["name"]))),
                 key=lambda e: (e["ts"], -e.get("dur", 0)))
    ext_ranges = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(EXT_PREFIX)]
    result = KernelProfile()
    inside_ms = 0.0   # library work done inside the submission's extension calls
    for op, children in _top_level(ops):
        if op["name"] in METADATA_OPS and all(c["name"] in METADATA_OPS for c in children):
            continue
        ms = op.get("dur", 0) / 1e3
        if not op["name"].startswith("aten::") and op["name"] not in TORCH_OPS:   # one the submission registered
            result.own += 1
            result.own_ms += ms
            continue
        result.add_library(op["name"], ms)
        if _inside(op, ext_ranges):
            inside_ms += ms
    ext_ms = sum(r.get("dur", 0) for r in ext_ranges) / 1e3
    result.own_ms += max(ext_ms - inside_ms, 0.0)
    return result


def _top_level(ops: list[dict]) -> list[tuple[dict, list[dict]]]:
    """(op, its nested ops) for every op not nested in another op of the same thread."""
    tops: list[tuple[dict, list[dict]]] = []
    for op in ops:
        if tops:
            parent, children = tops[-1]
            if parent.get("tid") == op.get("tid") and op["ts"] + op.get("dur", 0) <= parent["ts"] + parent.get(
                    "dur", 0):
                children.append(op)
                continue
        tops.append((op, []))
    return tops
