"""Typed messages from child processes: what an event line or an exchange file may carry, checked on arrival.

Children report on the event pipe (harness/shared/protocol.py) and through weights_only torch.save files. A child
builds one of the dataclasses below and sends it (`ChildChannel.send`, which writes `to_event()`); the parent parses
the line back with the same class's `from_event`. The candidate's process runs untrusted code, so everything it sends
is treated as hostile: each `from_*` constructor accepts only the documented types and ranges and raises `Malformed`
for anything else, so a forged number or a missing key becomes a verdict (the caller's choice of status) rather than
an exception deep in the parent. `to_event` is only the child's convenience: the parent never relies on it having
run. Messages from trusted children (the oracle) go through the same constructors: one shape per message, wherever
it comes from. Commands the other way are in harness/shared/commands.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Optional

from harness.shared import protocol

ERROR_CHARS = 400      # an error message from a child is cut to this
EVIDENCE_CHARS = 300   # the evidence of one finding reported by a child
SUMMARY_CHARS = 400    # the library-kernel summary of a profiled forward
METHOD_CHARS = 100     # a timer's method ("cuda_graph, stream end, checked, 64 calls a span, 8 placements")


class Malformed(ValueError):
    """A child sent something the protocol does not allow (wrong type, out of range, missing)."""


def nonnegative(value: Any) -> Optional[float]:
    """A number from an event (sent by an untrusted child): a finite float >= 0, else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def seconds(value: Any, names: tuple[str, ...]) -> dict[str, float]:
    """The known names of a child's {name: seconds} report with a valid number (diagnostics: what is malformed is
    left out, never an error)."""
    if not isinstance(value, dict):
        return {}
    return {name: float(value[name]) for name in names if nonnegative(value.get(name)) is not None}


def number(value: Any, what: str) -> float:
    """A finite number >= 0, else Malformed naming `what`."""
    checked = nonnegative(value)
    if checked is None:
        raise Malformed(f"malformed {what}: {str(value)[:40]}")
    return checked


def optional_number(value: Any, what: str) -> Optional[float]:
    return None if value is None else number(value, what)


def count(value: Any, what: str) -> int:
    """A whole number >= 0 (bool is not one)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise Malformed(f"malformed {what}: {str(value)[:40]}")


def text(value: Any, limit: int) -> str:
    return str(value)[:limit]


# ---------------------------------------------------------------- events

@dataclass(frozen=True)
class Failed:
    """FAILED: a stage raised. `status` is the child's claim (a Status value, checked by the caller)."""
    EVENT: ClassVar[str] = protocol.FAILED
    status: str
    error: str
    compile_s: Optional[float] = None   # how long the module ran before a compile or load failure

    def to_event(self) -> dict:
        return {"event": self.EVENT, "status": self.status, "error": self.error, "compile_s": self.compile_s}

    @classmethod
    def from_event(cls, event: dict) -> "Failed":
        return cls(text(event.get("status"), 40), text(event.get("error"), ERROR_CHARS),
                   nonnegative(event.get("compile_s")))


@dataclass(frozen=True)
class Audit:
    """AUDIT: the candidate's sandbox refused an operation."""
    EVENT: ClassVar[str] = protocol.AUDIT
    what: str
    detail: str

    def to_event(self) -> dict:
        return {"event": self.EVENT, "what": self.what, "detail": self.detail}

    @classmethod
    def from_event(cls, event: dict) -> "Audit":
        return cls(text(event.get("what"), 40), text(event.get("detail"), 120))

    def line(self) -> str:
        return f"{self.what}: {self.detail}"


def flags_of(event: dict) -> dict[str, str]:
    """The findings an event carries ({"flags": {name: evidence}}), evidence cut; names not yet checked (the parent
    keeps only the ones the sender may report: reported_findings)."""
    flags = event.get("flags")
    if not isinstance(flags, dict):
        return {}
    return {name: text(evidence, EVIDENCE_CHARS) for name, evidence in flags.items() if isinstance(name, str)}


def reported_findings(event: dict, known: dict[str, str]) -> dict[str, str]:
    """The findings an event carries, only names in `known`, evidence cut."""
    return {name: evidence for name, evidence in flags_of(event).items() if name in known}


@dataclass(frozen=True)
class Product:
    """A library one extension call built in a build child: the module name and the file the child says holds it
    (the parent still checks the file lies in the child's own folder before copying it)."""
    module: str
    file: str


