"""What a Python kernel language's kernels are called in a profiler trace, outside the judge (no sandbox): runs
each submission's ModelNew on its problem's inputs once to compile, then once under torch.profiler, and prints
every GPU kernel's name and whether the output matches the reference. Used to fit harness/shared/backends/ to a language
(docs/backends.md); needs a GPU and the language's package.

    python3 bench/backend_kernels.py PROBLEM SUBMISSION [SUBMISSION ...]
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.shared.problems import resolve_problem  # noqa: E402


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(problem_id: str, paths: list[str]) -> None:
    problem = _module(resolve_problem(problem_id).path, "problem")
    torch.manual_seed(0)
    inputs = [t.cuda() if torch.is_tensor(t) else t for t in problem.get_inputs()]
    expected = problem.Model(*problem.get_init_inputs()).cuda()(*inputs)
    for path in paths:
        began = time.perf_counter()
        try:
            submission = _module(Path(path), "submission")
            model = submission.ModelNew(*problem.get_init_inputs()).cuda()
            out = model(*inputs)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - began
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model(*inputs)
                torch.cuda.synchronize()
            names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
            ok = torch.allclose(out, expected, atol=1e-5, rtol=1e-5)
            print(f"{path}: first call {first_s:.1f} s, matches reference: {ok}")
            for name in names:
                print(f"    kernel: {name}")
        except Exception as exc:   # a probe: report and go on to the next submission
            print(f"{path}: {type(exc).__name__}: {str(exc)[:2000]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
