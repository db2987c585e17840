#!/usr/bin/env python3
r"""The judge's timings beside a plain probe on the same kernels: the passing records of a finished batch, one GPU.

  python bench/probe_records.py --results-dir D [--run NAME] [--problems-dir P] [--limit N] [--timeout S]
                                [--seed 42] [--ext-dir E] [--build-jobs N] [--out F.json] [--dry-run]

Reads D/NAME/records.jsonl (or D/records.jsonl without --run), the records `run_eval.py batch` wrote, and takes
those of status pass (the last record of each submission and problem; --limit N: the first N). Each kernel gets a
fresh subprocess, so that a crash or a hang ends that kernel only (--timeout seconds each, its build included).
There: the problem file's Model, get_init_inputs and get_inputs, and the record's extracted source (source_path) for
ModelNew; both built with the same get_init_inputs values, each constructor after torch.manual_seed(--seed: the
judge's default seed) as KernelBench does, cast to the record's precision, then Model's state_dict entries copied
into ModelNew where name and shape match, as the judge does; both moved to cuda and run WARMUP times untimed (the
first outputs compared: max_abs_diff). Then the probe, per side: CALLS calls, each: a clone of the inputs,
synchronize, the L2 flushed (a buffer of twice its size zeroed), a spin of ~2 ms queued (torch.cuda._sleep) so that
the host is ahead, start event, forward under no_grad on the clone, end event on the current stream, synchronize;
the median. TF32 as the record's allow_tf32 says (off where it says nothing). Inputs: get_inputs under seed + 1000
(the judge draws its trial inputs from a secret seed by default: the same shapes and distributions, not the same
values).

Prints per kernel the probe's and the judge's ms for the candidate and the reference, the difference (us) and ratio
(judge / probe), and the probe's speedup (ref / cand) beside the record's. The summary pools the timings of both
sides: from 0.1 ms (by the probe) the median ratio (target: within 2% of 1) and the worst (each within 5%), below
0.1 ms the worst difference (each within 5 us). A record timed as CUDA-graph replays (timing_method) is listed but
left out of the summary: the probe times eager calls. --out writes every figure, the device, torch and the date.

Trusted measuring machine only: this executes the submissions' code in plain subprocesses, without the judge's
sandbox. Their extensions build under TORCH_EXTENSIONS_DIR set to a folder of this script's own (--ext-dir, default
<run folder>/probe-ext, a subfolder per kernel), never the judge's build cache.

After `python bench/kb_compare.py ... --results-dir D --run NAME` (D holds NAME/records.jsonl and kb_compare.json,
whose problems_dir is taken when --problems-dir is not given), on the same machine:

  python3 bench/probe_records.py --results-dir D --run NAME --out D/NAME-probe.json

--dry-run does everything but the CUDA work: the records, their problems and sources, and in each kernel's
subprocess both modules loaded, both models built with the weights copied and run once on the CPU, no timing (a
submission with CUDA sources fails to build without a GPU: listed as an error, and the others go on).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.shared.problems import ProblemNotFound, resolve_problem  # noqa: E402
from harness.shared.record import RECORDS_FILE  # noqa: E402

CALLS = 20              # timed calls per side
WARMUP = 3              # untimed calls per side first (lazy initialisation, Triton's autotuning)
SPIN_MS = 2.0           # the host's head start, as GPU spin cycles (calibrated per process)
INPUT_SEED_OFFSET = 1000
FLOOR_MS = 0.1          # the targets: from 0.1 ms, median ratio within 2% and each within 5%; below, each within 5 us
MEDIAN_TOL, EACH_TOL, SHORT_TOL_US = 0.02, 0.05, 5.0
SIDES = (("cand", "runtime_ms"), ("ref", "ref_runtime_ms"))   # (our label, the record's field)


# ---------------------------------------------------------------- parent: records -> kernels

def passing_records(run_dir: Path, limit: Optional[int]) -> list[dict]:
    latest = {}
    for line in (run_dir / RECORDS_FILE).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            latest[(record["submission"], record["problem"])] = record   # a resumed batch appends: the last counts
    passed = [r for r in latest.values() if r["status"] == "pass"]
    return passed[:limit] if limit else passed


def job_of(record: dict, problems_dir: Optional[Path], seed: int) -> dict:
    """What the kernel's subprocess needs; raises ProblemNotFound or FileNotFoundError."""
    problem = resolve_problem(record["problem"], problems_dir)
    source = Path(record.get("source_path") or "")
    if not source.is_file():
        raise FileNotFoundError(f"source_path {record.get('source_path')!r} is not a file")
    return {"problem_path": str(problem.path), "source_path": str(source.resolve()), "seed": seed,
            "precision": record.get("precision") or "fp32", "allow_tf32": bool(record.get("allow_tf32"))}