@dataclass(frozen=True)
class Compiled:
    """COMPILED: the module executed and its extensions were built (or imported from the build pool)."""
    compile_s: Optional[float]
    extensions_built: int
    reused: int = 0                # extension calls served by the build pool's libraries
    cpu_s: float = 0.0             # build children: their own CPU time and their compilers' (for throughput only)
    products: dict[str, Product] = field(default_factory=dict)   # build children: call key -> product
    clock: dict[str, float] = field(default_factory=dict)   # wall-clock times the child reached "main", "prepared"
    light_built: int = 0           # CUDA builds compiled with the light torch/extension.h (candidate/extensions.py)
    light_failed: int = 0          # CUDA builds whose light compile failed, then built as written
    flags: dict[str, str] = field(default_factory=dict)   # findings {name: evidence} (the candidate's side)
    EVENT: ClassVar[str] = protocol.COMPILED

    def to_event(self) -> dict:
        return {"event": self.EVENT, "compile_s": self.compile_s, "extensions_built": self.extensions_built,
                "reused": self.reused, "cpu_s": self.cpu_s,
                "products": {call: asdict(product) for call, product in self.products.items()},
                "clock": dict(self.clock), "light_built": self.light_built, "light_failed": self.light_failed,
                "flags": dict(self.flags)}

    @property
    def light_headers(self) -> Optional[bool]:
        """True: every CUDA build here used the light torch/extension.h; False: one was built as written after its
        light compile failed; None: no CUDA build tried one."""
        return None if not (self.light_built or self.light_failed) else self.light_failed == 0

    @classmethod
    def from_event(cls, event: dict) -> "Compiled":
        products = {}
        raw = event.get("products")
        for call, item in (raw.items() if isinstance(raw, dict) else ()):
            if not (isinstance(call, str) and call.isalnum() and isinstance(item, dict)):
                continue
            module, file = item.get("module"), item.get("file")
            if isinstance(module, str) and module.isidentifier() and isinstance(file, str):
                products[call] = Product(module, file)
        return cls(compile_s=nonnegative(event.get("compile_s")),
                   extensions_built=count(event.get("extensions_built", 0), "extensions_built"),
                   reused=count(event.get("reused", 0), "reused"), cpu_s=nonnegative(event.get("cpu_s")) or 0.0,
                   products=products, clock=seconds(event.get("clock"), ("main", "prepared")),
                   light_built=count(event.get("light_built", 0), "light_built"),
                   light_failed=count(event.get("light_failed", 0), "light_failed"), flags=flags_of(event))


@dataclass(frozen=True)
class KernelCounts:
    """Who did the work in one profiled forward (harness/children/attribution.py), as the parent accepts it."""
    own: int                        # launches (CUDA) or extension calls (CPU) of the submission's own kernels
    library: int                    # library kernels, memcpys and memsets (CPU: top-level ATen work ops)
    own_share: Optional[float]      # share of the forward's kernel time in its own kernels (0..1)
    library_summary: str            # the most frequent library kernels, "name xN, ..."
    side_streams: tuple[int, ...]   # streams other than the harness's that ran kernels

    def to_event(self) -> dict:
        return {"own": self.own, "library": self.library, "own_share": self.own_share,
                "library_summary": self.library_summary, "side_streams": list(self.side_streams)}

    @classmethod
    def from_event(cls, value: Any) -> "KernelCounts":
        if not isinstance(value, dict):
            raise Malformed("malformed kernel counts")
        share = optional_number(value.get("own_share"), "own_share")
        if share is not None and share > 1:
            raise Malformed(f"malformed own_share: {share}")
        streams = value.get("side_streams") or []
        if not isinstance(streams, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in streams):
            raise Malformed("malformed side_streams")
        return cls(own=count(value.get("own"), "own kernels"), library=count(value.get("library"), "library kernels"),
                   own_share=share, library_summary=text(value.get("library_summary") or "", SUMMARY_CHARS),
                   side_streams=tuple(streams))


# what the candidate's process reports of its own clock over its checks (diagnostics): the model built from the feed,
# the trials and the repeat, one backward, one profiled forward, the result file written
CHECK_PHASES = ("model", "correctness", "gradients", "profile", "result_save")


@dataclass(frozen=True)
class FirstTrial:
    """FIRST: trial 0's outputs are in FIRST_FILE; the other trials run meanwhile. The findings so far."""
    flags: dict[str, str] = field(default_factory=dict)
    EVENT: ClassVar[str] = protocol.FIRST

    def to_event(self) -> dict:
        return {"event": self.EVENT, "flags": dict(self.flags)}

    @classmethod
    def from_event(cls, event: dict) -> "FirstTrial":
        return cls(flags_of(event))


@dataclass(frozen=True)
class Checked:
    """CHECKED: the candidate's outputs and gradients are in RESULT_FILE. Counts the parent cannot read are left
    out (None), never an error: they are evidence for the findings, not the verdict."""
    kernels: Optional[KernelCounts]            # who did the work in one profiled forward
    seconds: dict[str, float] = field(default_factory=dict)   # CHECK_PHASES (diagnostics)
    flags: dict[str, str] = field(default_factory=dict)
    EVENT: ClassVar[str] = protocol.CHECKED

    def to_event(self) -> dict:
        return {"event": self.EVENT, "kernels": self.kernels.to_event() if self.kernels is not None else None,
                "seconds": dict(self.seconds), "flags": dict(self.flags)}

    @classmethod
    def from_event(cls, event: dict) -> "Checked":
        try:
            kernels: Optional[KernelCounts] = KernelCounts.from_event(event.get("kernels"))
        except Malformed:
            kernels = None
        return cls(kernels, seconds(event.get("seconds"), CHECK_PHASES), flags_of(event))


