"""The reference's gradients in the oracle (harness/children/oracle/main.py): its start describes the feed's
grad_outputs without a backward; the backward runs when the parent sends CMD_GRADIENTS, whose answer
(GRADIENTS_FILE) holds the reference's gradients for those grad_outputs. Its fresh input sets are drawn and run when
the parent sends CMD_FRESH_SETS (FRESH_SETS_FILE), only the ones that are kept."""
from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from harness.children.oracle import main as oracle
from harness.children.runtime import draw_grad_outputs
from harness.shared import commands, protocol
from harness.shared.messages import Feed, FreshSets, Gradients, Truth
from harness.shared.problems import resolve_problem
from harness.shared.specs import OracleSpec

PROBLEM = resolve_problem("level0/2")   # Linear + ReLU: input and parameter gradients
SEED, INPUT_SEED = 42, 1234


class Channel:
    """The oracle's end of the pipes, in this process: the commands it is given, the events it sent."""

    def __init__(self, *sent: commands.Command):
        self.commands = [command.to_command() for command in sent]
        self.events: list[dict] = []

    def receive(self) -> dict:
        return self.commands.pop(0) if self.commands else {"cmd": protocol.CMD_STOP}

    def send(self, message) -> None:
        self.events.append(message.to_event())


@pytest.fixture
def in_process():
    """build_reference run here sets this process's torch threads and torch.save's CRC: both put back."""
    threads = torch.get_num_threads()
    crc = torch.serialization.get_crc32_options()
    yield
    torch.set_num_threads(threads)
    torch.serialization.set_crc32_options(crc)


def _spec(tmp_path: Path, **fields) -> OracleSpec:
    return OracleSpec(problem_path=str(PROBLEM.path), device="cpu", seed=SEED, input_seed=INPUT_SEED,
                      **{"trials": 2, "check_grad": True, "allow_tf32": False, "out_dir": str(tmp_path), **fields})


def _counting_backward(monkeypatch) -> list:
    runs: list = []
    real = oracle.backward

    def counted(pairs):
        runs.append(len(pairs))
        real(pairs)

    monkeypatch.setattr(oracle, "backward", counted)
    return runs


def test_the_start_makes_grad_outputs_without_a_backward_which_runs_when_asked(tmp_path, monkeypatch, in_process):
    backwards = _counting_backward(monkeypatch)
    state: dict = {}
    ready = oracle.build_reference(_spec(tmp_path), state)
    assert backwards == []   # no backward at the start
    assert "grad_outputs" in ready.steps and "gradients" not in ready.steps
    feed = Feed.from_file(torch.load(tmp_path / protocol.FEED_FILE, weights_only=True))
    truth = torch.load(tmp_path / protocol.TRUTH_FILE, weights_only=True)
    assert truth["has_graph"] is True and "input_grads" not in truth and "param_grads" not in truth
    assert Truth.from_file(truth).input_grads == []
    # the grad_output a candidate's backward gets: described in the feed (nothing output-sized drawn or handed
    # over), one seeded draw per output with a graph where a backward runs
    (spec,) = feed.grad_outputs
    assert spec == {"shape": list(truth["outputs"][0][0].shape), "dtype": "float32"} and feed.grad_seed == SEED
    (grad_output,) = draw_grad_outputs(feed.grad_outputs, feed.grad_seed, "cpu")
    expected = torch.randn(truth["outputs"][0][0].shape, generator=torch.Generator().manual_seed(SEED + 7))
    assert torch.equal(grad_output, expected)

    channel = Channel(commands.GRADIENTS)
    oracle.serve_reference(channel, state)
    assert backwards == [1] and channel.events == [{"event": protocol.GRADIENTS}]
    path = tmp_path / protocol.GRADIENTS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600   # candidates may run while it exists
    given = Gradients.from_file(torch.load(path, weights_only=True))

    # the reference's gradients for the feed's trial 0 and grad_output, as torch computes them
    _, _, _, model, _ = oracle.load_reference(str(PROBLEM.path), SEED, "cpu")
    x = feed.trials[0][0].clone().requires_grad_(True)
    wanted = torch.autograd.grad(model(x), [x, *model.parameters()], grad_output)
    assert torch.equal(given.input_grads[0], wanted[0])
    assert list(given.param_grads) == ["linear.weight", "linear.bias"]
    assert all(torch.equal(given.param_grads[name], grad)
               for name, grad in zip(("linear.weight", "linear.bias"), wanted[1:]))
    # the model's own gradients dropped again: no memory held through the timing
    assert all(p.grad is None for p in state["model"].parameters())


