"""The findings catalogue: every name a record's `flags` can hold, what it means, who sees it, and its default.

A finding is evidence, not a verdict: the record keeps every finding with its evidence, and a rule profile
(harness/integrity/profiles.py, configs/<name>.yaml) says which of them turn a measured pass into rule_violation.
Profiles name findings one by one or by group (`gaming`, `tampering`, `source`); a group expands to its members in
catalogue order, and a profile's `forbid` is kept in catalogue order whatever order it was written in.

Adding a rule: one entry here, one detector where `seen_by` says (source: a check in the `CHECKS` of one family
module of harness/integrity/static/; candidate: harness/children/candidate/watch.py, guard.py or main.py, reported on the
child's events; parent: harness/judge/evaluate.py and harness/judge/candidate_run.py), and its test.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable

# Categories. Groups below are unions of them.
KERNELS = "kernels"              # who did the forward's work
TAMPERING = "tampering"          # the measurement itself was gamed or cannot be trusted
SIDE_EFFECTS = "side_effects"    # the submission changed state it has no business changing
CORRECTNESS = "correctness"      # a wrong output found while timing (a status of its own, never forbidden)
EVIDENCE = "evidence"            # facts about a result that a reader should see, no sign of gaming by themselves
SOURCE = "source"                # read from the source with ast, never run (signs for a reviewer)

# Where the detector runs.
SEEN_IN_SOURCE = "source"        # the parent reads the extracted source
SEEN_IN_CANDIDATE = "candidate"  # inside the candidate's process, reported on its events (untrusted)
SEEN_BY_PARENT = "parent"        # the parent, from what it measured itself


@dataclass(frozen=True)
class FindingKind:
    name: str
    meaning: str
    category: str
    seen_by: str
    forbidden_by_default: bool


def _kind(name: str, meaning: str, category: str, seen_by: str, default: bool = False) -> FindingKind:
    return FindingKind(name, meaning, category, seen_by, default)


# The order is the canonical order of a profile's `forbid` (and so of the config hash): keep new entries at the end
# of their block, never reorder.
CATALOGUE: tuple[FindingKind, ...] = (
    _kind("no_custom_kernel", "no kernel of the submission's own extensions ran in the profiled forward",
          KERNELS, SEEN_BY_PARENT, default=True),
    _kind("no_fusion", "no custom kernel replaces two or more of the reference's operators", KERNELS, SEEN_BY_PARENT),
    _kind("output_subclass", "an output is not a plain torch.Tensor (e.g. a lazy subclass)",
          TAMPERING, SEEN_IN_CANDIDATE, default=True),
    _kind("patched_runtime", "a watched torch, time, builtins or harness attribute changed while the submission ran",
          TAMPERING, SEEN_IN_CANDIDATE, default=True),
    _kind("precision_changed", "TF32, matmul precision, autocast or the default dtype changed while the submission "
          "ran", SIDE_EFFECTS, SEEN_IN_CANDIDATE, default=True),
    _kind("mutates_inputs", "an input tensor differed after the forward call", SIDE_EFFECTS, SEEN_IN_CANDIDATE,
          default=True),
    _kind("sandbox_blocked", "the sandbox blocked an operation (network, process, ctypes, introspection, file write)",
          TAMPERING, SEEN_IN_CANDIDATE, default=True),
    _kind("spawned_processes", "processes started by the submission were alive at the end of its run",
          SIDE_EFFECTS, SEEN_BY_PARENT, default=True),
    _kind("background_thread", "Python threads started by the submission were alive after forward returned",
          SIDE_EFFECTS, SEEN_IN_CANDIDATE, default=True),
    _kind("timer_mismatch", "the parent's wall clock and the reported event times disagree beyond the stated bound",
          TAMPERING, SEEN_BY_PARENT, default=True),
    _kind("input_replay", "timed calls on input sets it had never been given ran far slower than on the rotating "
          "ones: its fast time came from outputs it kept, not from computing them", TAMPERING, SEEN_BY_PARENT,
          default=True),
    _kind("forged_events", "lines on the event pipe without the run's token (written by the submission)",
          TAMPERING, SEEN_BY_PARENT, default=True),
    _kind("output_flood", "more output than the log keeps (max_log_bytes)", SIDE_EFFECTS, SEEN_BY_PARENT,
          default=True),
    _kind("library_kernels", "library or ATen kernels did part of the forward's work", KERNELS, SEEN_BY_PARENT),
    _kind("side_stream_kernels", "kernels ran on a stream other than the one the harness called forward on",
          KERNELS, SEEN_BY_PARENT),
    _kind("timed_output_mismatch", "an output of a timed call (spot-checked) differs from the reference",
          CORRECTNESS, SEEN_BY_PARENT),
    _kind("beyond_reference_roofline", "faster than half the roofline floor of the reference's own FLOPs and bytes: "
          "a better algorithm than the reference's (its fresh-input timing and spot checks held)", EVIDENCE,
          SEEN_BY_PARENT),
    _kind("degenerate_problem", "the problem's output does not depend on its inputs (a constant passes) or on one of "
          "them, so a right answer can skip that work (harness/integrity/degenerate.py)", EVIDENCE, SEEN_BY_PARENT),
    _kind("reference_drift", "the reference ran slower beside the candidate than its clean time, but either the "
          "candidate could not have caused it (CPU device: no CPU used outside its own timed calls; GPU: the GPU ran a "
          "fixed workload at its clean pace with the candidate stopped) or it was as slow alone after the candidate "
          "was killed: put down to the machine; the speedup is taken against the faster reference time "
          "(docs/timing.md)", EVIDENCE, SEEN_BY_PARENT),
    _kind("timer_unexplained", "the candidate's timed blocks left more of the parent's wall time unaccounted for (not "
          "in its reported timed spans or its reported preparation) than the reference's did on the same timer, "
          "scaled by its calls, beyond the stated bound: evidence for timer reports that under-state "
          "(harness/timing/interleave.py)",
          EVIDENCE, SEEN_BY_PARENT),
    # Read from the source (harness/integrity/static/).
    _kind("imports_beyond_torch", "imports a package that is neither torch nor in the standard library",
          SOURCE, SEEN_IN_SOURCE),
    _kind("process_spawn", "starts processes (subprocess, multiprocessing, os.system, os.fork, os.exec*, ...)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("threads", "uses threads or an event loop (threading, ThreadPoolExecutor, asyncio)", SOURCE,
          SEEN_IN_SOURCE),
    _kind("network", "uses the network (socket, http, urllib, requests, ...)", SOURCE, SEEN_IN_SOURCE),
    _kind("native_access", "reaches native code outside extensions (ctypes, cffi, mmap, torch.ops.load_library)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("introspection", "inspects frames, the garbage collector or function internals (inspect, gc, f_back, ...)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("sys_modules", "touches the import machinery or builtins (sys.modules, importlib.reload, __builtins__)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("monkeypatch", "assigns to or deletes an attribute of an imported module or class "
          "(torch.cuda.synchronize = f)", SOURCE, SEEN_IN_SOURCE),
    _kind("exits", "can end or signal the process (sys.exit, os._exit, os.kill, signal, raise SystemExit)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("env_access", "reads or changes environment variables (os.environ, os.getenv, ...)", SOURCE,
          SEEN_IN_SOURCE),
    _kind("file_io", "reads or writes files (open, os/shutil/tempfile file operations, torch.save/load, "
          "/proc/self/fd)", SOURCE, SEEN_IN_SOURCE),
    _kind("seed_control", "reads or sets random number generator state (torch.manual_seed, torch.Generator, ...)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("precision_downgrade", "computes below float32 for a float32 problem (half, bfloat16, TF32, autocast, MMA)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("side_stream", "works off the current CUDA stream (new streams, host callbacks, threads in C++)", SOURCE,
          SEEN_IN_SOURCE),
    _kind("library_calls", "calls a vendor library or an ATen operator from C++/CUDA (cuBLAS, CUTLASS, at::matmul, "
          "...)", SOURCE, SEEN_IN_SOURCE),
    _kind("exception_fallback", "catches exceptions without re-raising, so a failing kernel can fall back to other "
          "code", SOURCE, SEEN_IN_SOURCE),
    _kind("uses_reference_model", "uses, subclasses or copies the reference Model", SOURCE, SEEN_IN_SOURCE),
    _kind("init_signature_mismatch", "ModelNew.__init__ takes other parameters than the reference Model.__init__",
          SOURCE, SEEN_IN_SOURCE),
    _kind("identity_keyed_state", "keys state by object identity or data pointer (id(x) or x.data_ptr() as a key)",
          SOURCE, SEEN_IN_SOURCE),
    _kind("obfuscation", "builds names or code at run time (eval, exec, __import__, getattr with a computed name, "
          "...)", SOURCE, SEEN_IN_SOURCE),
    # Read from the source, under one backend only (harness/shared/backends `source_checks`).
    _kind("no_triton_kernel", "a Triton submission defines no @triton.jit kernel", SOURCE, SEEN_IN_SOURCE),
    _kind("forward_without_kernel", "ModelNew.forward launches none of the submission's own kernels (Triton: "
          "kernel[grid](...)), directly or through the functions, methods and autograd Functions it calls",
          SOURCE, SEEN_IN_SOURCE),
)

BY_NAME: dict[str, FindingKind] = {kind.name: kind for kind in CATALOGUE}
_POSITION = {kind.name: index for index, kind in enumerate(CATALOGUE)}

# Groups a profile may name instead of listing findings: name -> the categories it covers.
GROUPS: dict[str, frozenset[str]] = {
    "tampering": frozenset({TAMPERING}),                 # only what means the measurement itself was gamed
    "gaming": frozenset({TAMPERING, SIDE_EFFECTS}),      # every sign of gaming the judge
    "source": frozenset({SOURCE}),                       # every static finding
}

# Name -> meaning, for the findings read from the source and those measured while the candidate runs.
STATIC: dict[str, str] = {k.name: k.meaning for k in CATALOGUE if k.seen_by == SEEN_IN_SOURCE}
DYNAMIC: dict[str, str] = {k.name: k.meaning for k in CATALOGUE if k.seen_by != SEEN_IN_SOURCE}
# What the candidate's process may report about itself: nothing the parent measures (a candidate that named a
# parent-side finding could, e.g., mark its problem degenerate and leave the leaderboard's other columns).
IN_CANDIDATE: dict[str, str] = {k.name: k.meaning for k in CATALOGUE if k.seen_by == SEEN_IN_CANDIDATE}


class UnknownFinding(ValueError):
    """A profile names a finding or group that does not exist; the message suggests the closest names."""


def members(group: str) -> tuple[str, ...]:
    return tuple(kind.name for kind in CATALOGUE if kind.category in GROUPS[group])


def expand(names: Iterable[str]) -> tuple[str, ...]:
    """Finding and group names -> the findings, each once, in catalogue order."""
    found: set[str] = set()
    for name in names:
        if name in GROUPS:
            found.update(members(name))
        elif name in BY_NAME:
            found.add(name)
        else:
            close = difflib.get_close_matches(name, [*BY_NAME, *GROUPS], n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UnknownFinding(f"unknown finding '{name}'{hint}")
    return tuple(sorted(found, key=_POSITION.__getitem__))


DEFAULT_FORBID: tuple[str, ...] = tuple(kind.name for kind in CATALOGUE if kind.forbidden_by_default)