@dataclass(frozen=True)
class Warm:
    """WARM: a side's timer is ready and warmed up. `per_call_ms`: the median wall time of one timed span with its
    preparation (what sizes a block; a span holds one call, or several where the method says so)."""
    per_call_ms: float
    method: str
    graph_error: Optional[str]
    launch_ms: float = 0.0   # median host time per call to enqueue the forward (Timer.launch_ms)
    flags: dict[str, str] = field(default_factory=dict)
    EVENT: ClassVar[str] = protocol.WARM

    def to_event(self) -> dict:
        return {"event": self.EVENT, "per_call_ms": self.per_call_ms, "method": self.method,
                "graph_error": self.graph_error, "launch_ms": self.launch_ms, "flags": dict(self.flags)}

    @classmethod
    def from_event(cls, event: dict) -> "Warm":
        error = event.get("graph_error")
        return cls(number(event.get("per_call_ms"), "per_call_ms"), text(event.get("method"), METHOD_CHARS),
                   text(error, 240) if error else None, number(event.get("launch_ms", 0.0), "launch_ms"),
                   flags_of(event))


@dataclass(frozen=True)
class FreshTimed:
    """FRESH: one timed span of `calls` calls whose last was on an input set the candidate had never been given (its
    outputs in FRESH_OUT_FILE), `ms` the whole span to its stream's end event, `synced_ms` to the end event after a
    device-wide synchronize (sync "checked" on CUDA; else None); and the spans on a seen set just before it, per call
    (`near_ms`; the candidate's own report: evidence only), with each one's whole-span gap from its stream's end
    event to that synchronized one (`near_gaps_ms`; sync "checked" only)."""
    ms: float
    near_ms: tuple[float, ...] = ()
    flags: dict[str, str] = field(default_factory=dict)
    calls: int = 1
    synced_ms: Optional[float] = None
    near_gaps_ms: tuple[float, ...] = ()
    EVENT: ClassVar[str] = protocol.FRESH
    NEAR_MAX: ClassVar[int] = 16   # the most near_ms it may carry
    CALLS_MAX: ClassVar[int] = 64  # the most calls its span may hold (harness/shared/timer.py SPAN_CALLS_CAP)

    def to_event(self) -> dict:
        return {"event": self.EVENT, "ms": self.ms, "near_ms": list(self.near_ms), "flags": dict(self.flags),
                "calls": self.calls, "synced_ms": self.synced_ms, "near_gaps_ms": list(self.near_gaps_ms)}

    @classmethod
    def from_event(cls, event: dict) -> "FreshTimed":
        near, gaps = event.get("near_ms", []), event.get("near_gaps_ms", [])
        for name, values in (("near_ms", near), ("near_gaps_ms", gaps)):
            if not isinstance(values, list) or len(values) > cls.NEAR_MAX:
                raise Malformed(f"malformed {name}: {str(values)[:80]}")
        calls = event.get("calls", 1)
        if not (isinstance(calls, int) and not isinstance(calls, bool) and 1 <= calls <= cls.CALLS_MAX):
            raise Malformed(f"malformed calls in a fresh span: {str(calls)[:40]}")
        synced = event.get("synced_ms")
        return cls(number(event.get("ms"), "fresh-input time"), tuple(number(v, "near_ms") for v in near),
                   flags_of(event), calls, None if synced is None else number(synced, "fresh-input synced time"),
                   tuple(number(v, "near_gaps_ms") for v in gaps))


