import logging

import pytest
import torch

from harness.judge import compare_on
from harness.judge.compare_on import comparison_device, visible_index
from harness.shared.config import Config


def test_a_workers_gpu_id_maps_to_this_processs_index():
    assert visible_index("1", None) == 1
    assert visible_index("3", "2,3") == 1          # this process sees GPUs 2 and 3 as 0 and 1
    assert visible_index("GPU-abc", "GPU-xyz, GPU-abc") == 1
    assert visible_index("5", "2,3") is None       # not among them: the CPU compares
    assert visible_index("GPU-abc", None) is None  # a UUID cannot be mapped without the list


def test_off_or_on_the_cpu_device_the_cpu_compares():
    assert Config().compare_on_gpu   # on by default since it was measured (docs/performance.md)
    assert comparison_device(Config(compare_on_gpu=False), "cuda", {"CUDA_VISIBLE_DEVICES": "0"}) is None
    assert comparison_device(Config(compare_on_gpu=True), "cpu", None) is None


def test_a_gpu_this_process_cannot_use_leaves_the_cpu_comparing_with_the_reason_logged(monkeypatch, caplog):
    monkeypatch.setattr(compare_on, "_DEVICES", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with caplog.at_level(logging.WARNING, logger="harness.judge.compare_on"):
        assert comparison_device(Config(compare_on_gpu=True), "cuda", {"CUDA_VISIBLE_DEVICES": "7"}) is None
        assert comparison_device(Config(compare_on_gpu=True), "cuda", {"CUDA_VISIBLE_DEVICES": "7"}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "comparisons stay on the CPU for GPU 7: GPU '7' is not among this process's (0)"]


def test_the_switch_is_operational_not_part_of_the_config_hash():
    assert Config(compare_on_gpu=False).hash() == Config().hash()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_machine_the_workers_gpu_is_used(monkeypatch):
    monkeypatch.setattr(compare_on, "_DEVICES", {})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert comparison_device(Config(compare_on_gpu=True), "cuda", {"CUDA_VISIBLE_DEVICES": "0"}) == torch.device(
        "cuda", 0)
