"""`problems` listing and `problems --check`: is each reference a good question to ask?

Listing reads problem files (trusted code) on torch's meta device, so no tensor is allocated. The check runs each
reference once in its own process (harness/children/oracle/problem_check.py) and flags weak problems: an output that a
zero or constant tensor would match within tolerance, non-finite outputs, a reference that disagrees with itself
between two runs, no gradient where the backward check applies, a footprint beyond a 24 GB GPU.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from harness.isolation import policy
from harness.isolation.spawn import start_until_ready
from harness.shared.config import Config
from harness.shared.environment import exec_source
from harness.shared.messages import Malformed, ProblemCheckReady
from harness.shared.problems import Problem, ProblemMetadata
from harness.shared.settings import SandboxSettings
from harness.shared.specs import PROBLEM_CHECK_MODULE, ProblemCheckSpec

GPU_MEMORY_LIMIT_MB = 24 * 1024   # problems must fit a 24 GB GPU with gradients
MIN_EAGER_MS = 0.5                # on an H100-class GPU, below this launch overhead dominates


@dataclass(frozen=True)
class ProblemListing:
    problem: Problem
    description: Optional[str]
    inputs: tuple[str, ...]       # "(1024, 8192) float32" per input; empty when the file could not be read
    error: Optional[str]


@dataclass(frozen=True)
class ProblemReport:
    problem: Problem
    device: str
    info: Optional[ProblemCheckReady]   # what the child reported (None when the reference failed)
    error: Optional[str]
    flags: tuple[str, ...]        # reasons the problem is weak; empty when none


def list_problem(problem: Problem) -> ProblemListing:
    try:
        module = exec_source(problem.path.read_text(), str(problem.path), f"listed_{abs(hash(problem.path))}")
        metadata = ProblemMetadata.from_module(module, str(problem.path))
        with torch.device("meta"):
            inputs = tuple(_shape(v) for v in module.get_inputs())
        return ProblemListing(problem, metadata.description, inputs, None)
    except Exception as exc:  # a broken problem file is reported in the listing, not raised
        return ProblemListing(problem, None, (), f"{type(exc).__name__}: {exc}"[:200])


def weak_flags(info: ProblemCheckReady, device: str) -> list[str]:
    """Pure: the reasons a checked problem is weak."""
    flags = []
    for index, output in enumerate(info.outputs):
        if output.finite is False:
            flags.append(f"output {index} has NaN/Inf")
        if output.zero_passes:
            flags.append(f"a zero tensor passes output {index}")
        elif output.constant_passes:
            flags.append(f"a constant tensor passes output {index}")
        if output.repeat_agrees is False:
            flags.append(f"output {index} differs between two runs of the reference")
    grad = info.grad
    if grad.checked and grad.has_graph is False:
        flags.append("no gradient although the backward check applies")
    if grad.checked and grad.params_without_grad:
        flags.append(f"parameters without gradient: {', '.join(grad.params_without_grad)}")
    footprint = info.peak_mb if info.peak_mb is not None else info.tensor_mb
    if footprint > GPU_MEMORY_LIMIT_MB:
        flags.append(f"needs {footprint / 1024:.1f} GB (> 24 GB)")
    if device == "cuda" and info.eager_ms < MIN_EAGER_MS:
        flags.append(f"eager {info.eager_ms:.3f} ms < {MIN_EAGER_MS} ms: launch overhead dominates")
    return flags


def check_problem(problem: Problem, config: Config, device: str, log_dir: Path) -> ProblemReport:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"check-{problem.id.replace('/', '_')}.log"
    with tempfile.TemporaryDirectory(prefix="problem-check-") as workdir:
        spec = ProblemCheckSpec.from_config(config, problem.path, device)
        started = start_until_ready(PROBLEM_CHECK_MODULE, spec, Path(workdir), log_path, config.oracle_timeout_s,
                                    **policy.for_trusted(SandboxSettings.from_config(config)).options())
    if started.ready is None:
        reason = f"reference {started.error}" if started.died else started.error
        return ProblemReport(problem, device, None, f"{reason} (log: {log_path})", ("reference failed",))
    try:
        info = ProblemCheckReady.from_event(started.ready)
    except Malformed as exc:
        return ProblemReport(problem, device, None, f"the check's report is malformed: {exc} (log: {log_path})",
                             ("reference failed",))
    return ProblemReport(problem, device, info, None, tuple(weak_flags(info, device)))


def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return repr(value)