@dataclass(frozen=True)
class BlockReport:
    """BLOCK: one block of timed spans. `samples` one per counted span, its time per call (ms); `events_ms` the
    whole spans' sum as the side measured it; `outside_ms` the harness work the side did around them (clones,
    flushes, copies); `launch_ms` the host time inside the timed spans until their calls returned (a diagnostic, 0
    where the side did not say); `synced` per counted span its time to an end event after a device-wide synchronize,
    per call as the samples (sync "checked"; empty otherwise); `calls_per_span` the back-to-back calls each span
    held (the side's claim: evidence, harness/shared/timer.py span_calls); `null_gaps` the side's own round trip,
    one per null span of the block (harness/shared/timer.py NULL_SPANS; sync "checked" on CUDA, else empty)."""
    samples: tuple[float, ...]
    events_ms: float
    outside_ms: float
    launch_ms: float = 0.0
    flags: dict[str, str] = field(default_factory=dict)
    synced: tuple[float, ...] = ()
    calls_per_span: int = 1
    null_gaps: tuple[float, ...] = ()
    EVENT: ClassVar[str] = protocol.BLOCK
    NULL_MAX: ClassVar[int] = 16

    def to_event(self) -> dict:
        return {"event": self.EVENT, "samples": list(self.samples), "events_ms": self.events_ms,
                "outside_ms": self.outside_ms, "launch_ms": self.launch_ms, "flags": dict(self.flags),
                "synced": list(self.synced), "calls_per_span": self.calls_per_span,
                "null_gaps": list(self.null_gaps)}

    @classmethod
    def from_event(cls, event: dict, reps: int) -> "BlockReport":
        samples, synced = event.get("samples"), event.get("synced", [])
        if not isinstance(samples, list) or len(samples) != reps:
            raise Malformed(f"malformed timing block: {str(samples)[:80]}")
        if not isinstance(synced, list) or len(synced) not in (0, reps):
            raise Malformed(f"malformed synced spans in a timing block: {str(synced)[:80]}")
        calls_per_span = count(event.get("calls_per_span", 1), "calls_per_span")
        if calls_per_span < 1:
            raise Malformed("malformed calls_per_span: 0")
        null_gaps = event.get("null_gaps", [])
        if not isinstance(null_gaps, list) or len(null_gaps) > cls.NULL_MAX:
            raise Malformed(f"malformed null spans in a timing block: {str(null_gaps)[:80]}")
        return cls(tuple(number(s, "sample") for s in samples), number(event.get("events_ms"), "events_ms"),
                   number(event.get("outside_ms"), "outside_ms"), number(event.get("launch_ms", 0.0), "launch_ms"),
                   flags_of(event), tuple(number(s, "synced span") for s in synced), calls_per_span,
                   tuple(number(g, "null span") for g in null_gaps))


@dataclass(frozen=True)
class Spots:
    """SPOTS: a side's timing is over (the candidate's kept outputs are in SPOT_FILE)."""
    flags: dict[str, str] = field(default_factory=dict)
    EVENT: ClassVar[str] = protocol.SPOTS

    def to_event(self) -> dict:
        return {"event": self.EVENT, "flags": dict(self.flags)}

    @classmethod
    def from_event(cls, event: dict) -> "Spots":
        return cls(flags_of(event))


@dataclass(frozen=True)
class Pace:
    """PACE: the oracle's reading of the GPU's pace, the host ahead (ms per copy; None: it could not tell)."""
    ms: Optional[float]
    EVENT: ClassVar[str] = protocol.PACE

    def to_event(self) -> dict:
        return {"event": self.EVENT, "ms": self.ms}

    @classmethod
    def from_event(cls, event: dict) -> "Pace":
        return cls(optional_number(event.get("ms"), "GPU pace"))


@dataclass(frozen=True)
class GpuDone:
    """GPU_DONE: a gated oracle's stage of GPU work is over. After its truth it names the size class its rates
    depend on (`rates_key`), so that the parent may hand over rates it already measured for it."""
    rates_key: Optional[str] = None
    EVENT: ClassVar[str] = protocol.GPU_DONE

    def to_event(self) -> dict:
        return {"event": self.EVENT, **({"rates_key": self.rates_key} if self.rates_key is not None else {})}

    @classmethod
    def from_event(cls, event: dict) -> "GpuDone":
        key = event.get("rates_key")
        return cls(text(key, 80) if isinstance(key, str) else None)


@dataclass(frozen=True)
class Signal:
    """An event that carries nothing but its name (IMPORTED, IDLE, STAGED): where a child stands."""
    event: str

    def to_event(self) -> dict:
        return {"event": self.event}


# ---------------------------------------------------------------- exchange files

@dataclass(frozen=True)
class Feed:
    """FEED_FILE: what the oracle hands a candidate (written by the oracle, read in the candidate's process): the
    reference's init inputs and weights, the trial inputs, and the grad_outputs of the gradient check (empty when
    gradients are not checked): per output of trial 0 with an autograd graph its shape and dtype, None for the
    others, drawn from `grad_seed` where a backward runs (harness/children/runtime.py draw_grad_outputs), so that an
    output-sized tensor per output is neither drawn nor handed over for the candidates that never run one. On disk it
    is the mapping `to_file` gives (torch.save's weights_only load reads no dataclass)."""
    init_inputs: list
    state_dict: dict                # name -> tensor, in the run's precision
    trials: list                    # per trial, its input set
    grad_outputs: list              # per output of trial 0: {"shape": [...], "dtype": "float32"} or None
    grad_seed: int = 0

    def to_file(self) -> dict:
        return {"init_inputs": self.init_inputs, "state_dict": self.state_dict, "trials": self.trials,
                "grad_outputs": self.grad_outputs, "grad_seed": self.grad_seed}

    @classmethod
    def from_file(cls, loaded: Any) -> "Feed":
        if not isinstance(loaded, dict):
            raise Malformed("the feed is not a mapping")
        parts = {name: loaded.get(name) for name in ("init_inputs", "state_dict", "trials", "grad_outputs")}
        if not (isinstance(parts["init_inputs"], list) and isinstance(parts["state_dict"], dict)
                and isinstance(parts["grad_outputs"], list) and isinstance(parts["trials"], list)
                and all(isinstance(t, list) for t in parts["trials"])):
            raise Malformed("the feed lacks its inputs, weights or trials")
        if not all(spec is None or _grad_spec(spec) for spec in parts["grad_outputs"]):
            raise Malformed(f"malformed grad_outputs in the feed: {str(parts['grad_outputs'])[:80]}")
        seed = loaded.get("grad_seed", 0)
        if type(seed) is not int:
            raise Malformed(f"malformed grad_seed in the feed: {str(seed)[:40]}")
        return cls(**parts, grad_seed=seed)


