#!/usr/bin/env python3
"""How often an honest submission's reference reads slow beside it, and by how much: the reference times the drift
check compares (clean, interleaved, alone again) for N evaluations of each submission, with the judge kept up
between them (`--fresh`: a new judge, so a new reference and clean time, for every evaluation, as a batch has).
Also how its calls on never-seen input sets read against its median (`fresh x`: fresh_runtime_ms / runtime_ms) and
how often they were taken for a replay (`replay`: input_replay flagged): an honest submission should never be.

  python bench/drift_probe.py --problem level0/5 --repeats 8 [--fresh] [--device cuda] [--set KEY=VALUE ...] \
      SUBMISSION [SUBMISSION ...]

Prints one line per evaluation and a table per submission; writes the records' figures to --out (JSON).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submissions", nargs="+")
    parser.add_argument("--problem", default="level0/5")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--fresh", action="store_true", help="a new judge (reference, clean time) per evaluation")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config key")
    parser.add_argument("--out", default=None, help="JSON file for the figures")
    args = parser.parse_args()

    import yaml

    from harness import Judge

    settings = {key: _value(value) for key, value in (item.split("=", 1) for item in args.set)}
    config = Path(tempfile.mkstemp(suffix=".yaml")[1])
    config.write_text(yaml.safe_dump(settings) if settings else "{}\n")
    rows = []
    judge = None
    try:
        for submission in args.submissions:
            for repeat in range(args.repeats):
                if judge is None or args.fresh:
                    if judge is not None:
                        judge.close()
                    judge = Judge(device=args.device, config=str(config), results_dir=None)
                began = time.perf_counter()
                record = judge.evaluate(args.problem, submission)
                row = {"submission": Path(submission).name, "repeat": repeat, "status": record.status.value,
                       "wall_s": round(time.perf_counter() - began, 2), "speedup": record.speedup,
                       "runtime_ms": record.runtime_ms, "ref_runtime_ms": record.ref_runtime_ms,
                       "ref_clean_ms": record.ref_clean_ms, "ref_drift": record.ref_drift,
                       "ref_source": record.ref_source, "error": record.error,
                       "drift_evidence": (record.flag_evidence or {}).get("reference_drift"),
                       "flags": record.flags, "fresh_runtime_ms": record.fresh_runtime_ms,
                       "fresh_ratio": (record.fresh_runtime_ms / record.runtime_ms
                                       if record.fresh_runtime_ms is not None and record.runtime_ms else None),
                       "replay_evidence": (record.flag_evidence or {}).get("input_replay"),
                       "phases": record.phases}
                rows.append(row)
                print(f"{row['submission']} #{repeat}: {row['status']} speedup {_fmt(row['speedup'])} "
                      f"cand {_fmt(row['runtime_ms'])} ref {_fmt(row['ref_runtime_ms'])} clean "
                      f"{_fmt(row['ref_clean_ms'])} drift {_fmt(row['ref_drift'])} fresh x {_fmt(row['fresh_ratio'])} "
                      f"wall {row['wall_s']} s"
                      + "".join(f"\n    {text}" for text in (row["error"], row["drift_evidence"],
                                                               row["replay_evidence"]) if text), flush=True)
    finally:
        if judge is not None:
            judge.close()
        config.unlink(missing_ok=True)
    print(f"\n{'submission':28} {'n':>3} {'pass':>5} {'interf':>6} {'drift med':>9} {'drift max':>9} "
          f"{'speedup spread':>14} {'replay':>6} {'fresh x med':>11} {'fresh x max':>11}")
    for name in dict.fromkeys(row["submission"] for row in rows):
        mine = [row for row in rows if row["submission"] == name]
        drifts = [row["ref_drift"] for row in mine if row["ref_drift"] is not None]
        speedups = [row["speedup"] for row in mine if row["speedup"]]
        spread = max(speedups) / min(speedups) - 1 if speedups else None
        fresh = [row["fresh_ratio"] for row in mine if row["fresh_ratio"] is not None]
        print(f"{name:28} {len(mine):3d} {sum(r['status'] == 'pass' for r in mine):5d} "
              f"{sum(r['status'] == 'timing_interference' for r in mine):6d} "
              f"{_fmt(statistics.median(drifts) if drifts else None):>9} {_fmt(max(drifts) if drifts else None):>9} "
              f"{'-' if spread is None else f'{spread:.1%}':>14} "
              f"{sum('input_replay' in (r['flags'] or ()) for r in mine):6d} "
              f"{_fmt(statistics.median(fresh) if fresh else None):>11} {_fmt(max(fresh) if fresh else None):>11}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    sys.exit(main())
