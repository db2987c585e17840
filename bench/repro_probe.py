"""How far apart the speedups of separate processes land for one submission, and how that depends on the number
of timed calls, outside the judge: each run is a fresh process that times the reference and the submission in
alternating blocks (CUDA events per call, L2 flushed before each, as the judge does) and reports, for the first
N calls of each side, the ratio of medians. Spread over runs = max / min - 1 (issue: within 3% on a GPU).

    python3 bench/repro_probe.py [--runs 5] [--calls 40,160,480] [--gap-ms 0] [--profiled] [--rotate 1]
                                 [--split] [--device-sync]
                                 [--problem level2/62 --submission PATH]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ("level2/62", "submissions/examples/level2/62_Matmul_GroupNorm_LeakyReLU_Sum/fused_cuda.py")


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _side(problem_id: str, submission: str, which: str, profiled: bool, rotate: int, device_sync: bool):
    """One side's model, input sets and L2 flush buffer, warmed up (and profiled once if asked)."""
    import torch
    sys.path.insert(0, str(REPO))
    from harness.shared.problems import resolve_problem
    problem = _module(resolve_problem(problem_id).path, "problem")
    torch.manual_seed(0)
    input_sets = [[t.cuda() if torch.is_tensor(t) else t for t in problem.get_inputs()] for _ in range(rotate)]
    init = problem.get_init_inputs()
    model = problem.Model(*init).cuda() if which == "reference" else \
        _module(REPO / submission, "submission").ModelNew(*init).cuda()
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            model(*input_sets[0])
        if profiled:   # one forward under torch.profiler first, as the judge's attribution pass does
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
                model(*input_sets[0])
                torch.cuda.synchronize()
    torch.cuda.synchronize()

    def block(reps: int, done: int) -> list[float]:
        """An uncounted call, then `reps` timed ones (L2 flushed before each, synchronized after)."""
        times = []
        with torch.no_grad():
            model(*input_sets[0])
            for index in range(reps):
                inputs = input_sets[(done + index) % rotate]
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(*inputs)
                if device_sync:   # as the judge's default `timer_sync: device`: the end event after a device sync
                    torch.cuda.synchronize()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        return times

    return block


def _serve_side(conn, *args) -> None:
    """A side in its own process (as the judge runs each side): answers (reps, done) with one block's times."""
    block = _side(*args)
    conn.send("ready")
    while (command := conn.recv()) is not None:
        conn.send(block(*command))


def one_run(problem_id: str, submission: str, calls: int, block: int, gap_ms: float, profiled: bool,
            rotate: int, split: bool, device_sync: bool) -> dict:
    """The two sides timed in alternating blocks, in this process or (split) each in its own process."""
    times = {"reference": [], "candidate": []}
    if split:
        import multiprocessing
        context = multiprocessing.get_context("spawn")
        sides, processes = {}, []
        for name in times:
            parent, child = context.Pipe()
            process = context.Process(target=_serve_side, args=(child, problem_id, submission, name, profiled, rotate,
                                                                      device_sync))
            process.start()
            processes.append(process)
            assert parent.recv() == "ready"
            sides[name] = parent
        run = {name: (lambda reps, done, conn=conn: (conn.send((reps, done)), conn.recv())[1])
               for name, conn in sides.items()}
    else:
        run = {name: _side(problem_id, submission, name, profiled, rotate, device_sync) for name in times}
    while len(times["candidate"]) < calls:
        for name in ("candidate", "reference"):
            time.sleep(gap_ms / 1e3)   # the GPU idle between blocks, as while the judge hands over a block
            times[name] += run[name](block, len(times[name]))
    if split:
        for conn in sides.values():
            conn.send(None)
        for process in processes:
            process.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", default="40,160,480")
    parser.add_argument("--block", type=int, default=6)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--profiled", action="store_true", help="one forward under torch.profiler before timing")
    parser.add_argument("--rotate", type=int, default=1, help="input sets the timed calls cycle through")
    parser.add_argument("--split", action="store_true", help="each side in its own process, as in the judge")
    parser.add_argument("--device-sync", action="store_true", help="synchronize the device before the end event")
    parser.add_argument("--problem", default=DEFAULT[0])
    parser.add_argument("--submission", default=DEFAULT[1])
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    counts = [int(n) for n in args.calls.split(",")]
    if args.one:
        print(json.dumps(one_run(args.problem, args.submission, max(counts), args.block, args.gap_ms, args.profiled,
                                 args.rotate, args.split, args.device_sync)))
        return
    runs = []
    for _ in range(args.runs):
        command = [sys.executable, __file__, "--one", "--calls", args.calls, "--block", str(args.block),
                   "--gap-ms", str(args.gap_ms), "--problem", args.problem, "--submission", args.submission,
                   "--rotate", str(args.rotate)] + (["--profiled"] if args.profiled else []) + \
            (["--split"] if args.split else []) + (["--device-sync"] if args.device_sync else [])
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{'calls':>6} {'speedups (ratio of medians) per run':<52} {'spread':>7}  reference ms / candidate ms")
    for n in counts:
        ratios, medians = [], []
        for times in runs:
            ref, own = statistics.median(times["reference"][:n]), statistics.median(times["candidate"][:n])
            ratios.append(ref / own)
            medians.append(f"{ref:.3f}/{own:.3f}")
        spread = max(ratios) / min(ratios) - 1
        print(f"{n:>6} {' '.join(f'{r:.4f}' for r in ratios):<52} {spread:>6.1%}  {' '.join(medians)}")


if __name__ == "__main__":
    main()
