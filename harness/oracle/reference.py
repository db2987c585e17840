"""Parent side of the oracle: run the reference once per problem in its own process and keep its truth in memory.

The oracle writes its feed and truth into memfds made here (harness/shared/handover.py). Once it reports READY both
are sealed: the truth is mapped into this process (its fd never reaches a candidate), the feed is kept and each
candidate is lent a read-only fd of it (harness/judge/candidate_run.py). Where no memfd can be made they are files in
the oracle's folder: the truth is mapped and unlinked at once, the feed is read by its path.

The oracle process stays up after READY (one per problem, for all of that problem's candidates): the parent times
the reference in it, in blocks interleaved with each candidate's (harness/timing/interleave.py). It idles on its command
pipe while a candidate is built and checked, and never runs while a candidate's block runs."""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from harness.integrity.degenerate import evidence
from harness.isolation import policy
from harness.isolation.spawn import (
    Child,
    Started,
    StartGate,
    claimed_status,
    start_gate,
    wait_until_ready,
)
from harness.isolation.started_ahead import unexpected
from harness.oracle import ahead
from harness.shared import commands, protocol
from harness.shared.check import Tolerance
from harness.shared.config import Config
from harness.shared.handover import oracle_files
from harness.shared.messages import (
    Failed,
    FreshSets,
    GpuDone,
    Gradients,
    Malformed,
    ReferenceReady,
    Roofline,
    Truth,
)
from harness.shared.problems import Problem
from harness.shared.resources import JudgeShort, ran_short
from harness.shared.settings import SandboxSettings
from harness.shared.specs import ORACLE_MODULE, OracleSpec
from harness.shared.timer import TimingStats

log = logging.getLogger(__name__)


class OracleError(RuntimeError):
    """The reference itself failed: a problem (or environment) error, not the candidate's."""

    def __init__(self, problem: Problem, message: str, log_path: Path):
        super().__init__(f"reference for {problem.id} failed: {message} (log: {log_path})")
        self.problem, self.message, self.log_path = problem, message, log_path


class ReferenceShort(OracleError):
    """The judge ran short keeping the reference (its temporary folder full, host or GPU memory exhausted): the
    machine's failure, not the problem's. Its submissions get judge_error (no verdict, judged again on resume) and
    the problem is tried again by the next one."""


def _failed(problem: Problem, started: Started, log_path: Path) -> OracleError:
    """The error of a start that did not come READY: ReferenceShort when the oracle said it ran short, or died of a
    SIGKILL the judge did not send (a timeout is the judge's kill: `timed_out`), which on a trusted process is the
    kernel's out-of-memory killer."""
    ended = started.child.ended if started.status is None else None
    killed = ended is not None and not ended.timed_out and ended.returncode == -signal.SIGKILL
    if started.status == protocol.JUDGE_SHORT or killed:
        return ReferenceShort(problem, started.error + (" (the host out of memory?)" if killed else ""), log_path)
    return OracleError(problem, started.error, log_path)


