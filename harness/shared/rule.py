"""When a measurement stops: the adaptive rule's parameters, built from the config with the timing settings
(harness/shared/settings.py `TimingSettings.from_config`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Rule:
    """When to stop: the method's parameters, recorded with every stored baseline."""
    warmup_ms: float = 50.0       # each side, before its first block
    block_ms: float = 20.0        # target duration of one block of timed calls
    min_blocks: int = 24          # per side (six pairs are the fewest with a 95% interval of their median; 24 for
                                  #   reproducible GPU speedups, docs/benchmarks.md)
    target_ci: float = 0.01       # stop once every side's 95% CI of the median is within this share of it
    cap_s: float = 3.0            # ... or once the blocks have taken this long (wall, all sides together)
    max_block_reps: int = 1000    # timed calls in one block at most

    def to_dict(self) -> dict:
        return asdict(self)
