"""Building ModelNew in the candidate's process (the `unsafe_` side: the submission's `__init__` runs here).

ModelNew is built under the reference's seed, so that weights drawn in the same order as the reference's come out
the same, and then every state_dict entry whose name and shape match the reference's is overwritten with the
reference's value. The random initialisation of standard layers is then mostly work thrown away: torch draws their
weights on the CPU, one number at a time (an 8192 x 8192 nn.Linear 0.3 s, level2/59's 32768 x 32768 one about
5 s), and the copy replaces them.

`unsafe_fast_construct` builds ModelNew with the random initialisation of nn.Linear and the convolutions skipped:
their weights and biases are filled with NaN instead. That model is kept only if it cannot differ from the one a
normal build gives once the reference's weights are in:
- no random number was drawn after the first skipped initialisation, on the CPU or a GPU (otherwise later draws,
  say a bias made with torch.randn, would have come from another point of the stream);
- every skipped weight and bias is an entry of ModelNew's state_dict that the reference's weights overwrite;
- no other tensor or float of the model (parameter, buffer, attribute of a module, or held one level down in its
  lists and dicts) holds a NaN: nothing in `__init__` derived state from a skipped weight (a transposed copy, a
  packed buffer, a scale), which a normal build would have derived from the same values as the reference's.
Otherwise (harness/children/candidate/main.py `unsafe_build`) ModelNew is built again, normally, under the same
seed. Neither build is timed or judged; both run in the child, whose sandbox and watch are already in place.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
from torch import nn

SKIPPED_LAYERS = (nn.Linear, nn.modules.conv._ConvNd)   # their reset_parameters draws the weights, nothing else


@contextlib.contextmanager
def _inits_skipped(skipped: list[nn.Module], rng_at_first: list[list[torch.Tensor]]):
    originals = {layer: layer.__dict__["reset_parameters"] for layer in SKIPPED_LAYERS}

    def poisoned(module: nn.Module) -> None:
        if not rng_at_first:
            rng_at_first.append(_rng_states())
        skipped.append(module)
        with torch.no_grad():
            for tensor in (module.weight, module.bias):
                if tensor is not None:
                    tensor.fill_(float("nan"))

    for layer in SKIPPED_LAYERS:
        layer.reset_parameters = poisoned
    try:
        yield
    finally:
        for layer, original in originals.items():
            layer.reset_parameters = original


def _rng_states() -> list[torch.Tensor]:
    """The CPU generator's state, and each GPU's where CUDA is up (a layer made on a GPU draws from its generator)."""
    return [torch.get_rng_state()] + (torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [])


def _same_states(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return value != value
    return isinstance(value, torch.Tensor) and value.is_floating_point() and bool(torch.isnan(value).any())


def _attributes(module: nn.Module) -> list:
    """A module's own attributes and, one level down, what its lists, tuples and dicts hold (a scale computed from
    a weight, a list of transposed copies)."""
    values = []
    for value in vars(module).values():
        values.append(value)
        if isinstance(value, (list, tuple)):
            values.extend(value)
        elif isinstance(value, dict) and not isinstance(value, nn.Module):
            values.extend(value.values())
    return values


def unsafe_fast_construct(model_class: type, init_inputs: list, seed: int
                          ) -> Optional[tuple[nn.Module, list[torch.Tensor]]]:
    """ModelNew(*init_inputs) under `seed` with the standard layers' random initialisation skipped, and the skipped
    weights and biases (none: a normal build); None when the build could differ from a normal one by more than those
    (a draw after the first skip, a NaN elsewhere in the model). The caller keeps it only if the reference's weights
    then overwrite every skipped tensor (`unsafe_build`)."""
    skipped: list[nn.Module] = []
    rng_at_first: list[list[torch.Tensor]] = []
    torch.manual_seed(seed)
    with _inits_skipped(skipped, rng_at_first):
        model = model_class(*init_inputs)
    if not isinstance(model, nn.Module):
        return None
    if not skipped:
        return model, []   # nothing was skipped: this was a normal build
    if not _same_states(_rng_states(), rng_at_first[0]):
        return None
    poisoned = {id(t): t for module in skipped for t in (module.weight, module.bias) if t is not None}
    others = [t for t in model.parameters() if id(t) not in poisoned] + list(model.buffers())
    others += [v for module in model.modules() for v in _attributes(module)]
    if any(_has_nan(t) for t in others if id(t) not in poisoned):
        return None
    return model, list(poisoned.values())
