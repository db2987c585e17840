"""Parent side of the oracle: run the reference once per problem in its own process and keep its truth in memory.

The oracle process stays up after READY (one per problem, for all of that problem's candidates): the parent times
the reference in it, in blocks interleaved with each candidate's (harness/interleave.py). It idles on its command
pipe while a candidate is built and checked, and never runs while a candidate's block runs."""
from __future__ import annotations

import logging
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from harness.core import protocol
from harness.core.check import Tolerance
from harness.core.config import Config
from harness.core.problems import Problem
from harness.isolation.spawn import Child

log = logging.getLogger(__name__)


class OracleError(RuntimeError):
    """The reference itself failed: a problem (or environment) error, not the candidate's."""

    def __init__(self, problem: Problem, message: str, log_path: Path):
        super().__init__(f"reference for {problem.id} failed: {message} (log: {log_path})")
        self.problem, self.message, self.log_path = problem, message, log_path


@dataclass
class Reference:
    problem: Problem
    device: str
    device_name: str
    feed_path: Path               # what the candidate's process may read
    truth: dict                   # reference outputs and gradients, CPU tensors; never written where candidates run
    ref_kernels: int              # kernels (CPU: top-level compute ops) in one reference forward
    floor_ms: Optional[float]     # roofline floor at the rates measured in the oracle (harness/roofline.py)
    roofline: dict                # flops, bytes and the measured rates behind floor_ms
    check_grad: bool              # gradients are checked (config and the problem's CHECK_GRAD agree)
    tolerance: Tolerance          # for outputs
    grad_tolerance: Tolerance     # for gradients
    workdir: Path
    child: Child                  # the oracle process, serving timing commands until closed
    log_path: Path
    timeout_s: float
    env: Optional[dict] = None    # environment overrides for this problem's processes (one GPU worker's GPU)

    def expect(self, wanted: str, timeout_s: float) -> dict:
        """The oracle's next event, which must be `wanted`; anything else raises OracleError."""
        event = self.child.next_event(timeout_s)
        if event is None:
            raise OracleError(self.problem, f"while timing: {self.child.ended.detail}", self.log_path)
        if event["event"] != wanted:
            raise OracleError(self.problem, f"while timing: {event.get('error', event['event'])}", self.log_path)
        return event

    def close(self) -> None:
        self.child.finish()
        shutil.rmtree(self.workdir, ignore_errors=True)


def tolerance_for(config: Config, metadata: dict) -> tuple[Tolerance, Tolerance]:
    """(outputs, gradients): the config (when set) over the problem's constants over the dtype defaults."""
    def pick(configured: Optional[float], key: str) -> Optional[float]:
        return configured if configured is not None else metadata.get(key)

    return (Tolerance(pick(config.atol, "atol"), pick(config.rtol, "rtol")),
            Tolerance.for_gradients(pick(config.grad_atol, "grad_atol"), pick(config.grad_rtol, "grad_rtol")))


def run_oracle(problem: Problem, config: Config, device: str, log_dir: Path,
               env: Optional[dict] = None) -> Reference:
    """`env` (e.g. {"CUDA_VISIBLE_DEVICES": "1"}) goes to the oracle and to the candidates run against it."""
    workdir = Path(tempfile.mkdtemp(prefix="oracle-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"oracle-{problem.id.replace('/', '_')}.log"
    # An unpredictable input seed: a submission that regenerates "the" inputs from a known seed gets other ones.
    input_seed = secrets.randbits(31) if config.secret_inputs else config.seed
    spec = {"problem_path": str(problem.path), "device": device, "seed": config.seed, "trials": config.trials,
            "input_seed": input_seed,
            "check_grad": config.check_grad, "allow_tf32": config.allow_tf32, "out_dir": str(workdir)}
    log.info("running the reference for %s on %s", problem.id, device)
    child = Child("harness.oracle.child", spec, workdir, log_path, with_commands=True,
                  max_log_bytes=config.max_log_bytes, env=env)
    try:
        event = child.next_event(config.oracle_timeout_s)
    except BaseException:
        child.finish()
        raise
    if event is None or event["event"] != protocol.READY:
        child.finish()
        shutil.rmtree(workdir, ignore_errors=True)
        reason = event.get("error", event["event"]) if event else child.ended.detail
        raise OracleError(problem, reason, log_path)
    truth_path = workdir / protocol.TRUTH_FILE
    truth = torch.load(truth_path, weights_only=True)
    truth_path.unlink()  # candidates run later with read access to /tmp: the truth lives only in this process
    tolerance, grad_tolerance = tolerance_for(config, event["metadata"])
    return Reference(problem=problem, device=device, device_name=event["device_name"],
                     feed_path=workdir / protocol.FEED_FILE, truth=truth, child=child, log_path=log_path,
                     timeout_s=config.run_timeout_s,
                     check_grad=event["check_grad"], tolerance=tolerance, grad_tolerance=grad_tolerance,
                     workdir=workdir, ref_kernels=event["ref_kernels"], floor_ms=event["floor_ms"], env=env,
                     roofline={key: event[key] for key in ("flops", "bytes", "rates")})
