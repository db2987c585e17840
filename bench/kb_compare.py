#!/usr/bin/env python3
r"""Our batch against KernelBench's own eval flow: the same kernels, the same machine, one after the other.

  python bench/kb_compare.py SOURCE | --from-repo  [--kernelbench KB] [--results-dir DIR] [--run NAME]
                             [--gpus N] [--kb-cpu-workers N] [--kb-site DIR] [--config C] [--side-by-side]
                             [--dry-run]

SOURCE is a folder of submissions in KernelBench run naming (level_{L}_problem_{P}_sample_{S}_kernel.py) or in our
layout (levelN/NN_Name/<file>); --from-repo assembles the ready-made folder instead: the five seeds (level 2
problem 62; $JUDGE_SEEDS_DIR, else ../shared/seeds, else .seeds/; two of them hold code), our level-2 examples
fused_cuda.py, fused_triton.py, wrong_gn_eps.py (62), collapsed_gemv_cuda.py (51) and zero_fill_cuda.py (80), which
are KernelBench's problems of the same numbers, and the ten fused-epilogue kernels under bench/kb_kernels/ (level 2
problems 9, 12, 29, 40, 59, 63, 70, 76, 81, 86: KernelBench's, so they map only with --kernelbench): 17 kernels.

Every submission is mapped to its problem as `run_eval.py batch` maps it (harness/submission/submissions.py), raw
model output (.md, .txt) goes through our extraction once, here and untimed, and each resulting source is written
as DIR/kernels/NAME/level_{L}_problem_{P}_sample_{S}_kernel.py. Both flows read those files and nothing else; an
answer with no code is listed as skipped by both (KernelBench's generation never writes a kernel file for one).
With --kernelbench, the problems are KernelBench's own files (our batch gets --problems-dir KB/KernelBench).

1. Ours: `run_eval.py --results-dir DIR batch DIR/kernels/NAME --run NAME --device cuda --problems-dir ...
   --config DIR/NAME-ours.yaml`, a subprocess timed from start to exit. That config is the chosen one (default
   configs/default.yaml) with a fresh build_cache_dir (DIR/NAME-ours-build-cache): no earlier build is reused.
2. Theirs (--kernelbench): this file again, as a driver subprocess per level, timed the same way. The driver runs
   the local-mode body of KernelBench's scripts/eval_from_generations.py main() with upstream's EvalConfig and its
   defaults (5 correctness trials, 100 timed trials, cuda events, 180 s timeout, fp32), gpu_arch Hopper, --gpus
   GPUs, --kb-cpu-workers compile processes, the build dir DIR/NAME-kb-build (fresh) and the build cache on:
   batch_compile on the CPUs, then batch_eval (--kb-no-build-cache: upstream's default, each kernel compiles inside
   its GPU eval worker). Beyond those settings it changes only this: `modal`, `pydra`, `dotenv`, `openai` and
   `litellm` are stand-ins in sys.modules (imported at top level, never used on the local path); the work list is
   the (problem, sample) files present rather than samples 0..n-1 of every problem; when upstream's batch_eval
   raises because eval_kernel_against_ref returned None (a compile error text holding "lock" or "No such file or
   directory"), that sample is recorded as crashed and batch_eval goes on with the rest.
   ../shared/kb-compare/README.md lists where upstream's flow differs from a straight reading (TF32, timeouts,
   compiled=false on a CUDA error in forward, ...).

--side-by-side runs the two at once instead of one after the other, each on GPUs and cores of its own (ours: the
first --gpus visible GPUs, default 1, and the first half of the usable cores; theirs: the next GPUs and the other
half), so that a machine of two GPUs measures both in the longer one's wall; each flow's wall is still its own.
Each flow's bytes written to storage are counted (its wrapper's /proc/self/io after the flow exits), and the least
free space of the results folder's and /tmp's file systems is sampled while it runs.

--theirs-limit SECONDS stops KernelBench's flow there if it is still running (a device run too short for it): its
wall is then a lower bound, and the ratio is reported as "below" ours / that time, never as a figure.

It prints both walls, the ratio ours / theirs (target: <= 0.5, --target) and, per kernel, our status and
compiled/correct beside KernelBench's compiled/correctness, and writes DIR/kb_compare.json (raw figures, date,
`nvidia-smi -L`). --dry-run does everything but the GPU work: the folder, our batch's own discovery of it (problem
of each file), the commands, and the driver's --dry-run (upstream's imports, dataset, work list and build paths, one
spawned worker that loads each reference and kernel source); no build, no evaluation.

On the GPU machine (no network). Here, once: `bash ../shared/kb-compare/export.sh GIT_DIR .kb` (GIT_DIR: the
`fetch github:ScalingIntelligence/KernelBench` snapshot) and `python3 -m pip download --no-deps --only-binary=:all:
--python-version 3.12 --platform manylinux2014_x86_64 -d .whl pydantic==2.11.10 pydantic-core==2.33.2
annotated-types==0.7.0 typing-inspection==0.4.2` (kernelbench/eval.py imports pydantic, which the GPU image lacks;
it has tqdm, requests and numpy). Carry the ignored paths `.kb`, `.whl` and, for --from-repo, `.seeds` (a copy of
../shared/seeds), then from the repository root:

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kbsite .whl/*.whl &&
  PYTHONUNBUFFERED=1 python3 bench/kb_compare.py --from-repo --kernelbench .kb --kb-site /tmp/kbsite \
      --results-dir /tmp/kbcmp --run h100-seeds-examples; cp /tmp/kbcmp/kb_compare.json /tmp/kbcmp/*.log $OUT/

python3 there is the interpreter with CUDA torch and our dependencies; both flows run under it (--python to change
it). --kb-site goes on PYTHONPATH for KernelBench's flow only. A dry run here, where torch is CPU-only and tqdm is
missing: `pip install --no-deps --target /tmp/kbsite tqdm` (pydantic comes from .venv), then the same command with
.venv/bin/python and --dry-run. Every run needs a fresh --run (default kbcmp-<time>): a reused one would make our
batch reuse its records and upstream resume from its eval_results.json.
"""
from __future__ import annotations

