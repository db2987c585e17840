"""The GPU's pace with the host ahead (harness/children/oracle/pace.py): what tells a host that slowed a launch-bound
reference from a GPU that another context held."""
import subprocess
import sys
import time

import pytest
import torch

from harness.children.oracle.pace import gpu_pace_ms


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_without_cuda_the_pace_is_not_told():
    assert gpu_pace_ms() is None


SPINNER = """
import sys, torch
torch.cuda._sleep(1000)
torch.cuda.synchronize()
print("up", flush=True)
while True:   # a kernel that never ends, near enough (about 50 ms each, back to back)
    torch.cuda._sleep(100_000_000)
    torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpus_pace_is_steady_alone_and_another_contexts_work_lengthens_it():
    quiet = [gpu_pace_ms() for _ in range(3)]
    assert all(ms is not None and ms > 0 for ms in quiet), quiet
    assert max(quiet) < 1.1 * min(quiet), quiet
    spinner = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline().strip() == "up"
        time.sleep(0.2)
        held = gpu_pace_ms()
    finally:
        spinner.kill()
        spinner.wait()
    assert held is not None and held > 1.3 * max(quiet), (held, quiet)
