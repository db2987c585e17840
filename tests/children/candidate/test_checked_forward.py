"""The checked forwards in the candidate's process (harness/children/candidate/main.py `_forward`, `unsafe_check`): an
input the call changed is named, whichever way its bits are compared (on the CPU against the feed's own tensors; on a
GPU against trial 0's resident copy or a copy made there before the call, or on the host where the GPU has no room
for one), and every trial's outputs come back as the host tensors the parent reads."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.children.candidate import main
from harness.children.runtime import draw_grad_outputs
from harness.shared.findings import MUTATES_INPUTS
from harness.shared.messages import Feed


class InPlace(nn.Module):   # computes on its second input in place
    def forward(self, x, y, scale):
        y.mul_(2)
        return x + y


class InPlaceWithoutGrad(nn.Module):   # the same values; in place only where no graph is recorded
    def forward(self, x, y, scale):
        if torch.is_grad_enabled():
            return x + 2 * y
        y.mul_(2)
        return x + y


class Honest(nn.Module):
    def forward(self, x, y, scale):
        return x + y


class NegativeZero(nn.Module):   # -0.0 == 0.0 as values, not as bits: what a caller could notice
    def forward(self, x, y, scale):
        y.mul_(-1.0)
        return x


def _inputs() -> list:
    return [torch.randn(64, 32), torch.randn(64, 32), 3]


def _checked(model: nn.Module, device: str, inputs: list) -> tuple[dict, list]:
    flags: dict[str, str] = {}
    outputs = main._forward(model, inputs, device, flags)
    return flags, outputs


def test_cpu_compares_with_the_feed_itself():
    inputs = _inputs()
    handed = main.to_device(inputs, "cpu")
    before = main._as_handed(handed, inputs, "cpu")
    assert before is inputs   # nothing copied on the CPU: the call got copies, the feed is the untouched one


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_changed_input_is_named(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    inputs = _inputs()
    feed = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    flags, outputs = _checked(InPlace(), device, inputs)
    assert flags[MUTATES_INPUTS] == "forward changed input(s) [1]"
    assert outputs[0].device.type == "cpu" and torch.equal(outputs[0], (inputs[0] + 2 * inputs[1]).to(outputs[0]))
    assert all(torch.equal(a, b) for a, b in zip(inputs[:2], feed[:2]))   # the feed itself is untouched
    flags, _ = _checked(Honest(), device, inputs)
    assert MUTATES_INPUTS not in flags
    flags, _ = _checked(NegativeZero(), device, [inputs[0], torch.zeros(64, 32), 3])
    assert flags[MUTATES_INPUTS] == "forward changed input(s) [1]"


@pytest.mark.gpu
def test_gpu_without_room_for_a_copy_compares_on_the_host(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    inputs = _inputs()
    handed = main.to_device(inputs, "cuda")
    assert main._as_handed(handed, inputs, "cuda") is not None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *args: (0, 1))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *args: 0)
    assert main._as_handed(handed, inputs, "cuda") is None
    assert main._resident(inputs, "cuda") is inputs
    flags, _ = _checked(InPlace(), "cuda", inputs)
    assert flags[MUTATES_INPUTS] == "forward changed input(s) [1]"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_trial_is_checked_from_its_own_inputs_and_trial_0_stays_as_drawn(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    trials = [_inputs() for _ in range(3)]
    drawn = [[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs] for inputs in trials]
    feed = Feed(init_inputs=[], state_dict={}, trials=trials, grad_outputs=[{"shape": [64, 32], "dtype": "float32"}],
                grad_seed=5)
    first = main._resident(feed.trials[0], device)
    assert (first is feed.trials[0]) == (device == "cpu")   # on the CPU the calls copy from the feed itself
    flags: dict[str, str] = {}
    result = main.unsafe_check(InPlaceWithoutGrad(), feed, device, True, flags, first=first)
    assert flags[MUTATES_INPUTS] == "forward changed input(s) [1]"
    expected = [inputs[0] + 2 * inputs[1] for inputs in drawn]
    assert [len(outputs) for outputs in result["outputs"]] == [1, 1, 1]
    for outputs, wanted in zip(result["outputs"], expected):
        assert outputs[0].device.type == "cpu" and torch.allclose(outputs[0], wanted)
    assert torch.allclose(result["repeat"][0], expected[0])   # the repeat got trial 0 as drawn, not as mutated
    (grad_output,) = draw_grad_outputs(feed.grad_outputs, feed.grad_seed, device)   # the one the backward drew
    assert result["has_graph"] and torch.allclose(result["input_grads"][1], 2 * grad_output.cpu())
    for mine, theirs in zip(first[:2], drawn[0][:2]):   # trial 0's source is untouched by the four calls
        assert torch.equal(mine.cpu(), theirs)


class Counted(nn.Module):   # x + y, or its transpose: the calls counted
    def __init__(self, transpose: bool):
        super().__init__()
        self.transpose, self.calls = transpose, 0

    def forward(self, x, y, scale):
        self.calls += 1
        return (x + y).t() if self.transpose else x + y


def test_a_first_trial_of_another_shape_ends_the_checks_and_one_of_the_same_runs_them_all():
    from harness.shared.check import output_signature

    feed = Feed(init_inputs=[], state_dict={}, trials=[_inputs() for _ in range(3)], grad_outputs=[], grad_seed=5)
    expected = output_signature([torch.zeros(64, 32)])
    wrong = Counted(transpose=True)
    result = main.unsafe_check(wrong, feed, "cpu", True, {}, expected=expected)
    assert wrong.calls == 1 and result["stopped"] is True and result["repeat"] == []
    assert [outputs[0].shape for outputs in result["outputs"]] == [(32, 64)]   # trial 0's outputs, all it decides
    right = Counted(transpose=False)
    result = main.unsafe_check(right, feed, "cpu", True, {}, expected=expected)
    assert right.calls == 3 + 1 + 1 and "stopped" not in result and len(result["outputs"]) == 3   # and the backward
    assert output_signature([torch.zeros(2, 3, dtype=torch.float16), 4]) == (((2, 3), "torch.float16"), None)