def run_kernel(job: dict, ext_dir: Path, log: Path, timeout: float, dry_run: bool, build_only: bool = False) -> dict:
    """The kernel's subprocess, in a session of its own (a timeout kills it and the compilers it started).
    `build_only`: it loads the submission (building its extensions into `ext_dir`) and stops there."""
    ext_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="probe-records-") as tmp:
        job_file, result_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job))
        command = [sys.executable, str(Path(__file__).resolve()), "--child", str(job_file), str(result_file)]
        command += ["--dry-run"] if dry_run else []
        command += ["--build-only"] if build_only else []
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext_dir))
        with open(log, "w") as sink:
            child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            try:
                rc = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return {"outcome": "timeout", "error": f"no result within {timeout:.0f} s"}
        if result_file.is_file():
            return json.loads(result_file.read_text())
    how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
    return {"outcome": "crash", "error": f"died without a result ({how}); log {log}"}


# ---------------------------------------------------------------- child: one kernel, probed

def child_main(job_file: str, result_file: str, dry_run: bool, build_only: bool = False) -> None:
    job = json.loads(Path(job_file).read_text())
    try:
        if build_only:
            load_module(job["source_path"], "probe_candidate")   # builds its extensions
            result = {"outcome": "built"}
        else:
            result = {"outcome": "ok", **probe_kernel(job, dry_run)}
    except Exception as exc:   # the process boundary: whatever the kernel raised is this kernel's error
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        result = {"outcome": "error", "error": f"{type(exc).__name__}: {first}"}
    Path(result_file).write_text(json.dumps(result))


def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def probe_kernel(job: dict, dry_run: bool) -> dict:
    import torch

    from harness.shared.precision import cast_dtype, cast_floating

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = job["allow_tf32"]
    device = "cpu" if dry_run else "cuda"
    problem = load_module(job["problem_path"], "probe_problem")
    candidate = load_module(job["source_path"], "probe_candidate")   # builds its extensions
    seed, dtype = job["seed"], cast_dtype(job["precision"])
    torch.manual_seed(seed)
    init_inputs = list(problem.get_init_inputs())
    ref = built(problem.Model, init_inputs, seed, dtype)
    new = built(candidate.ModelNew, init_inputs, seed, dtype)
    loaded = copy_weights(ref, new)
    torch.manual_seed(seed + INPUT_SEED_OFFSET)
    inputs = [v.to(device) if isinstance(v, torch.Tensor) else v
              for v in cast_floating(list(problem.get_inputs()), dtype)]
    ref, new = ref.to(device), new.to(device)
    facts = {"weights_loaded": loaded, "device": torch.cuda.get_device_name() if not dry_run else "cpu (dry run)",
             "torch": torch.__version__}
    with torch.no_grad():
        facts["max_abs_diff"] = max_abs_diff(ref(*cloned(inputs)), new(*cloned(inputs)))
        if dry_run:
            return facts
        for _ in range(WARMUP - 1):
            ref(*cloned(inputs)), new(*cloned(inputs))
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        flush = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device="cuda")
        spin = spin_cycles(SPIN_MS)
        return {**facts, "ref_ms": probe_ms(ref, inputs, flush, spin), "cand_ms": probe_ms(new, inputs, flush, spin)}