import os
import sys
import types

# Set for the driver subprocess (and inherited by the processes upstream spawns, which import this file again as
# __mp_main__): the KernelBench folder whose src/ and scripts/ hold upstream's code.
DRIVER_ENV = "KB_COMPARE_DRIVER_KB"
STAND_INS = ("modal", "pydra", "dotenv", "openai", "litellm")


class _StandIn(types.ModuleType):
    """A module upstream imports but never uses on the local path: any attribute or call gives itself back, and
    applied as a decorator (one callable argument) it returns what it decorates unchanged."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _StandIn):
            return args[0]
        return self


class _PydraConfig:
    """pydra.Config as upstream's EvalConfig uses it: attributes, and to_dict() for batch_compile."""

    def to_dict(self):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


if os.environ.get(DRIVER_ENV):
    for _name in STAND_INS:
        sys.modules.setdefault(_name, _StandIn(_name))
    sys.modules["pydra"].Config, sys.modules["pydra"].REQUIRED = _PydraConfig, "<REQUIRED>"
    for _path in ("scripts", "src"):
        _path = os.path.join(os.environ[DRIVER_ENV], _path)
        if _path not in sys.path:
            sys.path.insert(0, _path)

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Optional  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KB_NAME = re.compile(r"^level_(?P<level>\d+)_problem_(?P<problem>\d+)_sample_(?P<sample>\d+)_kernel\.py$")
EXAMPLES = ("submissions/examples/level2/62_Matmul_GroupNorm_LeakyReLU_Sum/fused_cuda.py",
            "submissions/examples/level2/62_Matmul_GroupNorm_LeakyReLU_Sum/fused_triton.py",
            "submissions/examples/level2/62_Matmul_GroupNorm_LeakyReLU_Sum/wrong_gn_eps.py",
            "submissions/examples/level2/51_Gemm_Subtract_GlobalAvgPool_LogSumExp_GELU_ResidualAdd/collapsed_gemv_cuda.py",
            "submissions/examples/level2/80_Gemm_Max_Subtract_GELU/zero_fill_cuda.py")
BENCH_KERNELS = REPO / "bench" / "kb_kernels"   # more kernels in our layout, for KernelBench's problems
SEED_FOLDER = "level2/62_Matmul_GroupNorm_LeakyReLU_Sum"   # the seeds' problem (their README)
TARGET_RATIO = 0.5


@dataclass(frozen=True)
class Kernel:
    origin: str               # the submission as given (path)
    problem: str              # "level2/62"
    level: int
    number: int
    sample: Optional[int]     # None: skipped
    file: Optional[str]       # level_{L}_problem_{P}_sample_{S}_kernel.py; None: nothing to feed (see skipped)
    skipped: Optional[str]    # why no kernel file was written (no code in the answer), else None


# ---------------------------------------------------------------- the kernels both flows read

def seeds_dir(given: Optional[Path]) -> Path:
    if given:
        candidates = [given]
    else:
        candidates = [Path(p) for p in (os.environ.get("JUDGE_SEEDS_DIR"),) if p]
        candidates += [REPO.parent / "shared" / "seeds", REPO / ".seeds"]
    for folder in candidates:
        if folder.is_dir():
            return folder
    sys.exit(f"seeds not found (tried {', '.join(map(str, candidates))}): pass --seeds DIR")


def assemble_from_repo(stage: Path, seeds: Path) -> dict[str, str]:
    """The ready-made input in our layout: the seeds under level 2 problem 62, five level-2 examples and the kernels
    under bench/kb_kernels/. Returns each staged file's original path, for the report."""
    origins = {}
    (stage / SEED_FOLDER).mkdir(parents=True)
    for seed in sorted(seeds.glob("[0-9][0-9][0-9]_*.txt")):
        origins[str(stage / SEED_FOLDER / seed.name)] = str(seed)
        shutil.copy2(seed, stage / SEED_FOLDER)
    for example in EXAMPLES:
        target = stage / Path(example).relative_to("submissions/examples")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / example, target)
        origins[str(target)] = example
    for kernel in sorted(BENCH_KERNELS.rglob("*.py")):
        target = stage / kernel.relative_to(BENCH_KERNELS)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kernel, target)
        origins[str(target)] = str(kernel.relative_to(REPO))
    return origins


def write_kernels(source: Path, problems_dir: Path, out: Path,
                  origins: Optional[dict[str, str]] = None) -> tuple[list[Kernel], list[dict]]:
    """Map each submission to its problem as our batch does, extract raw output once, write KernelBench names."""
    from harness.submission.extract import extract
    from harness.submission.submissions import discover

    found, skipped = discover(source, None, problems_dir)
    not_mapped = [{"submission": s.label, "reason": s.reason} for s in skipped]
    taken: dict[tuple[int, int], set[int]] = {}
    for sub in found:   # samples named by KernelBench keep their number; the others get the next free one
        match = KB_NAME.match(Path(sub.label).name)
        if match:
            taken.setdefault((sub.problem.level, _number(sub.problem.id)), set()).add(int(match["sample"]))
    out.mkdir(parents=True)
    kernels = []
    for sub in found:
        level, number = sub.problem.level, _number(sub.problem.id)
        origin = (origins or {}).get(sub.label, sub.label)
        code = extract(sub.text, sub.is_python).source
        if code is None:
            kernels.append(Kernel(origin, sub.problem.id, level, number, None, None, "no code in the answer"))
            continue
        match = KB_NAME.match(Path(sub.label).name)
        if match:
            sample = int(match["sample"])
        else:
            used = taken.setdefault((level, number), set())
            sample = next(s for s in range(len(used) + 1) if s not in used)
            used.add(sample)
        name = f"level_{level}_problem_{number}_sample_{sample}_kernel.py"
        if (out / name).exists():   # the same KernelBench name in two subfolders of SOURCE
            not_mapped.append({"submission": sub.label, "reason": f"a second file named {name}"})
            continue
        (out / name).write_text(code if code.endswith("\n") else code + "\n")
        kernels.append(Kernel(origin, sub.problem.id, level, number, sample, name, None))
    return kernels, not_mapped


