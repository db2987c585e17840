#!/usr/bin/env python3
"""What a candidate process's first library calls cost after its CUDA context exists: each op in a fresh
process, as a candidate started ahead is when its submission arrives (CUDA initialised, nothing else run), timed on
its first call and on its second.

  python bench/first_calls.py [--out F]

The first call of a cuBLAS GEMM or a cuDNN convolution loads and initialises its library (handles, workspaces,
kernels); a warm-up before the submission arrives (harness/children/candidate/main.py warm_up) could take that off the
evaluation's path. An elementwise op is the control.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

OPS = {
    "elementwise": "x = torch.randn(1024, 1024, device='cuda'); f = lambda: torch.relu(x)",
    "linear (cuBLASLt, bias)": ("x = torch.randn(128, 1024, device='cuda'); w = torch.randn(512, 1024, device='cuda');"
                                " b = torch.randn(512, device='cuda'); f = lambda: F.linear(x, w, b)"),
    "matmul (cuBLAS)": "x = torch.randn(512, 512, device='cuda'); f = lambda: x @ x",
    "conv2d (cuDNN)": ("x = torch.randn(8, 16, 32, 32, device='cuda'); w = torch.randn(32, 16, 3, 3, device='cuda');"
                       " f = lambda: F.conv2d(x, w)"),
}

CHILD = """
import json, time, torch
import torch.nn.functional as F
torch.cuda.init(); torch.empty(1, device='cuda'); torch.cuda.synchronize()
{setup}
torch.cuda.synchronize()
seen = []
for _ in range(2):
    began = time.perf_counter(); f(); torch.cuda.synchronize(); seen.append((time.perf_counter() - began) * 1e3)
print(json.dumps(seen))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rows = {}
    for name, setup in OPS.items():
        done = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup)], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            rows[name] = {"error": done.stderr.strip().splitlines()[-1:]}
            print(f"{name:<26} failed: {rows[name]['error']}")
            continue
        first, second = json.loads(done.stdout.strip().splitlines()[-1])
        rows[name] = {"first_ms": first, "second_ms": second}
        print(f"{name:<26} first {first:9.2f} ms   second {second:7.3f} ms")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
