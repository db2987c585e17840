"""Parent side of timing: drive the candidate's process and the oracle's through `timing.measure`.

Neither process times the other or sees the other's numbers. The parent sends each side its blocks in turn (never
two at once), keeps its own wall clock around every block, picks which calls are spot-checked, and computes the
medians, their confidence intervals and the paired speedup from the samples the sides report. The cross-check
compares that wall clock with the sum of a side's reported event times.
"""
from __future__ import annotations

import secrets
from typing import Any, Callable, Optional, Sequence

from harness.core import protocol
from harness.core.config import Config
from harness.core.messages import BlockReport, Malformed, Warm
from harness.timing.rule import Rule
from harness.timing.timer import Block, Measurement, TimingStats, measure

# The wall-clock cross-check. The parent's wall time around a side's blocks covers the timed spans, the harness work
# the side reports (clones, flushes, copies) and host overhead the events do not see: the pipe round trip per block
# and the Python, event and synchronize work around each call. A side whose timed spans fall short of
# WALL_MIN_SHARE of the rest, after those allowances, has work the events missed; one whose spans exceed the wall
# reported time that did not pass.
WALL_MIN_SHARE = 0.5
WALL_SLACK_MS = 50.0       # once per measurement
PER_BLOCK_MS = 2.0         # pipe round trip and process wake-up, per block
PER_CALL_MS = 0.15         # host work per timed call outside both the events and the reported harness work


class SideStopped(Exception):
    """A side's process stopped answering the timing dialogue; `cause` is its Stop or OracleError."""

    def __init__(self, side: str, cause: Any):
        super().__init__(f"{side}: {cause}")
        self.side, self.cause = side, cause


class RemoteSide:
    """A side in another process. `expect(event, timeout_s)` returns the event or raises SideStopped."""

    def __init__(self, name: str, send: Callable[..., None], expect: Callable[[str, float], dict],
                 timeout_s: float):
        self.name, self._send, self._expect, self.timeout_s = name, send, expect, timeout_s
        self.method = ""
        self.calls = 0
        self.per_call_ms = 0.0
        self.graph_error: Optional[str] = None

    def start(self, **settings: Any) -> None:
        """A fresh timer in the side's process, warmed up (settings: warmup_ms, l2_flush, sync, graph)."""
        self._send(protocol.CMD_TIME_START, order_seed=secrets.randbits(31), **settings)
        warm = self._parse(Warm.from_event, self._expect(protocol.WARM, self.timeout_s))
        self.per_call_ms, self.method, self.graph_error = warm.per_call_ms, warm.method, warm.graph_error
        self.calls = 0

    def warmup(self, budget_ms: float) -> float:
        return self.per_call_ms   # warmed up in start()

    def block(self, reps: int, keep: Sequence[int] = ()) -> Block:
        self._send(protocol.CMD_BLOCK, reps=reps, keep=list(keep))
        report = self._parse(BlockReport.from_event, self._expect(protocol.BLOCK, self.timeout_s), reps)
        self.calls += reps + 1
        return Block(list(report.samples), report.events_ms, report.outside_ms)

    def end(self) -> dict:
        self._send(protocol.CMD_TIME_END)
        return self._expect(protocol.SPOTS, self.timeout_s)

    def _parse(self, parse: Callable[..., Any], event: dict, *args: Any) -> Any:
        """A timing event as its message type; a malformed one stops this side (the child is untrusted)."""
        try:
            return parse(event, *args)
        except Malformed as exc:
            raise SideStopped(self.name, f"{exc} (in a timing event)") from exc


def run_timing(candidate: RemoteSide, reference: Optional[RemoteSide],
               config: Config) -> tuple[Measurement, Optional[str]]:
    """Time the candidate (last side) against the reference (first side, unless None: a stored baseline).

    Returns the measurement and, when CUDA-graph timing was asked for but a side could not be captured, why (both
    sides are then timed eagerly, so the two are always timed alike)."""
    sides = [side for side in (reference, candidate) if side is not None]
    settings = dict(warmup_ms=config.warmup_ms, l2_flush=config.l2_flush, sync=config.timer_sync)
    for side in sides:
        side.start(graph=config.cuda_graph, **settings)
    graph_error = None
    if config.cuda_graph and any(not side.method.startswith("cuda_graph") for side in sides):
        graph_error = next((f"{s.name}: {s.graph_error}" for s in sides if s.graph_error), "not captured")
        for side in sides:
            side.start(graph=False, **settings)
    measurement = measure(sides, Rule.from_config(config), interleave=config.ref_timing != "sequential",
                          spot_side=len(sides) - 1, spot_count=config.spot_checks, spot_seed=secrets.randbits(31))
    for side in sides:
        side.end()
    return measurement, graph_error


def wall_mismatch(stats: TimingStats) -> Optional[str]:
    """The cross-check of one side: its reported event times against the parent's wall clock (None: they agree)."""
    overhead = WALL_SLACK_MS + PER_BLOCK_MS * stats.blocks + PER_CALL_MS * stats.calls
    unexplained = stats.wall_ms - stats.outside_ms
    if stats.events_ms > stats.wall_ms + WALL_SLACK_MS or stats.events_ms < WALL_MIN_SHARE * unexplained - overhead:
        return (f"timed spans {stats.events_ms:.1f} ms over {stats.calls} calls in {stats.blocks} blocks, parent wall "
                f"{stats.wall_ms:.1f} ms, harness work {stats.outside_ms:.1f} ms (bound: spans >= "
                f"{WALL_MIN_SHARE:g} x (wall - work) - {overhead:.0f} ms and <= wall + {WALL_SLACK_MS:g} ms)")
    return None
