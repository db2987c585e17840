#!/usr/bin/env python3
"""Where a reference's start goes: the oracle's steps (harness/children/oracle/main.py build_reference) timed one by
one, in this process (trusted code only: the problem's reference).

  python bench/oracle_profile.py PROBLEM [--device cuda|cpu] [--fresh-inputs 4]

Prints seconds per step: imports, loading the model, drawing inputs, the trials, the grad_outputs, the degenerate-input
probes, saving the feed and truth, the profiled forward, FLOP counting and the roofline's rate measurement; then the
reference's backward, which the oracle runs only when the parent asks for its gradients (CMD_GRADIENTS). On the CPU
machine (2026-11-23) level0/4 took 1.5 s plus 1.4 s of imports; `reference_start` in records reads more when builds
and other starts share the cores.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

STARTED = time.perf_counter()
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import harness.children.oracle.main as oracle  # noqa: E402
from harness.shared.problems import resolve_problem  # noqa: E402
from harness.shared.specs import OracleSpec  # noqa: E402

STEPS = ("load_reference", "draw_trials", "_grad_outputs", "swapped_outputs", "profile_forward", "count_flops",
         "measure_rates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problem")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--fresh-inputs", type=int, default=4)
    args = parser.parse_args()
    print(f"imports {time.perf_counter() - STARTED:.2f} s")
    spent: dict[str, float] = {}

    def timed(name: str, function):
        def wrapper(*a, **k):
            began = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - began
        return wrapper

    for name in STEPS:
        setattr(oracle, name, timed(name, getattr(oracle, name)))
    oracle.torch.save = timed("torch.save", torch.save)
    if args.device == "cuda":
        began = time.perf_counter()
        torch.cuda.init()
        torch.empty(1, device="cuda")
        print(f"cuda init {time.perf_counter() - began:.2f} s")
    problem = resolve_problem(args.problem)
    spec = OracleSpec(problem_path=str(problem.path), device=args.device, seed=42, input_seed=7, trials=5,
                      check_grad=True, allow_tf32=False, out_dir=tempfile.mkdtemp(prefix="oracle-profile-"),
                      fresh_inputs=args.fresh_inputs)
    began = time.perf_counter()
    state: dict = {}
    oracle.build_reference(spec, state)
    total = time.perf_counter() - began
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {name:16} {seconds:7.2f} s")
    print(f"build_reference {total:.2f} s (trials and fresh outputs: the rest)")
    if state["grad_outputs"]:
        began = time.perf_counter()
        oracle.reference_gradients(state["model"], state["grad_inputs"], state["grad_outputs"], args.device)
        print(f"reference_gradients {time.perf_counter() - began:.2f} s (when the parent asks)")


if __name__ == "__main__":
    main()