@dataclass
class Reference:
    problem: Problem
    device: str
    device_name: str
    feed_fd: Optional[int]        # the feed's sealed memfd (the oracle child's, closed with it): lent to candidates
    feed_path: Optional[Path]     # the feed's file where there is no memfd (read by the candidate's process)
    feed_bytes: int               # the feed's size: what a candidate may map of it
    truth: Truth                  # reference outputs (gradients once asked for: with_gradients), CPU tensors; never
                                  # written where candidates run
    ref_kernels: int              # kernels (CPU: top-level compute ops) in one reference forward
    floor_ms: Optional[float]     # roofline floor at the rates measured in the oracle (harness/shared/roofline.py)
    roofline: Roofline            # flops, bytes and the measured rates behind floor_ms
    check_grad: bool              # gradients are checked (config and the problem's CHECK_GRAD agree)
    tolerance: Tolerance          # for outputs
    grad_tolerance: Tolerance     # for gradients
    workdir: Path
    child: Child                  # the oracle process, serving timing commands until closed
    log_path: Path
    timeout_s: float
    env: Optional[dict] = None    # environment overrides for this problem's processes (one GPU worker's GPU)
    clean: Optional[TimingStats] = None   # the reference timed alone, no candidate alive; kept while it lives
    clean_pace_ms: Optional[float] = None  # beside it, the GPU's time per call with the host ahead (timing/pace.py)
    degenerate: Optional[str] = None      # why the problem is degenerate (oracle/degenerate.py); None: it is not
    start_steps: dict = field(default_factory=dict)   # seconds per step of its start: the record's ref_* phases
    timing_sets: Optional[int] = None   # the fed input sets timed calls rotate among (None: all; timer.timing_sets)
    held_bytes: int = 0           # its feed and truth: the host memory it holds while it lives (oracle/budget.py)
    gradients_in: bool = False    # the truth holds the reference's gradients (asked of the oracle: with_gradients)
    fresh_in: bool = False        # the truth holds the fresh input sets (asked of the oracle: with_fresh_sets)

    def expect(self, wanted: str, timeout_s: float) -> dict:
        """The oracle's next event, which must be `wanted`; anything else raises OracleError."""
        event = self.child.next_event(timeout_s)
        if event is None:
            raise OracleError(self.problem, f"while timing: {self.child.ended.detail}", self.log_path)
        if event["event"] != wanted:
            raise OracleError(self.problem, f"while timing: {event.get('error', event['event'])}", self.log_path)
        return event

    def with_gradients(self) -> Truth:
        """The truth with the reference's gradients in it. The oracle runs the reference's backward only when first
        asked (between timings: CMD_GRADIENTS); the answer is kept for every later submission of the problem. A
        reference whose outputs have no autograd graph has none to ask for: its truth as it is."""
        if self.truth.has_graph and not self.gradients_in:
            gradients = self._ask(commands.GRADIENTS, protocol.GRADIENTS, protocol.GRADIENTS_FILE, Gradients.from_file,
                                  "computing its gradients")
            self.truth = replace(self.truth, input_grads=list(gradients.input_grads),
                                 param_grads=dict(gradients.param_grads))
            self.gradients_in = True
        return self.truth

    def with_fresh_sets(self) -> Truth:
        """The truth with the fresh input sets and the reference's outputs on them in it: input sets never fed to a
        candidate, drawn and run by the oracle only when first asked (between timings: CMD_FRESH_SETS, once a
        candidate reaches the fresh-input check); kept for every later submission of the problem."""
        if not self.fresh_in:
            fresh = self._ask(commands.FRESH_SETS, protocol.FRESH_SETS, protocol.FRESH_SETS_FILE, FreshSets.from_file,
                              "drawing its fresh input sets")
            self.truth = replace(self.truth, fresh_inputs=list(fresh.inputs), fresh_outputs=list(fresh.outputs))
            self.fresh_in = True
        return self.truth

    def _ask(self, command, answer: str, name: str, parse, doing: str):
        """Send the oracle `command` and read the file `name` it answers with (`answer`), parsed by `parse`; its size
        joins held_bytes (unlinked but mapped: in memory, as the truth)."""
        self.child.send(command)
        event = self.child.next_event(self.timeout_s)
        if event is None:
            raise OracleError(self.problem, f"{doing}: {self.child.ended.detail}", self.log_path)
        if event["event"] != answer:
            failed = Failed.from_event(event)
            if failed.status == protocol.JUDGE_SHORT:   # the machine's, as at a start (ran_short sees the cause)
                raise ReferenceShort(self.problem, failed.error, self.log_path) from JudgeShort(failed.error)
            raise OracleError(self.problem, f"{doing}: {failed.error or event['event']}", self.log_path)
        try:
            loaded, size = read_asked(self.child, self.workdir, name)
            value = parse(loaded)
        except Malformed as exc:
            raise OracleError(self.problem, str(exc), self.log_path) from exc
        self.held_bytes += size
        return value

    def close(self) -> None:
        self.child.finish()
        shutil.rmtree(self.workdir, ignore_errors=True)