def _number(problem_id: str) -> int:
    return int(problem_id.split("/")[1])   # "level2/62" -> 62


# ---------------------------------------------------------------- the two flows

def gpu_names() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.startswith("GPU ")]


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's list where it is set, else every one nvidia-smi lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(len(gpu_names()))]


# Runs a flow's command and, once it has exited, leaves the wrapper's /proc/self/io in a file: its write_bytes is
# what the command and its waited-for descendants sent to storage (the kernel adds a child's count to its parent's
# when the parent reaps it), the flow's alone even while another flow runs beside it.
# The flow's wrapper: runs it in a session of its own and writes its own /proc/self/io (which holds what the flow's
# waited-for processes wrote) once it exits; on SIGTERM (--theirs-limit) it kills the flow's session first.
_COUNTED = ("import os, signal, subprocess, sys\n"
            "flow = subprocess.Popen(sys.argv[2:], start_new_session=True)\n"
            "def stop(*_):\n"
            "    try:\n        os.killpg(flow.pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "rc = flow.wait()\n"
            "try:\n    text = open('/proc/self/io').read()\nexcept OSError:\n    text = ''\n"
            "open(sys.argv[1], 'w').write(text)\n"
            "sys.exit(rc if rc >= 0 else 128 - rc)\n")


def written_bytes(io_text: str) -> Optional[int]:
    """write_bytes of a /proc/PID/io text; None where the kernel keeps no such count."""
    for line in io_text.splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return None


class FreeSpace(threading.Thread):
    """The least free space seen on the file systems of `folders` while a flow runs (sampled every second)."""

    def __init__(self, folders: list[Path]):
        super().__init__(daemon=True)
        self.folders, self.least, self.stop = folders, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for folder in self.folders:
                try:
                    free = shutil.disk_usage(folder).free
                except OSError:
                    continue
                self.least[str(folder)] = min(free, self.least.get(str(folder), free))
            self.stop.wait(1.0)


def timed(command: list[str], log: Path, env: Optional[dict] = None, cwd: Optional[Path] = None,
          cpus: Optional[set[int]] = None, limit_s: Optional[float] = None) -> dict:
    """Run a command with its output to `log` (on `cpus` only, given); wall from start to exit (time.monotonic), the
    bytes it and its descendants wrote to storage, and the least free space of the results folder's and /tmp's file
    systems meanwhile. `limit_s`: stopped there if still running (`stopped`: its wall is then a lower bound)."""
    watch = FreeSpace([log.parent, Path(tempfile.gettempdir())])
    watch.start()
    io_file = log.with_suffix(".io")
    pinned = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    stopped = False
    with open(log, "w") as sink:
        began = time.monotonic()
        flow = subprocess.Popen([sys.executable, "-c", _COUNTED, str(io_file), *command], stdout=sink,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd, preexec_fn=pinned)
        try:
            rc = flow.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stopped = True
            flow.terminate()   # the wrapper kills the flow's session, then writes its counts
            try:
                rc = flow.wait(timeout=60)
            except subprocess.TimeoutExpired:
                flow.kill()
                rc = flow.wait()
        wall = time.monotonic() - began
    watch.stop.set()
    watch.join()
    return {"command": command, "rc": rc, "wall_s": round(wall, 2), "log": str(log), "stopped": stopped,
            "limit_s": limit_s,
            "written_bytes": written_bytes(io_file.read_text()) if io_file.is_file() else None,
            "least_free_bytes": watch.least, "cpus": len(cpus) if cpus else len(os.sched_getaffinity(0)),
            "cuda_visible_devices": (env or os.environ).get("CUDA_VISIBLE_DEVICES")}


def side_by_side(gpus: int) -> tuple[dict, dict]:
    """--side-by-side: where each flow runs, as (env, cpus) for ours and for KernelBench's: the first `gpus` GPUs
    this process sees (CUDA_VISIBLE_DEVICES, else nvidia-smi's) and the first half of its cores for ours, the next
    `gpus` GPUs and the other half for theirs."""
    ids = visible_gpus()
    if len(ids) < 2 * gpus:
        raise SystemExit(f"--side-by-side needs {2 * gpus} GPUs ({gpus} a flow); this process sees {len(ids)}")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--side-by-side needs two cores at least")
    half = len(cores) // 2
    return ({"env": dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(ids[:gpus])), "cpus": set(cores[:half])},
            {"env": dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(ids[gpus:2 * gpus])), "cpus": set(cores[half:])})


def ours_config(base: Optional[str], path: Path, build_cache: Path, gpus: Optional[int]) -> Path:
    """The run's config: `base` (a path or a name in configs/; default configs/default.yaml) with a fresh build
    cache and, given --gpus, the GPUs 0..N-1."""
    import yaml

    from harness.shared.config import find_config, load_config

    base_path = Path(find_config(base)) if base else REPO / "configs" / "default.yaml"
    values = yaml.safe_load(base_path.read_text()) or {}
    values["build_cache_dir"] = str(build_cache)
    if gpus is not None:
        values["gpus"] = ",".join(str(g) for g in range(gpus))
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    load_config(path)   # a key the harness no longer takes stops here, named
    return path


