"""What each kind of child may see and do: its environment, the folders it may write, its limits. One place.

The mechanisms live elsewhere (harness/isolation/sandbox.py applies a `sandbox.Policy`, harness/isolation/spawn.py
starts the process and enforces memory and deadlines); this module decides, per kind of child, what they get:

  candidate (evaluation)  sandbox: writes only in its own folder, no network, rlimits, no scheduling privileges, and
                          where the judge is root an unprivileged user of its own (so RLIMIT_NPROC binds it and file
                          permissions keep it from the judge's files); memory cap; a cgroup of its own with a process
                          cap; the GPU worker's GPU
  candidate (build)       the same sandbox (a user of its own too: the parent copies its libraries into the cache,
                          which no candidate can read, and into each evaluation's folder, read-only there) and cap,
                          no GPU visible, TORCH_CUDA_ARCH_LIST of the evaluation GPU, niced
  trusted (oracle, baseline, problem check)  no sandbox (it runs the problem's own reference); the same log cap; a
                          cgroup of its own (so the candidate's timing can stop it too)

Every child gets only the allowlisted variables of the parent's environment (and those the backends' toolchains
read, harness/shared/backends), with HOME, TMPDIR and every backend's JIT cache (TORCH_EXTENSIONS_DIR, TRITON_CACHE_DIR,
...) inside its own folder.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from harness.isolation.sandbox import Limits, Policy
from harness.shared import backends
from harness.shared.paths import IMPORT_ROOT
from harness.shared.settings import SandboxSettings

# Environment passed to children: names, and prefixes for toolchain families.
ENV_NAMES = {"PATH", "LANG", "LC_ALL", "TERM", "LD_LIBRARY_PATH", "CC", "CXX", "CUDA_HOME", "CUDA_PATH",
             "CUDA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NCCL_NVLS_ENABLE",
             "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "OMP_NUM_THREADS",
             "PYTORCH_CUDA_ALLOC_CONF",   # the caching allocator's settings: the same for both sides of a timing
             "KERNEL_JUDGE_FILL_HOW",     # how a GPU's tensors reach a handover file (harness/shared/handover.py)
             "KERNEL_JUDGE_TIMING_SET_BYTES"}   # the timed calls' input sets (harness/shared/timer.py timing_sets)
ENV_PREFIXES = ("NVIDIA_", "CUDNN_")


# pids.max of a submission's cgroup: tasks, threads included (torch starts one per core for its CPU pool, a build
# runs a compiler per job); a fork bomb stops here instead of filling the machine's process table.
CAGE_TASKS = 4096


@dataclass(frozen=True)
class Confinement:
    """Child options (harness/isolation/spawn.py `Child`) for one kind of child."""
    policy: Optional[Policy]          # the sandbox; None: not sandboxed (trusted code)
    max_rss_bytes: Optional[int]      # the process group is killed above this resident memory
    max_log_bytes: int                # the log keeps its first and last halves of this
    env: dict[str, str] = field(default_factory=dict)   # on top of child_environment's
    nice: int = 0
    caged: bool = True                # in a cgroup of its own where the machine allows (harness/isolation/freeze.py)
    max_processes: Optional[int] = None   # pids.max of that cgroup
    cpus: Optional[tuple[int, ...]] = None   # the cores it and everything it starts may run on (None: any)
    build: bool = False               # a build: stopped beside every timing on the CPU device (spawn.builds_paused)

    def options(self) -> dict:
        return {"policy": self.policy, "max_rss_bytes": self.max_rss_bytes, "max_log_bytes": self.max_log_bytes,
                "env": self.env, "nice": self.nice, "caged": self.caged, "max_processes": self.max_processes,
                "cpus": self.cpus, "build": self.build}


def timing_cpus(device: Optional[str]) -> Optional[tuple[int, ...]]:
    """On the CPU device both sides of a timing (the reference's process and the candidate's, with everything they
    start) run on one core, the last this process may use. They never run at once (the candidate is stopped while
    its reference is timed, and the reference waits on its pipe meanwhile), each has one torch thread, so neither
    side's time depends on which core the scheduler gave it or on moving between cores; the parent, builds and
    processes being started ahead keep the other cores. None on a GPU (the host only launches)."""
    if device != "cpu":
        return None
    return (max(os.sched_getaffinity(0)),)


def submission_limits(sandbox: SandboxSettings) -> Limits:
    """A submission's child (build or evaluation): CPU time covers every phase; files up to 64 GB (results of
    GB-sized problems); a few hundred processes."""
    cpu_s = int(sandbox.compile_timeout_s + 3 * sandbox.run_timeout_s) + 60
    return Limits(cpu_s=cpu_s, file_bytes=64 * 2**30, extra_processes=512, open_files=4096)


def for_candidate(sandbox: SandboxSettings, workdir: Path, env: Optional[dict[str, str]] = None,
                  device: Optional[str] = None) -> Confinement:
    """An evaluation on `device`: the GPU worker's environment (`env`, e.g. its CUDA_VISIBLE_DEVICES); on the CPU
    device, the timing core (timing_cpus). `device` None: a build, which times nothing."""
    return Confinement(Policy(writable=(str(workdir),), limits=submission_limits(sandbox)),
                       int(sandbox.max_host_memory_gb * 2**30), sandbox.max_log_bytes, dict(env or {}),
                       max_processes=CAGE_TASKS, cpus=timing_cpus(device))


def for_build(sandbox: SandboxSettings, workdir: Path, arch: Optional[str], nice: int = 0) -> Confinement:
    """A build in the build pool: the candidate's confinement, but no GPU visible (a module that runs GPU work at
    import cannot disturb a timing), compiled for the evaluation GPU's architecture, at a lower CPU priority."""
    env = {"CUDA_VISIBLE_DEVICES": "", **({"TORCH_CUDA_ARCH_LIST": arch} if arch else {})}
    return dataclasses.replace(for_candidate(sandbox, workdir, env), nice=nice, build=True)


def for_trusted(sandbox: SandboxSettings, env: Optional[dict[str, str]] = None,
                device: Optional[str] = None) -> Confinement:
    """The oracle, a baseline or a problem check: the problem's own reference, never candidate code. `device`: the
    oracle's, which times the reference against candidates (on the CPU device, on the timing core)."""
    return Confinement(None, None, sandbox.max_log_bytes, dict(env or {}), cpus=timing_cpus(device))


def child_environment(workdir: Path, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    passed = ENV_NAMES | backends.passed_environment()
    env = {k: v for k, v in os.environ.items() if k in passed or k.startswith(ENV_PREFIXES)}
    env.update({
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "PYTHONPATH": str(IMPORT_ROOT),   # where `harness` is imported from: the checkout or site-packages
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        **backends.cache_environment(workdir),   # the JIT caches: one folder per backend, all in the workdir
    })
    env.update(extra or {})
    return env