def read_asked(child: Child, workdir: Path, name: str) -> tuple[Any, int]:
    """A file the oracle wrote when asked (GRADIENTS_FILE, FRESH_SETS_FILE), loaded, and its size: from the memfd made
    for it, sealed and mapped, as the truth; where there is none, its file in the oracle's folder, mapped, then
    unlinked at once (only this process can reach it)."""
    if name in child.handover.fds:
        return child.handover.load(name), child.handover.size(name)
    path = workdir / name
    try:
        size = path.stat().st_size
        return torch.load(path, weights_only=True, mmap=True), size
    finally:
        path.unlink(missing_ok=True)

# The device's rates (harness/shared/roofline.py) measured by this process's oracles, per device, GPU worker
# environment and `rates_key` (dtype and size class): a gated reference of the same class is handed them instead of
# waiting for a moment with no candidate process alive to measure them again. They are a property of the device, not
# of the problem; measured once per class (and again once RATES_MAX_AGE_S old: a long-lived `serve` follows the
# device's clocks), the slowest of the references' starts (a gap between two evaluations) goes once per class.
RATES_MAX_AGE_S = 600.0
_RATES: dict[tuple, tuple[float, dict]] = {}   # place -> (when measured, rates)
_RATES_LOCK = threading.Lock()


def _rates_place(device: str, env: Optional[dict], key: str) -> tuple:
    return device, (env or {}).get("CUDA_VISIBLE_DEVICES"), key


def known_rates(device: str, env: Optional[dict], key: str) -> Optional[dict]:
    """The rates measured for this place and class, unless older than RATES_MAX_AGE_S (None: measure them)."""
    with _RATES_LOCK:
        measured = _RATES.get(_rates_place(device, env, key))
    if measured is None or time.monotonic() - measured[0] > RATES_MAX_AGE_S:
        return None
    return measured[1]


def remember_rates(device: str, env: Optional[dict], ready: ReferenceReady) -> None:
    if ready.rates_key and ready.rates_measured:
        rates = {"bandwidth_gbps": ready.roofline.rates.bandwidth_gbps,
                 "fp32_tflops": ready.roofline.rates.fp32_tflops}
        with _RATES_LOCK:
            _RATES[_rates_place(device, env, ready.rates_key)] = (time.monotonic(), rates)


def _gated_gpu_work(child: Child, gate: StartGate, here: StartGate, timeout_s: float,
                    known: Callable[[str], Optional[dict]] = lambda key: None) -> Optional[Started]:
    """A gated oracle's two stages of GPU work (harness/children/oracle/main.py build_reference): its truth and its
    files while no timing runs on its GPU in this process (`here`: spawn.start_gate of its place), then the device's
    rates while no evaluation runs on its worker either (`gate`: no candidate process alive there), unless `known`
    has them for its rates key (then handed over at once). None, or the failed start where an event did not come
    (`_stage_failed`). Holding `here` also keeps spawn.builds_paused from stopping the process halfway through.
    Where no evaluation runs on its worker when the truth's stage begins, that stage holds the worker's gate too (an
    evaluation then waits for it to end) and the oracle is told its truth may wait on the GPU (GpuGo's `keep`);
    beside an evaluation, whose candidate may need that memory, the truth waits on the host."""
    failed = _stage_failed(child, child.next_event(timeout_s), protocol.STAGED)
    if failed is not None:
        return failed
    with here.start_up(), gate.start_up_if_idle() as idle:
        child.send(commands.GpuGo(keep=idle))
        event = child.next_event(timeout_s)
        failed = _stage_failed(child, event, protocol.GPU_DONE)
    if failed is not None:
        return failed
    rates = known(GpuDone.from_event(event).rates_key or "")
    if rates is not None:
        child.send(commands.GpuGo(rates))
        return _stage_failed(child, child.next_event(timeout_s), protocol.GPU_DONE)
    with gate.start_up(), gate.alone, here.start_up():   # alone: not beside another reference's either
        child.send(commands.GpuGo())
        return _stage_failed(child, child.next_event(timeout_s), protocol.GPU_DONE)


