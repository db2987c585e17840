#!/usr/bin/env python3
"""Timing interference: a saboteur against its honest twin, with and without stopping the candidate, and the
reproducibility of repeated submits of one honest submission.

  python bench/interference_bench.py [--device cuda|cpu] [--modes freeze,off] [--submits 5] [--out DIR]

Saboteur and twin are the hostile fixtures 31 (tests/fixtures/gpu_integrity on cuda: the bundled fused level2/62
kernel plus a native thread that keeps the GPU busy while its forward is idle; tests/fixtures/integrity on cpu:
native threads that burn the cores meanwhile, on level0/5). `freeze` is the judge as it is; `off` replaces every
child's freezer with one that does nothing (what the judge did before the candidate was stopped), to show what
the attack does when nothing stops it. Each mode judges both files in one batch, so they share one reference.
Then `--submits` runs `run_eval.py submit` of the twin's honest kernel in a row (a warm build cache, nothing else
running) and reports the spread of the speedups. Writes DIR/interference.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from conftest import copy_fixtures, pipeline_settings  # noqa: E402

from harness.pipeline.batch import run_batch  # noqa: E402
from harness.shared.problems import resolve_problem  # noqa: E402
from harness.submission.submissions import discover  # noqa: E402

FIXTURES = {"cuda": REPO / "tests/fixtures/gpu_integrity", "cpu": REPO / "tests/fixtures/integrity"}
NAMES = {"cuda": ("31_gpu_saboteur.py", "31_gpu_saboteur_twin.py"),
         "cpu": ("31_native_saboteur.py", "31_native_saboteur_twin.py")}
EXAMPLES = REPO / "submissions/examples"
HONEST = {"cuda": ("level2/62", EXAMPLES / "level2/62_Matmul_GroupNorm_LeakyReLU_Sum/fused_cuda.py"),
          "cpu": ("level0/4", EXAMPLES / "level0/4_Tiny_Matmul_GroupNorm_LeakyReLU_Sum/correct_cpp.py")}


class _NoFreeze:
    mechanism = "none (bench: freezing off)"
    escaped: list = []
    stragglers: list = []
    costs_ms: list = []
    freezes = 0

    def freeze(self) -> None:
        pass

    def thaw(self) -> None:
        pass

    def cpu_ms(self) -> None:   # unknown: the drift verdict then holds the candidate to account, as with no cage
        return None


def judge_pair(device: str, mode: str, out: Path) -> list[dict]:
    from harness.isolation import spawn
    original = spawn.Child.freezer
    if mode == "off":
        spawn.Child.freezer = property(lambda self: _NoFreeze())
    try:
        source = out / f"fixtures-{mode}"
        source.mkdir(parents=True)
        for name in NAMES[device]:
            shutil.copy(FIXTURES[device] / name, source)
        rows = []
        for problem, folder in copy_fixtures(source, out / f"judged-{mode}", "level0/5").items():
            submissions, skipped = discover(folder, resolve_problem(problem), REPO / "problems", run="bench")
            assert not skipped, skipped
            outcome = run_batch(submissions, pipeline_settings(device=device, check_grad=False), out / f"runs-{mode}")
            for record in outcome.records:
                rows.append({"mode": mode, "file": Path(record.submission).name, "status": record.status.value,
                             "speedup": record.speedup, "runtime_ms": record.runtime_ms,
                             "ref_runtime_ms": record.ref_runtime_ms, "ref_clean_ms": record.ref_clean_ms,
                             "ref_drift": record.ref_drift, "hold_ms": record.hold_ms, "error": record.error,
                             "isolation": record.isolation, "device_name": record.device_name})
        return rows
    finally:
        spawn.Child.freezer = original


def submits(device: str, count: int, out: Path) -> list[dict]:
    problem, path = HONEST[device]
    rows = []
    for index in range(count):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, str(REPO / "run_eval.py"), "submit", "--problem", problem,
                               "--submission", str(path), "--device", device, "--json",
                               "--results-dir", str(out / "submits"), "--no-background"],
                              capture_output=True, text=True)
        wall = time.perf_counter() - start
        record = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
        rows.append({"submit": index + 1, "status": record.get("status"), "speedup": record.get("speedup"),
                     "runtime_ms": record.get("runtime_ms"), "ref_runtime_ms": record.get("ref_runtime_ms"),
                     "ref_clean_ms": record.get("ref_clean_ms"), "wall_s": wall,
                     "error": record.get("error") or (done.stderr[-300:] if done.returncode else None)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--modes", default="freeze,off")
    parser.add_argument("--submits", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="interference-"))
    out.mkdir(parents=True, exist_ok=True)
    pairs = [row for mode in args.modes.split(",") if mode for row in judge_pair(args.device, mode, out)]
    repeated = submits(args.device, args.submits, out) if args.submits else []
    (out / "interference.json").write_text(json.dumps({"device": args.device, "pairs": pairs, "submits": repeated,
                                                       "date": time.strftime("%Y-%m-%d")}, indent=1))
    print(f"{'mode':7s} {'file':28s} {'status':20s} {'speedup':>8s} {'ref ms':>8s} {'clean ms':>8s} {'drift':>6s} "
          f"{'hold ms':>7s}")
    for row in pairs:
        print(f"{row['mode']:7s} {row['file']:28s} {row['status']:20s} {_f(row['speedup']):>8s} "
              f"{_f(row['ref_runtime_ms']):>8s} {_f(row['ref_clean_ms']):>8s} {_f(row['ref_drift']):>6s} "
              f"{_f(row['hold_ms']):>7s}")
    if repeated:
        speedups = [row["speedup"] for row in repeated if row["speedup"]]
        print("submits:", ", ".join(f"{_f(row['speedup'])} ({row['status']}, {row['wall_s']:.1f} s)"
                                    for row in repeated))
        if speedups:
            print(f"spread max/min {max(speedups) / min(speedups):.3f}")
    print(f"raw: {out / 'interference.json'}")


def _f(value) -> str:
    return "-" if value is None else f"{value:.4g}"


if __name__ == "__main__":
    main()