GRAD_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _grad_spec(spec: Any) -> bool:
    """A grad_output's description: its shape (whole numbers >= 0) and a floating dtype's name."""
    return (isinstance(spec, dict) and set(spec) == {"shape", "dtype"} and spec["dtype"] in GRAD_DTYPES
            and isinstance(spec["shape"], list) and all(type(n) is int and n >= 0 for n in spec["shape"]))


@dataclass(frozen=True)
class CandidateResult:
    """RESULT_FILE: what the candidate's process computed for the checks (CPU tensors or descriptions of
    non-tensors). Values inside the lists are compared by harness/shared/check.py, which accepts anything."""
    outputs: list                   # per trial, the forward's outputs
    repeat: list                    # trial 0 again
    weights_loaded: int             # reference parameters/buffers copied into ModelNew
    has_graph: Optional[bool]       # None: gradients not checked
    input_grads: Optional[list]
    param_grads: Optional[dict]
    grad_error: Optional[str]       # backward raised this
    stopped: bool = False           # its checks stopped after trial 0, whose outputs differ from the reference's in
                                    # count, type, shape or dtype (the parent holds it to that: evaluate._compared)

    @classmethod
    def from_file(cls, loaded: Any, trials: int, first: Optional[list] = None) -> "CandidateResult":
        """`first`: trial 0's outputs where they came apart (FIRST_FILE); the result then holds the other trials'
        (`first_apart`), and never trial 0's twice."""
        if not isinstance(loaded, dict):
            raise Malformed("the result is not a mapping")
        outputs, repeat, stopped = loaded.get("outputs"), loaded.get("repeat"), loaded.get("stopped") is True
        apart = loaded.get("first_apart") is True
        if apart != (first is not None):
            raise Malformed("trial 0's outputs came apart but the result holds them too" if first is not None else
                            "the result says trial 0's outputs came apart, and they did not")
        if apart and stopped:
            raise Malformed("the result stopped after trial 0 after handing it over")
        held = 1 if stopped and trials > 0 else trials - (1 if apart else 0)
        if not (isinstance(outputs, list) and len(outputs) == held and all(isinstance(o, list) for o in outputs)):
            raise Malformed(f"the result holds no outputs for the {held} trials")
        if apart:
            if not isinstance(first, list):
                raise Malformed("trial 0's outputs are not a list")
            outputs = [first, *outputs]
        if not isinstance(repeat, list):
            raise Malformed("the result holds no repeated trial")
        has_graph, grads, params = loaded.get("has_graph"), loaded.get("input_grads"), loaded.get("param_grads")
        if has_graph is not None and not isinstance(has_graph, bool):
            raise Malformed("malformed has_graph")
        if grads is not None and not isinstance(grads, list):
            raise Malformed("malformed input gradients")
        if params is not None and not (isinstance(params, dict) and all(isinstance(k, str) for k in params)):
            raise Malformed("malformed parameter gradients")
        error = loaded.get("grad_error")
        return cls(outputs=outputs, repeat=repeat, weights_loaded=count(loaded.get("weights_loaded"), "weights_loaded"),
                   has_graph=has_graph, input_grads=grads, param_grads=params,
                   grad_error=text(error, ERROR_CHARS) if error else None, stopped=stopped)


