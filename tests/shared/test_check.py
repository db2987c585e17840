import pytest
import torch

from harness.oracle.reference import tolerance_for
from harness.shared import check
from harness.shared.check import (
    Tolerance,
    check_grads,
    check_outputs,
    check_repeat,
    compare,
)
from harness.shared.config import load_config
from harness.shared.messages import CandidateResult, Truth
from harness.shared.record import Status


def test_dtype_aware_defaults():
    assert Tolerance().for_dtype(torch.float32) == (1e-4, 1e-4)
    assert Tolerance().for_dtype(torch.float16) == (1e-2, 1e-2)
    assert Tolerance().for_dtype(torch.bfloat16) == (1e-2, 1e-2)
    assert Tolerance(atol=1e-3).for_dtype(torch.float32) == (1e-3, 1e-4)
    assert Tolerance.for_gradients().for_dtype(torch.float32) == (1e-3, 1e-3)
    assert Tolerance.for_gradients(rtol=0.0).for_dtype(torch.bfloat16) == (1e-2, 0.0)


def test_allclose_rule_and_errors():
    ref = torch.tensor([1.0, 0.0, -2.0])
    assert compare(ref + 0.9e-4, ref, Tolerance()).ok
    # bound per element is 1e-4 + 1e-4 * |ref|: 1.5e-4 passes at 1.0 and -2.0 but not at 0.0
    assert not compare(ref + 1.5e-4, ref, Tolerance()).ok
    assert compare(ref + torch.tensor([1.5e-4, 0, 1.5e-4]), ref, Tolerance()).ok
    result = compare(ref + torch.tensor([0, 2e-4, 0]), ref, Tolerance())
    assert not result.ok and abs(result.max_abs_error - 2e-4) < 1e-9
    assert result.max_rel_error is not None


def test_nan_and_inf_never_pass_even_against_nan():
    ref = torch.tensor([float("nan"), 1.0])
    assert not compare(ref.clone(), ref, Tolerance(atol=1e9, rtol=1e9)).ok
    assert not compare(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 1.0]), Tolerance(atol=1e9)).ok


@pytest.mark.parametrize("figures", [True, False])
def test_a_finite_value_never_passes_against_an_infinite_reference(figures):
    """|x - inf| <= atol + rtol * inf holds for every finite x: as written, the rule would pass any answer there."""
    for poison in (float("inf"), float("-inf")):
        ref = torch.tensor([1.0, poison, 2.0])
        for cand in (torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 3.4e38, 2.0]), ref.clone()):
            result = compare(cand, ref, Tolerance(atol=1e-4, rtol=1e-4), figures)
            assert not result.ok and result.max_abs_error == float("inf")
    verdict = check_outputs([[torch.zeros(3)]], [[torch.tensor([0.0, float("inf"), 0.0])]], Tolerance())
    assert verdict.status == Status.INCORRECT


def test_zero_output_fails_a_real_reference():
    ref = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    verdict = check_outputs([[torch.zeros_like(ref)]], [[ref]], Tolerance())
    assert verdict.status == Status.INCORRECT


def test_shape_then_dtype_then_values():
    ref = torch.ones(2, 3)
    assert check_outputs([[torch.ones(3, 2)]], [[ref]], Tolerance()).status == Status.SHAPE_MISMATCH
    assert check_outputs([[torch.ones(2, 3).double()]], [[ref]], Tolerance()).status == Status.DTYPE_MISMATCH
    assert check_outputs([[ref, ref]], [[ref]], Tolerance()).status == Status.SHAPE_MISMATCH
    assert check_outputs([[{"not_a_tensor": "int"}]], [[ref]], Tolerance()).status == Status.SHAPE_MISMATCH
    assert check_outputs([[ref.clone()]], [[ref]], Tolerance()).status is None


def test_repeat_must_agree():
    a = torch.ones(4)
    assert check_repeat([a], [a.clone()], Tolerance()) is None
    assert "differs" in check_repeat([a], [a + 1e-2], Tolerance())


def _truth(has_graph=True):
    return Truth(outputs=[], has_graph=has_graph, input_grads=[torch.ones(3)],
                 param_grads={"fc.weight": torch.ones(2, 2), "fc.bias": torch.ones(2)})


def _result(has_graph, input_grads=None, param_grads=None):
    """What a candidate's process reports for the gradients (the outputs do not matter here)."""
    return CandidateResult(outputs=[], repeat=[], weights_loaded=0, has_graph=has_graph, input_grads=input_grads,
                           param_grads=param_grads, grad_error=None)


def test_grads_compare_inputs_and_mapped_parameters():
    cand = _result(True, [torch.ones(3)],
                   {"fc.weight": torch.ones(2, 2), "fc.bias": torch.ones(2), "extra": torch.ones(1)})
    verdict = check_grads(cand, _truth(), Tolerance())
    assert verdict.correct is True and verdict.compared == 3 and verdict.not_comparable == ("extra",)
    cand.param_grads["fc.bias"] = torch.zeros(2)
    verdict = check_grads(cand, _truth(), Tolerance())
    assert verdict.correct is False and "fc.bias" in verdict.error


