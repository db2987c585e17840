"""What the references a GPU worker keeps may hold of the machine, and whether one more fits.

A reference holds its feed and truth files in the temporary folder (the truth unlinked but mapped: still on the
disk), as much host memory (its inputs and weights in its process, its truth in the judge's page cache) and, on
CUDA, GPU memory of its process. Its files' size (`Reference.files_bytes`) stands for all three: measured once it is
up, and before that the size its problem had at an earlier start here, else the largest a reference of the worker
had (none known: it starts, and its size is known from then on). A reference is started ahead
(harness/pipeline/driver.py Station.start_ahead) only if it fits beside those held; one an evaluation needs now
starts anyway, after the unused ones are closed for room (Station.make_room).

The budget is the config's `ahead_budget_gb` where set, else BUDGET_SHARE of the temporary folder's free space and
of the host's available memory when the worker first asks (GPU memory: bounded by `oracles_per_gpu` alone then).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from harness.shared.config import Config
from harness.shared.resources import free_bytes

BUDGET_SHARE = 0.5   # of the free temporary space and available memory: the rest for candidates, builds, the rest
GB = 2**30


@dataclass(frozen=True)
class Budget:
    """Bytes the references of one worker may hold together; None: not bounded."""
    disk_bytes: Optional[int]     # of the temporary folder
    memory_bytes: Optional[int]   # host memory
    gpu_bytes: Optional[int]      # GPU memory (CUDA only)

    def limit(self, device: str) -> Optional[int]:
        """The tightest of the bounds that apply on `device` (a reference's size stands for all three)."""
        bounds = [b for b in (self.disk_bytes, self.memory_bytes, self.gpu_bytes if device == "cuda" else None)
                  if b is not None]
        return min(bounds) if bounds else None


def derived(free_disk: Optional[int], available_memory: Optional[int], configured_gb: Optional[float]) -> Budget:
    """The budget from the config (`ahead_budget_gb`, for all three) or from the machine's free space and memory."""
    if configured_gb is not None:
        n = int(configured_gb * GB)
        return Budget(n, n, n)
    return Budget(_share(free_disk), _share(available_memory), None)


def _share(n: Optional[int]) -> Optional[int]:
    return int(n * BUDGET_SHARE) if n is not None else None


def fits(held: Iterable[int], size: int, limit: Optional[int]) -> bool:
    """Whether one more reference of `size` bytes fits beside those `held` under `limit` (None: always)."""
    return limit is None or sum(held) + size <= limit


def expected_size(problem_id: str, known: dict[str, int]) -> int:
    """A reference's size before it is up: its problem's at an earlier start, else the largest known, else 0."""
    if problem_id in known:
        return known[problem_id]
    return max(known.values(), default=0)


def available_memory() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def for_machine(config: Config) -> Budget:
    """The budget on this machine now (its temporary folder's free space, its available memory) or the config's."""
    if config.ahead_budget_gb is not None:
        return derived(None, None, config.ahead_budget_gb)
    try:
        free = free_bytes(Path(tempfile.gettempdir()))
    except OSError:
        free = None
    return derived(free, available_memory(), None)
