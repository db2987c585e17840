#!/usr/bin/env python3
"""Where a timed block's time goes, outside the kernel: one problem's reference timed in this process with the
judge's own Timer (harness/shared/timer.py), block by block, beside the parts of a call timed one at a time.

  python bench/timer_probe.py --problem level2/62 [--problems-dir DIR] [--device cuda] [--blocks 24]
                              [--idle-ms 40] [--out F]

Per block: the host's wall around Timer.block, the timed spans (events) and the harness's own time the Timer
reports (clones, flushes); per call, the same divided by the calls; the block's uncounted first call apart. The
blocks run twice: back to back, and idling --idle-ms after every second block (as a side idles interleaved while
the other runs its two blocks of A B B A), which shows whether idling alone slows a reference's calls. Then each
part alone, as host wall per call over --calls calls: the input clone, the L2 flush, an empty pair of events with
the device synchronizes the timer does, and the forward alone with a synchronize. The difference between a block's
wall and its events is what a timed block costs beyond the kernels it times. Trusted code only: the reference,
never a candidate.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from harness.children.oracle.main import draw_trials, load_reference  # noqa: E402
from harness.children.runtime import configure_precision, to_device  # noqa: E402
from harness.shared.problems import resolve_problem  # noqa: E402
from harness.shared.timer import make_timer  # noqa: E402


def wall_per_call_ms(step, calls: int, device: str) -> float:
    """Median host wall time of `step()` followed by a synchronize, over `calls` calls (ms)."""
    seen = []
    for _ in range(calls):
        began = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        seen.append((time.perf_counter() - began) * 1e3)
    return statistics.median(seen)


def run_blocks(timer, reps: int, blocks: int, idle_ms: float, beside: "Beside | None" = None) -> list[dict]:
    rows = []
    for index in range(blocks):
        if idle_ms and index % 2 == 0:
            if beside is not None:
                beside.run_for(idle_ms)
            else:
                time.sleep(idle_ms / 1e3)
        began = time.perf_counter()
        block = timer.block(reps)
        wall = (time.perf_counter() - began) * 1e3
        rows.append({"wall_ms": wall, "events_ms": block.events_ms, "outside_ms": block.outside_ms,
                     "median_ms": statistics.median(block.samples),
                     "first_call_ms": block.events_ms - sum(block.samples)})
    return rows


# What runs beside the timed blocks (--beside), to tell apart what can slow a launch-bound reference interleaved:
# `stopped`: a process holding a CUDA context of its own, stopped throughout (a frozen candidate, idle);
# `alternating`: the same process launching small kernels while the probe idles, stopped (and left SETTLE_MS) before
# each block (a frozen candidate that ran its blocks in between, as interleaved); `importing`: processes importing torch
# one after another on the host, never the GPU (a candidate process being started ahead, or a build).
BESIDE_GPU = """
import sys, torch
x = torch.zeros(1024, device="cuda")
torch.cuda.synchronize()
sys.stdout.write("up\\n"); sys.stdout.flush()
while True:
    for _ in range(8):
        x.add_(1)
    torch.cuda.synchronize()
