"""The baseline process: times one problem's trusted reference in eager mode and under torch.compile, or measures the
device's peaks. Started by `run_eval.py baseline` (harness/oracle/baselines.py) as `python -m
harness.children.oracle.baseline SPEC`; never sees candidate code. Each mode is timed alone with the adaptive method of
harness/shared/timer.py on rotating input sets, the L2 flushed before each call; the reference is cast to the run's
precision as in the oracle (harness/shared/precision.py)."""
from __future__ import annotations

import sys
import time

import torch

from harness.children.oracle.main import draw_trials, load_reference
from harness.children.runtime import configure_precision, serve_once, to_device
from harness.shared.environment import device_name
from harness.shared.messages import BaselineReady, PeaksReady
from harness.shared.precision import cast_dtype
from harness.shared.roofline import count_flops, measure_peaks
from harness.shared.rule import Rule
from harness.shared.sizes import tensor_bytes
from harness.shared.specs import BaselineSpec
from harness.shared.timer import bench

COMPILE_MODES = {"compile": "default", "max-autotune": "max-autotune"}


def main(spec_path: str) -> None:
    serve_once(spec_path, BaselineSpec, lambda spec, channel, wiring: peaks(spec) if spec.peaks else run(spec),
               "baseline_error")


def peaks(spec: BaselineSpec) -> PeaksReady:
    configure_precision(spec.allow_tf32, spec.device)
    return PeaksReady(device_name(spec.device), **measure_peaks(spec.device, cast_dtype(spec.precision)))


def run(spec: BaselineSpec) -> BaselineReady:
    device, dtype = spec.device, cast_dtype(spec.precision)
    configure_precision(spec.allow_tf32, device)
    module, _, _, model, state_dict = load_reference(spec.problem_path, spec.seed, device, dtype)
    with torch.device(device):   # drawn on the device: GB-sized inputs take seconds on the host
        input_sets = [to_device(inputs, device) for inputs in draw_trials(module, spec.seed, spec.trials,
                                                                           plain_cpu=False, dtype=dtype)]
    rule = Rule(**spec.rule)
    with torch.no_grad():
        flops = count_flops(lambda: model(*input_sets[0]))
        moved = tensor_bytes(input_sets[0]) + tensor_bytes(state_dict) + tensor_bytes(model(*input_sets[0]))
        modes = {mode: _time_mode(model, mode, input_sets, device, rule, spec) for mode in spec.modes}
    return BaselineReady(device_name(device), flops, moved, modes)


def _time_mode(model, mode: str, input_sets: list, device: str, rule: Rule, spec: BaselineSpec) -> dict:
    forward = model
    compile_s = None
    if mode != "eager":
        torch._dynamo.reset()
        forward = torch.compile(model, mode=COMPILE_MODES[mode])
        start = time.perf_counter()
        try:
            forward(*input_sets[0])   # the compilation, outside the timing
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # a problem torch.compile cannot handle is a fact to store, not a crash
            return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
        compile_s = time.perf_counter() - start
    stats = bench(lambda inputs: forward(*inputs), input_sets, device, rule, l2_flush=spec.l2_flush,
                  sync=spec.sync, host_ahead=spec.host_ahead).to_dict()
    if compile_s is not None:
        stats["compile_s"] = compile_s
    return stats


if __name__ == "__main__":
    main(sys.argv[1])
