"""Rule profiles: statuses derived from measurements and findings, per profile, from the same records."""

import pytest
from conftest import REPO, make

from harness.children.attribution import _attribute_cpu, global_function_names
from harness.integrity.profiles import KNOWN_FLAGS, Profile, derive, load_profile, status_under
from harness.report.scoring import leaderboard
from harness.shared.config import ConfigError, load_config
from harness.shared.record import Status
from harness.shared.settings import IntegritySettings

profile = load_profile
CONFIGS = REPO / "configs"


def test_every_shipped_profile_loads_and_names_known_findings():
    names = {path.stem for path in CONFIGS.glob("*.yaml")}
    assert {"default", "strict", "fusion", "kernelbench-legacy"} <= names
    for name in names:
        loaded = profile(name)
        assert loaded.name == name and loaded.forbid <= set(KNOWN_FLAGS)
    assert profile("strict").grad_required and not profile("default").grad_required
    assert profile("kernelbench-legacy").tolerance == pytest.approx(1e-2)
    assert "no_custom_kernel" not in profile("kernelbench-legacy").forbid


def test_unknown_finding_in_a_profile_is_a_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("forbid: [no_custom_kernel, made_up_flag]\n")
    with pytest.raises(ConfigError, match="made_up_flag"):
        load_config(path)


def test_derive_order_failures_then_gradients_then_rules():
    default, strict = profile("default"), profile("strict")
    assert derive(Status.INCORRECT, None, {"no_custom_kernel"}, 0.5, default) == (Status.INCORRECT, None)
    assert derive(Status.PASS, None, {"library_kernels"}, 0.0, default) == (Status.PASS, None)
    assert derive(Status.PASS, Status.GRAD_MISMATCH, {"library_kernels"}, 0.0, strict)[0] == Status.GRAD_MISMATCH
    status, message = derive(Status.PASS, None, {"library_kernels", "threads"}, 0.0, strict)
    assert status == Status.RULE_VIOLATION and "library_kernels, threads" in message
    assert derive(Status.PASS, None, {"no_fusion"}, 0.0, profile("fusion"))[0] == Status.RULE_VIOLATION


def test_a_wrong_backward_fails_by_default_and_a_missing_graph_where_gradients_are_required():
    """An output with a graph whose gradients are wrong trains silently wrong: grad_mismatch under every profile that
    checks gradients. An output with no graph (a forward-only kernel) fails loudly in backward: no_grad is a status
    only where gradients are required; profiles that never check gradients fail neither."""
    default, required, strict = profile("default"), profile("grad-required"), profile("strict")
    for rules in (default, required, strict):
        assert derive(Status.PASS, Status.GRAD_MISMATCH, set(), 0.0, rules)[0] == Status.GRAD_MISMATCH
    assert derive(Status.PASS, Status.NO_GRAD, set(), 0.0, default) == (Status.PASS, None)
    assert derive(Status.PASS, Status.NO_GRAD, set(), 0.0, required)[0] == Status.NO_GRAD
    assert derive(Status.PASS, Status.NO_GRAD, set(), 0.0, strict)[0] == Status.NO_GRAD
    for name in ("forward-only", "kernelbench-legacy"):
        for failure in (Status.GRAD_MISMATCH, Status.NO_GRAD):
            assert derive(Status.PASS, failure, set(), 0.0, profile(name))[0] == Status.PASS, name
    assert derive(Status.INCORRECT, Status.GRAD_MISMATCH, set(), 0.5, default)[0] == Status.INCORRECT
    loose = IntegritySettings.from_config(load_config(None, {"grad_mismatch_fails": False}))
    assert not Profile.from_settings(loose).mismatch_fails


def test_legacy_tolerance_rederives_value_verdicts_only():
    legacy = profile("kernelbench-legacy")
    assert derive(Status.INCORRECT, None, set(), 5e-3, legacy)[0] == Status.PASS
    assert derive(Status.INCORRECT, None, set(), 5e-2, legacy)[0] == Status.INCORRECT
    assert derive(Status.INCORRECT, None, {"timed_output_mismatch"}, 1e-9, legacy)[0] == Status.INCORRECT
    assert derive(Status.SHAPE_MISMATCH, None, set(), None, legacy)[0] == Status.SHAPE_MISMATCH


def test_leaderboard_per_profile_from_the_same_records():
    records = [make(Status.PASS, speedup=2.0, check_status=Status.PASS, flags=("library_kernels",)),
               make(Status.PASS, speedup=1.5, check_status=Status.PASS, flags=()),
               make(Status.RULE_VIOLATION, speedup=3.0, check_status=Status.PASS, flags=("no_custom_kernel",)),
               make(Status.INCORRECT, check_status=Status.INCORRECT, flags=(), tolerance_needed=3e-3)]
    assert status_under(records[0], profile("strict")) == Status.RULE_VIOLATION
    as_run = leaderboard(records).iloc[0]
    strict = leaderboard(records, profile("strict")).iloc[0]
    legacy = leaderboard(records, profile("kernelbench-legacy")).iloc[0]
    assert (as_run["pass"], strict["pass"], legacy["pass"]) == (2, 1, 4)
    assert legacy["fast_1"] == pytest.approx(3 / 4)   # the rescued record was never timed: it is not fast


def test_own_kernel_names_from_sources():
    source = """
    template <typename T> __global__ void __launch_bounds__(256) scale_kernel(const T* x) {}
    extern "C" __global__ void plain(float* y, int n) {}
    __device__ float helper(float v) { return v; }
    """
    assert global_function_names([source]) == {"scale_kernel", "plain"}


def test_cpu_attribution_counts_top_level_work_and_ignores_views():
    def op(name, ts, dur, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": 1}
    events = [op("ext::relu", 0, 100, "user_annotation"), op("aten::empty_like", 10, 5), op("aten::add", 20, 30),
              op("aten::view", 200, 2), op("aten::linear", 300, 50), op("aten::addmm", 310, 30)]
    result = _attribute_cpu(events)
    assert (result.library, sorted(result.library_names)) == (2, ["aten::add", "aten::linear"])
    assert result.own_ms == pytest.approx((100 - 30) / 1e3)


def test_cpu_attribution_looks_through_python_autograd_functions():
    """A torch.autograd.Function's forward shows as an op named after its class: the operators inside it are the
    work (library), not an operator of the submission's own; a registered `namespace::op` is its own."""
    def op(name, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": 1}
    wrapped = _attribute_cpu([op("LinearFn", 0, 100), op("aten::matmul", 10, 60), op("aten::add", 75, 20)])
    assert (wrapped.own, wrapped.library, sorted(wrapped.library_names)) == (0, 2, ["aten::add", "aten::matmul"])
    registered = _attribute_cpu([op("myops::fused", 0, 100), op("aten::empty", 10, 5)])
    assert (registered.own, registered.library) == (1, 0)
