"""The narrow settings each part of the judge takes instead of the whole `Config`, derived from it here and nowhere
else: timing (harness/timing, the timer's `Rule`, the specs of the children that time), the rule profile's inputs
(harness/integrity/profiles.py), the confinement of child processes (harness/isolation/policy.py) and the batch
pipeline (harness/pipeline).

Each is a frozen dataclass whose fields carry the `Config` keys' names (but for the timing's `rule`, built from its
keys, and the pipeline's config hash and the `Config` it hands on), so a field means what docs/configuration.md says
of its key. The orchestrators that hold the `Config` (harness/judge/evaluate.py, the oracle's and the build's
starters, the command line and the API) derive them with `from_config`.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from harness.shared.config import Config, find_config, load_config
from harness.shared.resources import usable_cores
from harness.shared.rule import Rule


def _keys(cls: type, config: Config, **derived: Any) -> Any:
    """`cls` with each field not in `derived` read from the config key of the same name."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if f.name not in derived},
               **derived)


@dataclass(frozen=True)
class TimingSettings:
    """How a timing runs: the stopping rule, the timer's options, the reference's timing and its drift checks."""
    rule: Rule                     # warmup_ms, block_ms, min_blocks, target_ci, timing_cap_s, max_block_reps
    l2_flush: bool
    timer_sync: str
    timer_host_ahead: bool
    cuda_graph: bool
    timing_placements: int
    ref_timing: str
    spot_checks: int
    ref_drift_margin: float
    ref_drift_margin_cpu: float
    ref_drift_retries: int

    timing: str                    # the method (config TIMING_METHODS); timer_sync, cuda_graph and
                                   # timer_host_ahead above are what it comes to (a graph with cuda-graph, no head
                                   # start with kernelbench)

    @classmethod
    def from_config(cls, config: Config) -> "TimingSettings":
        return _keys(cls, config, rule=Rule(warmup_ms=config.warmup_ms, block_ms=config.block_ms,
                                            min_blocks=config.min_blocks, target_ci=config.target_ci,
                                            cap_s=config.timing_cap_s, max_block_reps=config.max_block_reps),
                     cuda_graph=config.graph_timing, timer_host_ahead=config.host_ahead)


@dataclass(frozen=True)
class IntegritySettings:
    """The rule profile's inputs (harness/integrity/profiles.py `Profile.from_settings`)."""
    profile: str
    forbid: tuple[str, ...]
    check_grad: bool
    grad_failure_fails: bool
    grad_mismatch_fails: bool
    atol: Optional[float]
    rtol: Optional[float]

    @classmethod
    def from_config(cls, config: Config) -> "IntegritySettings":
        return _keys(cls, config)

    @classmethod
    def load(cls, name_or_path: str | Path) -> "IntegritySettings":
        """A profile's inputs by name (configs/<name>.yaml) or from a YAML path."""
        return cls.from_config(load_config(find_config(name_or_path)))


@dataclass(frozen=True)
class SandboxSettings:
    """What confines a child process (harness/isolation/policy.py): its time limits, memory and log caps."""
    compile_timeout_s: float
    run_timeout_s: float
    max_host_memory_gb: float
    max_log_bytes: int

    @classmethod
    def from_config(cls, config: Config) -> "SandboxSettings":
        return _keys(cls, config)


@dataclass(frozen=True)
class PipelineSettings:
    """What the batch pipeline (harness/pipeline) reads itself: where its workers run, how many builds and references
    they keep, the build cache, the kernel language its scheduling guesses at, the resume key's config hash.

    `judge_config` is the whole `Config`, which the pipeline hands unread to the layer that judges (the judge's
    evaluation, the oracle's start, the builder, the warm candidate processes), each deriving its own settings from
    it; tests/test_architecture.py holds the pipeline to passing it on as it is."""
    device: Optional[str]          # None: cuda when available (harness/pipeline/batch.py resolve_device)
    gpus: Optional[str]
    build_jobs: Optional[int]
    oracles_per_gpu: int
    oracle_timeout_s: float
    build_cache_dir: Optional[str]
    backend: str
    config_hash: str               # Config.hash(): the resume key's part that keeps configs apart
    judge_config: Config = dataclasses.field(repr=False)

    @classmethod
    def from_config(cls, config: Config) -> "PipelineSettings":
        return _keys(cls, config, config_hash=config.hash(), judge_config=config)

    def listed_gpus(self) -> Optional[list[str]]:
        """GPU ids for the workers as the config lists them, else as CUDA_VISIBLE_DEVICES does; None when neither
        names them (the caller counts the GPUs: torch, or the device nodes where torch is not loaded)."""
        listed = self.gpus or os.environ.get("CUDA_VISIBLE_DEVICES")
        return None if listed is None else [g.strip() for g in listed.split(",") if g.strip()]

    def build_slots(self, gpu_workers: int) -> int:
        """The build pool's size: the config's, else the usable cores (affinity) left once each GPU worker has
        CPU_PER_GPU_WORKER."""
        return self.build_jobs or max(1, usable_cores() - CPU_PER_GPU_WORKER * gpu_workers)


CPU_PER_GPU_WORKER = 2     # cores left to each GPU worker's oracle and candidate (host side of the timing)