"""
BESIDE_IMPORTS = "while true; do CUDA_VISIBLE_DEVICES= {python} -c 'import torch' ; done"
SETTLE_MS = 10.0


class Beside:
    def __init__(self, mode: str):
        self.mode, self.proc = mode, None
        if mode in ("stopped", "alternating"):
            self.proc = subprocess.Popen([sys.executable, "-c", BESIDE_GPU], stdout=subprocess.PIPE,
                                         start_new_session=True)
            self.proc.stdout.readline()   # its context is up
            self._signal(signal.SIGSTOP)
        elif mode == "importing":
            self.proc = subprocess.Popen(["bash", "-c", BESIDE_IMPORTS.format(python=sys.executable)],
                                         start_new_session=True)
            time.sleep(1.0)

    def _signal(self, sig) -> None:
        os.killpg(self.proc.pid, sig)

    def run_for(self, ms: float) -> None:
        """Idle `ms`, the process beside running its kernels meanwhile when alternating, then stopped again."""
        if self.mode != "alternating":
            time.sleep(ms / 1e3)
            return
        self._signal(signal.SIGCONT)
        time.sleep(ms / 1e3)
        self._signal(signal.SIGSTOP)
        time.sleep(SETTLE_MS / 1e3)

    def close(self) -> None:
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait()


def summary(rows: list[dict], calls_per_block: int) -> dict:
    def per(key: str) -> float:
        return statistics.median(r[key] for r in rows) / calls_per_block

    return {"wall per call": per("wall_ms"), "events per call": per("events_ms"),
            "outside per call (reported)": per("outside_ms"),
            "wall beyond events and outside per call": per("wall_ms") - per("events_ms") - per("outside_ms"),
            "a counted call (median of the block medians)": statistics.median(r["median_ms"] for r in rows),
            "the uncounted first call (median)": statistics.median(r["first_call_ms"] for r in rows)}


def probe(problem_id: str, problems_dir: str | None, device: str, blocks: int, block_ms: float, calls: int,
          idle_ms: float, beside_mode: str = "none") -> dict:
    configure_precision(False, device)
    problem = resolve_problem(problem_id, problems_dir)
    module, _, _, model, _ = load_reference(str(problem.path), 42, device)
    input_sets = [to_device(t, device) for t in draw_trials(module, 7, 3)]

    def forward(inputs):
        with torch.no_grad():
            return model(*inputs)

    timer, _ = make_timer(forward, input_sets, device, l2_flush=True, sync="device")
    per_call = timer.warmup(50.0)
    reps = max(1, round(block_ms / max(per_call, 1e-3)))
    beside = Beside(beside_mode) if beside_mode != "none" else None
    try:
        back_to_back = run_blocks(timer, reps, blocks, 0.0)
        idling = run_blocks(timer, reps, blocks, idle_ms, beside)
    finally:
        if beside is not None:
            beside.close()
    calls_per_block = reps + 1   # each block's uncounted first call

    source = input_sets[0]
    flush = timer.flush_buffer
    parts = {
        "clone": wall_per_call_ms(lambda: [v.clone() for v in source if isinstance(v, torch.Tensor)], calls, device),
        "flush": wall_per_call_ms(flush.zero_, calls, device) if flush is not None else None,
        "forward": wall_per_call_ms(lambda: forward(source), calls, device),
        "one timed call (Timer._one)": wall_per_call_ms(lambda: timer._one(None), calls, device),
    }
    if device == "cuda":
        def events():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda.synchronize()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
        parts["events and synchronizes, nothing timed"] = wall_per_call_ms(events, calls, device)

    return {"problem": problem_id, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "reps_per_block": reps, "warmup_per_call_ms": per_call, "idle_ms": idle_ms, "beside": beside_mode,
            "blocks": {"back to back": back_to_back, "idling": idling},
            "per_call_ms": {"back to back": summary(back_to_back, calls_per_block),
                            f"idling {idle_ms:g} ms after every second block": summary(idling, calls_per_block)},
            "parts_wall_per_call_ms": parts}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", default="level2/62")
    p.add_argument("--problems-dir", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--block-ms", type=float, default=20.0)
    p.add_argument("--calls", type=int, default=50, help="calls per part timed alone")
    p.add_argument("--idle-ms", type=float, default=40.0, help="idle after every second block, second pass")
    p.add_argument("--beside", choices=("none", "stopped", "alternating", "importing"), default="none",
                   help="what runs beside the blocks (both passes; alternating: during the idle of the second)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    result = probe(args.problem, args.problems_dir, args.device, args.blocks, args.block_ms, args.calls,
                   args.idle_ms, args.beside)
    print(f"{result['problem']} on {result['device']}: {result['reps_per_block']} counted calls a block "
          f"(+1 uncounted), {args.blocks} blocks a pass, beside: {args.beside}")
    for mode, figures in result["per_call_ms"].items():
        print(f"  {mode}:")
        for name, ms in figures.items():
            print(f"    {name:<46}{ms:9.4f} ms")
    for name, ms in result["parts_wall_per_call_ms"].items():
        print(f"  alone, {name:<37}{'-' if ms is None else f'{ms:9.4f}'} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
