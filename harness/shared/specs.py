"""What each child process is told to do: one frozen dataclass per child, built from the Config here and nowhere else.

The parent writes a spec as JSON into the child's working directory (harness/isolation/spawn.py), together with the
child's `Wiring` (its event and command pipes and the run's token); the child reads it once and deletes the file
(`read_spec`), so code that runs later in the child cannot read the token. A spec holds plain values only.

  child module                           spec
  harness.children.candidate.main                CandidateSpec (an evaluation, or a build with build_only)
  harness.children.oracle.main                   OracleSpec
  harness.children.oracle.baseline          BaselineSpec
  harness.children.oracle.problem_check     ProblemCheckSpec
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, TypeVar

from harness.shared.config import DEFAULT_TOLERANCES, Config
from harness.shared.settings import TimingSettings

CANDIDATE_MODULE = "harness.children.candidate.main"
ORACLE_MODULE = "harness.children.oracle.main"
BASELINE_MODULE = "harness.children.oracle.baseline"
PROBLEM_CHECK_MODULE = "harness.children.oracle.problem_check"

Spec = TypeVar("Spec")
_OUTPUT_DEFAULTS = tuple((name, t.atol, t.rtol) for name, t in DEFAULT_TOLERANCES)


@dataclass(frozen=True)
class Wiring:
    """The child's ends of its pipes and the token every event line must carry."""
    event_fd: int
    command_fd: Optional[int]
    token: str
    handover: Optional[dict] = None   # file name -> the memfd it is written into (harness/shared/handover.py)
    lend_fd: Optional[int] = None     # its end of the socket the parent lends it fds over (handover.lend): the feed


@dataclass(frozen=True)
class CandidateSpec:
    """The candidate's process (harness/children/candidate/main.py): an evaluation, or a build in the build pool."""
    source_path: str               # the extracted submission, copied into the child's folder
    device: str
    seed: int                      # ModelNew is built under the reference's weight seed
    allow_tf32: bool
    out_dir: str                   # the child's own folder: the only place it may write
    check_grad: bool = False
    feed: Optional[str] = None     # the oracle's FEED_FILE where it is a file; None in an evaluation: the feed is
                                   # lent as a read-only fd of its sealed memfd (harness/shared/handover.py)
    prebuilt: dict = field(default_factory=dict)   # call key -> {"module", "dir"}: libraries from the build pool
    build_only: bool = False       # execute the module, report the built libraries, exit (no GPU, no feed)
    precision: str = "fp32"        # ModelNew is cast to it before the reference weights (already cast) go in
    backend: str = "auto"          # the config's `backend`: a kernel language, or auto (harness/shared/backends)
    light_headers: bool = False    # the config's `light_cuda_headers` (harness/children/candidate/extensions.py)
    pch_root: Optional[str] = None   # the judge's precompiled torch/extension.h folder (build/pch.py)
    ahead: bool = False            # started ahead of its submission: warm up, report IDLE, take the real spec from
                                   # CMD_RUN (harness/judge/warm.py); only device, allow_tf32, out_dir count here
    expected: Optional[tuple] = None   # the reference's trial-0 outputs' check.output_signature: a first forward
                                       # whose own differs ends the checks there (None: every trial runs)

    @classmethod
    def for_evaluation(cls, config: Config, source_path: Path, workdir: Path, device: str, feed: Optional[Path],
                       check_grad: bool, prebuilt: dict, expected: Optional[tuple] = None) -> "CandidateSpec":
        return cls(source_path=str(source_path), device=device, seed=config.seed, allow_tf32=config.allow_tf32,
                   out_dir=str(workdir), check_grad=check_grad, feed=str(feed) if feed is not None else None,
                   prebuilt=prebuilt, precision=config.precision, backend=config.backend,
                   light_headers=config.light_cuda_headers, expected=expected)

    @classmethod
    def started_ahead(cls, config: Config, workdir: Path, device: str) -> "CandidateSpec":
        return cls(source_path="", device=device, seed=config.seed, allow_tf32=config.allow_tf32,
                   out_dir=str(workdir), precision=config.precision, ahead=True)

    @classmethod
    def for_build(cls, config: Config, source_path: Path, workdir: Path, device: str,
                  pch_root: Optional[Path] = None) -> "CandidateSpec":
        return cls(source_path=str(source_path), device=device, seed=config.seed, allow_tf32=config.allow_tf32,
                   out_dir=str(workdir), build_only=True, backend=config.backend,
                   light_headers=config.light_cuda_headers, pch_root=str(pch_root) if pch_root else None)