def test_missing_input_grad_and_no_graph():
    cand = _result(True, [None], {})
    assert check_grads(cand, _truth(), Tolerance()).correct is False
    assert check_grads(_result(False), _truth(), Tolerance()).correct is False
    assert check_grads(_result(False), _truth(has_graph=False), Tolerance()).correct is None


def test_a_result_file_with_fewer_entries_skips_no_check():
    """The result file is written in the candidate's process: short lists must not make a comparison vacuous."""
    assert check_grads(_result(True, [], {}), _truth(), Tolerance()).correct is False   # input 0 missing
    assert "missing" in check_grads(_result(True, None, {}), _truth(), Tolerance()).error
    assert check_repeat([torch.ones(2)], [], Tolerance()) == "the repeated input gave 0 outputs, the first run 1"
    assert check_repeat([torch.ones(2), torch.ones(2)], [torch.ones(2)], Tolerance()) is not None


def test_no_gradient_compared_is_not_measured_rather_than_correct():
    truth = Truth(outputs=[], has_graph=True, input_grads=[None], param_grads={"fc.weight": torch.ones(2, 2)})
    verdict = check_grads(_result(True, [None], {"renamed.weight": torch.ones(2, 2)}), truth, Tolerance())
    assert verdict.correct is None and verdict.compared == 0 and verdict.not_comparable == ("renamed.weight",)


def test_an_output_gets_the_looser_default_of_its_dtype_and_the_run_precision():
    fp32_run, bf16_run = Tolerance.for_outputs(), Tolerance.for_outputs(precision="bf16")
    assert fp32_run.for_dtype(torch.float32) == (1e-4, 1e-4) and fp32_run.for_dtype(torch.int64) == (1e-4, 1e-4)
    assert fp32_run.for_dtype(torch.float16) == (1e-2, 1e-2)     # a half output in an fp32 run, as before
    assert bf16_run.for_dtype(torch.float32) == (1e-2, 1e-2)     # computed from bf16 inputs and weights
    assert Tolerance.for_outputs(atol=1e-6, precision="bf16").for_dtype(torch.bfloat16) == (1e-6, 1e-2)  # set wins
    assert Tolerance.for_gradients(precision="fp16").for_dtype(torch.float32) == (1e-2, 1e-2)
    assert fp32_run.loosest([torch.ones(1), torch.ones(1, dtype=torch.float16)]) == (1e-2, 1e-2)
    assert fp32_run.loosest([torch.ones(1), {"not_a_tensor": "int"}]) == (1e-4, 1e-4)


def test_the_defaults_per_precision_come_from_the_config():
    config = load_config(None, {"precision": "bf16", "tolerances": {"bf16": {"atol": 0.05, "grad_rtol": 0.0}}})
    outputs, gradients = tolerance_for(config, {"rtol": 3e-3})   # the problem's RTOL beats the default
    assert outputs.for_dtype(torch.bfloat16) == (0.05, 3e-3)
    assert gradients.for_dtype(torch.bfloat16) == (1e-2, 0.0)
    assert tolerance_for(load_config(), {})[0].for_dtype(torch.float32) == (1e-4, 1e-4)


def test_lower_precision_inside_an_fp32_run_is_caught_and_a_bf16_run_accepts_bf16_rounding():
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 256, generator=generator), torch.randn(256, 128, generator=generator)
    fp32_run, bf16_run = Tolerance.for_outputs(), Tolerance.for_outputs(precision="bf16")
    computed_in_fp16 = (x.half() @ w.half()).float()
    assert check_outputs([[computed_in_fp16]], [[x @ w]], fp32_run).status == Status.INCORRECT
    xb, wb = x.bfloat16(), w.bfloat16()
    reference = xb @ wb
    one_step_off = (reference.view(torch.int16) + 1).view(torch.bfloat16)   # the next bf16 value, everywhere
    verdict = check_outputs([[one_step_off]], [[reference]], bf16_run)
    assert verdict.status is None and verdict.tolerance_needed > 1e-4
    assert check_outputs([[one_step_off.float()]], [[reference.float()]], fp32_run).status == Status.INCORRECT
    mismatch = check_outputs([[xb.float() @ wb.float()]], [[reference]], bf16_run)   # computed in fp32, not cast back
    assert mismatch.status == Status.DTYPE_MISMATCH and "expected torch.bfloat16" in mismatch.error


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_the_finite_fast_path_gives_the_exact_rules_figures(dtype):
    """compare() takes a shorter path for chunks without NaN or infinities; it must give what the general path
    gives, and hand every chunk with one (on either side) to the general path."""
    torch.manual_seed(0)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    ref = torch.randn(5000).to(dtype)
    ref[::7] = 0
    for cand in (ref, ref.double().add(1e-3 * torch.randn(5000, dtype=torch.float64)).to(dtype), torch.zeros_like(ref)):
        fast = check._compare_finite(cand.to(work), ref.to(work), 1e-4, 1e-4)
        assert fast == check._compare_any(cand.to(work), ref.to(work), 1e-4, 1e-4)
    for poison in (float("nan"), float("inf"), float("-inf")):
        bad = ref.clone()
        bad[3] = poison
        assert check._compare_finite(bad.to(work), ref.to(work), 1e-4, 1e-4) is None
        assert check._compare_finite(ref.to(work), bad.to(work), 1e-4, 1e-4) is None