def run_ours(args, kernels_dir: Path, problems_dir: Path, out: Path) -> dict:
    place = getattr(args, "ours_place", None) or {}
    # side by side, CUDA_VISIBLE_DEVICES names ours' GPUs (the config's `gpus` are ids as nvidia-smi counts them)
    config = ours_config(args.config, out / f"{args.run}-ours.yaml", out / f"{args.run}-ours-build-cache",
                         None if place else args.gpus)
    command = [args.python, str(REPO / "run_eval.py"), "--results-dir", str(out), "batch", str(kernels_dir),
               "--run", args.run, "--device", args.device, "--problems-dir", str(problems_dir),
               "--config", str(config)]
    if args.dry_run:
        return {"command": command, "dry_run": True, "discovered": ours_discovery(kernels_dir, problems_dir)}
    result = timed(command, out / f"{args.run}-ours.log", cwd=REPO, env=place.get("env"), cpus=place.get("cpus"))
    (out / f"{args.run}-ours.done").write_text(f"{result['rc']}\n")   # for a script waiting to use its GPU
    run_dir = out / args.run
    batch = run_dir / "batch.json"
    result["batch"] = json.loads(batch.read_text()) if batch.is_file() else None
    records = run_dir / "records.jsonl"
    result["records"] = [json.loads(line) for line in records.read_text().splitlines() if line.strip()] \
        if records.is_file() else []
    return result


def ours_discovery(kernels_dir: Path, problems_dir: Path) -> list[dict]:
    """What `batch` would judge: its own discovery of the folder (no process started)."""
    from harness.submission.submissions import discover

    found, skipped = discover(kernels_dir, None, problems_dir)
    return [{"file": Path(s.label).name, "problem": s.problem.id, "problem_file": str(s.problem.path),
             "sample_id": s.sample_id} for s in found] + [{"file": s.label, "skipped": s.reason} for s in skipped]


def run_theirs(args, kernels: list[Kernel], kb: Path, kernels_dir: Path, out: Path) -> dict:
    """One driver subprocess per level (upstream evaluates one level per run), timed from start to exit."""
    place = getattr(args, "theirs_place", None) or {}
    env = dict(place.get("env") or os.environ, **{DRIVER_ENV: str(kb)})
    if args.kb_site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(args.kb_site.resolve()), env.get("PYTHONPATH")) if p)
    levels = []
    for level in sorted({k.level for k in kernels if k.file}):
        work = ",".join(f"{k.number}:{k.sample}" for k in kernels if k.file and k.level == level)
        summary = out / f"{args.run}-kb-level{level}.json"
        command = [args.python, str(Path(__file__).resolve()), "--runs-dir", str(kernels_dir.parent),
                   "--run-name", kernels_dir.name, "--level", str(level), "--work", work,
                   "--num-gpu-devices", str(args.gpus or max(1, len(visible_gpus()))),
                   "--num-cpu-workers", str(args.kb_cpu_workers
                                            or max(1, len(place.get("cpus") or os.sched_getaffinity(0)) - 2)),
                   "--build-dir", str(out / f"{args.run}-kb-build"), "--summary", str(summary)]
        command += ["--no-build-cache"] if args.kb_no_build_cache else []
        command += ["--dry-run"] if args.dry_run else []
        # cwd: upstream's batch_compile may write error_log.txt into the current directory
        left = None if args.theirs_limit is None else args.theirs_limit - sum(r["wall_s"] for r in levels)
        if left is not None and left <= 0:
            break
        result = timed(command, out / f"{args.run}-kb-level{level}.log", env=env, cwd=out, cpus=place.get("cpus"),
                       limit_s=left)
        result["summary"] = json.loads(summary.read_text()) if summary.is_file() else None
        if result["stopped"] and result["summary"] is None:   # what it had evaluated when it was stopped
            result["summary"] = {"level": level, "stopped_after_s": result["wall_s"],
                                 "records": kb_records(str(kernels_dir / "eval_results.json"), level)}
        levels.append(result)
        if result["stopped"]:
            break
    written = [r.get("written_bytes") for r in levels]
    stopped = any(r["stopped"] for r in levels) or len(levels) < len({k.level for k in kernels if k.file})
    return {"levels": levels, "wall_s": round(sum(r["wall_s"] for r in levels), 2), "stopped": stopped,
            "rc": max((r["rc"] for r in levels), default=0),
            "written_bytes": None if None in written else sum(written)}


# ---------------------------------------------------------------- comparison (pure) and report

def compare(kernels: list[Kernel], ours: Optional[dict], theirs: Optional[dict]) -> list[dict]:
    """One row per kernel: our status and compiled/correct beside KernelBench's compiled/correctness."""
    by_file = {Path(r["submission"]).name: r for r in (ours or {}).get("records", [])}
    kb = {}
    for level in (theirs or {}).get("levels", []):
        for r in (level.get("summary") or {}).get("records", []):
            kb[f"level_{r['level']}_problem_{r['problem_id']}_sample_{r['sample_id']}_kernel.py"] = r
        for c in (level.get("summary") or {}).get("crashed", []):
            kb[c["file"]] = {"compiled": None, "correctness": None, "error": "crashed: " + c["error"]}
    rows = []
    for k in kernels:
        row = {"kernel": k.file, "origin": k.origin, "problem": k.problem,
               "skipped": k.skipped}
        mine, theirs_row = by_file.get(k.file), kb.get(k.file)
        if mine:
            row.update(ours_status=mine["status"], ours_compiled=mine["compiled"], ours_correct=mine["correct"],
                       ours_error=mine.get("error"))
        if theirs_row:
            row.update(kb_compiled=theirs_row["compiled"], kb_correct=theirs_row["correctness"],
                       kb_error=theirs_row.get("error"), kb_runtime_ms=theirs_row.get("runtime"))
        if mine and theirs_row:
            row["correct_agree"] = bool(mine["correct"]) == bool(theirs_row["correctness"])
            row["compiled_agree"] = bool(mine["compiled"]) == bool(theirs_row["compiled"])
        rows.append(row)
    return rows


def _yn(value) -> str:
    return "-" if value is None else ("y" if value else "n")


