"""What the references a GPU worker keeps may hold of the machine, and whether one more fits.

A reference holds its feed and truth in memfds (harness/oracle/reference.py): host memory that nothing reclaims while
it lives, beside its process's inputs and weights and, on CUDA, its process's GPU memory. The size of its feed and
truth (`Reference.held_bytes`) stands for all of it: measured once it is up, and before that the size its problem had
at an earlier start here, else the largest a reference of the worker had (none known: it starts, and its size is
known from then on). A reference is started ahead (harness/pipeline/driver.py Station.start_ahead) only if it fits
beside those held; one an evaluation needs now starts anyway, after the unused ones are closed for room
(Station.make_room).

The budget is the config's `ahead_budget_gb` where set (host memory, and GPU memory on CUDA), else BUDGET_SHARE of the
host's available memory when the worker first asks, split evenly among the GPU workers that share the host (GPU
memory: bounded by `oracles_per_gpu` alone then). The split is what keeps several workers together inside the share:
each worker asks when its own first reference starts, when the others have yet to take theirs, and a 4-GPU host
whose workers each kept half its memory in references held twice what it had (its out-of-memory killer then took
candidates mid-timing). The local pipeline's workers are its threads (LocalEngine names how many); a Dask `worker`
command tells its GPU workers' processes through HOST_WORKERS_ENV (two `worker` commands on one host do not know of
each other: give each an `ahead_budget_gb`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Optional

from harness.shared.config import Config
from harness.shared.resources import available_memory

BUDGET_SHARE = 0.5   # of the available memory: the rest for candidates (which map the feed too), builds, the rest
GB = 2**30
HOST_WORKERS_ENV = "KERNEL_JUDGE_HOST_WORKERS"   # GPU workers of one `worker` command on this host (engines.py)


@dataclass(frozen=True)
class Budget:
    """Bytes the references of one worker may hold together; None: not bounded."""
    memory_bytes: Optional[int]   # host memory
    gpu_bytes: Optional[int]      # GPU memory (CUDA only)

    def limit(self, device: str) -> Optional[int]:
        """The tightest of the bounds that apply on `device` (a reference's size stands for both)."""
        bounds = [b for b in (self.memory_bytes, self.gpu_bytes if device == "cuda" else None) if b is not None]
        return min(bounds) if bounds else None


def derived(available: Optional[int], configured_gb: Optional[float], sharers: int = 1) -> Budget:
    """The budget from the config (`ahead_budget_gb`, for both, a worker's own) or from the host's available memory,
    shared by `sharers` workers."""
    if configured_gb is not None:
        n = int(configured_gb * GB)
        return Budget(n, n)
    return Budget(int(available * BUDGET_SHARE / max(sharers, 1)) if available is not None else None, None)


def fits(held: Iterable[int], size: int, limit: Optional[int]) -> bool:
    """Whether one more reference of `size` bytes fits beside those `held` under `limit` (None: always)."""
    return limit is None or sum(held) + size <= limit


def expected_size(problem_id: str, known: dict[str, int]) -> int:
    """A reference's size before it is up: its problem's at an earlier start, else the largest known, else 0."""
    if problem_id in known:
        return known[problem_id]
    return max(known.values(), default=0)


def host_workers() -> int:
    """The GPU workers sharing this host's memory, as a Dask `worker` command told its processes; else 1."""
    try:
        return max(int(os.environ.get(HOST_WORKERS_ENV, "")), 1)
    except ValueError:
        return 1


def for_machine(config: Config, sharers: int = 1) -> Budget:
    """The budget on this machine now (its available memory, shared by `sharers` workers) or the config's."""
    if config.ahead_budget_gb is not None:
        return derived(None, config.ahead_budget_gb)
    return derived(available_memory(), None, sharers)