def test_the_gradients_go_through_a_memfd_the_parent_made_and_maps_sealed(tmp_path, in_process):
    # as the feed and the truth: no file in the oracle's folder, the parent's own memfd, sealed before it is mapped
    from types import SimpleNamespace

    from harness.oracle.reference import read_asked
    from harness.shared.handover import Handover, oracle_files

    files = Handover(oracle_files(), tmp_path)
    try:
        state: dict = {}
        oracle.build_reference(_spec(tmp_path, fresh_inputs=1), state, files=files.fds)
        # nothing until asked
        assert files.size(protocol.GRADIENTS_FILE) == files.size(protocol.FRESH_SETS_FILE) == 0
        oracle.serve_reference(Channel(commands.GRADIENTS, commands.FRESH_SETS), state)
        assert not any(tmp_path.glob("*.pt"))
        loaded, size = read_asked(SimpleNamespace(handover=files), tmp_path, protocol.GRADIENTS_FILE)
        assert size == files.size(protocol.GRADIENTS_FILE) > 0 and files.mapped[protocol.GRADIENTS_FILE]
        assert list(Gradients.from_file(loaded).param_grads) == ["linear.weight", "linear.bias"]
        loaded, size = read_asked(SimpleNamespace(handover=files), tmp_path, protocol.FRESH_SETS_FILE)
        assert size == files.size(protocol.FRESH_SETS_FILE) > 0 and files.mapped[protocol.FRESH_SETS_FILE]
        assert len(FreshSets.from_file(loaded).inputs) == 2   # two rounds of one
    finally:
        files.close()


def test_without_check_grad_there_are_no_grad_outputs_and_no_graph(tmp_path, in_process):
    oracle.build_reference(_spec(tmp_path, check_grad=False), {})
    feed = Feed.from_file(torch.load(tmp_path / protocol.FEED_FILE, weights_only=True))
    truth = Truth.from_file(torch.load(tmp_path / protocol.TRUTH_FILE, weights_only=True))
    assert feed.grad_outputs == [] and truth.has_graph is False


def test_only_the_fresh_sets_kept_are_drawn(tmp_path, monkeypatch, in_process):
    drawn: list[int] = []
    real = oracle.draw_trials

    def counted(module, input_seed, count, *args, **kwargs):
        drawn.append(count)
        return real(module, input_seed, count, *args, **kwargs)

    monkeypatch.setattr(oracle, "draw_trials", counted)
    monkeypatch.setattr(oracle, "FRESH_BYTES", 1)   # room for none: two are kept (one a round) of the 8 asked for
    state: dict = {}
    oracle.build_reference(_spec(tmp_path, fresh_inputs=4), state)
    truth = torch.load(tmp_path / protocol.TRUTH_FILE, weights_only=True)
    assert drawn == [2] and "fresh_inputs" not in truth and "fresh_outputs" not in truth   # the trials only
    assert Truth.from_file(truth).fresh_inputs == []
    channel = Channel(commands.FRESH_SETS)   # a candidate reached the fresh-input check
    oracle.serve_reference(channel, state)
    assert drawn == [2, 1, 1] and channel.events == [{"event": protocol.FRESH_SETS}]   # the two fresh sets kept
    path = tmp_path / protocol.FRESH_SETS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600   # candidates may run while it exists
    fresh = FreshSets.from_file(torch.load(path, weights_only=True))
    # the same sets as ever: trials 102 and 103 of the input seed, and the reference's outputs on them
    module, _, _, model, _ = oracle.load_reference(str(PROBLEM.path), SEED, "cpu")
    expected = real(module, INPUT_SEED, 2, first=2 + oracle.FRESH_OFFSET)
    assert len(fresh.inputs) == len(fresh.outputs) == 2
    assert all(torch.equal(got[0], want[0]) for got, want in zip(fresh.inputs, expected))
    with torch.no_grad():
        assert all(torch.equal(got[0], model(want[0])) for got, want in zip(fresh.outputs, expected))


def test_inputs_are_drawn_with_the_devices_default_and_on_the_host_as_ever():
    """On a GPU the oracle draws with torch's default device set to it (here the meta device stands in for one):
    get_inputs' torch.randn(...) makes its tensors there. On the CPU device the sets are the plain CPU draws."""
    module = oracle.load_reference(str(PROBLEM.path), SEED, "cpu")[0]
    (elsewhere,) = oracle.draw_trials(module, INPUT_SEED, 1, plain_cpu=False, device="meta")
    assert elsewhere[0].device.type == "meta" and elsewhere[0].shape == (64, 256)
    (host,) = oracle.draw_trials(module, INPUT_SEED, 1)
    torch.manual_seed(oracle.trial_seed(INPUT_SEED, 0))
    assert host[0].device.type == "cpu" and torch.equal(host[0], torch.randn(64, 256))