@dataclass(frozen=True)
class OracleSpec:
    """The reference's process (harness/children/oracle/main.py), one per problem, serving timing after READY."""
    problem_path: str
    device: str
    seed: int                      # weights (both sides) and grad_outputs
    input_seed: int                # trial inputs (unpredictable unless config.secret_inputs is off)
    trials: int
    check_grad: bool
    allow_tf32: bool
    out_dir: str                   # its folder: FEED_FILE and TRUTH_FILE are written here where no memfd is made
    precision: str = "fp32"        # parameters and floating inputs cast to it (harness/shared/precision.py)
    fresh_inputs: int = 0          # input sets kept out of the feed, with their outputs, for the fresh-input timing
    ahead: bool = False            # started ahead (harness/oracle/ahead.py): report IMPORTED, wait for CMD_RUN
    gated: bool = False            # started beside timings: STAGED before any GPU work, which waits for CMD_GPU

    @classmethod
    def from_config(cls, config: Config, problem_path: Path, device: str, workdir: Path,
                    input_seed: int) -> "OracleSpec":
        return cls(problem_path=str(problem_path), device=device, seed=config.seed, input_seed=input_seed,
                   trials=config.trials, check_grad=config.check_grad, allow_tf32=config.allow_tf32,
                   out_dir=str(workdir), precision=config.precision,
                   fresh_inputs=config.fresh_inputs if config.time_candidates else 0)

    @classmethod
    def started_ahead(cls, config: Config, workdir: Path, device: str) -> "OracleSpec":
        """A process started before its problem is known: only what its start needs (the rest comes with CMD_RUN)."""
        return replace(cls.from_config(config, Path(), device, workdir, 0), problem_path="", ahead=True)


@dataclass(frozen=True)
class BaselineSpec:
    """A stored-baseline process (harness/children/oracle/baseline.py): the device's peaks, or one problem's times."""
    device: str
    seed: int
    trials: int
    allow_tf32: bool
    out_dir: str
    rule: dict                     # harness/shared/rule.py `Rule` fields
    l2_flush: bool
    sync: str
    peaks: bool = False            # measure the device's peaks instead of a problem
    problem_path: Optional[str] = None
    modes: tuple[str, ...] = ()    # eager, compile, max-autotune
    precision: str = "fp32"        # the reference cast as in the oracle; the peak matmul rate includes this dtype's
    host_ahead: bool = False       # CUDA: the host's head start before each timed call (config timer_host_ahead)

    @classmethod
    def from_config(cls, config: Config, device: str, workdir: Path, problem_path: Optional[Path] = None,
                    modes: tuple[str, ...] = ()) -> "BaselineSpec":
        """A problem's baseline in `modes`; without a problem, the device's peaks."""
        timing = TimingSettings.from_config(config)
        return cls(device=device, seed=config.seed, trials=config.trials, allow_tf32=config.allow_tf32,
                   out_dir=str(workdir), rule=timing.rule.to_dict(), l2_flush=timing.l2_flush,
                   sync=timing.timer_sync, peaks=problem_path is None,
                   problem_path=str(problem_path) if problem_path is not None else None, modes=tuple(modes),
                   precision=config.precision, host_ahead=timing.timer_host_ahead)


@dataclass(frozen=True)
class ProblemCheckSpec:
    """`problems --check` (harness/children/oracle/problem_check.py): one run of a reference, inspected."""
    problem_path: str
    device: str
    seed: int
    allow_tf32: bool
    rule: dict
    l2_flush: bool
    precision: str = "fp32"        # the reference cast as in the oracle
    tolerances: tuple = _OUTPUT_DEFAULTS   # ((precision, atol, rtol), ...): the config's output defaults
    host_ahead: bool = False       # CUDA: the host's head start before each timed call (config timer_host_ahead)

    @classmethod
    def from_config(cls, config: Config, problem_path: Path, device: str) -> "ProblemCheckSpec":
        timing = TimingSettings.from_config(config)
        return cls(problem_path=str(problem_path), device=device, seed=config.seed, allow_tf32=config.allow_tf32,
                   rule=timing.rule.to_dict(), l2_flush=timing.l2_flush, precision=config.precision,
                   tolerances=tuple((name, t.atol, t.rtol) for name, t in config.tolerances),
                   host_ahead=timing.timer_host_ahead)


def write_spec(path: Path, spec, wiring: Wiring) -> None:
    path.write_text(json.dumps({"spec": dataclasses.asdict(spec), "wiring": dataclasses.asdict(wiring)}))


def read_spec(path: str | Path, kind: type[Spec]) -> tuple[Spec, Wiring]:
    """The spec and the wiring, then the file is deleted: its token must not be readable by code that runs later."""
    path = Path(path)
    data = json.loads(path.read_text())
    path.unlink()
    return from_fields(kind, data["spec"]), Wiring(**data["wiring"])


def from_fields(kind: type[Spec], fields: dict) -> Spec:
    """A spec from its fields as JSON carried them (in the spec file, or with CMD_RUN to a process started ahead)."""
    return kind(**{name: _tuples(value) for name, value in fields.items()})


def _tuples(value):
    """JSON has lists where the dataclass has tuples (of tuples, for a table)."""
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value