@dataclass(frozen=True)
class Truth:
    """TRUTH_FILE: the reference's outputs; it lives only in the parent's memory. Its gradients and fresh input sets
    are not in the file: the oracle computes them only when the parent asks (GRADIENTS_FILE, `Gradients`;
    FRESH_SETS_FILE, `FreshSets`), which then fills them in."""
    outputs: list                   # per trial, the reference's outputs (CPU tensors)
    input_grads: list               # per input, its gradient or None (empty until asked for)
    param_grads: dict               # parameter name -> gradient (empty until asked for)
    has_graph: bool                 # the reference's output has an autograd graph (it has gradients to ask for)
    fresh_inputs: list = field(default_factory=list)    # input sets never put in the feed (empty until asked for)
    fresh_outputs: list = field(default_factory=list)   # the reference's outputs for them
    swapped: list = field(default_factory=list)   # per input, trial 0's outputs with that input from another trial
                                                  # (None: not probed); read once for degenerate_problem, then dropped

    @classmethod
    def from_file(cls, loaded: Any) -> "Truth":
        if not isinstance(loaded, dict) or not isinstance(loaded.get("outputs"), list):
            raise Malformed("the reference's truth is not readable")
        swapped = loaded.get("swapped") or []
        if not (isinstance(swapped, list) and all(p is None or isinstance(p, list) for p in swapped)):
            raise Malformed("the reference's swapped-input outputs are not a list per input")
        return cls(outputs=loaded["outputs"], input_grads=list(loaded.get("input_grads") or []),
                   param_grads=dict(loaded.get("param_grads") or {}), has_graph=bool(loaded.get("has_graph")),
                   swapped=swapped)


@dataclass(frozen=True)
class FreshSets:
    """FRESH_SETS_FILE: input sets never put in the feed and the reference's outputs on them, drawn and run when the
    parent asks (a candidate reached the fresh-input check); they join its Truth in the parent's memory."""
    inputs: list                    # per set, its inputs
    outputs: list                   # per set, the reference's outputs

    def to_file(self) -> dict:
        return {"fresh_inputs": self.inputs, "fresh_outputs": self.outputs}

    @classmethod
    def from_file(cls, loaded: Any) -> "FreshSets":
        inputs = loaded.get("fresh_inputs") if isinstance(loaded, dict) else None
        outputs = loaded.get("fresh_outputs") if isinstance(loaded, dict) else None
        if not (isinstance(inputs, list) and isinstance(outputs, list)
                and all(isinstance(v, (list, tuple)) for v in (*inputs, *outputs))):
            raise Malformed("the reference's fresh input sets are not readable")
        if len(inputs) != len(outputs):
            raise Malformed("the reference's fresh input sets and outputs differ in number")
        return cls(inputs, outputs)


@dataclass(frozen=True)
class Gradients:
    """GRADIENTS_FILE: the reference's gradients on trial 0 for the feed's grad_outputs (one backward, run when the
    parent asks); they join its Truth in the parent's memory."""
    input_grads: list               # per input, its gradient or None
    param_grads: dict               # parameter name -> gradient

    def to_file(self) -> dict:
        return {"input_grads": self.input_grads, "param_grads": self.param_grads}

    @classmethod
    def from_file(cls, loaded: Any) -> "Gradients":
        grads = loaded.get("input_grads") if isinstance(loaded, dict) else None
        params = loaded.get("param_grads") if isinstance(loaded, dict) else None
        if not (isinstance(grads, list) and isinstance(params, dict) and all(isinstance(k, str) for k in params)):
            raise Malformed("the reference's gradients are not readable")
        return cls(grads, params)


@dataclass(frozen=True)
class Rates:
    """Measured device rates behind a roofline floor."""
    bandwidth_gbps: float
    fp32_tflops: float             # float32 matmul; in an fp16/bf16 run the faster of that and one in the run's dtype


@dataclass(frozen=True)
class Roofline:
    """The reference's minimum work: FLOPs, bytes moved (inputs, weights, outputs), and the rates they are priced at."""
    flops: float
    bytes: float
    rates: Rates


REFERENCE_STEPS = ("load", "draw", "gate", "cuda_init", "outputs", "copy", "grad_outputs", "swapped", "profile",
                   "quiet", "roofline", "save_feed", "save")


