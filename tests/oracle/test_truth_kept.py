"""Where the oracle's truth waits for its save (harness/children/oracle/main.py Keeper): on the GPU it was made on
while it fits, so the save copies it once, straight into the truth's pages; beyond that room, and on the CPU, as a
plain CPU copy. Always a copy, never the reference's own tensor. The fresh input sets alike, when asked for."""
from __future__ import annotations

import pytest
import torch

from harness.children.oracle import main as oracle
from harness.shared import protocol


class Marked(torch.Tensor):
    """A subclass a reference might return: kept as a plain tensor."""


def test_kept_on_the_device_while_it_fits_then_copied_to_the_host(monkeypatch):
    hosted = []
    monkeypatch.setattr(oracle, "to_plain_cpu", lambda value: hosted.append(value) or "host copy")
    keeper = oracle.Keeper("cuda", free_bytes=int(1000 / oracle.KEEP_SHARE) + 1)   # room for 1000 bytes
    assert keeper.room == 1000
    first = torch.empty(200, device="meta").as_subclass(Marked)   # 800 bytes: kept where it is
    kept = keeper.keep(first)
    assert kept is not first and type(kept) is torch.Tensor and kept.device.type == "meta" and kept.shape == (200,)
    assert (keeper.room, keeper.on_device, hosted) == (200, 800, [])
    second = torch.empty(100, device="meta")                       # 400 bytes: beyond the room, to the host
    assert keeper.keep(second) == "host copy" and hosted == [second] and keeper.room == 200
    keeper.release()
    assert keeper.on_device == 0


def test_on_the_cpu_everything_is_a_host_copy():
    keeper = oracle.Keeper("cpu")
    value = torch.arange(4.0)
    kept = keeper.keep(value)
    assert torch.equal(kept, value) and kept.data_ptr() != value.data_ptr() and keeper.on_device == 0
    assert keeper.keep(3) == {"not_a_tensor": "int"}   # as the truth has always described a non-tensor output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_truth_saved_from_the_gpu_reads_back_as_the_reference_computes_it(tmp_path):
    from harness.shared import commands
    from harness.shared.messages import FreshSets, Truth
    from harness.shared.problems import resolve_problem
    from harness.shared.specs import OracleSpec

    class Channel:   # the oracle's end of the pipes, here: asked for its fresh sets, then stopped
        def __init__(self):
            self.commands, self.events = [commands.FRESH_SETS.to_command()], []

        def receive(self) -> dict:
            return self.commands.pop(0) if self.commands else {"cmd": protocol.CMD_STOP}

        def send(self, message) -> None:
            self.events.append(message.to_event())

    spec = OracleSpec(problem_path=str(resolve_problem("level0/2").path), device="cuda", seed=42, input_seed=7,
                      trials=3, check_grad=True, allow_tf32=False, out_dir=str(tmp_path), fresh_inputs=2)
    state: dict = {}
    ready = oracle.build_reference(spec, state)
    truth = Truth.from_file(torch.load(tmp_path / protocol.TRUTH_FILE, weights_only=True))
    channel = Channel()
    oracle.serve_reference(channel, state)   # the fresh sets drawn on the GPU and saved from there when asked
    assert channel.events == [{"event": protocol.FRESH_SETS}]
    fresh = FreshSets.from_file(torch.load(tmp_path / protocol.FRESH_SETS_FILE, weights_only=True))
    assert len(fresh.inputs) == len(fresh.outputs) == 4
    model = state["model"]
    with torch.no_grad():
        for inputs, outputs in zip(state["input_sets"], truth.outputs):
            assert outputs[0].device.type == "cpu"
            torch.testing.assert_close(outputs[0], model(*inputs).cpu(), rtol=1e-5, atol=1e-5)
        for inputs, outputs in zip(fresh.inputs, fresh.outputs):
            assert inputs[0].device.type == "cpu"
            torch.testing.assert_close(outputs[0], model(inputs[0].cuda()).cpu(), rtol=1e-5, atol=1e-5)
    assert "copy" in ready.steps
