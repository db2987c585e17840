#!/usr/bin/env python3
"""How far the judge's timing can be trusted, measured (the figures behind docs/timing.md).

  python bench/timing_bench.py [--device cuda] [--parts 1,2,3,4] [--evals 5] [--out DIR]

1. reference: for each problem, the reference timed the way a record's ref_runtime_ms is (in the oracle process,
   driven over its pipes by the parent's measure()), against an independent figure from torch.profiler in this
   process: per forward, the sum of its kernels' durations and their span (first start to last end), the L2
   flushed before each forward; and the reference again with the L2 flush off.
2. spread: one correct submission evaluated --evals times, each a separate `run_eval.py submit` (new processes,
   new oracle): the spread of its speedup, interleaved (the default).
3. ablation: the same evaluations with the reference timed sequentially instead of interleaved, and with the L2
   flush off.
4. side stream: a submission that returns while its kernel still runs on a private stream, with the default timer
   (device sync before the end event) and with end events on the current stream only (timer_sync: stream), where
   only the wall-clock cross-check can see the missing time.
5. CUDA graphs: the control evaluated with eager timing and with cuda_graph: true (not in the default --parts).
Writes bench.json to --out and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from harness.children.oracle.main import draw_trials, load_reference  # noqa: E402
from harness.children.runtime import configure_precision, to_device  # noqa: E402
from harness.oracle.reference import run_oracle  # noqa: E402
from harness.shared.config import load_config  # noqa: E402
from harness.shared.problems import resolve_problem  # noqa: E402
from harness.shared.settings import TimingSettings  # noqa: E402
from harness.shared.timer import measure  # noqa: E402
from harness.timing.interleave import RemoteSide  # noqa: E402

# Compute-bound (matmul, GEMM epilogue, the seed problem), a transformer block, a small CNN, and a launch-bound ReLU
# whose 16 MB fit in the L2 cache
PROBLEMS = ["level1/1", "level2/1", "level2/62", "level3/2", "level3/4", "level0/5"]
CONTROL = REPO / "tests" / "fixtures" / "gpu_integrity" / "00_control_pass.py"
SIDE_STREAM = REPO / "tests" / "fixtures" / "gpu_integrity" / "05_side_stream.py"


def harness_reference(problem_id: str, config, device: str, logs: Path) -> dict:
    """The reference timed exactly as in a record: in its oracle process, blocks driven from here."""
    ref = run_oracle(resolve_problem(problem_id), config, device, logs)
    try:
        side = RemoteSide("reference", ref.child.send, ref.expect, 300.0)
        side.start(graph=False, warmup_ms=config.warmup_ms, l2_flush=config.l2_flush, sync=config.timer_sync)
        stats = measure([side], TimingSettings.from_config(config).rule).stats[0]
        side.end()
    finally:
        ref.close()
    unexplained = (stats.wall_ms - stats.events_ms - stats.outside_ms) / max(stats.calls, 1)
    return {"median_ms": stats.median_ms, "ci": [stats.ci_low_ms, stats.ci_high_ms], "reps": stats.reps,
            "blocks": stats.blocks, "converged": stats.converged, "host_overhead_ms_per_call": unexplained}


def profiler_reference(problem_id: str, device: str, calls: int = 25) -> dict:
    """Independent: torch.profiler kernel durations of single forwards, the L2 flushed before each."""
    from torch.profiler import ProfilerActivity, profile

    configure_precision(False, device)
    problem = resolve_problem(problem_id)
    module, _, _, model, _ = load_reference(str(problem.path), 42, device)
    input_sets = [to_device(t, device) for t in draw_trials(module, 7, 3)]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    sums, spans = [], []
    with torch.no_grad():
        for _ in range(5):
            model(*input_sets[0])
        for call in range(calls):
            inputs = [v.clone() for v in input_sets[call % len(input_sets)]]
            flush.zero_()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model(*inputs)
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                       and e.device_time > 0]
            if not kernels:
                continue
            sums.append(sum(e.device_time for e in kernels) / 1e3)
            spans.append((max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e3)
    del model, input_sets, flush
    torch.cuda.empty_cache()
    return {"kernel_sum_ms": statistics.median(sums), "kernel_span_ms": statistics.median(spans),
            "kernels_per_forward": len(kernels)}


def evaluate(submission: Path, problem_id: str, config_text: str, work: Path, label: str) -> dict:
    """One `run_eval.py submit --json` in its own processes; the record's timing fields."""
    config = work / f"{label}.yaml"
    config.write_text(config_text)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(work / "results"),
                             "submit", "--problem", problem_id, "--submission", str(submission), "--config",
                             str(config), "--json", "--run", label, "--no-background"], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        return {"error": result.stderr[-600:]}
    record = json.loads(result.stdout)
    keys = ("status", "speedup", "speedup_ci_low", "speedup_ci_high", "runtime_ms", "ref_runtime_ms",
            "runtime_reps", "timing_blocks", "timing_converged", "timing_method", "ref_source", "flags", "error")
    out = {key: record.get(key) for key in keys}
    out["timer_mismatch"] = (record.get("flag_evidence") or {}).get("timer_mismatch")
    out["seconds"] = time.perf_counter() - start
    return out