def _stage_failed(child: Child, event: Optional[dict], wanted: str) -> Optional[Started]:
    """None when `event` is `wanted`; else the child ended (as wait_until_ready ends one that fails) and the start
    that failed: why (started_ahead.unexpected), with the status a FAILED event claims (JUDGE_SHORT: the machine ran
    short, as at any other step of the start)."""
    why = unexpected(child, event, wanted)
    if why is None:
        return None
    child.finish()
    return Started(child, None, why, claimed_status(event))


def _take_files(problem: Problem, child: Child, workdir: Path, log_path: Path) -> tuple[Truth, int]:
    """The truth the oracle wrote, mapped (not read: the oracle never touches it again, and a copy into this
    process's memory took seconds for level2/62's 1.5 GB), and its size; the feed sealed for the candidates. Where
    there are no memfds, the truth's file is unlinked once mapped (candidates run later with read access to /tmp:
    the truth lives only in this process) and the feed's file is made readable to a candidate running as a user of
    its own (the folder passed through, not listed; the rest of it stays the reference's)."""
    files = child.handover
    truth_bytes = files.size(protocol.TRUTH_FILE)
    if protocol.FEED_FILE in files.fds:
        if not files.seal(protocol.FEED_FILE):   # never lent unsealed: a candidate could change it for the next
            raise OracleError(problem, "its feed could not be sealed", log_path)
        return Truth.from_file(files.load(protocol.TRUTH_FILE)), truth_bytes
    truth_path = workdir / protocol.TRUTH_FILE
    truth = Truth.from_file(torch.load(truth_path, weights_only=True, mmap=True))
    truth_path.unlink()
    os.chmod(workdir, 0o711)
    os.chmod(workdir / protocol.FEED_FILE, 0o644)
    return truth, truth_bytes


def tolerance_for(config: Config, metadata: dict) -> tuple[Tolerance, Tolerance]:
    """(outputs, gradients): the config (when set) over the problem's constants over the defaults of the config's
    `tolerances` for the output's dtype and the run's precision."""
    def pick(configured: Optional[float], key: str) -> Optional[float]:
        return configured if configured is not None else metadata.get(key)

    table, precision = config.tolerances, config.precision
    return (Tolerance.for_outputs(pick(config.atol, "atol"), pick(config.rtol, "rtol"), table, precision),
            Tolerance.for_gradients(pick(config.grad_atol, "grad_atol"), pick(config.grad_rtol, "grad_rtol"), table,
                                    precision))


