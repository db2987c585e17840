#!/usr/bin/env python3
"""Host memory one evaluation holds at its peak, and what holds it: each memfd the judge's processes hand over
(feed, truth, fresh sets, result, spot outputs, ...) and each process's own anonymous memory.

  python bench/host_memory.py --problem P --submission S [--device cpu|cuda] [--scale N] [--out FILE]
                              [--interval 0.25] [--config C]

Runs `run_eval.py submit --no-server --json` on the submission once, sampling every --interval seconds: the
distinct memfds any process under it holds open (by inode; their sizes), each process's RssAnon, and the
machine's MemAvailable. The sample with the largest memfds + anonymous memory is the peak reported. --scale N
writes a copy of the problem with every `batch_size = X` line made `batch_size = X * N` (a larger problem from a
small one; --problem must then be a file), to see how the footprint grows with the problem.

The report (printed; --out: JSON) gives the problem's input and output bytes as its reference draws them (one
set: get_inputs() and Model(*get_init_inputs()) on the CPU, this process), the peak, and the peak over the input
bytes: how many times its inputs one evaluation holds in host memory. Figures are the machine's, with its date and
commit; memory held on a GPU is not in them.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
MB = 2**20


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(pid))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    module = next((a for a in argv if a.startswith("harness.")), None)
    return module.rsplit(".", 1)[0].rsplit(".", 1)[-1] if module else Path(argv[0]).name or "?"


def sample(root: int) -> dict:
    memfds: dict[int, tuple[str, int]] = {}
    anon: dict[str, int] = collections.Counter()
    for pid in descendants(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            anon[role(pid)] += int(re.search(r"RssAnon:\s+(\d+)", status).group(1)) * 1024
            fds = os.listdir(f"/proc/{pid}/fd")
        except (OSError, AttributeError):
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/memfd:"):
                    memfds[os.stat(f"/proc/{pid}/fd/{fd}").st_ino] = (target[7:].split(" ")[0], os.stat(
                        f"/proc/{pid}/fd/{fd}").st_size)
            except OSError:
                continue
    by_name: dict[str, int] = collections.Counter()
    for name, size in memfds.values():
        by_name[name] += size
    available = int(re.search(r"MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    return {"total": sum(by_name.values()) + sum(anon.values()), "memfds": dict(by_name), "anon": dict(anon),
            "available": available}


def scaled(problem: Path, factor: int, folder: Path) -> Path:
    text, count = re.subn(r"^batch_size = (.+)$", lambda m: f"batch_size = ({m.group(1)}) * {factor}",
                          problem.read_text(), flags=re.M)
    if not count:
        raise SystemExit(f"{problem}: no `batch_size = ...` line to scale")
    target = folder / problem.parent.name / problem.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def problem_bytes(problem: Path) -> tuple[int, int]:
    """(input bytes, output bytes) of one set, drawn and run here on the CPU."""
    import torch

    sys.path.insert(0, str(REPO))
    from harness.shared.environment import exec_source

    module = exec_source(problem.read_text(), str(problem), "host_memory_problem")
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    inputs = module.get_inputs()
    with torch.no_grad():
        out = model(*inputs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))  # noqa: E731
    return size(inputs), size(outs)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", required=True)
    p.add_argument("--submission", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--config")
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--out")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="host-memory-"))
    problem = Path(args.problem)
    if args.scale != 1:
        problem = scaled(problem, args.scale, work / "problems")
    in_bytes, out_bytes = problem_bytes(problem) if problem.is_file() else (None, None)
    command = [sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(work / "results"), "submit",
               "--problem", str(problem), "--submission", args.submission, "--device", args.device, "--no-server",
               "--json"] + (["--config", args.config] if args.config else [])
    began = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(work / "stderr.txt", "w"), text=True)
    peak, lowest = None, None
    while child.poll() is None:
        now = sample(child.pid)
        if peak is None or now["total"] > peak["total"]:
            peak = now
        lowest = now["available"] if lowest is None else min(lowest, now["available"])
        time.sleep(args.interval)
    out, _ = child.communicate()
    record = json.loads(out) if out.strip() else {}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "commit": commit, "device": args.device,
              "problem": str(problem), "submission": args.submission, "scale": args.scale,
              "input_bytes": in_bytes, "output_bytes": out_bytes, "wall_s": round(time.monotonic() - began, 1),
              "status": record.get("status"), "peak_bytes": peak["total"] if peak else None,
              "peak_over_input": round(peak["total"] / in_bytes, 1) if peak and in_bytes else None,
              "memfds": peak["memfds"] if peak else {}, "anon": peak["anon"] if peak else {},
              "lowest_available_bytes": lowest, "stderr": str(work / "stderr.txt")}
    print(f"{problem.name} x{args.scale}: inputs {in_bytes / MB:.0f} MB, outputs {out_bytes / MB:.0f} MB; status "
          f"{report['status']}; peak {report['peak_bytes'] / MB:.0f} MB held = {report['peak_over_input']}x the inputs")
    for name, size in sorted(report["memfds"].items(), key=lambda kv: -kv[1]):
        if size:
            print(f"  memfd {name:24s} {size / MB:8.0f} MB")
    for name, size in sorted(report["anon"].items(), key=lambda kv: -kv[1])[:4]:
        print(f"  anon  {name:24s} {size / MB:8.0f} MB")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["status"] else 1


if __name__ == "__main__":
    sys.exit(main())
