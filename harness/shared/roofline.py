"""The roofline floor: no correct forward can beat moving the problem's minimum bytes or doing its FLOPs.

Computed in the oracle (trusted code): FLOPs by torch.utils.flop_counter's formulas on the reference forward,
minimum bytes as inputs + parameters + buffers read once and outputs written once. The device's rates are measured
there too: bandwidth as a device copy of half the problem's bytes (so a CPU problem that fits in cache is compared
with cache bandwidth), FLOP rate as a float32 matmul at full precision. floor_ms = max(bytes / bandwidth, FLOPs /
rate).
In an fp16 or bf16 run (harness/shared/precision.py) a correct candidate may use that dtype's matmul units, so the rate
is the faster of the float32 matmul and one in the run's dtype (on the CPU measured at a quarter of the size: CPUs
without bf16 or fp16 units run it tens of times slower than float32); it keeps the name `fp32_tflops`, which stored
baselines and the oracle's READY use.
A candidate faster than half the floor is flagged `beyond_reference_roofline` (harness/integrity/detectors.py), as
information: the floor bounds the reference's algorithm, not the function, and a better algorithm (a GEMM and a mean
done as a GEMV) beats it legitimately; what a fast time could also mean (outputs kept and replayed) is checked
directly by timing calls on never-seen inputs. Measured rates are below the hardware's peaks, so the margin keeps
excellent kernels of the reference's own algorithm clear of the flag. The reference
itself is a correct implementation, so a floor above its own median means the rates were mismeasured (a busy
machine): the oracle then reports no floor rather than a wrong one.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class _FlopCount(TorchDispatchMode):
    """The FLOPs of every operator run inside it, by torch's own per-operator formulas (torch.utils.flop_counter);
    an operator without one is counted through its decomposition where it has one. torch's FlopCounterMode counts
    the same, but tracks modules too: its hooks import torch._dynamo (about a CPU second per reference
    process), which a total does not need."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False   # torch would wrap __torch_dispatch__ in a dynamo guard that imports torch._dynamo

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = flop_registry.get(func._overloadpacket)
        if formula is None and func is not torch.ops.prim.device.default:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


def count_flops(forward: Callable[[], Any]) -> int:
    counter = _FlopCount()
    with counter, torch.no_grad():
        forward()
    return int(counter.flops)


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


def copy_elements(problem_bytes: int) -> int:
    """float32 elements copied to measure the bandwidth: half the problem's bytes (read + write = all of them),
    rounded up to a power of two, 2^14 to 2^28: problems of one size class share a measurement (`rates_key`)."""
    wanted = max(min(problem_bytes // 8, 1 << 28), 1 << 14)
    return 1 << (wanted - 1).bit_length()


def rates_key(problem_bytes: int, dtype: Optional[torch.dtype] = None) -> str:
    """What `measure_rates` depends on besides the device: the dtype and the copy's size class."""
    return f"{str(dtype or torch.float32).replace('torch.', '')}:{copy_elements(problem_bytes)}"


def measure_rates(device: str, problem_bytes: int, dtype: Optional[torch.dtype] = None) -> dict[str, float]:
    """{"bandwidth_gbps", "fp32_tflops"} measured now on `device` (fastest runs, a fraction of a second); with a
    `dtype` (an fp16/bf16 run) the matmul rate is the faster of float32's and that dtype's."""
    elements = copy_elements(problem_bytes)
    size = 4096 if device == "cuda" else 512
    rate = _matmul_tflops(size, device)
    if dtype is not None:
        rate = max(rate, _matmul_tflops(_half_size(size, device), device, dtype=dtype))
    return {"bandwidth_gbps": _copy_gbps(elements, device), "fp32_tflops": rate}


def _half_size(size: int, device: str) -> int:
    return size if device == "cuda" else size // 4


def _copy_gbps(elements: int, device: str, **best: Any) -> float:
    """Bandwidth of a device copy of `elements` float32 values (read + write)."""
    source = torch.rand(elements, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    return 2 * elements * 4 / _best_ms(lambda: target.copy_(source), device, **best) / 1e6


def _matmul_tflops(size: int, device: str, dtype: torch.dtype = torch.float32, **best: Any) -> float:
    """Rate of a `size`^2 matmul in `dtype` at full precision (TF32 off for the measurement)."""
    a = torch.rand(size, size, device=device, dtype=dtype)
    b = torch.rand(size, size, device=device, dtype=dtype)
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


def measure_peaks(device: str, dtype: Optional[torch.dtype] = None) -> dict[str, float]:
    """The device's speed of light as far as measurement goes: one large copy (1 GiB on CUDA, 256 MiB on the CPU)
    and one large float32 matmul without TF32 (8192^2 on CUDA, 2048^2 on the CPU), with a `dtype` also one in that
    dtype (the faster counts); stored with the baselines."""
    elements = (1 << 28) if device == "cuda" else (1 << 26)
    size = 8192 if device == "cuda" else 2048
    rate = _matmul_tflops(size, device, repeats=5, budget_s=1.0)
    if dtype is not None:
        rate = max(rate, _matmul_tflops(_half_size(size, device), device, dtype=dtype, repeats=5, budget_s=1.0))
    return {"bandwidth_gbps": _copy_gbps(elements, device, repeats=10, budget_s=1.0), "fp32_tflops": rate,
            "copy_bytes": 2 * elements * 4, "matmul_size": size}