def print_report(report: dict) -> None:
    ours, theirs = report["ours"], report.get("theirs")
    print(f"\n{report['date']}  device: {'; '.join(report['device']) or 'no GPU (nvidia-smi absent)'}")
    print(f"kernels: {report['kernels_dir']}  ({sum(1 for r in report['rows'] if not r['skipped'])} fed to both, "
          f"{sum(1 for r in report['rows'] if r['skipped'])} skipped)")
    for r in report["rows"]:
        if r["skipped"]:
            print(f"  skipped by both: {r['origin']} ({r['problem']}): {r['skipped']}")
    for r in report["not_mapped"]:
        print(f"  not mapped to a problem: {r['submission']}: {r['reason']}")
    if report["dry_run"]:
        print("\nours (dry run): batch would judge")
        for d in ours["discovered"]:
            print(f"  {d['file']:<40} -> {d.get('problem') or 'skipped: ' + d['skipped']}  {d.get('problem_file', '')}")
        print("  command: " + " ".join(ours["command"]))
        for level in (theirs or {}).get("levels", []):
            s = level["summary"] or {}
            print(f"\nKernelBench driver --dry-run, level {s.get('level')}: rc {level['rc']}, {level['wall_s']} s "
                  f"(log {level['log']})")
            for w in s.get("work", []):
                print(f"  {w['file']:<40} ref {w['reference']}  build {w['build_dir']}")
            for probe in s.get("worker_probe", []):
                print(f"  spawned worker: {probe}")
        print("\ndry run: no build, no evaluation; both walls need the GPU run")
        return
    print(f"\n{'flow':<26}{'wall s':>9}{'rc':>4}{'judged':>8}{'compiled':>10}{'correct':>9}")
    recs = ours.get("records", [])
    print(f"{'ours (run_eval.py batch)':<26}{ours['wall_s']:>9.1f}{ours['rc']:>4}{len(recs):>8}"
          f"{sum(bool(r['compiled']) for r in recs):>10}{sum(bool(r['correct']) for r in recs):>9}")
    if theirs:
        kb = [r for lv in theirs["levels"] for r in (lv["summary"] or {}).get("records", [])]
        print(f"{'KernelBench eval flow':<26}{theirs['wall_s']:>9.1f}{theirs['rc']:>4}{len(kb):>8}"
              f"{sum(bool(r['compiled']) for r in kb):>10}{sum(bool(r['correctness']) for r in kb):>9}")
        for lv in theirs["levels"]:
            s = lv["summary"] or {}
            print(f"  level {s.get('level')}: compile {s.get('compile_s')} s, eval {s.get('eval_s')} s, "
                  f"crashed {len(s.get('crashed', []))}")
    print(f"\n{'kernel':<40}{'ours status':<18}{'ours c/c':>9}{'KB c/c':>8}{'agree':>7}  from")
    for r in report["rows"]:
        if r["skipped"]:
            continue
        agree = "-" if "correct_agree" not in r else ("yes" if r["correct_agree"] else "NO")
        print(f"{r['kernel']:<40}{r.get('ours_status', '-'):<18}"
              f"{_yn(r.get('ours_compiled')) + '/' + _yn(r.get('ours_correct')):>9}"
              f"{_yn(r.get('kb_compiled')) + '/' + _yn(r.get('kb_correct')):>8}{agree:>7}  {Path(r['origin']).name}")
    target = report.get("target_ratio", TARGET_RATIO)
    if report.get("ratio_below") is not None:
        met = "met" if report["ratio_below"] <= target else "not shown"
        print(f"\nKernelBench's flow stopped unfinished after {theirs['wall_s']:.1f} s (--theirs-limit): ratio ours "
              f"/ theirs below {report['ratio_below']:.3f}  (target <= {target}: {met}); correctness agrees on "
              f"{report['agree']['correct']} of the {report['agree']['compared']} it judged")
    if report.get("ratio") is not None:
        met = "met" if report["ratio"] <= target else "not met"
        print(f"\nratio ours / theirs: {report['ratio']:.3f}  (target <= {target}: {met}); correctness "
              f"agrees on {report['agree']['correct']} of {report['agree']['compared']}, compiled on "
              f"{report['agree']['compiled']} (KernelBench records a CUDA error in forward as compiled=false)")
    if theirs and not report["dry_run"] and report.get("ratio") is None and report.get("ratio_below") is None:
        failed = [f"{name} ended with rc {flow.get('rc')} after {flow['wall_s']:.1f} s"
                  for name, flow in (("ours", report["ours"]), ("KernelBench's flow", theirs))
                  if flow.get("rc") != 0 and not flow.get("stopped")]
        logs = ", ".join(str(lv["log"]) for lv in theirs.get("levels", []))
        print(f"\nno ratio: {'; '.join(failed)} (KernelBench's logs: {logs})")
    own = ((report.get("ours") or {}).get("batch") or {}).get("own_work_ratio")
    if own is not None:
        print(f"ours: GPU-worker time per timed kernel over its own checks and timing, median {own:.2f}x "
              f"(target <= 2: {'met' if own <= 2 else 'not met'})")
    spent = where_the_wall_went(ours)
    if spent:
        print(spent)
    print(storage_line(report))
    evidence = evidence_flags(recs)
    if evidence:
        print(evidence)


# Findings that are evidence only (not forbidden by default) and whose rate on honest records decides whether they
# can become rules, or that say the judge saw its reference drift.
WATCHED_FLAGS = ("timer_unexplained", "reference_drift", "timer_mismatch")


def evidence_flags(records: list) -> Optional[str]:
    """Which of our records carry a watched finding, with its evidence (None: none does)."""
    lines = []
    for record in records:
        for flag in WATCHED_FLAGS:
            if flag in (record.get("flags") or ()):
                seen = ((record.get("flag_evidence") or {}).get(flag) or "")[:200]
                lines.append(f"  {flag}: {record.get('problem')} {Path(str(record.get('submission'))).name} "
                             f"({record.get('status')}): {seen}")
    return "watched findings on our records:\n" + "\n".join(lines) if lines else None


