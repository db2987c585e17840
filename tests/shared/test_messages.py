"""Typed messages: what a child may send is accepted only in its documented shape (the candidate's is hostile)."""
import json
import math

import pytest
import torch

from harness.shared import protocol
from harness.shared.messages import (
    Audit,
    BaselineReady,
    BlockReport,
    CandidateResult,
    Checked,
    Compiled,
    Failed,
    Feed,
    FreshTimed,
    GpuDone,
    KernelCounts,
    Malformed,
    Pace,
    PeaksReady,
    ProblemCheckReady,
    Product,
    Rates,
    ReferenceGrad,
    ReferenceOutput,
    ReferenceReady,
    Roofline,
    Signal,
    Spots,
    Truth,
    Warm,
    nonnegative,
    reported_findings,
)

FLAGS = {"patched_runtime": "replaced: torch.allclose", "mutates_inputs": "forward changed input(s) [0]"}
COUNTS = KernelCounts(own=3, library=1, own_share=0.75, library_summary="gemm x1", side_streams=(7, 9))

# One message of each type a child sends, with every field set away from its default where it has one.
SENT = [
    Failed("compile_error", "RuntimeError: nvcc failed", 2.5),
    Failed("runtime_error", "ValueError: bad"),
    Audit("socket.connect", "('1.2.3.4', 80)"),
    Compiled(1.5, 2, reused=1, clock={"main": 1.7e9, "prepared": 1.7e9 + 0.4}, light_built=1, light_failed=1,
             flags=FLAGS),
    Compiled(3.0, 1, cpu_s=9.5, products={"abc123": Product("ext", "/tmp/build/ext.so")}),
    Checked(COUNTS, {"model": 0.1, "correctness": 0.2, "gradients": 0.0, "profile": 0.3, "result_save": 0.05},
            FLAGS),
    Checked(None),
    Warm(0.5, "events, device sync", "capture failed", launch_ms=0.02, flags=FLAGS),
    FreshTimed(0.2, (0.05, 0.06), FLAGS),
    FreshTimed(0.7, (0.05,), FLAGS, calls=14, synced_ms=0.74),
    FreshTimed(0.7, (0.05, 0.05), FLAGS, calls=14, synced_ms=0.79, near_gaps_ms=(0.04, 0.06)),
    Spots(FLAGS),
    Spots(),
    Pace(0.031),
    Pace(None),
    GpuDone("float32:131072"),
    GpuDone(),
    ReferenceReady(device_name="NVIDIA H100", metadata={"atol": 1e-3, "check_grad": True}, check_grad=True,
                   ref_kernels=4, roofline=Roofline(2e9, 4e6, Rates(3000.0, 50.5)), floor_ms=0.04,
                   began=1.7e9, steps={"load": 0.5, "outputs": 0.25}, rates_key="float32:131072",
                   rates_measured=False, timing_sets=2),
    PeaksReady("NVIDIA H100", bandwidth_gbps=3000.5, fp32_tflops=51.25, copy_bytes=2 << 30, matmul_size=8192),
    BaselineReady("cpu", flops=0, bytes=4096,
                  modes={"eager": {"median_ms": 0.5, "reps": 12}, "compile": {"error": "BackendCompilerFailed: x"}}),
    ProblemCheckReady(device_name="cpu", metadata={"atol": 1e-3, "check_grad": True},
                      inputs=("(16, 8) float32", "3"),
                      outputs=(ReferenceOutput((16, 8), "float32", finite=False, zero_passes=False,
                                               constant_passes=True, repeat_agrees=True, repeat_bitwise=False,
                                               std=math.inf),
                               ReferenceOutput((4,), "int64", True, True, False, True, True, None),
                               ReferenceOutput(None, "NoneType")),
                      eager_ms=0.25, eager_iqr_ms=0.01, tensor_mb=1.5, peak_mb=None,
                      grad=ReferenceGrad(True, False, ("bias", "weight"))),
]


@pytest.mark.parametrize("message", SENT, ids=lambda m: type(m).__name__)
def test_what_a_child_sends_the_parent_reads_back_unchanged(message):
    """Both sides use the same dataclass: to_event is from_event's inverse, through the JSON of the pipe."""
    event = json.loads(json.dumps(message.to_event()))
    assert event["event"] == message.EVENT
    assert type(message).from_event(event) == message


