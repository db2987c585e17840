"""The findings catalogue: every name a record's `flags` can hold, what it means, who sees it, and its default.

A finding is evidence, not a verdict: the record keeps every finding with its evidence, and a rule profile
(harness/integrity/profiles.py, configs/<name>.yaml) says which of them turn a measured pass into rule_violation.
Profiles name findings one by one or by group (`gaming`, `tampering`, `source`); a group expands to its members in
catalogue order, and a profile's `forbid` is kept in catalogue order whatever order it was written in.

Adding a rule: its constant and one entry here, one detector where `seen_by` says (source: a check in the `CHECKS`
of one family module of harness/integrity/static/; candidate: harness/children/candidate/watch.py, guard.py or
main.py, reported on the child's events; parent: a pure function in harness/integrity/ (detectors.py, drift.py,
degenerate.py) or harness/timing/interleave.py, recorded by harness/judge/evaluate.py or candidate_run.py), and its
test. Detectors collect findings in a `Found`, which refuses a name that is not catalogued.
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


# The findings' names: detectors record them through these constants (a literal elsewhere in harness/ fails
# tests/shared/test_findings.py), so that a typo is an error rather than a finding no profile ever forbids.
NO_CUSTOM_KERNEL = "no_custom_kernel"
NO_FUSION = "no_fusion"
OUTPUT_SUBCLASS = "output_subclass"
PATCHED_RUNTIME = "patched_runtime"
PRECISION_CHANGED = "precision_changed"
MUTATES_INPUTS = "mutates_inputs"
SANDBOX_BLOCKED = "sandbox_blocked"
SPAWNED_PROCESSES = "spawned_processes"
BACKGROUND_THREAD = "background_thread"
TIMER_MISMATCH = "timer_mismatch"
INPUT_REPLAY = "input_replay"
FORGED_EVENTS = "forged_events"
OUTPUT_FLOOD = "output_flood"
LIBRARY_KERNELS = "library_kernels"
SIDE_STREAM_KERNELS = "side_stream_kernels"
TIMED_OUTPUT_MISMATCH = "timed_output_mismatch"
BEYOND_REFERENCE_ROOFLINE = "beyond_reference_roofline"
DEGENERATE_PROBLEM = "degenerate_problem"
REFERENCE_DRIFT = "reference_drift"
TIMER_UNEXPLAINED = "timer_unexplained"
TIMER_RETIMED = "timer_retimed"
# read from the source
IMPORTS_BEYOND_TORCH = "imports_beyond_torch"
PROCESS_SPAWN = "process_spawn"
THREADS = "threads"
NETWORK = "network"
NATIVE_ACCESS = "native_access"
INTROSPECTION = "introspection"
SYS_MODULES = "sys_modules"
MONKEYPATCH = "monkeypatch"
EXITS = "exits"
ENV_ACCESS = "env_access"
FILE_IO = "file_io"
SEED_CONTROL = "seed_control"
PRECISION_DOWNGRADE = "precision_downgrade"
SIDE_STREAM = "side_stream"
LIBRARY_CALLS = "library_calls"
EXCEPTION_FALLBACK = "exception_fallback"
USES_REFERENCE_MODEL = "uses_reference_model"
INIT_SIGNATURE_MISMATCH = "init_signature_mismatch"
IDENTITY_KEYED_STATE = "identity_keyed_state"
OBFUSCATION = "obfuscation"
# read from the source, under one backend only
NO_TRITON_KERNEL = "no_triton_kernel"
FORWARD_WITHOUT_KERNEL = "forward_without_kernel"


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
    _kind(NO_CUSTOM_KERNEL, "no kernel of the submission's own extensions ran in the profiled forward",
          KERNELS, SEEN_BY_PARENT, default=True),
    _kind(NO_FUSION, "no custom kernel replaces two or more of the reference's operators", KERNELS, SEEN_BY_PARENT),
    _kind(OUTPUT_SUBCLASS, "an output is not a plain torch.Tensor (e.g. a lazy subclass)",
          TAMPERING, SEEN_IN_CANDIDATE, default=True),
    _kind(PATCHED_RUNTIME, "a watched torch, time, builtins or harness attribute changed while the submission ran",
          TAMPERING, SEEN_IN_CANDIDATE, default=True),
    _kind(PRECISION_CHANGED, "TF32, matmul precision, autocast or the default dtype changed while the submission "
          "ran", SIDE_EFFECTS, SEEN_IN_CANDIDATE, default=True),
    _kind(MUTATES_INPUTS, "an input tensor differed after the forward call", SIDE_EFFECTS, SEEN_IN_CANDIDATE,
          default=True),
    _kind(SANDBOX_BLOCKED, "the sandbox blocked an operation (network, process, ctypes, introspection, file write)",
          TAMPERING, SEEN_IN_CANDIDATE, default=True),
    _kind(SPAWNED_PROCESSES, "processes started by the submission were alive at the end of its run",
          SIDE_EFFECTS, SEEN_BY_PARENT, default=True),
    _kind(BACKGROUND_THREAD, "Python threads started by the submission were alive after forward returned",
          SIDE_EFFECTS, SEEN_IN_CANDIDATE, default=True),
    _kind(TIMER_MISMATCH, "the parent's wall clock and the reported event times disagree beyond the stated bound",
          TAMPERING, SEEN_BY_PARENT, default=True),
    _kind(INPUT_REPLAY, "timed calls on input sets it had never been given ran far slower than on the rotating "
          "ones: its fast time came from outputs it kept, not from computing them", TAMPERING, SEEN_BY_PARENT,
          default=True),
    _kind(FORGED_EVENTS, "lines on the event pipe without the run's token (written by the submission)",
          TAMPERING, SEEN_BY_PARENT, default=True),
    _kind(OUTPUT_FLOOD, "more output than the log keeps (max_log_bytes)", SIDE_EFFECTS, SEEN_BY_PARENT,
          default=True),
    _kind(LIBRARY_KERNELS, "library or ATen kernels did part of the forward's work", KERNELS, SEEN_BY_PARENT),
    _kind(SIDE_STREAM_KERNELS, "kernels ran on a stream other than the one the harness called forward on",
          KERNELS, SEEN_BY_PARENT),
    _kind(TIMED_OUTPUT_MISMATCH, "an output of a timed call (spot-checked) differs from the reference's for the "
          "input set the judge chose for that call",
          CORRECTNESS, SEEN_BY_PARENT),
    _kind(BEYOND_REFERENCE_ROOFLINE, "faster than half the roofline floor of the reference's own FLOPs and bytes: "
          "a better algorithm than the reference's (its fresh-input timing and spot checks held)", EVIDENCE,
          SEEN_BY_PARENT),
    _kind(DEGENERATE_PROBLEM, "the problem's output does not depend on its inputs (a constant passes) or on one of "
          "them, so a right answer can skip that work (harness/integrity/degenerate.py)", EVIDENCE, SEEN_BY_PARENT),
    _kind(REFERENCE_DRIFT, "the reference ran slower beside the candidate than its clean time, but either the "
          "candidate could not have caused it (CPU device: no CPU used outside its own timed calls; GPU: the GPU ran a "
          "fixed workload at its clean pace with the candidate stopped) or it was as slow alone after the candidate "
          "was killed: put down to the machine; the speedup is taken against the faster reference time "
          "(docs/timing.md)", EVIDENCE, SEEN_BY_PARENT),
    _kind(TIMER_UNEXPLAINED, "the candidate's timed blocks left more of the parent's wall time unaccounted for (not "
          "in its reported timed spans or its reported preparation) than the reference's did on the same timer, "
          "scaled by its calls, beyond the stated bound: evidence for timer reports that under-state "
          "(harness/timing/interleave.py)",
          EVIDENCE, SEEN_BY_PARENT),
    _kind(TIMER_RETIMED, "the first timing's reported event times fell short of the parent's wall clock beyond the "
          "stated bound; timed again from a fresh start, they agreed, and the figures are the second timing's "
          "(harness/timing/interleave.py WALL_RETIMES)",
          EVIDENCE, SEEN_BY_PARENT),
    # Read from the source (harness/integrity/static/).
    _kind(IMPORTS_BEYOND_TORCH, "imports a package that is neither torch nor in the standard library",
          SOURCE, SEEN_IN_SOURCE),
    _kind(PROCESS_SPAWN, "starts processes (subprocess, multiprocessing, os.system, os.fork, os.exec*, ...)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(THREADS, "uses threads or an event loop (threading, ThreadPoolExecutor, asyncio)", SOURCE,
          SEEN_IN_SOURCE),
    _kind(NETWORK, "uses the network (socket, http, urllib, requests, ...)", SOURCE, SEEN_IN_SOURCE),
    _kind(NATIVE_ACCESS, "reaches native code outside extensions (ctypes, cffi, mmap, torch.ops.load_library)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(INTROSPECTION, "inspects frames, the garbage collector or function internals (inspect, gc, f_back, ...)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(SYS_MODULES, "touches the import machinery or builtins (sys.modules, importlib.reload, __builtins__)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(MONKEYPATCH, "assigns to or deletes an attribute of an imported module or class "
          "(torch.cuda.synchronize = f)", SOURCE, SEEN_IN_SOURCE),
    _kind(EXITS, "can end or signal the process (sys.exit, os._exit, os.kill, signal, raise SystemExit)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(ENV_ACCESS, "reads or changes environment variables (os.environ, os.getenv, ...)", SOURCE,
          SEEN_IN_SOURCE),
    _kind(FILE_IO, "reads or writes files (open, os/shutil/tempfile file operations, torch.save/load, "
          "/proc/self/fd)", SOURCE, SEEN_IN_SOURCE),
    _kind(SEED_CONTROL, "reads or sets random number generator state (torch.manual_seed, torch.Generator, ...)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(PRECISION_DOWNGRADE, "computes below float32 for a float32 problem (half, bfloat16, TF32, autocast, MMA)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(SIDE_STREAM, "works off the current CUDA stream (new streams, host callbacks, threads in C++)", SOURCE,
          SEEN_IN_SOURCE),
    _kind(LIBRARY_CALLS, "calls a vendor library or an ATen operator from C++/CUDA (cuBLAS, CUTLASS, at::matmul, "
          "...)", SOURCE, SEEN_IN_SOURCE),
    _kind(EXCEPTION_FALLBACK, "catches exceptions without re-raising, so a failing kernel can fall back to other "
          "code", SOURCE, SEEN_IN_SOURCE),
    _kind(USES_REFERENCE_MODEL, "uses, subclasses or copies the reference Model", SOURCE, SEEN_IN_SOURCE),
    _kind(INIT_SIGNATURE_MISMATCH, "ModelNew.__init__ takes other parameters than the reference Model.__init__",
          SOURCE, SEEN_IN_SOURCE),
    _kind(IDENTITY_KEYED_STATE, "keys state by object identity or data pointer (id(x) or x.data_ptr() as a key)",
          SOURCE, SEEN_IN_SOURCE),
    _kind(OBFUSCATION, "builds names or code at run time (eval, exec, __import__, getattr with a computed name, "
          "...)", SOURCE, SEEN_IN_SOURCE),
    # Read from the source, under one backend only (harness/shared/backends `source_checks`).
    _kind(NO_TRITON_KERNEL, "a Triton submission defines no @triton.jit kernel", SOURCE, SEEN_IN_SOURCE),
    _kind(FORWARD_WITHOUT_KERNEL, "ModelNew.forward launches none of the submission's own kernels (Triton: "
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
    """A name that is no finding or group: named by a profile, or recorded by a detector (a typo); the message
    suggests the closest names."""


def _unknown(name: object) -> UnknownFinding:
    close = difflib.get_close_matches(name, [*BY_NAME, *GROUPS], n=3) if isinstance(name, str) else []
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return UnknownFinding(f"unknown finding {name!r}{hint}")


class Found(dict):
    """Findings as detectors collect them (name -> evidence): a name not in the catalogue raises UnknownFinding as
    it is recorded. Only for names our own code writes: what the candidate's process reports is untrusted, and is
    filtered (messages.reported_findings), never put here unfiltered."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.update(*args, **kwargs)

    def __setitem__(self, name: str, evidence: str) -> None:
        if name not in BY_NAME:
            raise _unknown(name)
        super().__setitem__(name, evidence)

    def update(self, *args, **kwargs) -> None:
        for name, evidence in dict(*args, **kwargs).items():
            self[name] = evidence

    def setdefault(self, name: str, evidence: str = "") -> str:
        if name not in self:
            self[name] = evidence
        return self[name]

    def __ior__(self, other):
        self.update(other)
        return self

    def copy(self) -> "Found":
        return Found(self)


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
            raise _unknown(name)
    return tuple(sorted(found, key=_POSITION.__getitem__))


DEFAULT_FORBID: tuple[str, ...] = tuple(kind.name for kind in CATALOGUE if kind.forbidden_by_default)