def spread(values: list[float]) -> dict:
    mean = statistics.fmean(values)
    return {"mean": mean, "min": min(values), "max": max(values),
            "half_range_pct": 100 * (max(values) - min(values)) / 2 / mean,
            "max_dev_pct": 100 * max(abs(v - mean) for v in values) / mean}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--parts", default="1,2,3,4")
    parser.add_argument("--evals", type=int, default=5)
    parser.add_argument("--problems", default=",".join(PROBLEMS))
    parser.add_argument("--control-problem", default="level0/5", help="where the ReLU control is evaluated (2, 3)")
    parser.add_argument("--side-problem", default="level1/16", help="where the side-stream submission runs (4)")
    parser.add_argument("--trials", type=int, default=2, help="input sets per evaluation in 2-4 (fewer: faster)")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench-timing")
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="timing-bench-"))
    config = load_config(None, {"device": args.device})
    results: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                     "torch": torch.__version__, "cuda": torch.version.cuda,
                     "date": time.strftime("%Y-%m-%d"), "rule": TimingSettings.from_config(config).rule.to_dict()}

    if 1 in parts:
        rows = []
        for problem_id in args.problems.split(","):
            row = {"problem": problem_id}
            row["harness"] = harness_reference(problem_id, config, args.device, work / "logs")
            row["no_flush"] = harness_reference(problem_id, replace(config, l2_flush=False), args.device,
                                                work / "logs")
            row["profiler"] = profiler_reference(problem_id, args.device)
            rows.append(row)
            h, p = row["harness"]["median_ms"], row["profiler"]
            print(f"{problem_id:10s} harness {h:.4f} ms  kernels {p['kernel_sum_ms']:.4f} ms "
                  f"({100 * (h / p['kernel_sum_ms'] - 1):+.1f}%)  span {p['kernel_span_ms']:.4f} ms "
                  f"({100 * (h / p['kernel_span_ms'] - 1):+.1f}%)  no flush {row['no_flush']['median_ms']:.4f} ms "
                  f"({100 * (row['no_flush']['median_ms'] / h - 1):+.1f}%)  host/call "
                  f"{row['harness']['host_overhead_ms_per_call']:.3f} ms", flush=True)
        results["reference"] = rows

    submission = work / "control.py"
    shutil.copy(CONTROL, submission)
    base = f"trials: {args.trials}\n"
    variants = {"interleaved": base, "sequential": base + "ref_timing: sequential\n",
                "no_flush": base + "l2_flush: false\n"}
    wanted = [name for name, part in (("interleaved", 2), ("sequential", 3), ("no_flush", 3)) if part in parts]
    if wanted:
        results["evaluations"] = {}
        for name in wanted:
            runs = [evaluate(submission, args.control_problem, variants[name], work, f"{name}-{i}")
                    for i in range(args.evals)]
            speedups = [r["speedup"] for r in runs if r.get("speedup")]
            results["evaluations"][name] = {"runs": runs, "speedup": spread(speedups) if speedups else None,
                                            "ref_ms": spread([r["ref_runtime_ms"] for r in runs
                                                              if r.get("ref_runtime_ms")]) if speedups else None}
            summary = results["evaluations"][name]["speedup"]
            print(f"{name:12s} speedups {[round(s, 4) for s in speedups]} " + (
                f"spread +-{summary['half_range_pct']:.2f}%" if summary else str(runs[:1])), flush=True)

    results["control_problem"], results["side_problem"] = args.control_problem, args.side_problem
    if 4 in parts:
        side = work / "side_stream.py"
        shutil.copy(SIDE_STREAM, side)
        results["side_stream"] = {
            "device_sync": evaluate(side, args.side_problem, base, work, "side-device"),
            "stream_sync": evaluate(side, args.side_problem, base + "timer_sync: stream\n", work, "side-stream"),
            "control_stream_sync": evaluate(submission, args.side_problem, base + "timer_sync: stream\n", work,
                                            "control-stream"),
        }
        for name, record in results["side_stream"].items():
            print(f"{name:20s} {record.get('status')} runtime {record.get('runtime_ms')} ms "
                  f"speedup {record.get('speedup')} flags {record.get('flags')} "
                  f"timer_mismatch: {record.get('timer_mismatch')}", flush=True)

    if 5 in parts:   # CUDA-graph timing end to end: both sides captured, labelled in the record
        results["cuda_graph"] = {name: evaluate(submission, args.control_problem, base + text, work, name)
                                 for name, text in (("events", ""), ("graph", "cuda_graph: true\n"))}
        for name, record in results["cuda_graph"].items():
            print(f"{name:8s} {record.get('status')} {record.get('timing_method')} runtime {record.get('runtime_ms')} "
                  f"ms ref {record.get('ref_runtime_ms')} ms speedup {record.get('speedup')}", flush=True)

    (args.out / "bench.json").write_text(json.dumps(results, indent=1))
    print(f"written: {args.out / 'bench.json'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
