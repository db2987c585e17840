#!/usr/bin/env python3
r"""Benchmark sets of real LLM-written KernelBench kernels, taken from public runs that other people published.

  python bench/real_runs.py --mirror DIR [--kernelbench KB] [--out .realrun] [--sets l2-one,l2-eight,l12-many]

--mirror is the folder that `fetch` fills (one bare git directory per repository: DIR/<owner>+<name>/repo). Each
set is written as OUT/<set>/level_{L}_problem_{P}_sample_{S}_kernel.py (KernelBench's run naming, which
`run_eval.py batch` and bench/kb_compare.py read as they are) beside OUT/<set>/MANIFEST.json. OUT is ignored by git:
the kernels are third-party code and stay out of this repository; only the pinned commits below are recorded.

Sources (each read at a pinned commit with `git show`; all four repositories carry the MIT license):

  hzeng2000/KernelBench @ 833e16d179fa5fd2ea8c69f4134658880b841517 (run files added in 7a6fd9f)
      runs/level_2_backend_cuda_model_Kimi-K2-0905/         Kimi-K2-0905, level 2, 1 sample, CUDA load_inline
      runs/level_2_backend_cuda_model_grok-code-fast-1/     grok-code-fast-1, level 2, 1 sample, CUDA load_inline
  technoabsurdist/KernelBench @ 9202a5c5786ab959fcaa3b4ce0356348bb87c86a
      runs/gemini_level2_run/                               gemini-2.5-pro, level 2, 1 sample
      runs/qwencoder_level2_run/                            Qwen3-Coder-480B-A35B-Instruct-FP8, level 2, 1 sample
      runs/opus4_level2_20250903_065424/problem_{P}_kernel.py   claude-opus-4-1-20250805, level 2 (60 problems)
  yenhao-huang/KernelBench @ 62472a673baf4540af8129fa0e531505f4e62c7d
      runs/openrouter_deepseek_v4_pro_leaderboard_l2/       deepseek-v4-pro, level 2, 1 sample
  anneouyang/KernelBenchLeaderboard @ 170ca7965f53bba599d1078b6fcaa5dd2658ec50
      docs/assets/data.json -> docs/assets/solutions/<hash>.py   the KernelBench leaderboard's correct solutions
                                                            (gpt-o1, deepseek-coder, claude-3.5-sonnet, ...)
  yoenoo/eh_kernelbench @ 3d3526ea85fc2d8f21fd48b812fe8151e018ff1c ("pass@16 eval"; removed from its HEAD later)
      results/level_1_problem_{P}_sample_{S}_kernel.py      cognition-ai/Kevin-32B, level 1, up to 16 samples

Sets:

  l2-one    Kimi-K2-0905's CUDA kernels for level 2 problems 1-50: one sample per problem, 27 of them
            ConvTranspose2d/3d or Conv3d problems (the large ones: 3, 13, 15, 20, 26, 34, 38, 49, 50 ConvTranspose3d).
  l2-forty  the first 40 of l2-one (problems 1-40): a comparison whose KernelBench side fits one device run.
  l2-eight  8 submissions for each of 10 level 2 problems, sample S = the S-th source in this order: Kimi-K2,
            grok-code-fast-1, gemini-2.5-pro, Qwen3-Coder, deepseek-v4-pro, claude-opus-4.1, then the problem's first
            two leaderboard solutions. No public run found holds 8 samples of one model on level 2, so the eight are
            eight models' answers to the same problem: the same workload shape (8 builds per problem), all CUDA.
  l12-many  level 1: Kevin-32B's first 4 samples (lowest sample ids, kept as they are) of the first 30 problems that
            have 4 usable samples; level 2: Kimi-K2-0905's kernels for problems 51-100 (that run has one sample).
  l12-scale l12-many less the level 1 problems whose inputs pass 192 MB (L12_SCALE_LEVEL1 keeps 13 of the 30: 52
            files) and its 50 level 2 files: 102 submissions of both levels, several samples a problem on level 1,
            whose GPU-worker time is seconds a kernel rather than the minutes of a 6 GB input (bench/scale_gpus.py).

Every file is checked before it is written: its (level, problem) is a KernelBench problem file in --kernelbench
(KB/KernelBench/levelL/P_Name.py, its name recorded), the source parses and defines class ModelNew, and
ModelNew.__init__ takes as many positional arguments as the problem's Model.__init__ (the arguments both get from
get_init_inputs; a mismatch means the file answers another problem). A file that fails is left out and listed under
"excluded" in the manifest with its reason; a set that then lacks a file it needs is an error. The script prints each
set's file count and size and fails if all sets together exceed the 64 MiB a device run can carry.

Sizes: l2-one 50 files, l2-forty 40, l2-eight 80, l12-many 170, l12-scale 102; about 1.7 MiB together. Building
them, from the repository root:
`fetch` github:hzeng2000/KernelBench, technoabsurdist/KernelBench, yenhao-huang/KernelBench,
anneouyang/KernelBenchLeaderboard, yoenoo/eh_kernelbench and ScalingIntelligence/KernelBench, export the problems
(bench/kb_compare.py's docstring), then

  python bench/real_runs.py --mirror /work/.mirror --kernelbench .kb
  python bench/kb_compare.py .realrun/l2-one --kernelbench .kb --kb-site /tmp/kbsite --dry-run

The dry run lists the problem our batch maps each file to, and KernelBench's reference for it; carry `.realrun`
(with `.kb` and `.whl`) to the device machine for the GPU run.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

CARRY_LIMIT_BYTES = 64 * 1024 * 1024
RUN_NAME = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")
OPUS_NAME = re.compile(r"problem_(\d+)_kernel\.py$")
MIT = "MIT"


@dataclass(frozen=True)
class Source:
    """One published run: a folder of kernels at a pinned commit of a public repository."""
    key: str
    repo: str          # owner/name on GitHub
    commit: str
    path: str          # folder inside the repository (for the leaderboard: its data.json)
    model: str
    layout: str        # "run": level_L_problem_P_sample_S_kernel.py; "opus": problem_P_kernel.py (level 2);
                       # "leaderboard": data.json's per-problem entries naming solutions/<hash>.py


SOURCES = {s.key: s for s in (
    Source("kimi", "hzeng2000/KernelBench", "833e16d179fa5fd2ea8c69f4134658880b841517",
           "runs/level_2_backend_cuda_model_Kimi-K2-0905", "Kimi-K2-0905", "run"),
    Source("grok", "hzeng2000/KernelBench", "833e16d179fa5fd2ea8c69f4134658880b841517",
           "runs/level_2_backend_cuda_model_grok-code-fast-1", "grok-code-fast-1", "run"),
    Source("gemini", "technoabsurdist/KernelBench", "9202a5c5786ab959fcaa3b4ce0356348bb87c86a",
           "runs/gemini_level2_run", "gemini-2.5-pro", "run"),
    Source("qwencoder", "technoabsurdist/KernelBench", "9202a5c5786ab959fcaa3b4ce0356348bb87c86a",
           "runs/qwencoder_level2_run", "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "run"),
    Source("deepseek", "yenhao-huang/KernelBench", "62472a673baf4540af8129fa0e531505f4e62c7d",
           "runs/openrouter_deepseek_v4_pro_leaderboard_l2", "deepseek-v4-pro", "run"),
    Source("opus", "technoabsurdist/KernelBench", "9202a5c5786ab959fcaa3b4ce0356348bb87c86a",
           "runs/opus4_level2_20250903_065424", "claude-opus-4-1-20250805", "opus"),
    Source("leaderboard", "anneouyang/KernelBenchLeaderboard", "170ca7965f53bba599d1078b6fcaa5dd2658ec50",
           "docs/assets/data.json", "(per entry)", "leaderboard"),
    Source("kevin", "yoenoo/eh_kernelbench", "3d3526ea85fc2d8f21fd48b812fe8151e018ff1c",
           "results", "cognition-ai/Kevin-32B", "run"),
)}

L2_EIGHT_SOURCES = ("kimi", "grok", "gemini", "qwencoder", "deepseek", "opus")  # + 2 leaderboard solutions
# Level 2 problems that every source above answers with a usable file and the leaderboard with at least two;
# Conv3d and ConvTranspose3d first (the heavy ones), then ConvTranspose2d, then two GEMM epilogues.
L2_EIGHT_PROBLEMS = (7, 8, 47, 60, 10, 16, 42, 44, 9, 14)
L12_LEVEL1_PROBLEMS = 30
L12_LEVEL1_SAMPLES = 4


@dataclass(frozen=True)
class Candidate:
    """One kernel file of a source, before it is checked."""
    source: str
    level: int
    problem: int
    sample: int        # the sample id in the source (0 where it has one sample per problem)
    path: str          # path inside the source repository
    model: str


@dataclass(frozen=True)
class Entry:
    """One written file of a set, as MANIFEST.json lists it."""
    file: str
    level: int
    problem: int
    problem_name: str
    sample: int
    source_sample: int
    model: str
    repo: str
    commit: str
    path: str
    license: str
    sha256: str
    bytes: int


class Mirror:
    """The bare git directories `fetch` brings, read with git; nothing is checked out."""

    def __init__(self, root: Path):
        self.root = root

    def git_dir(self, repo: str) -> Path:
        g = self.root / repo.replace("/", "+") / "repo"
        if not g.is_dir():
            raise SystemExit(f"{g}: no snapshot of {repo} (fetch github:{repo} first)")
        return g

    def _git(self, repo: str, *args: str) -> bytes:
        out = subprocess.run(["git", "--git-dir", str(self.git_dir(repo)), *args], check=False, capture_output=True)
        if out.returncode != 0:
            raise SystemExit(f"{repo}: git {' '.join(args)}: {out.stderr.decode(errors='replace').strip()}")
        return out.stdout

    def files(self, src: Source) -> list[str]:
        """Regular files (mode 100644/100755) under the source's folder; links are skipped (some runs hold
        symlinks into folders that were never committed)."""
        listing = self._git(src.repo, "ls-tree", "-r", src.commit, "--", src.path).decode()
        paths = []
        for line in listing.splitlines():
            meta, path = line.split("\t", 1)
            if meta.split()[0] in ("100644", "100755"):
                paths.append(path)
        return paths

    def read(self, src: Source, path: str) -> bytes:
        return self._git(src.repo, "show", f"{src.commit}:{path}")


def candidates(mirror: Mirror, src: Source) -> Iterator[Candidate]:
    if src.layout == "leaderboard":
        data = json.loads(mirror.read(src, src.path))
        solutions = src.path.rsplit("/", 1)[0] + "/solutions"
        for key, entries in data.items():
            m = re.match(r"Level (\d+): (\d+)_", key)
            for rank, e in enumerate(entries):
                yield Candidate(src.key, int(m[1]), int(m[2]), rank, f"{solutions}/{e['file']}.py",
                                e["display_name"])
        return
    for path in mirror.files(src):
        name = path.rsplit("/", 1)[-1]
        if src.layout == "run" and (m := RUN_NAME.match(name)):
            yield Candidate(src.key, int(m[1]), int(m[2]), int(m[3]), path, src.model)
        elif src.layout == "opus" and (m := OPUS_NAME.fullmatch(name)):
            yield Candidate(src.key, 2, int(m[1]), 0, path, src.model)


def init_positional(tree: ast.Module, cls: str) -> tuple[int, bool] | None:
    """(number of positional parameters of cls.__init__ after self, whether it takes *args); None without cls."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    return len(f.args.args) - 1, f.args.vararg is not None
            return 0, False
    return None


