"""The result record: one per (submission, problem), written as a JSON line.

`None` in any field means "not measured" (the stage that produces it did not run); it never means zero.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"   # results/<run>/: every record of the run, one JSON line each
RESULTS_CSV = "results.csv"      # results/<run>/: the table of the records of its last command


class Status(str, enum.Enum):
    """The first failing check, in pipeline order; `PASS` when none failed under the active config."""

    PASS = "pass"
    TOO_LARGE = "too_large"                # larger than max_submission_bytes: never extracted or run
    NO_CODE = "no_code"                    # raw output holds no complete Python block defining ModelNew
    SYNTAX_ERROR = "syntax_error"          # the extracted source does not parse
    NEEDS_CUDA = "needs_cuda"              # CUDA sources, but the evaluation device is not CUDA (environment fact)
    COMPILE_ERROR = "compile_error"        # an extension build (load_inline / load) failed
    LOAD_ERROR = "load_error"              # executing the module failed otherwise, or it defines no ModelNew
    INIT_ERROR = "init_error"              # ModelNew(*get_init_inputs()) or moving it to the device raised
    RUNTIME_ERROR = "runtime_error"        # forward (or timing) raised, CUDA faults included
    TIMEOUT = "timeout"                    # the child exceeded its compile or run time limit and was killed
    CRASH = "crash"                        # the child died (signal, os._exit) without reporting
    SHAPE_MISMATCH = "shape_mismatch"      # output count or shape differs from the reference
    DTYPE_MISMATCH = "dtype_mismatch"      # output dtype differs from the reference
    INCORRECT = "incorrect"                # values outside tolerance, or NaN/Inf
    NONDETERMINISTIC = "nondeterministic"  # the same input twice gave results that disagree beyond tolerance
    GRAD_MISMATCH = "grad_mismatch"        # an output with a graph, gradients wrong or missing (grad_mismatch_fails)
    NO_GRAD = "no_grad"                    # the output carries no autograd graph (a status with grad_failure_fails)
    TIMING_INTERFERENCE = "timing_interference"  # correct, but its reference ran slower beside it than alone
    RULE_VIOLATION = "rule_violation"      # correct, but breaks a rule of the active config
    # Not the submission's: the judge itself ran short (its temporary folder full, host or GPU memory exhausted)
    # while keeping the reference or running the evaluation. No verdict: never counted in a rate or a denominator
    # (harness/report/scoring.py), and `batch` judges it again on resume.
    JUDGE_ERROR = "judge_error"


# Statuses that are no verdict on the submission (left out of every rate; judged again on resume).
NO_VERDICT = {Status.JUDGE_ERROR}

# Statuses that mean the code never produced an output to judge.
NOT_RUN = {Status.TOO_LARGE, Status.NO_CODE, Status.SYNTAX_ERROR, Status.NEEDS_CUDA, Status.COMPILE_ERROR,
           Status.LOAD_ERROR}


@dataclass(frozen=True)
class Record:
    # --- identity
    problem: str                      # problem id, "levelN/NN"
    submission: str                   # path of the submission file, or "<jsonl path>:<line>"
    submission_hash: str              # sha256 (first 16 hex digits) of the raw submission text
    model: Optional[str]              # model label (JSONL field or --model), if known
    run: Optional[str]                # run label (--run), if known
    sample_id: Optional[str]          # sample id within the run (JSONL field or file name), if known
    # --- verdict
    status: Status
    compiled: Optional[bool]          # the module executed and every extension built (None: never got there)
    correct: Optional[bool]           # every trial's output matched the reference within tolerance
    grad_correct: Optional[bool]      # all comparable gradients matched (None: not checked or no graph)
    error: Optional[str]              # short message of the failure (exception type and first line)
    # --- numbers
    max_abs_error: Optional[float]    # max |candidate - reference| over all trials and outputs
    max_rel_error: Optional[float]    # max |candidate - reference| / |reference| over elements with reference != 0
    grad_max_abs_error: Optional[float]  # same as max_abs_error, over the compared gradients
    grads_compared: Optional[int]     # number of gradients compared (inputs + mapped parameters)
    grads_not_comparable: Optional[tuple]  # names of candidate parameters with no reference counterpart
    weights_loaded: Optional[int]     # reference parameters/buffers copied into ModelNew by key and shape
    runtime_ms: Optional[float]       # candidate forward, median over timed repetitions (docs/timing.md)
    runtime_iqr_ms: Optional[float]   # interquartile range of those repetitions
    runtime_reps: Optional[int]       # number of timed repetitions
    ref_runtime_ms: Optional[float]   # reference (eager) forward median: in the oracle process, or stored
    ref_runtime_iqr_ms: Optional[float]
    speedup: Optional[float]          # over eager: median of the paired blocks' ratios (stored: ratio of medians)
    runtime_ci_low_ms: Optional[float]   # 95% confidence interval of runtime_ms (order statistics)
    runtime_ci_high_ms: Optional[float]
    runtime_min_ms: Optional[float]
    ref_runtime_ci_low_ms: Optional[float]   # the same for the reference
    ref_runtime_ci_high_ms: Optional[float]
    ref_runtime_min_ms: Optional[float]
    ref_runtime_reps: Optional[int]
    speedup_ci_low: Optional[float]   # 95% CI of speedup (paired blocks; stored: the CIs' far ends)
    speedup_ci_high: Optional[float]
    speedup_compile: Optional[float]  # over torch.compile: needs a stored baseline with a compile time (None: none)
    ref_source: Optional[str]         # interleaved | sequential | "stored <file> (<date>)" | "interleaved (why not
                                      # stored)": where ref_runtime_ms comes from
    timing_method: Optional[str]      # e.g. "events, device sync; 16 host threads per side (torch's default)"
    timing_blocks: Optional[int]      # blocks of the candidate (interleaved: as many of the reference)
    timing_converged: Optional[bool]  # both CIs met target_ci (False: the time cap ended the measurement)
    calls_per_span: Optional[int]     # back-to-back calls in each of the candidate's timed spans, as its side reported
                                      # it (1: one call a span; more where one call is too short to time alone: each
                                      # timed repetition is its span over this count; docs/timing.md)
    ref_calls_per_span: Optional[int]  # the same for the reference (stored: as its baseline was timed)
    fresh_runtime_ms: Optional[float]  # median of one call on each of `fresh_inputs` never-seen sets (its span's share)
    ref_clean_ms: Optional[float]     # the reference timed alone, no candidate process alive (docs/timing.md)
    ref_drift: Optional[float]        # ref_runtime_ms / ref_clean_ms: how much the interleaved reference moved
    hold_ms: Optional[float]          # median time to stop and resume the idle side around one timed block
    sol_fraction: Optional[float]     # speed of light / runtime: the roofline floor at the device's stored peaks
                                      # (else at the oracle's measured rates) over runtime_ms
    compile_s: Optional[float]        # seconds to execute the module, extension builds included
    extensions_built: Optional[int]   # load_inline / load calls that returned a module
    prebuilt: Optional[bool]          # the extensions came from the build pool / its cache (compile_s is the build's)
    light_headers: Optional[bool]     # true: every CUDA build compiled with the light torch/extension.h; false: one
                                      # failed so and was built as written; null: none tried (config, no CUDA)
    phases: Optional[dict]            # seconds per phase of this evaluation: queue, reference_clean, spawn_import,
                                      # cuda_init, load, correctness, gradients, profile, timing, teardown (the
                                      # child's own phases as it reported them; docs/performance.md)
    # --- integrity (see harness/integrity/profiles.py and the README's "What the judge guards against")
    profile: Optional[str]            # the rule profile `status` was derived under
    check_status: Optional[Status]    # the first failing check, rules not applied (pass: every check passed)
    grad_failure: Optional[Status]    # grad_mismatch / no_grad when gradients were checked and failed, else None
    flags: Optional[tuple]            # names of findings (static and dynamic), whether or not the profile forbids them
    flag_evidence: Optional[dict]     # finding name -> what was seen, e.g. "line 12: torch.cuda.Stream()"
    own_kernels: Optional[int]        # launches of the submission's own kernels in one profiled forward
    library_kernels: Optional[int]    # launches of library / ATen kernels (CPU: compute ops) in that forward
    ref_kernels: Optional[int]        # the same count for the reference's forward
    own_kernel_share: Optional[float]  # share of that forward's kernel time spent in the submission's own kernels
    tolerance_needed: Optional[float]  # smallest t with allclose(atol=t, rtol=t) over all trials (inf: NaN)
    atol: Optional[float]             # output tolerance applied (the loosest over the reference's outputs);
    rtol: Optional[float]             # None: the reference never ran (harness/shared/check.py says how it is chosen)
    floor_ms: Optional[float]         # roofline floor: minimum bytes at measured bandwidth, FLOPs at measured rate
    sandbox_warnings: Optional[tuple]  # sandbox mechanisms that were unavailable on this machine, one line each
    isolation: Optional[str]          # how the candidate's processes were held: its cgroup (freezer, pids.max) or
                                      # SIGSTOP of its process group, and what was unavailable (freeze.py); the
                                      # user it ran as ("ran as uid N gid N": an unprivileged one of its own, or
                                      # "ran as the judge's user (why)": harness/isolation/sandbox.py pick_user)
    # --- environment and provenance
    device: str                       # "cpu" or "cuda" (a verdict of the text alone, judged without torch: the device
                                      # given, else the one torch would pick found from its build and the NVIDIA
                                      # driver's files: harness/pipeline/text_verdict.py; nothing ran on it)
    precision: Optional[str]          # fp32 | fp16 | bf16: the dtype the reference's parameters and floating inputs
                                      # were cast to, on both sides (harness/shared/precision.py)
    allow_tf32: Optional[bool]        # TF32 allowed for matmuls and cuDNN convolutions on both sides (config)
    backend: Optional[str]            # the kernel language it was judged as: cuda (load_inline / load, or none),
                                      # triton, cute, tilelang (harness/shared/backends: detected, or the config's)
    device_name: Optional[str]        # e.g. "NVIDIA H100 80GB HBM3" or the CPU model
    torch_version: str
    cuda_version: Optional[str]       # CUDA version torch was built with (None on CPU builds)
    config_hash: str                  # sha256 prefix of the active config, so records of different configs differ
    timestamp: str                    # ISO 8601, UTC, when the record was written
    log_path: Optional[str]           # the child's full stdout/stderr
    source_path: Optional[str]        # the extracted Python source that was run
    explanation_path: Optional[str]   # the prose around the code in raw model output, if any

    def to_json(self) -> str:
        row = dataclasses.asdict(self)
        for name in ("status", "check_status", "grad_failure"):
            if row[name] is not None:
                row[name] = row[name].value
        return json.dumps(row, default=_json_default)

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON line holds it: statuses as strings, tuples as lists, plain values otherwise."""
        return json.loads(self.to_json())

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> "Record":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(row) - names
        if unknown:
            raise ValueError(f"unknown record fields: {sorted(unknown)}")
        values = {name: row.get(name) for name in names}
        values["status"] = Status(values["status"])
        if "precision" not in row:   # written before precision modes, when every run was fp32
            values["precision"] = "fp32"
        if "backend" not in row:     # written before backends, when every submission took the load_inline path
            values["backend"] = "cuda"
        for name in ("check_status", "grad_failure"):
            if values[name] is not None:
                values[name] = Status(values[name])
        for name in ("flags", "sandbox_warnings"):
            if values[name] is not None:
                values[name] = tuple(values[name])
        if values["grads_not_comparable"] is not None:
            values["grads_not_comparable"] = tuple(values["grads_not_comparable"])
        return cls(**values)


def _json_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


NESTED_PHASES = ("ref_", "timing_", "fresh_", "spot_", "first_")   # phases inside another (reference_start, timing,
                                                                    # correctness)
BESIDE_PHASES = ("reference_ahead",)   # ran beside the evaluation (a reference started in the background)


def phases_total(phases: Optional[dict]) -> float:
    """Seconds of a record's phases that follow one another (the nested ones are inside others, and those beside
    the evaluation are not on its path)."""
    return sum(seconds for name, seconds in (phases or {}).items()
               if not name.startswith(NESTED_PHASES) and name not in BESIDE_PHASES)


def record_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(Record)]


def read_records(path: Path) -> list[Record]:
    """Records from a records.jsonl; a torn last line (a batch killed mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(Record.from_dict(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError, KeyError):
            log.warning("ignoring an unreadable line in %s", path)
    return records