def test_a_timing_block_and_kernel_counts_read_back_unchanged():
    block = BlockReport((1.0, 2.5, 0.75), events_ms=4.5, outside_ms=0.1, launch_ms=0.3, flags=FLAGS)
    assert BlockReport.from_event(json.loads(json.dumps(block.to_event())), reps=3) == block
    several = BlockReport((0.004, 0.005), events_ms=0.08, outside_ms=0.1, synced=(0.006, 0.007), calls_per_span=8,
                          null_gaps=(0.033, 0.034, 0.031))
    assert BlockReport.from_event(json.loads(json.dumps(several.to_event())), reps=2) == several
    assert KernelCounts.from_event(json.loads(json.dumps(COUNTS.to_event()))) == COUNTS


def test_bare_events_carry_their_name():
    assert Signal(protocol.IMPORTED).to_event() == {"event": protocol.IMPORTED}


def test_the_baseline_and_problem_check_reports_keep_what_the_parent_stores_and_reads():
    peaks = PeaksReady("cpu", bandwidth_gbps=20.0, fp32_tflops=0.5, copy_bytes=1 << 29, matmul_size=2048)
    assert peaks.peaks() == {"bandwidth_gbps": 20.0, "fp32_tflops": 0.5, "copy_bytes": 1 << 29, "matmul_size": 2048}
    assert peaks.to_event()["peaks"] == peaks.peaks()   # the baselines file's `peaks`, as the child measured them
    check = SENT[-1]
    event = json.loads(json.dumps(check.to_event()))
    assert event["outputs"][0]["shape"] == [16, 8] and event["outputs"][2]["finite"] is None
    assert ProblemCheckReady.from_event(event).outputs[0].shape == (16, 8)


@pytest.mark.parametrize("kind, event", [
    (PeaksReady, {"device_name": "cpu"}),
    (PeaksReady, {"device_name": "cpu", "peaks": {"bandwidth_gbps": -1, "fp32_tflops": 1, "copy_bytes": 1,
                                                  "matmul_size": 1}}),
    (BaselineReady, {"device_name": "cpu", "flops": 1, "bytes": 1}),
    (BaselineReady, {"device_name": "cpu", "flops": 1, "bytes": 1, "modes": {"eager": {"reps": 3}}}),
    (BaselineReady, {"device_name": "cpu", "flops": 1.5, "bytes": 1, "modes": {}}),
    (ProblemCheckReady, {"device_name": "cpu", "metadata": {}, "inputs": [], "outputs": [{"dtype": "x"}],
                         "eager_ms": 1.0, "eager_iqr_ms": 0.0, "tensor_mb": 1.0, "peak_mb": None}),
    (ProblemCheckReady, {"device_name": "cpu", "metadata": {}, "inputs": [], "outputs": [{"shape": "16"}],
                         "eager_ms": 1.0, "eager_iqr_ms": 0.0, "tensor_mb": 1.0, "peak_mb": None,
                         "grad": {"checked": False}}),
    (ProblemCheckReady, {"device_name": "cpu", "metadata": {}, "inputs": [], "outputs": [{"finite": "yes"}],
                         "eager_ms": 1.0, "eager_iqr_ms": 0.0, "tensor_mb": 1.0, "peak_mb": None,
                         "grad": {"checked": False}}),
])
def test_a_report_without_its_documented_shape_is_refused(kind, event):
    with pytest.raises(Malformed):
        kind.from_event(event)


def test_the_feed_reads_back_and_a_broken_one_is_refused():
    feed = Feed(init_inputs=[16], state_dict={"w": torch.ones(2)}, trials=[[torch.zeros(2)], [torch.ones(2)]],
                grad_outputs=[None, {"shape": [2, 3], "dtype": "bfloat16"}], grad_seed=42)
    assert Feed.from_file(feed.to_file()) == feed
    for broken in (None, [1], {**feed.to_file(), "trials": "x"}, {**feed.to_file(), "trials": [1]},
                   {k: v for k, v in feed.to_file().items() if k != "state_dict"},
                   {**feed.to_file(), "grad_outputs": [torch.ones(2)]},   # a spec, never a tensor
                   {**feed.to_file(), "grad_outputs": [{"shape": [2], "dtype": "int64"}]},
                   {**feed.to_file(), "grad_outputs": [{"shape": [-1], "dtype": "float32"}]},
                   {**feed.to_file(), "grad_seed": "42"}):
        with pytest.raises(Malformed):
            Feed.from_file(broken)


def test_nonnegative_accepts_only_finite_numbers_at_or_above_zero():
    assert nonnegative(3) == 3.0 and isinstance(nonnegative(3), float)
    assert nonnegative(0.5) == 0.5
    for bad in (True, -1, math.nan, math.inf, "1", None, [1]):
        assert nonnegative(bad) is None