def storage_line(report: dict) -> str:
    """Bytes each flow wrote to storage, per problem, and the least free space seen while ours ran."""
    problems = len({r["problem"] for r in report["rows"] if not r["skipped"]}) or 1
    parts = []
    for name, flow in (("ours", report.get("ours")), ("KernelBench", report.get("theirs"))):
        written = (flow or {}).get("written_bytes")
        if written is not None:
            parts.append(f"{name} {written / 2**20:.0f} MB ({written / problems / 2**20:.1f} MB a problem"
                         + (", until it was stopped" if (flow or {}).get("stopped") else "") + ")")
    least = ((report.get("ours") or {}).get("least_free_bytes") or {})
    free = ", ".join(f"{folder} {n / 2**30:.1f} GB" for folder, n in least.items())
    return (f"written to storage: {'; '.join(parts) or 'not counted here'} over {problems} problems (target <= 100 MB "
            f"a problem)" + (f"; least free space while ours ran: {free}" if free else ""))


def reference_preparation(records: list) -> Optional[str]:
    """The longest reference preparation of the run (its record's ref_* phases: draw, outputs, ...), by problem."""
    spent = sorted((sum(v for k, v in (r.get("phases") or {}).items() if k.startswith("ref_")), r["problem"])
                   for r in records if any(k.startswith("ref_") for k in (r.get("phases") or {})))
    if not spent:
        return None
    return ("reference preparation (the ref_* phases of the record that started it): longest "
            + ", ".join(f"{problem} {seconds:.1f} s" for seconds, problem in reversed(spent[-3:])))


