#!/usr/bin/env python3
"""Wall time of one `run_eval.py submit` end to end (a fresh process each time, as a user runs it), with the
record's phases: where the seconds go.

  python bench/submit_bench.py [--device cuda|cpu] [--repeats 3] [--configs default,cold,served] [--out DIR]
                               [--problem level2/62 --submission PATH] [--set KEY=VALUE ...]
                               [--host-threads 4,16] [--rounds N]

The first submit builds (into build-cache/, as a user's first call would) and is reported apart; the repeats hit the
cache. `default` is the judge as configured (candidate processes started ahead: `warm_candidates` 1); `cold` sets
`warm_candidates: 0` (each candidate process started on demand); `served` runs the submits against `run_eval.py
serve` (started first, untimed: the server keeps the reference and the worker between submits);
`served-cpu-compare` is `served` with `compare_on_gpu: false` (the outputs compared on the judging process's CPU,
the default until 2026-11-26); `served-w1` is `served` with `warm_candidates: 1` (the server's default until
2026-11-26, now 2: a submit right after another then finds a process up even when imports outlast an evaluation;
the raw files of that day call the two `served` and `served-w2`); `background` runs the submits as plainly as a user
does (no flag: the first of the set starts a background judge, the later ones go to it; the set's first submit is
its start, and the judge is stopped after the set). `--host-threads
4,16` runs a served set per value (`served-t4`, `served-t16`: the server's torch CPU threads instead of the judge's
HOST_THREADS); `--rounds 3` runs all the sets three times in turn, so that a difference between them is not the
machine's drift. Writes DIR/submit.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = {"cuda": ("level2/62", "submissions/examples/level2/62_Matmul_GroupNorm_LeakyReLU_Sum/fused_cuda.py"),
            "cpu": ("level0/4", "submissions/examples/level0/4_Tiny_Matmul_GroupNorm_LeakyReLU_Sum/correct_cpp.py")}
CONFIGS = {"default": {}, "cold": {"warm_candidates": 0}, "served": {},
           "served-cpu-compare": {"compare_on_gpu": "false"}, "served-w1": {"warm_candidates": 1}, "background": {}}
BACKGROUND_PID = re.compile(r"started a background judge \(pid (\d+)\)")


def submit(device: str, problem: str, submission: str, settings: dict, results: Path, config: Path,
           background: bool = False) -> dict:
    """One `submit` as a user runs it. `background`: as plain as that (the first starts a background judge, which
    the later ones find); else with --no-background (a running `serve`, the served configs, judges; none starts)."""
    config.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()) or "{}\n")   # one path: one judge key
    command = [sys.executable, str(REPO / "run_eval.py"), "submit", "--problem", problem, "--submission",
               submission, "--device", device, "--json", "--results-dir", str(results), "--config", str(config)]
    command += ["--idle-timeout", "300"] if background else ["--no-background"]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - began
    started = BACKGROUND_PID.search(done.stderr)
    try:
        record = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"wall_s": wall, "status": f"no record (exit {done.returncode}): {done.stderr[-300:]}",
                "background_pid": int(started.group(1)) if started else None}
    return {"wall_s": round(wall, 3), "status": record["status"],
            "background_pid": int(started.group(1)) if started else None, "speedup": record.get("speedup"),
            "runtime_ms": record.get("runtime_ms"), "ref_runtime_ms": record.get("ref_runtime_ms"),
            "ref_clean_ms": record.get("ref_clean_ms"), "ref_drift": record.get("ref_drift"),
            "timing_blocks": record.get("timing_blocks"), "hold_ms": record.get("hold_ms"),
            "timing_converged": record.get("timing_converged"), "fresh_runtime_ms": record.get("fresh_runtime_ms"),
            "error": record.get("error"), "input_replay": (record.get("flag_evidence") or {}).get("input_replay"),
            "phases": record.get("phases")}


def serving(device: str, results: Path, settings: dict, host_threads: Optional[int] = None) -> subprocess.Popen:
    """`run_eval.py serve` for `results`, up and answering (its start is not timed: the submits after it are).
    `host_threads`: the server's torch CPU threads instead of harness.shared.check.HOST_THREADS (an experiment)."""
    sys.path.insert(0, str(REPO))
    from harness import serve

    config = results.parent / "served.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()) or "{}\n")
    arguments = ["--verbose", "--results-dir", str(results), "serve", "--device", device, "--config", str(config)]
    launcher = [str(REPO / "run_eval.py")] if host_threads is None else [
        "-c", f"import runpy, sys; import harness.shared.check as check; check.HOST_THREADS = {int(host_threads)}; "
              f"sys.argv = ['run_eval.py'] + sys.argv[1:]; runpy.run_path('run_eval.py', run_name='__main__')"]
    process = subprocess.Popen([sys.executable, *launcher, *arguments], cwd=REPO)
    while not serve.socket_path(results).exists():
        if process.poll() is not None:
            raise SystemExit(f"the server ended with {process.returncode}")
        time.sleep(0.2)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="default,cold")
    parser.add_argument("--problem")
    parser.add_argument("--submission")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config setting for every submit and the server (e.g. target_ci=0.005)")
    parser.add_argument("--host-threads", default=None,
                        help="the server's torch CPU threads, e.g. 4,16: a served set per value (default: the "
                             "judge's HOST_THREADS)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the configs (and host-thread values) this many times, alternating, on one machine")
    args = parser.parse_args()
    threads = [int(n) for n in args.host_threads.split(",")] if args.host_threads else [None]
    common = dict(item.split("=", 1) for item in args.set)
    problem, submission = args.problem or DEFAULTS[args.device][0], args.submission or DEFAULTS[args.device][1]
    out = args.out or Path(tempfile.mkdtemp(prefix="submit-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": args.device, "problem": problem, "submission": submission, "settings": common,
              "host_threads": args.host_threads,
              "date": time.strftime("%Y-%m-%d"), "first": None, "runs": {}}
    report["first"] = submit(args.device, problem, submission, common, out / "results", out / "first.yaml")
    print(f"first: {report['first']}", flush=True)
    variants = [(f"{name}-t{n}" if n is not None else name, name, n) for name in args.configs.split(",")
                for n in (threads if name.startswith("served") else [None])]
    for _ in range(args.rounds):
        for label, name, host_threads in variants:
            runs = report["runs"].setdefault(label, [])
            server = serving(args.device, out / label, {**CONFIGS[name], **common},
                             host_threads) if name.startswith("served") else None
            background = name == "background"
            started = []
            try:
                for _ in range(args.repeats):
                    results = out / (label if server or background else "results")
                    runs.append(submit(args.device, problem, submission, {**CONFIGS[name], **common}, results,
                                       out / f"{label}.yaml", background))
                    started += [runs[-1]["background_pid"]] if runs[-1].get("background_pid") else []
                    print(f"{label}: {runs[-1]}", flush=True)
            finally:
                if server is not None:
                    server.send_signal(signal.SIGINT)
                    server.wait(timeout=120)
                for pid in started:   # the background judge this set started (it would stop when idle)
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
    (out / "submit.json").write_text(json.dumps(report, indent=1))
    print(f"first submit (builds): {report['first']['wall_s']:.1f} s, {report['first']['status']}")
    print(f"{'config':18} {'median wall s':>13} {'walls':30} {'speedups (spread)':44} top phases (median s)")
    for name, runs in report["runs"].items():   # each served set's first submit included
        walls = [r["wall_s"] for r in runs]
        phases: dict[str, list[float]] = {}
        for run in runs:
            for key, value in (run.get("phases") or {}).items():
                phases.setdefault(key, []).append(value)
        top = sorted(((statistics.median(v), k) for k, v in phases.items()), reverse=True)[:5]
        speedups = [r["speedup"] for r in runs if r.get("speedup")]
        spread = f"({max(speedups) / min(speedups) - 1:.1%})" if speedups else ""
        print(f"{name:18} {statistics.median(walls):13.2f} {' '.join(f'{w:.2f}' for w in walls):30} "
              f"{' '.join(f'{x:.3f}' for x in speedups) + ' ' + spread:44} "
              + ", ".join(f"{k} {v:.2f}" for v, k in top))
    print(f"raw: {out / 'submit.json'}")


if __name__ == "__main__":
    main()