def test_compiled_keeps_valid_products_and_drops_the_rest():
    event = {"compile_s": 2.5, "extensions_built": 2, "reused": 1, "cpu_s": 7.0, "products": {
        "abc123": {"module": "ext", "file": "/tmp/b/ext.so"},
        "../x": {"module": "ext", "file": "/tmp/b/ext.so"},          # not a cache-safe key
        "def456": {"module": "not an identifier", "file": "/x.so"},
        "f00": "not a mapping"}}
    compiled = Compiled.from_event(event)
    assert (compiled.compile_s, compiled.extensions_built, compiled.reused, compiled.cpu_s) == (2.5, 2, 1, 7.0)
    assert list(compiled.products) == ["abc123"] and compiled.products["abc123"].module == "ext"


@pytest.mark.parametrize("field, value", [("extensions_built", "2"), ("extensions_built", -1), ("reused", True)])
def test_compiled_rejects_forged_counts(field, value):
    with pytest.raises(Malformed):
        Compiled.from_event({"compile_s": 1.0, "extensions_built": 1, field: value})


def test_compiled_without_a_valid_time_records_none():
    assert Compiled.from_event({"compile_s": "fast", "extensions_built": 0}).compile_s is None


def test_failed_and_audit_cut_what_they_carry():
    failed = Failed.from_event({"status": "compile_error", "error": "x" * 1000, "compile_s": -3})
    assert failed.status == "compile_error" and len(failed.error) == 400 and failed.compile_s is None
    assert Audit.from_event({"what": "socket.connect", "detail": "y" * 500}).line() == "socket.connect: " + "y" * 120


def test_reported_findings_keep_only_known_names():
    event = {"flags": {"patched_runtime": "z" * 1000, "made_up": "x"}}
    found = reported_findings(event, {"patched_runtime": "..."})
    assert list(found) == ["patched_runtime"] and len(found["patched_runtime"]) == 300
    assert reported_findings({"flags": ["patched_runtime"]}, {"patched_runtime": "..."}) == {}


def test_kernel_counts_validate_every_field():
    counts = KernelCounts.from_event({"own": 1, "library": 2, "own_share": 0.25, "library_summary": "gemm x2",
                                      "side_streams": [7]})
    assert (counts.own, counts.library, counts.own_share, counts.side_streams) == (1, 2, 0.25, (7,))
    for bad in (None, {"own": "1", "library": 0}, {"own": 1, "library": 0, "own_share": 1.5},
                {"own": 1, "library": 0, "side_streams": ["s"]}):
        with pytest.raises(Malformed):
            KernelCounts.from_event(bad)


def test_timing_events():
    warm = Warm.from_event({"per_call_ms": 0.5, "method": "events, device sync", "graph_error": None})
    assert (warm.per_call_ms, warm.method, warm.graph_error) == (0.5, "events, device sync", None)
    block = BlockReport.from_event({"samples": [1.0, 2], "events_ms": 3.0, "outside_ms": 0.1}, reps=2)
    assert block.samples == (1.0, 2.0) and block.calls_per_span == 1   # a side that does not say held one call
    for forged in (0, -1, True, "8", 2.5, None):   # a whole number of calls, at least one
        with pytest.raises(Malformed, match="calls_per_span"):
            BlockReport.from_event({"samples": [1.0], "events_ms": 1.0, "outside_ms": 0.0, "calls_per_span": forged},
                                   reps=1)
    assert block.null_gaps == ()   # a side that timed no null spans
    for forged in ([-0.01], "0.03", [0.01] * (BlockReport.NULL_MAX + 1), [None]):
        with pytest.raises(Malformed, match="null span"):
            BlockReport.from_event({"samples": [1.0], "events_ms": 1.0, "outside_ms": 0.0, "null_gaps": forged},
                                   reps=1)
    long_method = "cuda_graph, stream end, checked, 64 calls a span, 8 placements"
    assert Warm.from_event({"per_call_ms": 0.5, "method": long_method, "graph_error": None}).method == long_method
    with pytest.raises(Malformed, match="block"):
        BlockReport.from_event({"samples": [1.0], "events_ms": 1.0, "outside_ms": 0.0}, reps=2)
    with pytest.raises(Malformed, match="sample"):
        BlockReport.from_event({"samples": [1.0, -2.0], "events_ms": 1.0, "outside_ms": 0.0}, reps=2)
    with pytest.raises(Malformed, match="per_call_ms"):
        Warm.from_event({"per_call_ms": math.nan})
    fresh = FreshTimed.from_event({"ms": 0.2, "near_ms": [0.05, 0.06, 0.05]})
    assert (fresh.ms, fresh.near_ms) == (0.2, (0.05, 0.06, 0.05))
    assert FreshTimed.from_event({"ms": 0.2}).near_ms == ()   # evidence only: may be absent
    for near in ("0.05", [0.05] * 17, [-1.0], [math.inf]):
        with pytest.raises(Malformed):
            FreshTimed.from_event({"ms": 0.2, "near_ms": near})
        with pytest.raises(Malformed, match="near_gaps_ms"):
            FreshTimed.from_event({"ms": 0.2, "near_gaps_ms": near})
    assert FreshTimed.from_event({"ms": 0.2}).near_gaps_ms == ()


