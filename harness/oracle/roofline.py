"""The roofline floor: no correct forward can beat moving the problem's minimum bytes or doing its FLOPs.

Computed in the oracle (trusted code): FLOPs with torch.utils.flop_counter on the reference forward, minimum bytes
as inputs + parameters + buffers read once and outputs written once. The device's rates are measured there too:
bandwidth as a device copy of half the problem's bytes (so a CPU problem that fits in cache is compared with cache
bandwidth), FLOP rate as a float32 matmul at full precision. floor_ms = max(bytes / bandwidth, FLOPs / rate).
A candidate faster than half the floor is flagged `implausible_time` (harness/integrity/detectors.py): measured
rates are below the hardware's peaks, so the margin keeps excellent kernels clear of the flag. The reference
itself is a correct implementation, so a floor above its own median means the rates were mismeasured (a busy
machine): the oracle then reports no floor rather than a wrong one.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_flops(forward: Callable[[], Any]) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        forward()
    return int(counter.get_total_flops())


def tensor_bytes(values: Any) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(tensor_bytes(v) for v in values)
    if isinstance(values, dict):
        return sum(tensor_bytes(v) for v in values.values())
    return 0


def _best_ms(work: Callable[[], Any], device: str, repeats: int = 20, budget_s: float = 0.2) -> float:
    """The fastest of `repeats` runs (more while under the time budget): noise only ever slows a run down."""
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    done = 0
    while done < repeats or (time.perf_counter() < deadline and done < 10 * repeats):
        done += 1
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        work()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def measure_rates(device: str, problem_bytes: int) -> dict[str, float]:
    """{"bandwidth_gbps", "fp32_tflops"} measured now on `device` (fastest runs, a fraction of a second)."""
    elements = max(min(problem_bytes // 8, 1 << 28), 1 << 14)   # copy half the bytes: read + write = all of them
    return {"bandwidth_gbps": _copy_gbps(elements, device),
            "fp32_tflops": _matmul_tflops(4096 if device == "cuda" else 512, device)}


def _copy_gbps(elements: int, device: str, **best: Any) -> float:
    """Bandwidth of a device copy of `elements` float32 values (read + write)."""
    source = torch.rand(elements, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    return 2 * elements * 4 / _best_ms(lambda: target.copy_(source), device, **best) / 1e6


def _matmul_tflops(size: int, device: str, **best: Any) -> float:
    """Rate of a `size`^2 float32 matmul at full precision (TF32 off for the measurement)."""
    a, b = torch.rand(size, size, device=device), torch.rand(size, size, device=device)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        torch.mm(a, b)
        return 2 * size ** 3 / _best_ms(lambda: torch.mm(a, b), device, **best) / 1e9
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def floor_ms(flops: int, nbytes: int, rates: dict[str, float]) -> float:
    memory_ms = nbytes / (rates["bandwidth_gbps"] * 1e6)
    compute_ms = flops / (rates["fp32_tflops"] * 1e9)
    return max(memory_ms, compute_ms)


def measure_peaks(device: str) -> dict[str, float]:
    """The device's speed of light as far as measurement goes: one large copy (1 GiB on CUDA, 256 MiB on the CPU)
    and one large float32 matmul without TF32 (8192^2 on CUDA, 2048^2 on the CPU); stored with the baselines."""
    elements = (1 << 28) if device == "cuda" else (1 << 26)
    size = 8192 if device == "cuda" else 2048
    return {"bandwidth_gbps": _copy_gbps(elements, device, repeats=10, budget_s=1.0),
            "fp32_tflops": _matmul_tflops(size, device, repeats=5, budget_s=1.0),
            "copy_bytes": 2 * elements * 4, "matmul_size": size}
