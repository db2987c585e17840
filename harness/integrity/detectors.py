"""Detectors the parent runs on what it measured itself: pure functions from numbers to findings (name -> evidence).

Runs in the parent. Each returns the findings it raises (empty or None when nothing fires); the caller adds them to
the record's findings, and the rule profile decides what they mean (harness/integrity/profiles.py). The detectors
that need the candidate's process live there (harness/children/candidate/watch.py, guard.py); those that read the
source are harness/integrity/static/; whose doing a drifted reference was is drift.py; the wall-clock cross-checks of
the timing are harness/timing/interleave.py (wall_mismatch, unexplained_beyond_reference).
"""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Optional, Sequence

from harness.shared import check
from harness.shared.check import Tolerance
from harness.shared.findings import (
    FORGED_EVENTS,
    LIBRARY_KERNELS,
    NO_CUSTOM_KERNEL,
    NO_FUSION,
    OUTPUT_FLOOD,
    SANDBOX_BLOCKED,
    SIDE_STREAM_KERNELS,
    SPAWNED_PROCESSES,
    Found,
)
from harness.shared.messages import KernelCounts, Roofline

if TYPE_CHECKING:
    import torch

# A candidate faster than this share of the reference's roofline floor is flagged beyond_reference_roofline
# (harness/shared/roofline.py says how the floor is measured; the margin keeps excellent kernels of the reference's
# own algorithm clear of the flag). Information: a better algorithm beats that floor legitimately.
ROOFLINE_FRACTION = 0.5
# Timed calls on input sets the candidate had never been given (one call each) against its rotating-input median:
# every one of them slower by this factor, and by at least FRESH_MIN_GAP_MS, and the fast time came from kept outputs.
FRESH_SLOWDOWN = 3.0
FRESH_MIN_GAP_MS = 0.05
SHOWN = 4   # leftover processes / blocked operations quoted in the evidence


def kernel_findings(kernels: KernelCounts, ref_kernels: int) -> dict[str, str]:
    """no_custom_kernel, library_kernels, side_stream_kernels and no_fusion from one profiled forward."""
    own, library, summary = kernels.own, kernels.library, kernels.library_summary
    found = Found()
    if own == 0:
        found[NO_CUSTOM_KERNEL] = f"0 own kernels in the profiled forward ({library} library kernels: {summary})"
    if library:
        share = kernels.own_share
        found[LIBRARY_KERNELS] = (f"{library} library kernel(s), own share of kernel time {share:.0%}: {summary}"
                                    if share is not None else f"{library} library kernel(s): {summary}")
    if kernels.side_streams:
        found[SIDE_STREAM_KERNELS] = f"kernels on stream(s) {list(kernels.side_streams)}"
    replaced = ref_kernels - library
    if not (own >= 1 and replaced >= own + 1):
        found[NO_FUSION] = (f"reference {ref_kernels} kernels; submission {own} own + {library} library, so its "
                              f"own kernels replace {replaced} reference kernel(s)")
    return found


def spot_mismatch(kept: Optional[list], truth_outputs: Sequence[list], tolerance: Tolerance,
                  on: Optional[torch.device] = None, chosen: Sequence[int] = ()) -> Optional[str]:
    """The first spot-checked timed call whose outputs differ from the reference's for the input set the parent chose
    for it (`chosen`: one per call it asked to keep, in order; compared `on` that device: harness/shared/check.py).
    The file is written in the candidate's process, so its word decides nothing: other than one entry per call asked
    is a mismatch (an empty list would check nothing), and so is an entry that names another input set than the
    parent chose (the set a cached output would be right for)."""
    if kept is None:
        return "the spot-checked outputs of timed calls are missing or unreadable"
    if len(kept) != len(chosen):
        return f"{len(kept)} spot-checked output(s) came back for the {len(chosen)} timed calls asked to keep them"
    for entry, index in zip(kept, chosen):
        if not isinstance(entry, dict):
            return "a spot-check entry is not a record of a timed call"
        named = entry.get("input_set")
        if not isinstance(named, int) or isinstance(named, bool) or named != index:
            return f"timed call {entry.get('call')} names input set {str(named)[:20]}, where the judge chose {index}"
        verdict = check.check_outputs([entry.get("outputs")], [truth_outputs[index]], tolerance, figures=False, on=on)
        if verdict.status is not None:
            return f"timed call {entry.get('call')} (input set {index}): {verdict.error}"
    return None