@dataclass(frozen=True)
class ReferenceReady:
    """The oracle's READY: what the parent keeps about the reference besides its truth."""
    device_name: str
    metadata: dict                  # ProblemMetadata fields (tolerances, check_grad, description)
    check_grad: bool                # gradients are checked (config and the problem agree)
    ref_kernels: int                # kernels (CPU: top-level compute ops) in one reference forward
    roofline: Roofline
    floor_ms: Optional[float]       # roofline floor at the measured rates
    began: Optional[float] = None   # the oracle's wall clock when its imports were done (diagnostics)
    steps: dict = field(default_factory=dict)   # seconds per step of its start (REFERENCE_STEPS; diagnostics)
    rates_key: Optional[str] = None   # what the rates depend on besides the device (roofline.rates_key)
    rates_measured: bool = True       # measured by this oracle (False: handed over by the parent)
    timing_sets: Optional[int] = None   # the fed input sets its timed calls rotate among (timer.timing_sets)
    EVENT: ClassVar[str] = protocol.READY

    def to_event(self) -> dict:
        roofline = self.roofline
        return {"event": self.EVENT, "device_name": self.device_name, "metadata": self.metadata,
                "check_grad": self.check_grad, "ref_kernels": self.ref_kernels, "flops": roofline.flops,
                "bytes": roofline.bytes, "rates": asdict(roofline.rates), "rates_key": self.rates_key,
                "rates_measured": self.rates_measured, "floor_ms": self.floor_ms, "began": self.began,
                "steps": dict(self.steps), "timing_sets": self.timing_sets}

    @classmethod
    def from_event(cls, event: dict) -> "ReferenceReady":
        rates = event.get("rates")
        if not isinstance(rates, dict) or not isinstance(event.get("metadata"), dict):
            raise Malformed("the reference's READY lacks its rates or metadata")
        roofline = Roofline(number(event.get("flops"), "flops"), number(event.get("bytes"), "bytes"),
                            Rates(number(rates.get("bandwidth_gbps"), "bandwidth_gbps"),
                                  number(rates.get("fp32_tflops"), "fp32_tflops")))
        return cls(device_name=text(event.get("device_name"), 200), metadata=event["metadata"],
                   check_grad=bool(event.get("check_grad")), ref_kernels=count(event.get("ref_kernels"), "ref_kernels"),
                   roofline=roofline, floor_ms=optional_number(event.get("floor_ms"), "floor_ms"),
                   began=nonnegative(event.get("began")), steps=seconds(event.get("steps"), REFERENCE_STEPS),
                   rates_key=text(event["rates_key"], 80) if isinstance(event.get("rates_key"), str) else None,
                   rates_measured=event.get("rates_measured") is not False,
                   timing_sets=None if event.get("timing_sets") is None else count(event["timing_sets"],
                                                                                  "timing_sets"))


@dataclass(frozen=True)
class PeaksReady:
    """The baseline process's READY when it measured the device's peaks (harness/shared/roofline.py measure_peaks),
    which the baselines file stores as `peaks`."""
    device_name: str
    bandwidth_gbps: float          # one large copy
    fp32_tflops: float             # float32 matmul; in an fp16/bf16 run the faster of that and one in the run's dtype
    copy_bytes: int                # bytes the copy moved
    matmul_size: int               # the float32 matmul's side
    EVENT: ClassVar[str] = protocol.READY

    def peaks(self) -> dict:
        """The peaks as the baselines file stores them."""
        return {"bandwidth_gbps": self.bandwidth_gbps, "fp32_tflops": self.fp32_tflops,
                "copy_bytes": self.copy_bytes, "matmul_size": self.matmul_size}

    def to_event(self) -> dict:
        return {"event": self.EVENT, "device_name": self.device_name, "peaks": self.peaks()}

    @classmethod
    def from_event(cls, event: dict) -> "PeaksReady":
        peaks = event.get("peaks")
        if not isinstance(peaks, dict):
            raise Malformed("the baseline's READY lacks the device's peaks")
        return cls(text(event.get("device_name"), 200), number(peaks.get("bandwidth_gbps"), "bandwidth_gbps"),
                   number(peaks.get("fp32_tflops"), "fp32_tflops"), count(peaks.get("copy_bytes"), "copy_bytes"),
                   count(peaks.get("matmul_size"), "matmul_size"))


@dataclass(frozen=True)
class BaselineReady:
    """The baseline process's READY for one problem: the reference's work (its roofline counts) and its timing in
    each mode asked for, stored in the baselines file as they are."""
    device_name: str
    flops: int                     # in one forward
    bytes: int                     # inputs, weights and outputs of one forward
    modes: dict[str, dict]         # mode -> TimingStats fields (and compile_s where compiled), or {"error": why}
                                   # where torch.compile failed
    EVENT: ClassVar[str] = protocol.READY

    def to_event(self) -> dict:
        return {"event": self.EVENT, "device_name": self.device_name, "flops": self.flops, "bytes": self.bytes,
                "modes": {mode: dict(timing) for mode, timing in self.modes.items()}}

    @classmethod
    def from_event(cls, event: dict) -> "BaselineReady":
        modes = event.get("modes")
        if not isinstance(modes, dict):
            raise Malformed("the baseline's READY lacks its modes")
        for mode, timing in modes.items():
            timed = isinstance(timing, dict) and nonnegative(timing.get("median_ms")) is not None
            if not (isinstance(mode, str) and (timed or (isinstance(timing, dict) and isinstance(
                    timing.get("error"), str)))):
                raise Malformed(f"the baseline's READY has no time nor error for mode {str(mode)[:40]}")
        return cls(text(event.get("device_name"), 200), count(event.get("flops"), "flops"),
                   count(event.get("bytes"), "bytes"), {mode: dict(timing) for mode, timing in modes.items()})


def _flag(value: Any, what: str) -> Optional[bool]:
    """A yes/no a trusted child reports, or None where it does not apply."""
    if value is None or isinstance(value, bool):
        return value
    raise Malformed(f"malformed {what}: {str(value)[:40]}")