def built(cls, init_inputs: list, seed: int, dtype):
    import torch

    torch.manual_seed(seed)
    model = cls(*init_inputs)
    return model.to(dtype) if dtype is not None else model


def copy_weights(ref, new) -> int:
    """Model's state_dict entries into ModelNew's of the same name and shape; how many."""
    import torch

    own, theirs = new.state_dict(), ref.state_dict()
    names = [n for n in theirs if n in own and own[n].shape == theirs[n].shape]
    with torch.no_grad():
        for name in names:
            own[name].copy_(theirs[name])
    return len(names)


def cloned(inputs: list) -> list:
    return [v.clone() if hasattr(v, "clone") else v for v in inputs]


def max_abs_diff(a, b) -> Optional[float]:
    import torch

    a, b = (list(x) if isinstance(x, (list, tuple)) else [x] for x in (a, b))
    diffs = [(x.float() - y.float()).abs().max().item() for x, y in zip(a, b)
             if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.numel()]
    return max(diffs) if diffs else None


def spin_cycles(ms: float) -> int:
    """GPU clock cycles that torch.cuda._sleep spins for `ms` (the fastest of three timed 1M-cycle spins)."""
    import torch

    spans = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        torch.cuda.synchronize()
        spans.append(start.elapsed_time(end))
    return int(ms * 1_000_000 / min(spans))


def probe_ms(model, inputs: list, flush, spin: int, calls: int = CALLS) -> float:
    import torch

    spans = []
    for _ in range(calls):
        fresh = cloned(inputs)
        torch.cuda.synchronize()
        flush.zero_()
        torch.cuda._sleep(spin)   # the host ahead of the GPU while it enqueues the call
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(*fresh)
        end.record()
        torch.cuda.synchronize()
        spans.append(start.elapsed_time(end))
    return statistics.median(spans)


# ---------------------------------------------------------------- comparison (pure) and report

def row_of(record: dict, result: dict) -> dict:
    row = {"problem": record["problem"], "submission": record["submission"], "source_path": record.get("source_path"),
           "timing_method": record.get("timing_method"), "precision": record.get("precision"),
           "allow_tf32": record.get("allow_tf32"), "judge_speedup": record.get("speedup"), **result}
    for side, field in SIDES:
        probe, judge = result.get(f"{side}_ms"), record.get(field)
        row[f"{side}_probe_ms"], row[f"{side}_judge_ms"] = probe, judge
        if probe and judge is not None:
            row[f"{side}_diff_us"], row[f"{side}_ratio"] = (judge - probe) * 1e3, judge / probe
    if result.get("cand_ms") and result.get("ref_ms") is not None:
        row["probe_speedup"] = result["ref_ms"] / result["cand_ms"]
    return row


def graph_timed(row: dict) -> bool:
    return "graph" in (row.get("timing_method") or "")


def summary_of(rows: list[dict]) -> dict:
    """Every compared timing (both sides, CUDA-graph records left out) against the targets."""
    timings = [(row[f"{side}_probe_ms"], row[f"{side}_judge_ms"],
                f"{row['problem']} {Path(row['submission']).name} {side}")
               for row in rows if not graph_timed(row) for side, _ in SIDES if f"{side}_ratio" in row]
    long = [(judge / probe, label) for probe, judge, label in timings if probe >= FLOOR_MS]
    short = [(abs(judge - probe) * 1e3, label) for probe, judge, label in timings if probe < FLOOR_MS]
    median = statistics.median(r for r, _ in long) if long else None
    worst = max(long, key=lambda x: abs(x[0] - 1)) if long else None
    worst_short = max(short) if short else None
    holds = {"median_within_2pct": None if median is None else abs(median - 1) <= MEDIAN_TOL,   # None: no timing
             "each_within_5pct": None if worst is None else abs(worst[0] - 1) <= EACH_TOL,
             "short_each_within_5us": None if worst_short is None else worst_short[0] <= SHORT_TOL_US}
    return {"compared": len(timings), "long": len(long), "short": len(short), "median_ratio": median,
            "worst_ratio": worst and worst[0], "worst_ratio_of": worst and worst[1],
            "worst_short_diff_us": worst_short and worst_short[0], "worst_short_of": worst_short and worst_short[1],
            "holds": holds, "all_hold": bool(timings) and False not in holds.values()}