def where_the_wall_went(ours: dict) -> Optional[str]:
    """Our batch's wall in the figures that bound it: how long the builds took, how busy the GPU worker was, how
    long it waited for references, and its time per evaluated kernel."""
    from harness.shared.record import BESIDE_PHASES, NESTED_PHASES, phases_total

    batch, records = ours.get("batch") or {}, ours.get("records") or []
    if not batch or not records:
        return None
    builds = sorted(r["compile_s"] for r in records if r.get("compile_s") and r.get("compiled") is not False
                    and r["compile_s"] > 1)
    worker = sorted((phases_total(r.get("phases")) - (r.get("phases") or {}).get("queue", 0.0), r["problem"])
                    for r in records if r.get("phases"))
    waits = sum((r.get("phases") or {}).get("reference_start", 0.0) for r in records)
    lines = [f"ours, where the wall went: GPU worker busy {batch.get('gpu_s', 0):.1f} s of {batch.get('wall_s', 0):.1f}"
             f" s, {waits:.1f} s of it waiting for references"]
    if builds:
        lines.append(f"  builds that compiled: {len(builds)}, each {builds[0]:.1f}-{builds[-1]:.1f} s from its start "
                     f"({batch.get('build_cpu_s', 0):.0f} CPU s on {batch.get('build_jobs')} jobs)")
    if worker:
        middle = worker[len(worker) // 2][0]
        lines.append(f"  worker time per evaluated kernel: median {middle:.1f} s, longest {worker[-1][0]:.1f} s "
                     f"({worker[-1][1]}), {sum(t for t, _ in worker):.1f} s in all")
    summed = sorted(((seconds, name) for name, seconds in (batch.get("phases") or {}).items()
                     if not name.startswith(NESTED_PHASES) and name not in BESIDE_PHASES and name != "queue"),
                    reverse=True)
    if summed:
        lines.append("  its largest phases, summed over the records: "
                     + ", ".join(f"{name} {seconds:.1f}" for seconds, name in summed[:8]) + " s")
    preparation = reference_preparation(records)
    if preparation:
        lines.append("  " + preparation)
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", type=Path, help="folder of submissions (KernelBench run naming or "
                   "levelN/NN_Name/<file>)")
    p.add_argument("--from-repo", action="store_true", help="the seeds and our level-2 CUDA examples 51, 62, 80")
    p.add_argument("--seeds", type=Path, help="seeds folder for --from-repo (default: $JUDGE_SEEDS_DIR, "
                   "../shared/seeds, .seeds)")
    p.add_argument("--kernelbench", type=Path, help="KernelBench checkout or export.sh folder (src/, scripts/, "
                   "KernelBench/): run its flow too, and use its problems for both")
    p.add_argument("--results-dir", type=Path, help="default: results/kb-compare-<time>")
    p.add_argument("--run", help="run name for both flows (default: kbcmp-<time>)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="our batch's device")
    p.add_argument("--config", help="our base config (path or name in configs/); a fresh build cache is set on it")
    p.add_argument("--gpus", type=int, help="GPUs for both flows (default: ours every visible one, KernelBench "
                   "the count of `nvidia-smi -L`)")
    p.add_argument("--kb-cpu-workers", type=int, help="KernelBench's compile processes (default: cores - 2)")
    p.add_argument("--kb-no-build-cache", action="store_true", help="upstream's default: compile inside eval")
    p.add_argument("--kb-site", type=Path, help="folder put on PYTHONPATH for KernelBench's flow only (pydantic)")
    p.add_argument("--python", default=sys.executable, help="interpreter for both flows (default: this one)")
    p.add_argument("--side-by-side", action="store_true", help="run both flows at once: ours on the first --gpus "
                   "(default 1) visible GPUs and the first half of the usable cores, KernelBench's on the next GPUs "
                   "and the other half")
    p.add_argument("--theirs-limit", type=float, help="stop KernelBench's flow after this many seconds if still "
                   "running: its wall is then a lower bound, and the report gives the ratio as an upper bound")
    p.add_argument("--target", type=float, default=TARGET_RATIO, help=f"the ratio wanted (default {TARGET_RATIO})")
    p.add_argument("--dry-run", action="store_true", help="everything but the GPU work")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))   # harness, for our batch's own discovery and extraction, without an install
    if args.side_by_side:
        if not args.kernelbench:
            p.error("--side-by-side runs KernelBench's flow beside ours: give --kernelbench")
        args.gpus = args.gpus or 1
        if not args.dry_run:
            ours_place, theirs_place = side_by_side(args.gpus)
            args.ours_place, args.theirs_place = ours_place, theirs_place
    if bool(args.source) == args.from_repo:
        p.error("give SOURCE or --from-repo (one of them)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.run = args.run or f"kbcmp-{stamp}"
    out = (args.results_dir or REPO / "results" / f"kb-compare-{stamp}").resolve()
    kb = args.kernelbench.resolve() if args.kernelbench else None
    if kb and not (kb / "scripts" / "eval_from_generations.py").is_file():
        p.error(f"{kb}: no scripts/eval_from_generations.py (export it: ../shared/kb-compare/export.sh GIT_DIR DEST)")
    if kb and "lock" in f"{out}/{args.run}".lower():
        p.error("'lock' in --results-dir or --run: upstream takes any compile error text holding it for a lock "
                "error (every compiler message names the build path)")
    kernels_dir = out / "kernels" / args.run
    if kernels_dir.exists() or (out / args.run).exists():
        p.error(f"run {args.run} already in {out}: take a fresh --run (records would be reused, upstream resumes)")
    out.mkdir(parents=True, exist_ok=True)
    problems_dir = kb / "KernelBench" if kb else REPO / "problems"

    with tempfile.TemporaryDirectory(prefix="kb-compare-") as stage:
        origins = assemble_from_repo(Path(stage), seeds_dir(args.seeds)) if args.from_repo else None
        source = Path(stage) if args.from_repo else args.source.resolve()
        kernels, not_mapped = write_kernels(source, problems_dir, kernels_dir, origins)
    if not any(k.file for k in kernels):
        print(f"no kernel to judge in {source} (not mapped: {not_mapped})", file=sys.stderr)
        return 2
    print(f"{sum(1 for k in kernels if k.file)} kernels written to {kernels_dir}; running ours"
          + (" (dry run)" if args.dry_run else ""), flush=True)
    theirs = None
    if kb and args.side_by_side and not args.dry_run:
        print("running KernelBench's flow beside ours, each on its own GPUs and half the cores", flush=True)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            beside = pool.submit(run_theirs, args, kernels, kb, kernels_dir, out)
            ours = run_ours(args, kernels_dir, problems_dir, out)
            print(f"ours done ({ours['wall_s']} s); waiting for KernelBench's flow", flush=True)
            theirs = beside.result()
    else:
        ours = run_ours(args, kernels_dir, problems_dir, out)
        if kb:
            print("running KernelBench's flow" + (" (dry run)" if args.dry_run else ""), flush=True)
            theirs = run_theirs(args, kernels, kb, kernels_dir, out)
    rows = compare(kernels, ours, theirs)
    compared = [r for r in rows if "correct_agree" in r]
    # a flow that failed has no wall to compare with: its time says how soon it failed, not how long it takes
    measured = (theirs and not args.dry_run and theirs["wall_s"] and ours.get("rc") == 0
                and (theirs["rc"] == 0 or theirs.get("stopped")))
    ratio = ours["wall_s"] / theirs["wall_s"] if measured and not theirs.get("stopped") else None
    # KernelBench's flow stopped by --theirs-limit: its wall is longer than the time it ran, the ratio smaller
    ratio_below = ours["wall_s"] / theirs["wall_s"] if measured and theirs.get("stopped") else None
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "device": gpu_names(),
              "cores": len(os.sched_getaffinity(0)), "dry_run": args.dry_run, "run": args.run,
              "kernels_dir": str(kernels_dir),
              "problems_dir": str(problems_dir), "our_commit": _git(REPO, "rev-parse", "HEAD"),
              "our_tree_dirty": bool(_git(REPO, "status", "--porcelain", "--untracked-files=no")),
              "kernelbench_commit": _kb_commit(kb), "kernels": [asdict(k) for k in kernels],
              "not_mapped": not_mapped, "ours": ours, "theirs": theirs, "rows": rows,
              "side_by_side": args.side_by_side,
              "ratio": None if ratio is None else round(ratio, 4), "target_ratio": args.target,
              "ratio_below": None if ratio_below is None else round(ratio_below, 4),
              "agree": {"compared": len(compared), "correct": sum(r["correct_agree"] for r in compared),
                        "compiled": sum(r["compiled_agree"] for r in compared)}}
    (out / "kb_compare.json").write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"\nwrote {out / 'kb_compare.json'}")
    failed = ours.get("rc") not in (None, 0) or (theirs and theirs["rc"] != 0 and not theirs.get("stopped"))
    return 1 if failed else 0


def _git(repo: Path, *args: str) -> Optional[str]:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _kb_commit(kb: Optional[Path]) -> Optional[str]:
    if kb is None:
        return None
    marker = kb / "UPSTREAM_COMMIT"   # written by export.sh
    return marker.read_text().strip() if marker.is_file() else _git(kb, "rev-parse", "HEAD")


# ---------------------------------------------------------------- KernelBench's flow (driver subprocess)

def _probe_worker(work, config, dataset, run_dir):
    """In a process spawned as upstream's eval workers are: what evaluate_single_sample reads before evaluating."""
    import eval_from_generations as efg

    ref = efg.fetch_ref_arch_from_problem_id(dataset, work.problem_id, config.dataset_src)
    src = efg.fetch_kernel_from_disk(run_dir, config.level, work.problem_id, work.sample_id)
    return {"kernel": f"problem {work.problem_id} sample {work.sample_id}", "pid": os.getpid(),
            "reference_chars": len(ref), "kernel_chars": len(src or ""),
            "stand_ins": sorted(n for n in STAND_INS if isinstance(sys.modules.get(n), _StandIn))}


def _results(eval_file: str) -> dict:
    if not os.path.exists(eval_file):
        return {}
    with open(eval_file) as f:
        return json.load(f)