def test_chunks_see_a_bad_value_wherever_it_sits(monkeypatch):
    monkeypatch.setattr(check, "COMPARE_CHUNK", 1000)
    ref = torch.randn(10_500)
    for index in (0, 999, 1000, 10_499):
        cand = ref.clone()
        cand[index] += 1.0
        result = compare(cand, ref, Tolerance.for_outputs())
        assert not result.ok and abs(result.max_abs_error - 1.0) < 1e-5
        cand[index] = float("nan")
        result = compare(cand, ref, Tolerance.for_outputs())
        assert not result.ok and result.tolerance_needed == float("inf")


def test_a_comparison_without_figures_gives_the_same_verdict_and_largest_error():
    torch.manual_seed(1)
    ref = torch.randn(3000)
    with_inf = ref.clone()
    with_inf[5] = float("inf")
    for cand in (ref + 1e-6, ref + 1e-2, torch.where(ref > 2, float("nan"), ref), with_inf):
        full, lean = compare(cand, ref, Tolerance.for_outputs()), compare(cand, ref, Tolerance.for_outputs(), False)
        assert (lean.ok, lean.max_abs_error) == (full.ok, full.max_abs_error)
        assert lean.max_rel_error is None and full.max_rel_error is not None


def _cases(generator):
    ref = torch.randn(40_000, generator=generator)
    ref[::11] = 0
    near = ref + 5e-5 * torch.randn(40_000, generator=generator)
    far = ref.clone()
    far[39_999] += 1.0
    poisoned = ref.clone()
    poisoned[17] = float("nan")
    return ref, (ref.clone(), near, far, poisoned, torch.zeros_like(ref))


@pytest.mark.parametrize("figures", [True, False])
def test_comparing_on_a_device_gives_the_same_figures(monkeypatch, figures):
    """`on` moves each chunk to that device (the GPU with compare_on_gpu); here the CPU as a device, in chunks that
    split the tensors, so the copy path runs and must give what comparing in place gives."""
    monkeypatch.setattr(check, "DEVICE_CHUNK", 7_000)
    ref, candidates = _cases(torch.Generator().manual_seed(3))
    for dtype in (torch.float32, torch.float16, torch.float64):
        for cand in candidates:
            here = compare(cand.to(dtype), ref.to(dtype), Tolerance(), figures)
            moved = compare(cand.to(dtype), ref.to(dtype), Tolerance(), figures, on=torch.device("cpu"))
            assert here == moved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_comparing_on_the_gpu_gives_the_cpus_figures():
    ref, candidates = _cases(torch.Generator().manual_seed(4))
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for cand in candidates:
            for figures in (True, False):
                cpu = compare(cand.to(dtype), ref.to(dtype), Tolerance(), figures)
                gpu = compare(cand.to(dtype), ref.to(dtype), Tolerance(), figures, on=torch.device("cuda"))
                assert cpu == gpu
    big = torch.randn(3 * check.DEVICE_CHUNK + 5, generator=torch.Generator().manual_seed(5))
    bad = big.clone()
    bad[-1] += 1.0
    assert not compare(bad, big, Tolerance(), on=torch.device("cuda")).ok
    assert compare(big.clone(), big, Tolerance(), on=torch.device("cuda")).ok


def test_complex_outputs_are_compared_in_both_parts():
    """A cast of a complex tensor to a real dtype keeps the real part alone: a wrong imaginary part passed that way."""
    ref = torch.tensor([1 + 1j, 2 - 3j, 0j], dtype=torch.complex64)
    assert compare(ref.clone(), ref, Tolerance()).ok
    assert compare(ref + 1e-5, ref, Tolerance()).ok
    wrong = torch.tensor([1 + 5j, 2 - 3j, 0j], dtype=torch.complex64)
    result = compare(wrong, ref, Tolerance())
    assert not result.ok and abs(result.max_abs_error - 4.0) < 1e-6
    assert check_outputs([[wrong.to(torch.complex128)]], [[ref.to(torch.complex128)]], Tolerance()).status == \
        Status.INCORRECT
    assert not compare(wrong, ref, Tolerance(), on=torch.device("cpu")).ok


def test_an_incorrect_error_names_the_worst_output_the_record_reports():
    reference = [[torch.zeros(4)], [torch.zeros(4)]]
    trials = [[torch.tensor([0.0, 0.0, 0.0, 0.04])], [torch.tensor([0.0, 0.0, 0.0, 0.05])]]
    verdict = check_outputs(trials, reference, Tolerance.for_outputs())
    assert verdict.status == Status.INCORRECT and verdict.max_abs_error == pytest.approx(0.05)
    assert verdict.error.startswith("trial 1 output 0: max abs error 0.05")