@dataclass(frozen=True)
class ReferenceOutput:
    """One output of a problem's reference, as the problem check saw it (harness/children/oracle/problem_check.py).
    Every yes/no is None where the output is not a tensor."""
    shape: Optional[tuple[int, ...]]   # None: not a tensor
    dtype: str                         # the tensor's dtype ("float32"), else the value's type name
    finite: Optional[bool] = None      # no NaN or Inf
    zero_passes: Optional[bool] = None       # a zero tensor would match it within the tolerance
    constant_passes: Optional[bool] = None   # so would a tensor of its mean
    repeat_agrees: Optional[bool] = None     # a second forward on the same input matches it within the tolerance
    repeat_bitwise: Optional[bool] = None    # ... bit for bit
    std: Optional[float] = None        # its standard deviation (NaN where it holds NaN); None: not floating point

    def to_event(self) -> dict:
        return {**asdict(self), "shape": list(self.shape) if self.shape is not None else None}

    @classmethod
    def from_event(cls, value: Any) -> "ReferenceOutput":
        if not isinstance(value, dict):
            raise Malformed("malformed reference output")
        shape, std = value.get("shape"), value.get("std")
        if shape is not None and not isinstance(shape, list):
            raise Malformed(f"malformed output shape: {str(shape)[:40]}")
        if std is not None and (isinstance(std, bool) or not isinstance(std, (int, float))):
            raise Malformed(f"malformed output std: {str(std)[:40]}")
        return cls(tuple(count(size, "output size") for size in shape) if shape is not None else None,
                   text(value.get("dtype"), 60),
                   **{name: _flag(value.get(name), name) for name in (
                       "finite", "zero_passes", "constant_passes", "repeat_agrees", "repeat_bitwise")},
                   std=float(std) if std is not None else None)


@dataclass(frozen=True)
class ReferenceGrad:
    """The problem check's backward through the reference."""
    checked: bool                      # the problem's gradients are checked (its CHECK_GRAD)
    has_graph: Optional[bool] = None   # every floating-point output had a graph; None: not checked
    params_without_grad: tuple[str, ...] = ()   # parameters the backward left without a gradient

    def to_event(self) -> dict:
        return {"checked": self.checked, "has_graph": self.has_graph,
                "params_without_grad": list(self.params_without_grad)}

    @classmethod
    def from_event(cls, value: Any) -> "ReferenceGrad":
        if not isinstance(value, dict) or not isinstance(value.get("checked"), bool):
            raise Malformed("malformed gradient report")
        names = value.get("params_without_grad") or []
        if not isinstance(names, list):
            raise Malformed("malformed params_without_grad")
        return cls(value["checked"], _flag(value.get("has_graph"), "has_graph"),
                   tuple(text(name, 200) for name in names))


@dataclass(frozen=True)
class ProblemCheckReady:
    """The problem check's READY: what the reference's outputs look like, its gradients, memory and eager time."""
    device_name: str
    metadata: dict                     # ProblemMetadata fields (tolerances, check_grad, description)
    inputs: tuple[str, ...]            # "(1024, 8192) float32" per input (the repr of one that is not a tensor)
    outputs: tuple[ReferenceOutput, ...]
    eager_ms: float                    # the eager forward's median
    eager_iqr_ms: float
    tensor_mb: float                   # inputs, outputs, parameters, buffers and gradients
    peak_mb: Optional[float]           # the GPU's peak allocation; None on the CPU
    grad: ReferenceGrad
    EVENT: ClassVar[str] = protocol.READY

    def to_event(self) -> dict:
        return {"event": self.EVENT, "device_name": self.device_name, "metadata": self.metadata,
                "inputs": list(self.inputs), "outputs": [output.to_event() for output in self.outputs],
                "eager_ms": self.eager_ms, "eager_iqr_ms": self.eager_iqr_ms, "tensor_mb": self.tensor_mb,
                "peak_mb": self.peak_mb, "grad": self.grad.to_event()}

    @classmethod
    def from_event(cls, event: dict) -> "ProblemCheckReady":
        inputs, outputs = event.get("inputs"), event.get("outputs")
        if not (isinstance(event.get("metadata"), dict) and isinstance(inputs, list) and isinstance(outputs, list)):
            raise Malformed("the problem check's READY lacks its metadata, inputs or outputs")
        return cls(device_name=text(event.get("device_name"), 200), metadata=event["metadata"],
                   inputs=tuple(text(value, 200) for value in inputs),
                   outputs=tuple(ReferenceOutput.from_event(output) for output in outputs),
                   eager_ms=number(event.get("eager_ms"), "eager_ms"),
                   eager_iqr_ms=number(event.get("eager_iqr_ms"), "eager_iqr_ms"),
                   tensor_mb=number(event.get("tensor_mb"), "tensor_mb"),
                   peak_mb=optional_number(event.get("peak_mb"), "peak_mb"),
                   grad=ReferenceGrad.from_event(event.get("grad")))