class Problems:
    """KernelBench's problem files: KB/KernelBench/levelL/P_Name.py."""

    def __init__(self, kb: Path):
        self.files: dict[tuple[int, int], Path] = {}
        for level_dir in sorted((kb / "KernelBench").glob("level*")):
            level = int(level_dir.name[len("level"):])
            for f in level_dir.glob("*.py"):
                if f.name.split("_", 1)[0].isdigit():
                    self.files[(level, int(f.name.split("_", 1)[0]))] = f
        if not self.files:
            raise SystemExit(f"{kb}: no KernelBench/levelN/*.py problems (export them: bench/kb_compare.py)")

    def check(self, c: Candidate, text: str) -> tuple[str | None, str]:
        """(reason the file is not usable, or None; the problem's file stem)."""
        ref = self.files.get((c.level, c.problem))
        if ref is None:
            return f"no KernelBench problem level {c.level} number {c.problem}", ""
        try:
            tree = ast.parse(text)
        except SyntaxError as e:
            return f"does not parse: {e.msg} (line {e.lineno})", ref.stem
        ours = init_positional(tree, "ModelNew")
        if ours is None:
            return "no class ModelNew", ref.stem
        theirs = init_positional(ast.parse(ref.read_text()), "Model")
        if theirs is not None and not ours[1] and ours[0] != theirs[0]:
            return (f"ModelNew.__init__ takes {ours[0]} positional arguments, the problem's Model "
                    f"{theirs[0]}"), ref.stem
        return None, ref.stem


