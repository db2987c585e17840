"""Scoring: pure functions from records to tables. No CUDA, no files.

fast_p is KernelBench's metric: the share of ALL submissions in a group that pass and run more than p times as fast
as the reference (p = 0 counts every pass). Only status `pass` counts, so a pure-PyTorch answer that the active
config forbids does not score even though its outputs are right. Groups are (model, run, precision): a run judged in
bf16 never shares a row with one judged in fp32. Records of degenerate problems (finding `degenerate_problem`: a
constant, or an answer that ignores an input, passes) are counted in every rate, and the fast_p and geometric mean
are also given without them (`..._nondegenerate`), since their speedups say little about kernels. Records without
a verdict (judge_error: the judge ran short of disk or memory) are in no rate and no denominator: `n` counts the
judged ones, and the judge_error column how many were not.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable, Optional

import pandas as pd

from harness.integrity.profiles import Profile, status_under
from harness.report.rows import record_row
from harness.shared.findings import DEGENERATE_PROBLEM
from harness.shared.record import NO_VERDICT, Record, Status, record_fields

FAST_P = (0.0, 1.0, 1.5, 2.0)
GROUP_KEYS = ["model", "run", "precision"]


def records_table(records: Iterable[Record]) -> pd.DataFrame:
    return pd.DataFrame([record_row(r) for r in records], columns=record_fields())


def fast_p(records: list[Record], p: float) -> float:
    if not records:
        return math.nan
    return sum(1 for r in records if _passes_at(r, p)) / len(records)


def _passes_at(record: Record, p: float) -> bool:
    if record.status != Status.PASS:
        return False
    return p == 0 or (record.speedup is not None and record.speedup > p)


def geometric_mean_speedup(records: list[Record], field: str = "speedup") -> Optional[float]:
    """Over the passes that have `field` (speedup over eager; speedup_compile over torch.compile)."""
    speedups = [getattr(r, field) for r in records
                if r.status == Status.PASS and getattr(r, field) is not None and getattr(r, field) > 0]
    if not speedups:
        return None
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


def is_degenerate(record: Record) -> bool:
    """The record's problem is degenerate: its output ignores its inputs, or one of them."""
    return DEGENERATE_PROBLEM in (record.flags or ())


def _rate(records: list[Record], flag: str) -> float:
    if not records:
        return math.nan
    return sum(1 for r in records if getattr(r, flag) is True) / len(records)


def judged(records: Iterable[Record]) -> list[Record]:
    """The records that are a verdict on their submission (not judge_error): what every rate counts."""
    return [r for r in records if r.status not in NO_VERDICT]


def group_records(records: Iterable[Record]) -> dict[tuple[str, str, str], list[Record]]:
    """Records by (model, run, precision), sorted by that key; a missing label is "-"."""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for record in records:
        key = (record.model or "-", record.run or "-", record.precision or "-")
        groups.setdefault(key, []).append(record)
    return dict(sorted(groups.items()))


def leaderboard(records: Iterable[Record], profile: Optional[Profile] = None) -> pd.DataFrame:
    """One row per (model, run, precision): n, rates, fast_p, geometric-mean speedup over passes, the number of
    records of degenerate problems with fast_p and the geometric mean without them, and a count per status.

    With a profile, every status is first re-derived under it from the record's measurements and findings
    (a record that becomes a pass only under a looser tolerance was never timed: it counts for fast_0 only)."""
    if profile is not None:
        records = [replace(r, status=status_under(r, profile)) for r in records]
    rows = []
    for (model, run, precision), recorded in group_records(records).items():
        members = judged(recorded)
        row = {"model": model, "run": run, "precision": precision, "n": len(members),
               "compile_rate": _rate(members, "compiled"), "correct_rate": _rate(members, "correct"),
               "grad_correct_rate": _rate(members, "grad_correct"),
               "pass_rate": fast_p(members, 0.0)}
        for p in FAST_P:
            row[f"fast_{p:g}"] = fast_p(members, p)
        row["geomean_speedup"] = geometric_mean_speedup(members)
        row["geomean_speedup_compile"] = geometric_mean_speedup(members, "speedup_compile")
        sound = [r for r in members if not is_degenerate(r)]
        row["n_degenerate"] = len(members) - len(sound)
        for p in FAST_P:   # over the records of the other problems only (NaN when there are none)
            row[f"fast_{p:g}_nondegenerate"] = fast_p(sound, p)
        row["geomean_speedup_nondegenerate"] = geometric_mean_speedup(sound)
        for status in Status:
            row[status.value] = sum(1 for r in recorded if r.status == status)
        rows.append(row)
    columns = [*GROUP_KEYS, "n", "compile_rate", "correct_rate", "grad_correct_rate", "pass_rate",
               *[f"fast_{p:g}" for p in FAST_P], "geomean_speedup", "geomean_speedup_compile", "n_degenerate",
               *[f"fast_{p:g}_nondegenerate" for p in FAST_P], "geomean_speedup_nondegenerate",
               *[s.value for s in Status]]
    return pd.DataFrame(rows, columns=columns)


def status_counts(records: Iterable[Record]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        counts[record.status.value] = counts.get(record.status.value, 0) + 1
    return counts