def _f(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(rows: list[dict], summary: dict, dry_run: bool) -> None:
    if dry_run:
        print(f"\n{'problem':<12} {'outcome':<8} {'weights':>7} {'max diff':>9}  source -> problem file (or error)")
        for r in rows:
            print(f"{r['problem']:<12} {r['outcome']:<8} {_f(r.get('weights_loaded'), 'd'):>7} "
                  f"{_f(r.get('max_abs_diff'), '.2e'):>9}  {r.get('source_path')} -> "
                  + (r["problem_path"] if r["outcome"] == "ok" else f"({r.get('error')})"))
        print("\ndry run: no CUDA work, no timing")
        return
    side = f"{'probe ms':>9} {'judge ms':>9} {'diff us':>8} {'ratio':>6}"
    print(f"\n{'':<41} {'candidate':^35} {'reference':^35} {'speedup':^13}")
    print(f"{'problem':<12} {'submission':<28} {side} {side} {'probe':>6} {'judge':>6}")
    for r in rows:
        line = f"{r['problem']:<12} {Path(r['submission']).name[:28]:<28}"
        if r["outcome"] != "ok":
            print(f"{line} {r['outcome']}: {r.get('error')}")
            continue
        for s, _ in SIDES:
            line += (f" {_f(r[f'{s}_probe_ms'], '.4f'):>9} {_f(r[f'{s}_judge_ms'], '.4f'):>9}"
                     f" {_f(r.get(f'{s}_diff_us'), '.1f'):>8} {_f(r.get(f'{s}_ratio'), '.3f'):>6}")
        line += f" {_f(r.get('probe_speedup'), '.3f'):>6} {_f(r.get('judge_speedup'), '.3f'):>6}"
        print(line + ("  (judge: CUDA-graph replays; not in the summary)" if graph_timed(r) else ""))
    s = summary
    print(f"\n{s['compared']} timings compared ({s['long']} from {FLOOR_MS} ms, {s['short']} below)")
    print(f"from {FLOOR_MS} ms: median ratio {_f(s['median_ratio'], '.4f')} (target within {MEDIAN_TOL:.0%}), worst "
          f"{_f(s['worst_ratio'], '.4f')} {s['worst_ratio_of'] or ''} (target each within {EACH_TOL:.0%})")
    print(f"below {FLOOR_MS} ms: worst difference {_f(s['worst_short_diff_us'], '.1f')} us {s['worst_short_of'] or ''}"
          f" (target each within {SHORT_TOL_US:.0f} us)")
    print("targets: " + ", ".join(f"{k} {'-' if v is None else 'yes' if v else 'NO'}" for k, v in s["holds"].items()))


def prebuild(records: list[dict], problems_dir: Optional[Path], seed: int, ext_root: Path, timeout: float,
             jobs: int) -> None:
    """Every kernel's extensions built ahead, `jobs` subprocesses at once, into the folders the timed pass uses (a
    failed build is left for the timed pass to meet and report)."""
    from concurrent.futures import ThreadPoolExecutor

    def build(item: tuple[int, dict]) -> str:
        index, record = item
        try:
            job = job_of(record, problems_dir, seed)
        except (ProblemNotFound, FileNotFoundError):
            return "missing"
        return run_kernel(job, ext_root / f"{index:03d}", ext_root / f"{index:03d}-build.log", timeout, False,
                          build_only=True)["outcome"]

    began = time.monotonic()
    with ThreadPoolExecutor(jobs) as pool:
        outcomes = list(pool.map(build, enumerate(records)))
    print(f"built ahead, {jobs} at once: {outcomes.count('built')} of {len(records)} in "
          f"{time.monotonic() - began:.0f} s", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", type=Path, required=True, help="the batch's --results-dir")
    p.add_argument("--run", help="the batch's --run (without it: --results-dir holds records.jsonl itself)")
    p.add_argument("--problems-dir", type=Path, help="the batch's --problems-dir (default: kb_compare.json's in "
                   "--results-dir, else the judge's default problems/)")
    p.add_argument("--limit", type=int, help="the first N passing records only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per kernel, its build included")
    p.add_argument("--seed", type=int, default=42, help="the weights' seed (the judge's config `seed`)")
    p.add_argument("--ext-dir", type=Path, help="TORCH_EXTENSIONS_DIR root (default: <run folder>/probe-ext)")
    p.add_argument("--out", type=Path, help="JSON file with every figure")
    p.add_argument("--build-jobs", type=int, default=1, help="build the kernels' extensions first, this many at once "
                   "(each in its own subprocess), then time them one at a time from the built extensions")
    p.add_argument("--dry-run", action="store_true", help="everything but the CUDA work")
    args = p.parse_args()
    run_dir = (args.results_dir / args.run if args.run else args.results_dir).resolve()
    if not (run_dir / RECORDS_FILE).is_file():
        p.error(f"no {RECORDS_FILE} in {run_dir}")
    problems_dir = args.problems_dir
    kb_report = args.results_dir / "kb_compare.json"
    if problems_dir is None and kb_report.is_file():
        problems_dir = Path(json.loads(kb_report.read_text())["problems_dir"])
    ext_root = (args.ext_dir or run_dir / "probe-ext").resolve()
    records = passing_records(run_dir, args.limit)
    print(f"{len(records)} passing records in {run_dir / RECORDS_FILE}; problems from "
          f"{problems_dir or 'the default problems/'}" + (" (dry run)" if args.dry_run else ""), flush=True)
    if args.build_jobs > 1 and not args.dry_run:
        prebuild(records, problems_dir, args.seed, ext_root, args.timeout, args.build_jobs)
    rows = []
    for index, record in enumerate(records):
        began = time.monotonic()
        try:
            job = job_of(record, problems_dir, args.seed)
        except (ProblemNotFound, FileNotFoundError) as exc:
            rows.append(row_of(record, {"outcome": "missing", "error": str(exc)}))
            continue
        log = ext_root / f"{index:03d}.log"
        result = run_kernel(job, ext_root / f"{index:03d}", log, args.timeout, args.dry_run)
        rows.append(row_of(record, {**result, "problem_path": job["problem_path"], "log": str(log),
                                    "wall_s": round(time.monotonic() - began, 1)}))
        print(f"  {record['problem']} {Path(record['submission']).name}: {result['outcome']} "
              f"({rows[-1]['wall_s']} s)", flush=True)
    summary = summary_of(rows)
    print_report(rows, summary, args.dry_run)
    if args.out:
        done = next((r for r in rows if r["outcome"] == "ok"), {})
        args.out.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "device": done.get("device"), "torch": done.get("torch"),
            "dry_run": args.dry_run, "run_dir": str(run_dir), "problems_dir": str(problems_dir or ""),
            "seed": args.seed, "calls": CALLS, "spin_ms": SPIN_MS, "rows": rows, "summary": summary}, indent=1) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3], "--dry-run" in sys.argv[4:], "--build-only" in sys.argv[4:])
    else:
        sys.exit(main())