class Pool:
    """Every candidate of the sources, checked once, looked up by (source, level, problem)."""

    def __init__(self, mirror: Mirror, problems: Problems, keys: tuple[str, ...]):
        self.mirror = mirror
        self.usable: dict[tuple[str, int, int], list[tuple[Candidate, bytes, str]]] = {}
        self.excluded: list[dict] = []
        for key in keys:
            src = SOURCES[key]
            for c in candidates(mirror, src):
                blob = mirror.read(src, c.path)
                reason, stem = problems.check(c, blob.decode("utf-8", errors="replace"))
                if reason:
                    self.excluded.append({"source": key, "repo": src.repo, "commit": src.commit, "path": c.path,
                                          "level": c.level, "problem": c.problem, "reason": reason})
                    continue
                self.usable.setdefault((key, c.level, c.problem), []).append((c, blob, stem))
        for found in self.usable.values():
            found.sort(key=lambda x: x[0].sample)

    def get(self, key: str, level: int, problem: int) -> list[tuple[Candidate, bytes, str]]:
        return self.usable.get((key, level, problem), [])


Pick = tuple[Candidate, bytes, str, int]  # candidate, its bytes, problem stem, sample id in the set


def one(pool: Pool, key: str, level: int, problem: int) -> tuple[Candidate, bytes, str]:
    found = pool.get(key, level, problem)
    if not found:
        raise SystemExit(f"{key}: no usable kernel for level {level} problem {problem}")
    return found[0]