def run_oracle(problem: Problem, config: Config, device: str, log_dir: Path,
               env: Optional[dict] = None, gate: Optional[StartGate] = None) -> Reference:
    """`env` (e.g. {"CUDA_VISIBLE_DEVICES": "1"}) goes to the oracle and to the candidates run against it. The oracle
    process is one started ahead (harness/oracle/ahead.py: `ref_take` is the wait for its imports, if any) or,
    without one, started now (`ref_process`: its imports). `gate`: a start beside evaluations
    (harness/pipeline/driver.py, a reference started in the background): its CPU work runs at once, its GPU work only
    when no timing runs on its GPU and its measurement of the device's rates only when no evaluation runs either (the
    GPU worker holds `gate.timing()` while it evaluates; see _gated_gpu_work), and until READY the process is stopped
    while anything is timed on its GPU (spawn.builds_paused)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"oracle-{problem.id.replace('/', '_')}.log"
    log.info("running the reference for %s on %s", problem.id, device)
    spawned, clock = time.time(), time.perf_counter()
    started_ahead = ahead.take(config, device, env)
    taken = time.perf_counter() - clock
    try:
        workdir = started_ahead.workdir if started_ahead is not None else Path(tempfile.mkdtemp(prefix="oracle-"))
    except OSError as exc:
        if ran_short(exc):
            raise ReferenceShort(problem, f"{type(exc).__name__}: {exc}", log_path) from exc
        raise
    # An unpredictable input seed: a submission that regenerates "the" inputs from a known seed gets other ones.
    input_seed = secrets.randbits(31) if config.secret_inputs else config.seed
    spec = replace(OracleSpec.from_config(config, problem.path, device, workdir, input_seed), gated=gate is not None)
    child: Optional[Child] = None
    try:
        if started_ahead is not None:
            child = started_ahead.child
            ahead.run(started_ahead, spec, log_path, config, device, env)
        else:
            child = Child(ORACLE_MODULE, spec, workdir, log_path, with_commands=True, handover=oracle_files(),
                          **policy.for_trusted(SandboxSettings.from_config(config), env, device).options())
        started = None
        if gate is not None:
            # "still starting" until READY: stopped beside any timing of its place until then
            child.mark_starting(threading.Event(), beside_any_timing=True)
            started = _gated_gpu_work(child, gate, start_gate(device, env), config.oracle_timeout_s,
                                      lambda key: known_rates(device, env, key))
        if started is None:
            started = wait_until_ready(child, config.oracle_timeout_s, keep=True)
        if child.settled is not None:
            child.settled.set()
        if started.ready is None:
            raise _failed(problem, started, log_path)
        ready = ReferenceReady.from_event(started.ready)
        remember_rates(device, env, ready)
        ready_at = time.perf_counter()
        truth, truth_bytes = _take_files(problem, child, workdir, log_path)
        feed_fd = child.handover.fds.get(protocol.FEED_FILE)
        feed_path = workdir / protocol.FEED_FILE if feed_fd is None else None
        feed_bytes = child.handover.size(protocol.FEED_FILE)
    except BaseException as exc:
        # Nothing of a failed start is left: its process and its folder (a start refused or killed because the
        # batch was interrupted included: spawn.ShuttingDown, spawn.stop_all).
        if child is not None:
            child.finish()
        shutil.rmtree(workdir, ignore_errors=True)
        if isinstance(exc, Malformed):
            raise OracleError(problem, str(exc), log_path) from exc
        if isinstance(exc, OSError) and ran_short(exc):   # the truth mapped or the folder opened: the parent's work
            raise ReferenceShort(problem, f"{type(exc).__name__}: {exc}", log_path) from exc
        raise
    tolerance, grad_tolerance = tolerance_for(config, ready.metadata)
    degenerate = evidence(truth.outputs, truth.swapped, tolerance)
    truth = replace(truth, swapped=[])   # only that answer is kept
    # Where the start went (the record's ref_* phases): the wait for a process started ahead to be up, the process
    # up to its work (the command to it; started now: its imports), its own steps, the rest of the wait for READY,
    # and the parent's read of the truth.
    process = max(ready.began - spawned - taken, 0.0) if ready.began is not None else None
    steps = {"take": taken, "process": process, **ready.steps, "truth": time.perf_counter() - ready_at}
    accounted = sum(v for k, v in steps.items() if k != "truth" and v is not None)
    steps["other"] = max(ready_at - clock - accounted, 0.0)
    steps = {f"ref_{k}": round(v, 4) for k, v in steps.items() if v is not None}
    return Reference(problem=problem, device=device, device_name=ready.device_name,
                     feed_fd=feed_fd, feed_path=feed_path, feed_bytes=feed_bytes, truth=truth, child=started.child,
                     log_path=log_path,
                     timeout_s=config.run_timeout_s, check_grad=ready.check_grad, tolerance=tolerance,
                     grad_tolerance=grad_tolerance, workdir=workdir, ref_kernels=ready.ref_kernels,
                     floor_ms=ready.floor_ms, env=env, roofline=ready.roofline, degenerate=degenerate,
                     start_steps=steps, held_bytes=feed_bytes + truth_bytes, timing_sets=ready.timing_sets)
