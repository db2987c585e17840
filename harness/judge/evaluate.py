"""Judge one submission against one problem: extraction (extraction.py) -> candidate process -> verdict -> Record.

Runs in the parent. Candidate code executes only in the child started by `CandidateRun`; what comes back is
event lines and weights_only torch.save files of CPU tensors. The parent adds what the child cannot forge: the
static checks on the source, the spot checks of timed outputs against truth the child never saw, its own wall
clock around the timing and the roofline floor. The status is derived from the measured `check_status` and the
findings under the config's rule profile (harness/integrity/profiles.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import statistics
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from harness.build.builder import Build
from harness.integrity import detectors, static
from harness.integrity.drift import Outcome, Pace, after_alone, could_have_slowed, worth_timing_alone
from harness.isolation.policy import timing_cpus
from harness.isolation.spawn import builds_paused, host_quieted
from harness.judge.candidate_run import CandidateRun, FirstFailed, Stop
from harness.judge.compare_on import comparison_device
from harness.judge.extraction import apply_profile as _apply_profile
from harness.judge.extraction import blank_record, prepare  # noqa: F401 (the pipeline calls them as evaluate's)
from harness.judge.speedup import against_reference, means_ratio, speed_of_light
from harness.oracle import baselines
from harness.oracle.reference import OracleError, Reference
from harness.shared import check
from harness.shared.config import Config
from harness.shared.environment import CPU_THREADS
from harness.shared.findings import (
    BEYOND_REFERENCE_ROOFLINE,
    DEGENERATE_PROBLEM,
    INPUT_REPLAY,
    REFERENCE_DRIFT,
    SIDE_STREAM,
    SIDE_STREAM_KERNELS,
    TIMED_OUTPUT_MISMATCH,
    TIMER_MISMATCH,
    TIMER_RETIMED,
    TIMER_UNEXPLAINED,
    Found,
)
from harness.shared.messages import Truth
from harness.shared.record import Record, Status
from harness.shared.settings import TimingSettings
from harness.shared.sizes import tensor_bytes
from harness.shared.timer import ahead_in
from harness.submission.submissions import Submission
from harness.timing.interleave import (
    CpuUse,
    RemoteSide,
    SideStopped,
    blocks_evidence,
    drift_margin,
    drift_of,
    run_timing,
    settle_ms,
    spot_count,
    stats_calls_per_span,
    stats_evidence,
    synced_gap_ms,
    time_alone,
    unexplained_beyond_reference,
    wall_mismatch,
)

log = logging.getLogger(__name__)

TIMING_FILE = "timing.json"   # every timed block of an evaluation, beside its log (_save_blocks)


def evaluate(submission: Submission, reference: Callable[[], Reference], config: Config, device: str,
             artifacts_dir: Path, build: Optional[Build] = None) -> Record:
    """`reference` is called only when the candidate gets as far as running (no_code needs no oracle). `build`:
    the submission's build from the build pool (harness/build/builder.py): its verdict, or libraries to reuse."""
    prepared = prepare(submission, config, device, artifacts_dir)
    if isinstance(prepared, Record):
        return prepared
    record, source = prepared
    if build is not None and build.status is not None:
        record = _built(record, build, source, submission, config)
    else:
        record = _run(record, source, reference, config, artifacts_dir, build)
    return replace(record, timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _built(record: Record, build: Build, source: str, submission: Submission, config: Config) -> Record:
    """The build pool's verdict (compile_error, needs_cuda, a module that never finished): no GPU was needed.
    Static findings are computed without the reference's dtype, so precision_downgrade is not judged here."""
    findings = Found((f.flag, f.evidence) for f in static.analyze(
        source, submission.problem.path.read_text(), reference_is_float32=False, backend=config.backend))
    compiled = False if build.status == Status.COMPILE_ERROR else None
    record = replace(record, status=build.status, error=build.error, compiled=compiled, compile_s=build.compile_s,
                     device_name=build.device_name, log_path=build.log_path, prebuilt=False)
    if build.status == Status.COMPILE_ERROR and build.log_path:
        record = replace(record, error=_first_compiler_error(Path(build.log_path)) or record.error)
    return _apply_profile(record, findings, config)


def needs_clean_time(ref: Reference, config: Config) -> bool:
    """Whether the reference is timed live against candidates and has no clean time yet."""
    return config.time_candidates and ref.clean is None and config.ref_timing != "stored"


def time_clean(ref: Reference, config: Config) -> None:
    """The reference's clean time (docs/timing.md), and its GPU pace beside it: timed alone, no candidate process
    alive on its device (the caller's to ensure: before the evaluation starts its candidate, or a reference started
    in the background, between two evaluations: harness/pipeline/driver.py)."""
    with _timing_alone(ref), builds_paused(ref.device, ref.env):
        side = _reference_side(ref)
        ref.clean = time_alone(side, TimingSettings.from_config(config), ref.device)
        ref.clean_pace_ms = _pace(side, ref)


@contextlib.contextmanager
def _timing_alone(ref: Reference):
    """The reference timed by itself: a side that stopped answering is its problem's OracleError."""
    try:
        yield
    except SideStopped as stopped:
        raise stopped.cause if isinstance(stopped.cause, OracleError) else OracleError(
            ref.problem, f"timing the reference alone: {stopped.cause}", ref.log_path) from stopped


def _run(record: Record, source: str, reference: Callable[[], Reference], config: Config, artifacts_dir: Path,
         build: Optional[Build]) -> Record:
    """The candidate's process against the reference: the measured record with its findings applied."""
    ref = reference()
    if needs_clean_time(ref, config):
        started = time.perf_counter()
        time_clean(ref, config)   # before the candidate's process exists
        record = replace(record, phases={**(record.phases or {}),
                                         "reference_clean": round(time.perf_counter() - started, 4)})
    atol, rtol = ref.tolerance.loosest(ref.truth.outputs[0])
    record = replace(record, device_name=ref.device_name, log_path=str(artifacts_dir / "log.txt"),
                     ref_kernels=ref.ref_kernels, floor_ms=ref.floor_ms, atol=atol, rtol=rtol)
    is_float32 = all(t.dtype == torch.float32 for t in ref.truth.outputs[0] if isinstance(t, torch.Tensor))
    findings = Found((f.flag, f.evidence) for f in static.analyze(
        source, ref.problem.path.read_text(), reference_is_float32=is_float32, backend=config.backend))
    with CandidateRun(Path(record.source_path), ref, config, artifacts_dir / "log.txt",
                      build.libraries if build is not None else None) as run:
        run.source_streams = findings.get(SIDE_STREAM)
        record = _judge(run, ref, config, record)
    if run.reused and build is not None:   # the libraries came from the build pool: its compile time counts
        record = replace(record, prebuilt=True, compile_s=build.compile_s, light_headers=build.light)
    elif record.extensions_built:
        record = replace(record, prebuilt=False)
    findings.update(run.findings)   # complete only once the run is over (leftover processes, blocked operations)
    # About the problem, not the submission (information for the leaderboard): the oracle's word. The child cannot
    # report it: candidate_run keeps only the findings the candidate's own side detects (findings.IN_CANDIDATE).
    if ref.degenerate is not None:
        findings[DEGENERATE_PROBLEM] = ref.degenerate
    record = replace(record, sandbox_warnings=run.sandbox_warnings,
                     phases={**(record.phases or {}), **{k: round(v, 4) for k, v in run.phases.items()}})
    if record.status == Status.COMPILE_ERROR:
        record = replace(record, error=_first_compiler_error(artifacts_dir / "log.txt") or record.error)
    return _apply_profile(record, findings, config)


def _judge(run: "CandidateRun", ref: Reference, config: Config, record: Record) -> Record:
    """The measured status: the first failing check, with gradient failures and findings left to the profile."""
    compiled = run.until_compiled()
    if isinstance(compiled, Stop):
        # A build or module failure says the code did not compile; a timeout, crash or needs_cuda says nothing.
        was_compiled = False if compiled.status in (Status.COMPILE_ERROR, Status.LOAD_ERROR) else None
        return replace(record, status=compiled.status, error=compiled.error, compiled=was_compiled,
                       compile_s=compiled.compile_s)
    record = replace(record, compiled=True, compile_s=compiled.compile_s, extensions_built=compiled.extensions_built,
                     light_headers=compiled.light_headers)

    on = comparison_device(config, ref.device, ref.env)
    result = run.until_checked(lambda first: _first_failed(first, ref, on))
    if isinstance(result, Stop):
        # A build that ModelNew's __init__ ran is judged as the module's own: a failed one did not compile, one that
        # needs CUDA says nothing of compiling.
        in_init = {Status.COMPILE_ERROR: False, Status.NEEDS_CUDA: None}
        return replace(record, status=result.status, error=result.error,
                       compiled=in_init.get(result.status, record.compiled))
    if isinstance(result, FirstFailed):   # trial 0 decided: the other trials, the backward and the profile never ran
        failed = result.verdict
        return replace(record, status=failed.status, error=failed.error, correct=False,
                       max_abs_error=failed.max_abs_error, max_rel_error=failed.max_rel_error,
                       tolerance_needed=failed.tolerance_needed)
    record = replace(record, weights_loaded=result.weights_loaded)
    record = _kernel_findings(run, ref, record)

    began = time.perf_counter()
    try:
        record = _compared(result, ref, record, on)
        if record.correct and ref.check_grad:
            record = _grads_compared(result, _truth_for_grads(result, ref, config, run.phases), ref, record, on)
    finally:
        run.phases["output_check"] = time.perf_counter() - began - run.phases.get("reference_gradients", 0.0)
    del result   # the trials' outputs, mapped from the candidate's memfd: their pages go now, not after the timing
    if record.correct is False:
        return record

    if not config.time_candidates:
        return replace(record, status=Status.PASS)
    started = time.perf_counter()
    try:
        return _timed(run, ref, config, record)
    finally:
        run.phases["timing"] = time.perf_counter() - started


def _host_threads(device: str) -> str:
    """The children's torch thread count (on the CPU device, and their core), for the record's timing_method."""
    if device == "cpu":
        return f"{CPU_THREADS} CPU thread per side, both on core {','.join(map(str, timing_cpus(device)))}"
    return f"{torch.get_num_threads()} host threads per side (torch's default)"


_DECIDED_BY_SHAPES = (Status.SHAPE_MISMATCH, Status.DTYPE_MISMATCH)   # what a first trial alone may decide


def _first_failed(first: list, ref: Reference, on: Optional[torch.device]) -> Optional[check.OutputVerdict]:
    """Trial 0's outputs, handed over before the other trials ran, against the reference's: the failing verdict, or
    None (the run goes on and every trial is checked once the result is in)."""
    verdict = check.check_outputs([first], ref.truth.outputs[:1], ref.tolerance, on=on)
    return verdict if verdict.status is not None else None


def _compared(result, ref: Reference, record: Record, on: Optional[torch.device]) -> Record:
    """The trials' outputs and the repeat against the reference's (in the parent; on the GPU `on` where one is
    given)."""
    outputs = check.check_outputs(result.outputs, ref.truth.outputs, ref.tolerance, on=on)
    record = replace(record, max_abs_error=outputs.max_abs_error, max_rel_error=outputs.max_rel_error,
                     tolerance_needed=outputs.tolerance_needed)
    if result.stopped and outputs.status not in _DECIDED_BY_SHAPES:   # the checks stopped early for no such cause
        return replace(record, status=Status.RUNTIME_ERROR, correct=False, error="unreadable result: the checks "
                       "stopped after trial 0, whose outputs match the reference's in count, type, shape and dtype")
    if outputs.status is not None:
        return replace(record, status=outputs.status, error=outputs.error, correct=False)
    repeat_problem = check.check_repeat(result.outputs[0], result.repeat, ref.tolerance, on)
    if repeat_problem is not None:
        return replace(record, status=Status.NONDETERMINISTIC, error=repeat_problem, correct=False)
    return replace(record, correct=True)


def _truth_for_grads(result, ref: Reference, config: Config, phases: dict) -> Truth:
    """The truth the gradient check needs: with the reference's gradients (its oracle's backward, run once per
    reference: Reference.with_gradients; phase `reference_gradients`) where the candidate's outputs have an autograd
    graph, the only case they are compared in, or where `ref_grads_always` asks for them; else as it is (whether
    the reference's outputs have a graph tells a no_grad)."""
    if not (result.has_graph or config.ref_grads_always) or ref.gradients_in or not ref.truth.has_graph:
        return ref.truth
    began = time.perf_counter()
    try:
        return ref.with_gradients()
    finally:
        phases["reference_gradients"] = time.perf_counter() - began


def _grads_compared(result, truth: Truth, ref: Reference, record: Record, on: Optional[torch.device]) -> Record:
    """The candidate's gradients against the reference's; a failure is left to the profile (`grad_failure`)."""
    grads = check.check_grads(result, truth, ref.grad_tolerance, on)
    record = replace(record, grad_correct=grads.correct, grad_max_abs_error=grads.max_abs_error,
                     grads_compared=grads.compared, grads_not_comparable=grads.not_comparable)
    if grads.correct is False:
        failure = Status.NO_GRAD if not result.has_graph and not result.grad_error else Status.GRAD_MISMATCH
        record = replace(record, grad_failure=failure, error=f"gradients: {grads.error}")
    return record


def _kernel_findings(run: "CandidateRun", ref: Reference, record: Record) -> Record:
    """Own vs library kernels in the profiled forward, and what they say under the rules."""
    kernels = run.kernels
    if kernels is None:
        return record
    run.findings.update(detectors.kernel_findings(kernels, ref.ref_kernels))
    return replace(record, own_kernels=kernels.own, library_kernels=kernels.library,
                   own_kernel_share=kernels.own_share)


def _timed(run: "CandidateRun", ref: Reference, config: Config, record: Record) -> Record:
    """Time the candidate against the reference; then check the spot-checked outputs, the wall clock and the
    roofline, and compute the speedups (over eager, paired; over torch.compile, through the stored baseline)."""
    stored, why_not = baselines.lookup(config, ref.device_name, ref.problem)
    live = config.ref_timing != "stored" or stored is None
    ref_side = _reference_side(ref) if live else None
    candidate = RemoteSide("candidate", run.child.send, run.expect, config.run_timeout_s,
                           pid=run.child.process.pid, holder=run.child.freezer, input_sets=_timed_sets(ref))
    run.phase = "timing"
    # one hold of the start-up gate (and the builds' stop on the CPU device) for the blocks, the spot check and the
    # fresh calls: a background start's GPU work that slipped in between them held the fresh calls up by seconds
    with builds_paused(ref.device, ref.env) as waited_s:
        run.phases["timing_gate_wait"] = waited_s
        began = time.perf_counter()
        try:
            kept_calls = spot_count(config.spot_checks, tensor_bytes(ref.truth.outputs[0]))
            measured, graph_error = run_timing(candidate, ref_side,
                                               replace(TimingSettings.from_config(config), spot_checks=kept_calls),
                                               ref.clean if live else None, ref.device,
                                               0.0 if live else ahead_in(str(stored.eager.get("method", ""))),
                                               conservative=_conservative(run))
        except SideStopped as stopped:
            if isinstance(stopped.cause, Stop):
                return replace(record, status=stopped.cause.status, error=f"during timing: {stopped.cause.error}")
            if isinstance(stopped.cause, OracleError):
                raise stopped.cause
            return replace(record, status=Status.CRASH, error=f"during timing: {stopped.cause}")
        run.phases["timing_blocks"] = time.perf_counter() - began
        _save_blocks(record, measured, [side for side in (ref_side, candidate) if side is not None],
                     ref.clean if live else None)
        mine = measured.stats[-1]
        if measured.escaped is not None and not _side_streams(run):   # found by the timing, not the profiler
            run.findings[SIDE_STREAM_KERNELS] = measured.escaped
        theirs, speedup, source = against_reference(measured, stored, config, why_not)
        compiled = None
        if stored is not None and stored.compile is not None:
            # Live: the paired eager speedup times the stored eager/compile ratio (each ratio measured side by side)
            compiled = speedup[0] * stored.compile["median_ms"] / stored.eager["median_ms"] if len(
                measured.stats) == 2 else stored.compile["median_ms"] / mine.median_ms
        method = mine.method + (f" (cuda_graph unavailable: {graph_error})" if graph_error else "") + \
            f"; {_host_threads(ref.device)}"
        floor = ref.floor_ms if ref.floor_ms is not None and ref.floor_ms <= theirs.median_ms else None
        light = speed_of_light(ref, stored, theirs) or floor
        record = replace(record, runtime_ms=mine.median_ms, runtime_ci_low_ms=mine.ci_low_ms,
                         runtime_ci_high_ms=mine.ci_high_ms, runtime_min_ms=mine.min_ms, runtime_iqr_ms=mine.iqr_ms,
                         runtime_reps=mine.reps, ref_runtime_ms=theirs.median_ms,
                         ref_runtime_ci_low_ms=theirs.ci_low_ms, ref_runtime_ci_high_ms=theirs.ci_high_ms,
                         ref_runtime_min_ms=theirs.min_ms, ref_runtime_iqr_ms=theirs.iqr_ms,
                         ref_runtime_reps=theirs.reps, speedup=speedup[0],
                         speedup_ci_low=speedup[1], speedup_ci_high=speedup[2], speedup_compile=compiled,
                         ref_source=source, timing_method=method, timing_blocks=mine.blocks,
                         timing_converged=mine.converged and theirs.converged, calls_per_span=mine.calls_per_span,
                         ref_calls_per_span=theirs.calls_per_span, floor_ms=floor,
                         sol_fraction=light / mine.median_ms if light and mine.median_ms > 0 else None,
                         isolation=_isolation(run, ref_side),
                         hold_ms=statistics.median(ref_side.hold_ms) if ref_side and ref_side.hold_ms else None)
        if config.timing == "kernelbench":   # KernelBench reports means, and their ratio, without an interval
            record = replace(record, runtime_ms=mine.mean_ms, ref_runtime_ms=theirs.mean_ms,
                             speedup=means_ratio(theirs, mine), speedup_ci_low=None, speedup_ci_high=None)

        disagreement = wall_mismatch(mine)   # recorded whatever the spot checks say
        if disagreement is not None:
            run.findings[TIMER_MISMATCH] = disagreement + (f"; timed again after: {measured.retimed}"
                                                           if measured.retimed else "")
        elif measured.retimed is not None:
            run.findings[TIMER_RETIMED] = f"first timing: {measured.retimed}"
        if len(measured.stats) == 2:
            unexplained = unexplained_beyond_reference(mine, measured.stats[0], candidate.kept_asked,
                                                       tensor_bytes(ref.truth.outputs[0]))
            if unexplained is not None:
                run.findings[TIMER_UNEXPLAINED] = unexplained
        spots = run.spot_checks()
        began = time.perf_counter()
        mismatch = detectors.spot_mismatch(spots, ref.truth.outputs, ref.tolerance,
                                           comparison_device(config, ref.device, ref.env), candidate.kept_sets)
        del spots   # mapped from the candidate's memfd: not held through the fresh-input calls
        run.phases["spot_check"] = time.perf_counter() - began
        if mismatch is not None:
            run.findings[TIMED_OUTPUT_MISMATCH] = mismatch
            return replace(record, status=Status.INCORRECT, correct=False, error=f"during timing: {mismatch}")
        began = time.perf_counter()
        span_calls = stats_calls_per_span(mine)
        gap = synced_gap_ms(measured.blocks[-1])   # per call, as the samples: a span's is `span_calls` of them
        fresh = time_fresh_inputs(run, ref, config, mine.median_ms, round(mine.reps / max(mine.blocks, 1)),
                                  candidate.ahead_ms, "device" if measured.escaped else config.timer_sync,
                                  span_calls, None if gap is None else gap * span_calls)
        run.phases["timing_fresh"] = time.perf_counter() - began
        if isinstance(fresh, Stop):
            return replace(record, status=fresh.status, error=f"during timing on fresh inputs: {fresh.error}",
                           correct=False if fresh.status == Status.INCORRECT else record.correct)
        record = replace(record, fresh_runtime_ms=fresh)
    beyond = detectors.beyond_roofline(mine.median_ms, floor, ref.roofline)
    if beyond is not None:
        run.findings[BEYOND_REFERENCE_ROOFLINE] = beyond
    if ref_side is not None and ref.clean is not None:
        return drift_verdict(run, ref, ref_side, measured, config, record, candidate.cpu_use())
    return replace(record, status=Status.PASS)


def _conservative(run: "CandidateRun") -> Optional[str]:
    """Why the candidate is to be timed the conservative way from the start (synchronized spans, no head start):
    its profiled forward ran kernels on other streams, or its source works off the current stream (a submission may
    keep its side streams out of the profiled forward, and work on them would run beside the head start's spin,
    before the start event)."""
    if run.source_streams:
        return f"its source works off the current stream ({run.source_streams})"
    return _side_streams(run)


def _side_streams(run: "CandidateRun") -> Optional[str]:
    """Why the candidate is to be timed the conservative way from the start: its profiled forward ran kernels on
    streams other than the one it was called on (None: it did not, or was not profiled)."""
    kernels = run.kernels
    if kernels is None or not kernels.side_streams:
        return None
    return f"its profiled forward ran kernels on stream(s) {list(kernels.side_streams)}"


def _save_blocks(record: Record, measured, sides: list[RemoteSide], clean) -> None:
    """timing.json beside the evaluation's log: every timed block of both sides (interleave.blocks_evidence)."""
    try:
        Path(record.log_path).with_name(TIMING_FILE).write_text(json.dumps(
            blocks_evidence(measured, [side.name for side in sides], clean),
            separators=(",", ":")) + "\n")   # compact: one per timed evaluation, thousands in a batch
    except OSError as exc:   # evidence only: the verdict does not rest on the file
        log.warning("could not write %s beside %s: %s", TIMING_FILE, record.log_path, exc)


def _save_alone(record: Record, alone, outcome: Outcome) -> None:
    """timing.json's `reference_alone`: the reference timed again after its candidate was killed, and what that made
    of the drift (`machine_changed`: this time became the reference's clean time, and the record's `ref_clean_ms`)."""
    if not record.log_path:
        return
    path = Path(record.log_path).with_name(TIMING_FILE)
    try:
        evidence = json.loads(path.read_text())
        evidence["reference_alone"] = {**stats_evidence(alone), "outcome": outcome.name.lower()}
        path.write_text(json.dumps(evidence, separators=(",", ":")) + "\n")
    except (OSError, ValueError) as exc:   # evidence only, as in _save_blocks
        log.warning("could not add the reference's alone time to %s: %s", path, exc)


# the most a fresh span's seen-set spans may add to the blocks' round trip (fresh_gap_ms): the fresh stage's gaps
# measured up to 0.105 ms beyond the blocks' median on an H200
NEAR_GAP_SLACK_MS = 0.1


def time_fresh_inputs(run: "CandidateRun", ref: Reference, config: Config, rotating_ms: float,
                      block_calls: int, ahead_ms: float = 0.0, sync: Optional[str] = None,
                      span_calls: int = 1, span_gap_ms: Optional[float] = None) -> Optional[float] | Stop:
    """One timed call on each input set the candidate was never given (never in the feed: the oracle draws them when
    the problem's first candidate gets here, Reference.with_fresh_sets), each output checked against the
    reference's: a cache or a replay cannot answer them. Each is the last of a span of
    `span_calls` calls, as the candidate's timed spans held (the others on a seen set), so that its span holds no
    more of the host's time than theirs did; its time is the span's less the others at the rotating-input median
    (`fresh_call_ms`; with the span to its end event after a device-wide synchronize less the host's round trip,
    fresh_gap_ms of `span_gap_ms`, the blocks' median gap between the two a span, where that is longer: work a fresh
    call left on another stream counts). Their
    median, or the Stop (incorrect on a wrong output). A round whose every call is far above the rotating-input
    median (detectors.fresh_slowdown) is `input_replay` only if a second round on as many other sets says so too: a
    call now and then waits for a busy CPU. Builds are paused as for the timed median they
    are held against: on CPU, calls beside a compiler read 1.2-3.4x slow. `sync`: how the calls' spans end, as the
    blocks' did (the config's, or "device" where the blocks were taken by their synchronized spans)."""
    with builds_paused(ref.device, ref.env):   # within _timed's own hold: part of it
        return _fresh_rounds(run, ref, config, rotating_ms, block_calls, ahead_ms, sync or config.timer_sync,
                             span_calls, span_gap_ms)


def fresh_call_ms(span_ms: float, calls: int, rotating_ms: float, synced_ms: Optional[float] = None,
                  span_gap_ms: Optional[float] = None) -> float:
    """A fresh call's time from its span of `calls` calls: the span less the calls on a seen set before it at the
    rotating-input median (the parent's figure, not the candidate's report of them); never below zero. Where the
    span was also timed to an end event after a device-wide synchronize (`synced_ms`) and the host's round trip
    between the two is known (`span_gap_ms`: fresh_gap_ms), the span is taken as the longer of its stream span and
    that synced span less the gap: a replay that computes only the inputs it has not seen, on a side stream that its
    blocks never use, ends its stream span at once and escapes the blocks' check (interleave.escaped_work)."""
    if synced_ms is not None and span_gap_ms is not None:
        span_ms = max(span_ms, synced_ms - span_gap_ms)
    return max(0.0, span_ms - (calls - 1) * rotating_ms)


def fresh_gap_ms(span_gap_ms: Optional[float], near_gaps_ms: Sequence[float]) -> Optional[float]:
    """The host's round trip to take off a fresh span's synchronized time: the blocks' median gap (`span_gap_ms`), or
    the largest gap of the spans on a seen set just before it (the same moment) where that is longer, by at most
    NEAR_GAP_SLACK_MS. A process woken from its pipe for the fresh calls can wake from the synchronize later than it
    did in its blocks (an honest 2.5 us ReLU on an H200: 0.08-0.13 ms gaps there against its blocks' median
    0.026 ms, which put its fresh calls at 22x its median: input_replay). The bound: those spans are the candidate's
    own, and what it could add to them hides no more than that much side-stream work in the fresh call."""
    if span_gap_ms is None:
        return None
    return max(span_gap_ms, min(max(near_gaps_ms, default=0.0), span_gap_ms + NEAR_GAP_SLACK_MS))


def _fresh_rounds(run: "CandidateRun", ref: Reference, config: Config, rotating_ms: float,
                  block_calls: int, ahead_ms: float, sync: str, span_calls: int,
                  span_gap_ms: Optional[float]) -> Optional[float] | Stop:
    if config.fresh_inputs <= 0:
        return None
    began, asked = time.perf_counter(), not ref.fresh_in
    truth = ref.with_fresh_sets()   # drawn and run by the oracle when a candidate of the problem first gets here
    if asked:
        run.phases["fresh_sets"] = time.perf_counter() - began
    per_round = min(config.fresh_inputs, len(truth.fresh_inputs) // 2)
    on = comparison_device(config, ref.device, ref.env)
    rounds: list[list[float]] = []
    near: list[float] = []
    for start in (0, per_round):
        times = []
        # the second round, run only when the first looked slow, warms each fresh call up with as many calls on a
        # seen set as a block has: a process slow for a while after waking (a launch-bound kernel beside a batch's
        # builds read 6x slow on its first calls) is then as warm as in its blocks, where a replay stays slow; and
        # on a GPU it runs with the builds stopped too (host_quieted), as on the CPU device: a short round is at
        # the mercy of a burst of compiling, where a replay is slow on a quiet host as well
        warm_calls = None if start == 0 else max(block_calls, 3)
        for index in range(start, start + per_round):
            with host_quieted(ref.device, ref.env) if start else contextlib.nullcontext():
                timed = run.time_fresh(truth.fresh_inputs[index], config.l2_flush, sync, warm_calls, ahead_ms,
                                       span_calls)
            if isinstance(timed, Stop):
                return timed
            fresh, outputs = timed
            ms = fresh_call_ms(fresh.ms, span_calls, rotating_ms, fresh.synced_ms,
                               fresh_gap_ms(span_gap_ms, fresh.near_gaps_ms))
            near.extend(fresh.near_ms)
            began = time.perf_counter()
            mismatch = detectors.fresh_mismatch(outputs, truth.fresh_outputs[index], index, ref.tolerance, on)
            run.phases["fresh_check"] = run.phases.get("fresh_check", 0.0) + time.perf_counter() - began
            if mismatch is not None:
                run.findings[TIMED_OUTPUT_MISMATCH] = mismatch
                return Stop(Status.INCORRECT, mismatch)
            times.append(ms)
        rounds.append(times)
        if detectors.fresh_slowdown(times, rotating_ms) is None:
            break
    replay = detectors.input_replay(rounds, rotating_ms, near)
    if replay is not None:
        run.findings[INPUT_REPLAY] = replay
    return statistics.median(rounds[-1]) if rounds and rounds[-1] else None


def _reference_side(ref: Reference) -> RemoteSide:
    return RemoteSide("reference", ref.child.send, ref.expect, ref.timeout_s, pid=ref.child.process.pid,
                      input_sets=_timed_sets(ref))


def _timed_sets(ref: Reference) -> int:
    """The fed input sets both sides' timed calls rotate among, the first ones: as many as the reference holds for
    its timing (harness/shared/timer.py timing_sets; the candidate's process keeps as many)."""
    return ref.timing_sets if ref.timing_sets is not None else len(ref.truth.outputs)


def _isolation(run: "CandidateRun", ref_side: Optional[RemoteSide]) -> str:
    """The record's `isolation`: how the candidate was held, and how its escapees or a failed freeze showed."""
    held = run.child.freezer
    text = run.child.isolation()
    if ref_side is not None:
        text += f"; stopped while its reference was timed ({held.mechanism})"
    if held.escaped:
        text += f"; stopped by signal outside it: {', '.join(held.escaped[:5])}"
    if held.stragglers:
        text += f"; {', '.join(held.stragglers)}"
    return text


def drift_verdict(run: "CandidateRun", ref: Reference, ref_side: RemoteSide, measured, config: Config,
                  record: Record, cpu: Optional[CpuUse]) -> Record:
    """The interleaved reference against its clean time. Beyond the margin after the re-measurements (or a freeze
    that did not hold), the reference's GPU pace is taken with the candidate stopped (on a GPU), then the candidate's
    processes are killed and the reference is timed alone again; harness/integrity/drift.py says whose doing the
    drift was. A timing_interference, or a pass whose speedup is taken against the faster of the two reference times
    (so that a drift is never credited to the candidate); still slow alone, the machine changed, and that alone time
    becomes the reference's clean time."""
    timing = TimingSettings.from_config(config)
    margin = drift_margin(timing, ref.device)
    drift = drift_of(measured, ref.clean, margin)
    record = replace(record, ref_clean_ms=ref.clean.median_ms, ref_drift=drift.ratio)
    held = run.child.freezer
    if not worth_timing_alone(drift.beyond, held.stragglers, could_have_slowed(ref.device, cpu)):
        return replace(record, status=Status.PASS)
    began = time.perf_counter()
    try:
        with _timing_alone(ref), builds_paused(ref.device, ref.env):
            stopped_pace = None if held.stragglers else _pace_beside_stopped(run, ref_side, ref, measured)
            run.end_now()
            alone = time_alone(ref_side, timing, ref.device, idle_ms=idle_between_pairs_ms(measured, config))
            alone_pace = _pace(ref_side, ref)
    finally:
        run.phases["timing_alone"] = time.perf_counter() - began
    verdict = after_alone(drift.evidence(margin), margin, ref.clean.ci_high_ms, record.ref_runtime_ms, alone.median_ms,
                          ref.device, held.stragglers, cpu, Pace(ref.clean_pace_ms, stopped_pace))
    _save_alone(record, alone, verdict.outcome)
    if verdict.outcome is Outcome.INTERFERENCE:
        return replace(record, status=Status.TIMING_INTERFERENCE, error=verdict.evidence)
    if verdict.outcome is Outcome.DRIFT:
        run.findings[REFERENCE_DRIFT] = verdict.evidence
        return _against_alone(replace(record, status=Status.PASS), alone)
    log.info("%s: the reference is slower alone too (%.4g ms, was %.4g ms): the machine changed; new clean time",
             ref.problem.id, alone.median_ms, ref.clean.median_ms)
    ref.clean, ref.clean_pace_ms = alone, alone_pace
    return _against_alone(replace(record, status=Status.PASS, ref_clean_ms=alone.median_ms,
                                  ref_drift=record.ref_runtime_ms / alone.median_ms if alone.median_ms > 0 else None),
                          alone)


def idle_between_pairs_ms(measured, config: Config) -> float:
    """How long the reference idled, interleaved, between its pairs of blocks: the wall time of two of the
    candidate's blocks (the last side's), at most four times `block_ms` (what two honest blocks with their
    preparation take; a candidate that stretches its blocks' wall does not stretch this). The reference timed alone
    again idles as long, so that it differs from its interleaved blocks only in the candidate being gone: a
    launch-bound reference woken from an idle pipe runs its first calls slower, and that is no one's doing."""
    return min(2 * _candidate_block_ms(measured), 4 * config.block_ms)


def _candidate_block_ms(measured) -> float:
    """The mean wall time of the candidate's (the last side's) blocks; 0 without any."""
    walls = [block.wall_ms for block in measured.blocks[-1]] if measured.blocks else []
    return statistics.mean(walls) if walls else 0.0


def _against_alone(record: Record, alone) -> Record:
    """A passing record whose reference drifted: its speedup against the reference timed alone after the candidate
    was killed when that is the faster time (a slower reference never raises a speedup)."""
    if record.ref_runtime_ms is None or alone.median_ms >= record.ref_runtime_ms or not record.runtime_ms:
        return record
    return replace(record, ref_runtime_ms=alone.median_ms, ref_runtime_ci_low_ms=alone.ci_low_ms,
                   ref_runtime_ci_high_ms=alone.ci_high_ms, ref_runtime_min_ms=alone.min_ms,
                   ref_runtime_iqr_ms=alone.iqr_ms, ref_runtime_reps=alone.reps,
                   ref_calls_per_span=alone.calls_per_span,
                   speedup=alone.median_ms / record.runtime_ms,
                   speedup_compile=record.speedup_compile * alone.median_ms / record.ref_runtime_ms
                   if record.speedup_compile is not None else None,
                   speedup_ci_low=alone.ci_low_ms / record.runtime_ci_high_ms if record.runtime_ci_high_ms else None,
                   speedup_ci_high=alone.ci_high_ms / record.runtime_ci_low_ms if record.runtime_ci_low_ms else None,
                   ref_source=f"{record.ref_source} (drifted to {record.ref_runtime_ms:.4g} ms; speedup against "
                              f"the reference alone after the candidate was killed)")


def _pace(side: RemoteSide, ref: Reference) -> Optional[float]:
    """The GPU's pace now, measured in the reference's process (harness/children/oracle/pace.py); None on the CPU
    device or without a clean time."""
    if ref.device == "cpu" or ref.clean is None:
        return None
    return side.pace()


def _pace_beside_stopped(run: "CandidateRun", ref_side: RemoteSide, ref: Reference, measured) -> Optional[float]:
    """The reference's GPU pace with its candidate stopped and left to settle as before a block timed again (what
    it queued drains), on a GPU; None on the CPU device."""
    if ref.device == "cpu" or ref.clean is None:
        return None
    holder = run.child.freezer
    holder.freeze()
    try:
        time.sleep(settle_ms(_candidate_block_ms(measured)) / 1e3)
        return _pace(ref_side, ref)
    finally:
        holder.thaw()


_COMPILER_ERROR = re.compile(r"^.*?(?:error:|error [A-Z]*\d+:|\berror\b.*: ).*$", re.MULTILINE)


def _first_compiler_error(log_path: Path) -> Optional[str]:
    """For display only: the first compiler diagnostic in the build output (verbose builds print it to the log)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    match = _COMPILER_ERROR.search(text)
    return match.group(0).strip()[:300] if match else None
