"""The speedup arithmetic: from the timing's measurement (and a stored baseline) to the record's figures. Pure."""
from __future__ import annotations

from typing import Optional

from harness.oracle import baselines
from harness.oracle.reference import Reference
from harness.shared.config import Config
from harness.shared.roofline import floor_ms
from harness.shared.timer import Measurement, TimingStats


def against_reference(measured: Measurement, stored: Optional[baselines.Stored], config: Config,
                       why_not: str) -> tuple[TimingStats, tuple[float, float, float], str]:
    """(the reference's stats, (speedup, CI low, CI high), where the reference time comes from)."""
    mine = measured.stats[-1]
    if len(measured.stats) == 2:   # timed live next to the candidate
        source = config.ref_timing if config.ref_timing != "stored" else f"interleaved ({why_not})"
        return measured.stats[0], measured.ratio(0, 1), source
    theirs = TimingStats(**{k: v for k, v in stored.eager.items() if k in TimingStats.__dataclass_fields__})
    speedup = (theirs.median_ms / mine.median_ms, theirs.ci_low_ms / mine.ci_high_ms,
               theirs.ci_high_ms / mine.ci_low_ms)
    return theirs, speedup, stored.source


def means_ratio(theirs: TimingStats, mine: TimingStats) -> Optional[float]:
    """The reference's mean time over the candidate's: KernelBench's speedup (`timing: kernelbench`)."""
    return theirs.mean_ms / mine.mean_ms if mine.mean_ms > 0 else None


def speed_of_light(ref: Reference, stored: Optional[baselines.Stored], theirs: TimingStats) -> Optional[float]:
    """The roofline floor at the device's stored peaks; None without peaks, or when it exceeds the reference's own
    time (peaks from GB-sized copies do not bound a problem that sits in cache)."""
    if stored is None or not stored.peaks:
        return None
    light = floor_ms(ref.roofline.flops, ref.roofline.bytes, stored.peaks)
    return light if light <= theirs.median_ms else None