def set_l2_one(pool: Pool, last: int = 50) -> list[Pick]:
    return [(*one(pool, "kimi", 2, p), 0) for p in range(1, last + 1)]


def set_l2_eight(pool: Pool) -> list[Pick]:
    picks: list[Pick] = []
    for p in L2_EIGHT_PROBLEMS:
        for s, key in enumerate(L2_EIGHT_SOURCES):
            picks.append((*one(pool, key, 2, p), s))
        board = pool.get("leaderboard", 2, p)
        if len(board) < 2:
            raise SystemExit(f"leaderboard: fewer than 2 usable solutions for level 2 problem {p}")
        for extra, found in enumerate(board[:2]):
            picks.append((*found, len(L2_EIGHT_SOURCES) + extra))
    return picks


def set_l12_many(pool: Pool) -> list[Pick]:
    picks: list[Pick] = []
    taken = 0
    for p in range(1, 101):
        found = pool.get("kevin", 1, p)
        if len(found) < L12_LEVEL1_SAMPLES:
            continue
        picks += [(c, blob, stem, c.sample) for c, blob, stem in found[:L12_LEVEL1_SAMPLES]]
        taken += 1
        if taken == L12_LEVEL1_PROBLEMS:
            break
    if taken < L12_LEVEL1_PROBLEMS:
        raise SystemExit(f"kevin: only {taken} level 1 problems with {L12_LEVEL1_SAMPLES} usable samples")
    return picks + [(*one(pool, "kimi", 2, p), 0) for p in range(51, 101)]


