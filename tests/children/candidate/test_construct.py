"""Building ModelNew with the standard layers' random initialisation skipped: kept only where a normal build, once the
reference's weights are in, could not differ (harness/children/candidate/construct.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.children.candidate.construct import unsafe_fast_construct
from harness.children.candidate.main import unsafe_build
from harness.shared.messages import Feed

SEED = 42


class Reference(nn.Module):
    def __init__(self, features: int = 16):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.conv = nn.Conv2d(3, 4, 3)


class SameLayers(nn.Module):   # the common answer: the reference's layers, its own forward
    def __init__(self, features: int = 16):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.conv = nn.Conv2d(3, 4, 3)
        self.scale = 2.0


class DrawsAfter(SameLayers):   # a parameter drawn after the layers: its values depend on their draws
    def __init__(self, features: int = 16):
        super().__init__(features)
        self.extra = nn.Parameter(torch.randn(features))


class Derives(SameLayers):   # state derived from a layer's weight in __init__ (equal to the reference's by the seed)
    def __init__(self, features: int = 16):
        super().__init__(features)
        self.weight_t = self.linear.weight.t().contiguous()


class Scales(SameLayers):   # a float and a list derived from a layer's weight
    def __init__(self, features: int = 16):
        super().__init__(features)
        self.weight_scale = float(self.linear.weight.detach().abs().mean())
        self.cache = [self.conv.weight.flatten()]


class NoLayers(nn.Module):   # nothing to skip: its one build is the normal one
    def __init__(self, features: int = 16):
        super().__init__()
        self.builds = getattr(NoLayers, "builds", 0) + 1
        NoLayers.builds = self.builds
        self.bias = nn.Parameter(torch.randn(features))


class Renamed(nn.Module):   # a layer the reference's weights do not cover (another name)
    def __init__(self, features: int = 16):
        super().__init__()
        self.fc = nn.Linear(features, features)
        self.conv = nn.Conv2d(3, 4, 3)


class Checks(SameLayers):   # an __init__ that fails on a skipped weight's placeholder
    def __init__(self, features: int = 16):
        super().__init__(features)
        if torch.isnan(self.linear.weight).any():
            raise ValueError("NaN weight")


def _feed() -> Feed:
    torch.manual_seed(SEED)
    return Feed(init_inputs=[16], state_dict=Reference(16).state_dict(), trials=[], grad_outputs=[])


def _normal(model_class: type, feed: Feed) -> nn.Module:
    torch.manual_seed(SEED)
    model = model_class(*feed.init_inputs)
    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in feed.state_dict.items():
            if name in own and own[name].shape == tensor.shape:
                own[name].copy_(tensor)
    return model


def _same(a: nn.Module, b: nn.Module) -> bool:
    tensors = lambda m: {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)}  # noqa: E731
    return (a.state_dict().keys() == b.state_dict().keys()
            and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
            and all(torch.equal(tensors(a)[k], tensors(b)[k]) for k in tensors(a)))


@pytest.mark.parametrize("model_class, fast", [(SameLayers, True), (DrawsAfter, False), (Derives, False),
                                               (Scales, False), (NoLayers, True), (Renamed, True),
                                               (Checks, None)])
def test_a_build_with_the_layers_initialisation_skipped_equals_the_normal_one(model_class, fast):
    feed = _feed()
    linear_init = nn.Linear.__dict__["reset_parameters"]
    if fast is None:
        with pytest.raises(ValueError):
            unsafe_fast_construct(model_class, feed.init_inputs, SEED)
    else:   # None: a draw after the skips or a NaN elsewhere; Renamed passes here and fails the overwrite below
        assert (unsafe_fast_construct(model_class, feed.init_inputs, SEED) is not None) == fast
    assert nn.Linear.__dict__["reset_parameters"] is linear_init   # put back, whatever the build did
    model, loaded, renamed = unsafe_build(model_class, feed, SEED, "cpu")
    expected = _normal(model_class, feed)
    assert _same(model, expected)
    if model_class is Scales:
        assert model.weight_scale == expected.weight_scale and torch.equal(model.cache[0], expected.cache[0])
    assert not any(torch.isnan(t).any() for t in model.state_dict().values())
    # Renamed's fc holds the reference's linear under another name (built in its order, same seed): matched by value
    assert renamed == ({"fc.weight": "linear.weight", "fc.bias": "linear.bias"} if model_class is Renamed else {})
    assert loaded == sum(1 for name in feed.state_dict if name in expected.state_dict()) + len(renamed)


def test_a_model_with_nothing_to_skip_is_built_once():
    NoLayers.builds = 0
    unsafe_build(NoLayers, _feed(), SEED, "cpu")
    assert NoLayers.builds == 1


def test_derived_state_keeps_the_values_a_normal_build_gives():
    """What a normal build gives and the fast one must not change: the derived copy equals the reference's weight
    through the seed (a candidate built that way passes under KernelBench's flow too)."""
    feed = _feed()
    model, _, _ = unsafe_build(Derives, feed, SEED, "cpu")
    assert torch.equal(model.weight_t, feed.state_dict["linear.weight"].t())


def test_a_cast_build_is_checked_after_the_cast():
    feed = _feed()
    model, loaded, _ = unsafe_build(SameLayers, feed, SEED, "cpu", torch.bfloat16)
    assert loaded == 4 and model.linear.weight.dtype == torch.bfloat16
    assert torch.equal(model.linear.weight, feed.state_dict["linear.weight"].to(torch.bfloat16))


class DrawsOnTheGpu(nn.Module):   # layers made on the GPU draw from its generator: a draw after them depends on them
    def __init__(self, features: int = 16):
        super().__init__()
        self.linear = nn.Linear(features, features, device="cuda")
        self.conv = nn.Conv2d(3, 4, 3, device="cuda")
        self.extra = nn.Parameter(torch.randn(features, device="cuda"))


@pytest.mark.gpu
def test_a_draw_on_the_gpu_after_a_skipped_layer_made_there_keeps_the_normal_build():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.cuda.init()
    feed = _feed()
    assert unsafe_fast_construct(DrawsOnTheGpu, feed.init_inputs, SEED) is None
    model, _, _ = unsafe_build(DrawsOnTheGpu, feed, SEED, "cuda")
    torch.manual_seed(SEED)
    assert torch.equal(model.extra, DrawsOnTheGpu(16).extra)


def test_entries_are_matched_by_value_only_when_the_pair_is_unique_and_says_something():
    from harness.children.candidate.main import _matched_by_value

    torch.manual_seed(SEED)
    weight, other = torch.randn(4, 3), torch.randn(4, 3)
    reference = {"linear.weight": weight, "linear.bias": torch.zeros(4), "norm.weight": torch.ones(4)}
    mine = {"w": weight.clone(), "b": torch.zeros(4), "g": torch.ones(4), "extra": other}
    assert _matched_by_value(mine, reference) == {"w": "linear.weight"}   # constants say nothing: unmatched
    assert _matched_by_value({**mine, "w2": weight.clone()}, reference) == {}   # two of mine hold it: a tie
    assert _matched_by_value(mine, {**reference, "copy": weight.clone()}) == {}   # two of the reference's: a tie
    assert _matched_by_value({"w": weight.to(torch.bfloat16)}, {"linear.weight": weight}) == {}   # other dtype
    assert _matched_by_value({"linear.weight": weight.clone()}, reference) == {}   # same name: matched by name