def _result(**changes):
    base = {"outputs": [[torch.ones(2)], [torch.ones(2)]], "repeat": [torch.ones(2)], "weights_loaded": 3,
            "has_graph": True, "input_grads": [None], "param_grads": {"w": torch.ones(1)}, "grad_error": None}
    base.update(changes)
    return base


def test_candidate_result_accepts_the_child_s_shape():
    result = CandidateResult.from_file(_result(), trials=2)
    assert result.weights_loaded == 3 and result.has_graph is True and len(result.outputs) == 2


@pytest.mark.parametrize("changes", [{"outputs": [[torch.ones(2)]]}, {"outputs": "x"}, {"repeat": None},
                                     {"weights_loaded": -1}, {"has_graph": "yes"}, {"input_grads": {}},
                                     {"param_grads": {1: torch.ones(1)}}])
def test_candidate_result_rejects_a_forged_file(changes):
    with pytest.raises(Malformed):
        CandidateResult.from_file(_result(**changes), trials=2)
    with pytest.raises(Malformed):
        CandidateResult.from_file(["not", "a", "mapping"], trials=2)


def test_a_result_whose_trial_0_came_apart_holds_the_other_trials_and_never_trial_0_twice():
    first = [torch.zeros(2)]
    result = CandidateResult.from_file(_result(outputs=[[torch.ones(2)]], first_apart=True), trials=2, first=first)
    assert len(result.outputs) == 2 and result.outputs[0] is first
    for changes, handed in (({"first_apart": True}, first),                 # trial 0 held twice
                            ({}, first),                                    # handed over, and held in the result
                            ({"outputs": [[torch.ones(2)]], "first_apart": True}, None),   # said apart, never came
                            ({"outputs": [[torch.ones(2)]], "first_apart": True}, "not a list"),
                            ({"outputs": [[torch.ones(2)]], "first_apart": True, "stopped": True}, first)):
        with pytest.raises(Malformed):
            CandidateResult.from_file(_result(**changes), trials=2, first=handed)


def test_reference_ready_and_truth():
    ready = ReferenceReady.from_event({"device_name": "cpu", "metadata": {"atol": None}, "check_grad": True,
                                       "ref_kernels": 4, "flops": 2e9, "bytes": 4e6, "floor_ms": 0.1,
                                       "rates": {"bandwidth_gbps": 20.0, "fp32_tflops": 0.1}})
    assert ready.roofline.rates.bandwidth_gbps == 20.0 and ready.ref_kernels == 4 and ready.floor_ms == 0.1
    with pytest.raises(Malformed):
        ReferenceReady.from_event({"device_name": "cpu", "metadata": {}, "ref_kernels": 1, "flops": 1, "bytes": 1})
    truth = Truth.from_file({"outputs": [[torch.zeros(1)]], "input_grads": None, "param_grads": None,
                             "has_graph": False})
    assert truth.input_grads == [] and truth.param_grads == {} and truth.has_graph is False
    with pytest.raises(Malformed):
        Truth.from_file({"outputs": None})


def test_flags_ride_on_every_candidate_event_and_only_known_names_are_kept():
    for message in (Compiled(1.0, 0, flags=FLAGS), Checked(None, flags=FLAGS), Warm(1.0, "m", None, flags=FLAGS),
                    BlockReport((1.0,), 1.0, 0.0, flags=FLAGS), Spots(FLAGS), FreshTimed(1.0, flags=FLAGS)):
        assert reported_findings(message.to_event(), {"patched_runtime": "..."}) == {
            "patched_runtime": FLAGS["patched_runtime"]}


def test_checked_leaves_out_what_it_cannot_read_without_rejecting_the_event():
    checked = Checked.from_event({"kernels": {"own": "many"}, "seconds": {"model": -1, "profile": 0.5, "x": 1.0},
                                  "flags": "no"})
    assert checked == Checked(None, {"profile": 0.5}, {})


def test_a_forged_pace_or_gpu_done_is_refused_or_dropped():
    with pytest.raises(Malformed, match="GPU pace"):
        Pace.from_event({"ms": -1.0})
    assert GpuDone.from_event({"rates_key": 5}).rates_key is None
