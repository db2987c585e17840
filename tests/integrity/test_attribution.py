"""Who did the work on the CPU device: operators the submission registered against torch's own."""
from harness.integrity import attribution


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
