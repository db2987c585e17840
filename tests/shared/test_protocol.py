"""The child's end of the pipes: every event line carries the run's token; a silent or closed parent means stop."""
import json
import os

from harness.shared import protocol
from harness.shared.messages import BlockReport, Warm
from harness.shared.protocol import ChildChannel


class Forger:
    """A message whose fields try to carry a token of their own."""

    def to_event(self) -> dict:
        return {"event": protocol.BLOCK, "samples": [1.0, 2.0], "token": "forged"}


def _lines(read_fd: int) -> list[dict]:
    with os.fdopen(read_fd) as events:
        return [json.loads(line) for line in events.read().splitlines()]


def test_every_event_line_carries_the_token_and_a_field_cannot_replace_it():
    event_r, event_w = os.pipe()
    channel = ChildChannel(event_w, token="t0k")
    channel.send(Warm(0.5, "perf_counter", None))
    channel.send(Forger())
    channel.send(BlockReport((1.0, 2.0), 3.5, 0.25))
    channel.close()
    warm, forged, block = _lines(event_r)
    assert warm == {"event": "warm", "per_call_ms": 0.5, "method": "perf_counter", "graph_error": None,
                    "launch_ms": 0.0, "flags": {}, "token": "t0k"}
    assert forged["event"] == "block" and forged["samples"] == [1.0, 2.0] and forged["token"] == "t0k"
    assert BlockReport.from_event(block, 2) == BlockReport((1.0, 2.0), 3.5, 0.25) and block["token"] == "t0k"


def test_commands_are_read_one_a_line_and_blank_or_eof_means_stop():
    event_r, event_w = os.pipe()
    command_r, command_w = os.pipe()
    channel = ChildChannel(event_w, command_r, token="t")
    os.write(command_w, b'{"cmd": "block", "reps": 3, "keep": [1]}\n\n{"cmd": "time_end"}\n')
    os.close(command_w)
    assert channel.receive() == {"cmd": "block", "reps": 3, "keep": [1]}
    assert channel.receive() == {"cmd": protocol.CMD_STOP}     # a blank line
    assert channel.receive() == {"cmd": "time_end"}
    assert channel.receive() == {"cmd": protocol.CMD_STOP}     # EOF: the parent closed its end
    channel.close()
    os.close(event_r)


def test_a_child_without_a_command_pipe_is_told_to_stop():
    event_r, event_w = os.pipe()
    channel = ChildChannel(event_w, None, token="t")
    assert channel.receive() == {"cmd": protocol.CMD_STOP}
    channel.close()
    os.close(event_r)
