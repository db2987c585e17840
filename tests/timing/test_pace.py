"""The reference's GPU pace with the host ahead (harness/timing/pace.py): what tells a host that slowed a
launch-bound reference from a GPU that another context held."""
import subprocess
import sys
import time

import pytest
import torch

from harness.timing.pace import PACE_CALLS_MAX, gpu_pace_ms, pace_calls


def test_calls_per_round_cover_a_few_ms_of_the_references_work():
    assert pace_calls(0.02) == PACE_CALLS_MAX and pace_calls(1.0) == 5 and pace_calls(50.0) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_without_cuda_the_pace_is_not_told():
    assert gpu_pace_ms(lambda: None, 4) is None


SPINNER = """
import sys, torch
torch.cuda._sleep(1000)
torch.cuda.synchronize()
print("up", flush=True)
while True:
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_pace_of_launch_bound_work_is_the_gpus_and_another_contexts_kernel_lengthens_it():
    x = torch.randn(4096, device="cuda")
    # a launch-bound call: its host dispatch is longer than its kernel; queued behind the spin, the GPU's time shows
    quiet = [gpu_pace_ms(lambda: torch.relu(x), 64) for _ in range(3)]
    assert all(ms is not None and 0 < ms < 0.05 for ms in quiet), quiet
    assert max(quiet) < 1.3 * min(quiet), quiet
    spinner = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline().strip() == "up"
        time.sleep(0.2)
        held = gpu_pace_ms(lambda: torch.relu(x), 64)
    finally:
        spinner.kill()
        spinner.wait()
    assert held is not None and held > 1.5 * max(quiet), (held, quiet)
