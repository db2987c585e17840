"""The roofline floor: the larger of moving the bytes at the bandwidth and doing the FLOPs at the rate."""
import pytest
import torch

from harness.oracle.roofline import count_flops, floor_ms, tensor_bytes

RATES = {"bandwidth_gbps": 20.0, "fp32_tflops": 1.0}   # 2e7 bytes and 1e9 FLOPs per millisecond


def test_the_floor_is_the_slower_of_memory_and_compute():
    assert floor_ms(flops=2e9, nbytes=4e6, rates=RATES) == pytest.approx(2.0)    # compute: 2e9 / 1e9 per ms
    assert floor_ms(flops=1e6, nbytes=1e8, rates=RATES) == pytest.approx(5.0)    # memory: 1e8 / 2e7 per ms
    assert floor_ms(flops=0, nbytes=0, rates=RATES) == 0.0


def test_a_linear_forward_counts_two_flops_per_multiply_add():
    layer = torch.nn.Linear(32, 16)   # K = 32, N = 16
    x = torch.randn(8, 32)            # M = 8
    assert count_flops(lambda: layer(x)) == 2 * 8 * 16 * 32


def test_tensor_bytes_sum_over_nested_containers_and_skip_non_tensors():
    values = [torch.zeros(3), {"half": torch.zeros(2, dtype=torch.float16), "n": 5},
              (torch.zeros(4, dtype=torch.int64), "text", None)]
    assert tensor_bytes(values) == 3 * 4 + 2 * 2 + 4 * 8
    assert tensor_bytes(7) == 0