# level 1 problems of l12-many whose inputs are at most 192 MB in KernelBench's problem files (the matmul family; the
# others hold 1-8 GB: 3-6, 11, 19-30), read once with get_inputs() on torch's meta device
L12_SCALE_LEVEL1 = frozenset({1, 2, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18})


def set_l12_scale(pool: Pool) -> list[Pick]:
    return [pick for pick in set_l12_many(pool) if pick[0].level == 2 or pick[0].problem in L12_SCALE_LEVEL1]


SETS = {
    "l2-one": (set_l2_one, ("kimi",)),
    "l2-forty": (lambda pool: set_l2_one(pool, 40), ("kimi",)),
    "l2-eight": (set_l2_eight, L2_EIGHT_SOURCES + ("leaderboard",)),
    "l12-many": (set_l12_many, ("kimi", "kevin")),
    "l12-scale": (set_l12_scale, ("kimi", "kevin")),
}


def write_set(name: str, picks: list[Pick], excluded: list[dict], out: Path) -> int:
    dest = out / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    entries = []
    for c, blob, stem, sample in picks:
        src = SOURCES[c.source]
        fname = f"level_{c.level}_problem_{c.problem}_sample_{sample}_kernel.py"
        if (dest / fname).exists():
            raise SystemExit(f"{name}: two kernels would be {fname}")
        (dest / fname).write_bytes(blob)
        entries.append(Entry(fname, c.level, c.problem, stem, sample, c.sample, c.model, src.repo, src.commit,
                             c.path, MIT, hashlib.sha256(blob).hexdigest(), len(blob)))
    used = {c.source for c, *_ in picks}
    manifest = {
        "set": name,
        "files": len(entries),
        "bytes": sum(e.bytes for e in entries),
        "sources": [asdict(SOURCES[k]) | {"license": MIT} for k in sorted(used)],
        "entries": [asdict(e) for e in entries],
        "excluded": [x for x in excluded if x["source"] in used],
    }
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return sum(f.stat().st_size for f in dest.iterdir())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--mirror", type=Path, required=True, help="folder of fetched snapshots (<owner>+<name>/repo)")
    ap.add_argument("--kernelbench", type=Path, default=Path(".kb"),
                    help="KernelBench export holding KernelBench/levelN/ (default: .kb)")
    ap.add_argument("--out", type=Path, default=Path(".realrun"), help="where the sets go (default: .realrun)")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    args = ap.parse_args(argv)
    names = [n for n in args.sets.split(",") if n]
    unknown = [n for n in names if n not in SETS]
    if unknown:
        ap.error(f"unknown set(s): {', '.join(unknown)}")
    mirror, problems = Mirror(args.mirror), Problems(args.kernelbench)
    keys = tuple(dict.fromkeys(k for n in names for k in SETS[n][1]))
    pool = Pool(mirror, problems, keys)
    total = 0
    for n in names:
        build, _ = SETS[n]
        picks = build(pool)
        size = write_set(n, picks, pool.excluded, args.out)
        total += size
        problems_in = sorted({(c.level, c.problem) for c, *_ in picks})
        print(f"{args.out / n}: {len(picks)} kernels, {len(problems_in)} problems, {size / 1024:.0f} KiB")
    print(f"all sets: {total / 1024 / 1024:.1f} MiB (carry limit 64 MiB); {len(pool.excluded)} source files "
          f"left out (MANIFEST.json 'excluded')")
    if total > CARRY_LIMIT_BYTES:
        print("too large to carry to the device machine", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