def beyond_roofline(median_ms: float, floor_ms: Optional[float], roofline: Roofline) -> Optional[str]:
    """Evidence when the median is below ROOFLINE_FRACTION of the reference's roofline floor; None otherwise or
    without one."""
    if not floor_ms or median_ms >= ROOFLINE_FRACTION * floor_ms:
        return None
    rates = roofline.rates
    return (f"median {median_ms:.4g} ms < {ROOFLINE_FRACTION:g} x floor {floor_ms:.4g} ms "
            f"({roofline.bytes / 1e6:.3g} MB at {rates.bandwidth_gbps:.3g} GB/s, "
            f"{roofline.flops / 1e9:.3g} GFLOP at {rates.fp32_tflops:.3g} TFLOP/s)")


def fresh_slowdown(fresh_ms: Sequence[float], rotating_median_ms: float) -> Optional[str]:
    """input_replay evidence: the first calls on never-seen input sets against the median on the rotating ones, when
    even the fastest of them is slow. None when one was not (or nothing was timed fresh). A cache misses on every
    never-seen set; the host's noise, which only ever adds time, lands on some calls and not others (beside a
    batch's compilers an honest launch-bound kernel's median of four can read 2.5x its blocks')."""
    if not fresh_ms:
        return None
    fastest, fresh = min(fresh_ms), statistics.median(fresh_ms)
    if fastest <= FRESH_SLOWDOWN * rotating_median_ms or fastest - rotating_median_ms <= FRESH_MIN_GAP_MS:
        return None
    return (f"{len(fresh_ms)} call(s) on never-seen input sets took a median {fresh:.4g} ms, "
            f"{fresh / rotating_median_ms:.1f}x its {rotating_median_ms:.4g} ms on the rotating ones "
            f"(the fastest {fastest:.4g} ms)")


def fresh_mismatch(outputs: list, truth: list, index: int, tolerance: Tolerance,
                   on: Optional[torch.device] = None) -> Optional[str]:
    """timed_output_mismatch evidence when the outputs of the timed call on never-seen input set `index` differ from
    the reference's for that set (compared `on` that device: harness/shared/check.py); None when they agree."""
    verdict = check.check_outputs([outputs], [truth], tolerance, figures=False, on=on)
    return f"fresh input set {index}: {verdict.error}" if verdict.status is not None else None


def input_replay(rounds: Sequence[Sequence[float]], rotating_median_ms: float,
                 near_ms: Sequence[float] = ()) -> Optional[str]:
    """input_replay evidence: two rounds of calls on never-seen input sets (the second on as many other sets), each
    slow by fresh_slowdown; None with one round only or when either was not slow (a call now and then waits for a
    busy CPU: one slow round is no replay). `near_ms`: the calls on seen sets just before the fresh ones."""
    evidence = [fresh_slowdown(times, rotating_median_ms) for times in rounds]
    if len(evidence) != 2 or not all(evidence):
        return None
    return f"{evidence[0]}; again on {len(rounds[1])} other set(s): {evidence[1]}" + (
        f"; the calls on seen sets just before them: median {statistics.median(near_ms):.4g} ms" if near_ms else "")


def aftermath(leftovers: Sequence[str], forged: Sequence[str], log_bytes: int, log_cap: Optional[int],
              blocked: Sequence[str]) -> dict[str, str]:
    """What the candidate's process left behind once it ended: processes still running, event lines without the
    run's token, output beyond the log's cap (`log_cap` None: not flooded), operations the sandbox refused."""
    found = Found()
    if leftovers:
        found[SPAWNED_PROCESSES] = f"{len(leftovers)} process(es) left running: " + ", ".join(leftovers[:SHOWN])
    if forged:
        found[FORGED_EVENTS] = f"{len(forged)} event line(s) without the run's token, e.g. {forged[0]!r}"
    if log_cap is not None:
        found[OUTPUT_FLOOD] = f"{log_bytes / 2**20:.1f} MB of output, cut to {log_cap / 2**20:.1f} MB"
    if blocked:
        found[SANDBOX_BLOCKED] = "; ".join(blocked[:5]) + (
            f" (+{len(blocked) - 5} more)" if len(blocked) > 5 else "")
    return found