def kb_records(eval_file: str, level: int) -> list[dict]:
    """Upstream's evaluation results (every kernel evaluated so far) as the summary's records."""
    return [{"level": level, "problem_id": int(pid), "sample_id": r["sample_id"], "compiled": r["compiled"],
             "correctness": r["correctness"], "runtime": r["runtime"], "error": _short_error(r.get("metadata") or {})}
            for pid, rs in _results(eval_file).items() for r in rs]


def _done(eval_file: str) -> set[tuple[int, int]]:
    """(problem, sample) pairs with a record; upstream's own check looks at the problem only."""
    return {(int(pid), int(r["sample_id"])) for pid, rs in _results(eval_file).items() for r in rs}


def _short_error(metadata: dict) -> Optional[str]:
    for key, value in metadata.items():
        if "error" in key or "issue" in key:
            return f"{key}: {str(value).strip().splitlines()[-1][:200] if str(value).strip() else ''}"
    return None


def kb_driver() -> int:
    p = argparse.ArgumentParser(description="KernelBench's local eval flow (internal: run by kb_compare.py)")
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--run-name", required=True)
    p.add_argument("--level", type=int, required=True)
    p.add_argument("--work", required=True, help="problem:sample,...")
    p.add_argument("--num-gpu-devices", type=int, required=True)
    p.add_argument("--num-cpu-workers", type=int, required=True)
    p.add_argument("--build-dir", required=True)
    p.add_argument("--gpu-arch", default="Hopper")
    p.add_argument("--no-build-cache", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--summary", required=True, help="JSON file written at the end")
    a = p.parse_args()
    began = time.monotonic()
    import multiprocessing as mp

    import eval_from_generations as efg  # upstream's script, unchanged (found through the paths set at the top)
    import torch

    config = efg.EvalConfig()   # upstream's attributes and defaults
    config.run_name, config.dataset_src, config.level = a.run_name, "local", a.level
    config.runs_dir, config.kernel_eval_build_dir = a.runs_dir, a.build_dir
    config.gpu_arch, config.build_cache = [a.gpu_arch], not a.no_build_cache
    config.num_gpu_devices, config.num_cpu_workers = a.num_gpu_devices, a.num_cpu_workers
    work = [tuple(int(x) for x in item.split(":")) for item in a.work.split(",")]
    config.problem_ids = sorted({pid for pid, _ in work})   # informative: upstream's main() does not read it
    print(f"Starting Batch Eval with config: {config}", flush=True)
    if not a.dry_run:   # upstream main(), local mode
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA device not available. Local evaluation requires GPU.")
        if config.num_gpu_devices > torch.cuda.device_count():
            raise RuntimeError(f"{config.num_gpu_devices} GPUs asked, {torch.cuda.device_count()} visible")
    efg.set_gpu_arch(config.gpu_arch)   # TORCH_CUDA_ARCH_LIST, inherited by the spawned workers
    if mp.get_start_method(allow_none=True) is None:
        mp.set_start_method("spawn")
    dataset = efg.construct_kernelbench_dataset(level=config.level, source=config.dataset_src,
                                                dataset_name=config.dataset_name)
    run_dir = os.path.join(config.runs_dir, config.run_name)
    eval_file = os.path.join(run_dir, "eval_results.json")
    summary = {"level": a.level, "run_name": a.run_name, "build_cache": config.build_cache,
               "num_gpu_devices": config.num_gpu_devices, "num_cpu_workers": config.num_cpu_workers,
               "timeout_s": config.timeout, "num_correct_trials": config.num_correct_trials,
               "num_perf_trials": config.num_perf_trials, "precision": config.precision}
    if a.dry_run:
        summary["work"] = [{"file": f"level_{a.level}_problem_{pid}_sample_{s}_kernel.py",
                            "reference": os.path.basename(dataset.get_problem_by_id(pid).path),
                            "build_dir": os.path.join(config.kernel_eval_build_dir, config.run_name, str(pid), str(s)),
                            "kernel_exists": os.path.exists(os.path.join(
                                run_dir, f"level_{a.level}_problem_{pid}_sample_{s}_kernel.py"))}
                           for pid, s in work]
        with mp.Pool(1) as pool:   # the pickling and imports batch_eval's workers go through
            probes = [efg.WorkArgs(problem_id=pid, sample_id=s, device=torch.device("cuda:0")) for pid, s in work]
            summary["worker_probe"] = [pool.apply_async(_probe_worker, (w, config, dataset, run_dir)).get(300)
                                       for w in probes]
        summary.update(dry_run=True, gpu_arch_env=os.environ.get("TORCH_CUDA_ARCH_LIST"),
                       total_s=round(time.monotonic() - began, 2))
    else:
        t1 = time.monotonic()
        if config.build_cache:
            efg.compile.batch_compile(work, config.to_dict())
        t2 = time.monotonic()
        crashed, pending = [], list(work)
        while pending:
            try:
                efg.batch_eval(pending, config, dataset, run_dir, eval_file)
                break
            except Exception as exc:   # upstream would stop here (a None result); the rest still gets evaluated
                done = _done(eval_file)
                pending = [w for w in pending if w not in done]
                if pending:
                    print(f"[kb_compare driver] batch_eval raised {exc!r}; no result for {pending[0]}", flush=True)
                    pid, s = pending.pop(0)
                    crashed.append({"file": f"level_{a.level}_problem_{pid}_sample_{s}_kernel.py",
                                    "error": repr(exc)[:300]})
        t3 = time.monotonic()
        records = kb_records(eval_file, a.level)
        summary.update(dry_run=False, compile_s=round(t2 - t1, 2), eval_s=round(t3 - t2, 2),
                       total_s=round(t3 - began, 2), records=records, crashed=crashed, eval_results=eval_file)
    with open(a.summary, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(kb_driver() if os.environ.get(DRIVER_ENV) else main())
