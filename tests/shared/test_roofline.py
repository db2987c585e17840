"""The roofline floor: the larger of moving the bytes at the bandwidth and doing the FLOPs at the rate."""
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from harness.shared.roofline import count_flops, floor_ms
from harness.shared.sizes import tensor_bytes

RATES = {"bandwidth_gbps": 20.0, "fp32_tflops": 1.0}   # 2e7 bytes and 1e9 FLOPs per millisecond


def test_the_floor_is_the_slower_of_memory_and_compute():
    assert floor_ms(flops=2e9, nbytes=4e6, rates=RATES) == pytest.approx(2.0)    # compute: 2e9 / 1e9 per ms
    assert floor_ms(flops=1e6, nbytes=1e8, rates=RATES) == pytest.approx(5.0)    # memory: 1e8 / 2e7 per ms
    assert floor_ms(flops=0, nbytes=0, rates=RATES) == 0.0


def test_a_linear_forward_counts_two_flops_per_multiply_add():
    layer = torch.nn.Linear(32, 16)   # K = 32, N = 16
    x = torch.randn(8, 32)            # M = 8
    assert count_flops(lambda: layer(x)) == 2 * 8 * 16 * 32


def test_flops_agree_with_torchs_counter_and_import_no_compiler():
    from torch.utils.flop_counter import FlopCounterMode

    conv, q = torch.nn.Conv2d(3, 8, 3), torch.randn(2, 4, 16, 8)
    forwards = [lambda: conv(torch.randn(2, 3, 12, 12)),
                lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q),   # no formula on CPU: 0 both
                lambda: torch.bmm(torch.randn(3, 4, 5), torch.randn(3, 5, 6)).relu().sum()]
    for forward in forwards:
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            forward()
        assert count_flops(forward) == counter.get_total_flops()
    assert count_flops(forwards[0]) == 2 * 2 * 8 * 10 * 10 * 3 * 3 * 3
    # torch's counter imports torch._dynamo (1.2 CPU s in every reference process); this one does not
    script = ("import sys, torch; from harness.shared.roofline import count_flops; "
              "count_flops(lambda: torch.nn.Linear(4, 4)(torch.ones(2, 4))); print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "False"


def test_tensor_bytes_sum_over_nested_containers_and_skip_non_tensors():
    values = [torch.zeros(3), {"half": torch.zeros(2, dtype=torch.float16), "n": 5},
              (torch.zeros(4, dtype=torch.int64), "text", None)]
    assert tensor_bytes(values) == 3 * 4 + 2 * 2 + 4 * 8
    assert tensor_bytes(7) == 0


def test_problems_of_one_size_class_share_a_rates_measurement():
    from harness.shared.roofline import copy_elements, rates_key

    assert copy_elements(0) == 1 << 14 and copy_elements(8 << 14) == 1 << 14 and copy_elements((8 << 14) + 8) == 1 << 15
    assert copy_elements(1 << 40) == 1 << 28
    assert all(copy_elements(n) & (copy_elements(n) - 1) == 0 and copy_elements(n) >= min(n // 8, 1 << 28)
               for n in (1, 12345, 10 ** 6, 3 * 10 ** 8, 10 ** 10))
    assert rates_key(10 ** 6) == rates_key(1_048_000) == "float32:131072"
    assert rates_key(10 ** 6, torch.bfloat16) == "bfloat16:131072" != rates_key(4 * 10 ** 6)


def test_rates_handed_to_an_oracle_are_used_only_when_they_are_two_positive_numbers():
    from harness.shared.commands import handed_rates

    given = {"bandwidth_gbps": 3000, "fp32_tflops": 50.5}
    assert handed_rates(given) == {"bandwidth_gbps": 3000.0, "fp32_tflops": 50.5}
    for given in (None, "fast", {"bandwidth_gbps": 3000}, {"bandwidth_gbps": 0, "fp32_tflops": 1},
                  {"bandwidth_gbps": float("inf"), "fp32_tflops": 1}, {"bandwidth_gbps": True, "fp32_tflops": 1}):
        assert handed_rates(given) is None, given


def test_rates_kept_for_a_size_class_expire(monkeypatch):
    from types import SimpleNamespace

    from harness.oracle import reference

    monkeypatch.setattr(reference, "_RATES", {})
    measured = SimpleNamespace(rates_key="float32:16384", rates_measured=True,
                               roofline=SimpleNamespace(rates=SimpleNamespace(bandwidth_gbps=3000.0, fp32_tflops=50.0)))
    reference.remember_rates("cuda", {"CUDA_VISIBLE_DEVICES": "1"}, measured)
    assert reference.known_rates("cuda", {"CUDA_VISIBLE_DEVICES": "1"}, "float32:16384") == {
        "bandwidth_gbps": 3000.0, "fp32_tflops": 50.0}
    assert reference.known_rates("cuda", {"CUDA_VISIBLE_DEVICES": "0"}, "float32:16384") is None   # another GPU
    assert reference.known_rates("cuda", {"CUDA_VISIBLE_DEVICES": "1"}, "float32:32768") is None   # another class
    handed = SimpleNamespace(**{**vars(measured), "rates_measured": False})
    reference.remember_rates("cuda", None, handed)   # rates handed over are not measured again: nothing kept
    assert reference.known_rates("cuda", None, "float32:16384") is None
    later = reference.time.monotonic() + reference.RATES_MAX_AGE_S + 1
    monkeypatch.setattr(reference.time, "monotonic", lambda: later)
    assert reference.known_rates("cuda", {"CUDA_VISIBLE_DEVICES": "1"}, "float32:16384") is None   # measure again
