"""Who did the work on the CPU device: operators the submission registered against torch's own."""
import torch

from harness.children import attribution


def _op(name: str, ts: int, dur: int = 10) -> dict:
    return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": 1, "ph": "X"}


def test_only_an_operator_registered_after_torch_s_own_counts_as_the_submission_s():
    # torch.ops.prims.maximum is torch's (a pure-PyTorch forward through it passed as a custom kernel before);
    # an operator in a namespace torch never registered is the submission's TORCH_LIBRARY
    assert {"aten::relu", "prims::maximum"} <= attribution.TORCH_OPS
    assert "my_submission::relu" not in attribution.TORCH_OPS
    events = [_op("prims::maximum", 0), _op("aten::maximum", 1, 5),   # nested: counted through its parent
              _op("aten::relu", 20), _op("my_submission::relu", 40)]
    profile = attribution._attribute_cpu(events)
    assert profile.own == 1 and profile.library == 2
    assert sorted(profile.library_names) == ["aten::relu", "prims::maximum"]


@torch.library.custom_op("harness_test_attribution::relu", mutates_args=())
def _python_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp_min(x, 0.0)


def test_an_operator_registered_from_python_is_looked_through_to_the_operators_it_runs():
    # torch.library.custom_op around torch's own operators registers a namespaced operator with no native code of
    # the submission's in it (fixture 36 passed as a custom kernel); a native TORCH_LIBRARY kernel's registration
    # names its C++ source
    name = "harness_test_attribution::relu"
    assert attribution.python_operator(name) and not attribution.python_operator("aten::relu")
    assert not attribution.python_operator("never_registered::op")
    profile = attribution._attribute_cpu([_op(name, 0, 20), _op("aten::clamp_min", 2, 10)])
    assert profile.own == 0 and profile.library_names == {"aten::clamp_min": 1}
