"""The child's side of the timing dialogue, on the CPU device with a trivial call."""
import re

import torch

from harness.children.timing_server import serve_timing
from harness.shared import commands, protocol


class ScriptedChannel:
    """Commands in (then stop, as at EOF), events captured."""

    def __init__(self, *commands: dict):
        self.commands, self.events = list(commands), []

    def receive(self) -> dict:
        return self.commands.pop(0) if self.commands else {"cmd": protocol.CMD_STOP}

    def send(self, message) -> None:
        self.events.append(message.to_event())


def _serve(*commands: dict):
    channel = ScriptedChannel(*commands)
    sets = [[torch.full((4,), float(i))] for i in range(2)]
    timer = serve_timing(channel, lambda inputs: inputs[0] * 2, sets, "cpu", keep=lambda out: out.clone(),
                         flags=lambda: {"patched_runtime": "none here"})
    return timer, channel.events


START = {"cmd": protocol.CMD_TIME_START, "warmup_ms": 1.0, "order_seed": 5}
# the trivial call is too short to time alone: its spans may hold several calls, and the method says how many
CLOCK = r"perf_counter(, \d+ calls a span)?"


def test_a_full_dialogue_warms_up_answers_each_block_and_returns_the_timer():
    timer, (warm, block) = _serve(START, {"cmd": protocol.CMD_BLOCK, "reps": 5, "keep": [0, 3]},
                                  {"cmd": protocol.CMD_TIME_END})
    assert warm["event"] == protocol.WARM and re.fullmatch(CLOCK, warm["method"]) and warm["graph_error"] is None
    assert isinstance(warm["per_call_ms"], float) and warm["per_call_ms"] > 0
    assert block["event"] == protocol.BLOCK and len(block["samples"]) == 5
    assert block["events_ms"] >= sum(block["samples"]) and block["flags"] == {"patched_runtime": "none here"}
    # the calls each span held: the timer's, in the BLOCK and the method alike; each sample its span over them
    spans = re.fullmatch(CLOCK, warm["method"]).group(1)
    assert block["calls_per_span"] == timer.calls_per_span == (int(spans.split()[1]) if spans else 1)
    assert block["events_ms"] >= block["calls_per_span"] * sum(block["samples"])
    assert timer is not None and timer.calls >= 6 and len(timer.kept) == 2
    for kept in timer.kept:
        assert torch.equal(kept["outputs"], torch.full((4,), 2.0 * kept["input_set"]))


def test_a_block_runs_each_spans_last_call_on_the_input_set_the_parent_chose():
    timer, (_, block) = _serve(START, {"cmd": protocol.CMD_BLOCK, "reps": 4, "keep": [0, 2], "sets": [1, 0, 0, 1]},
                               {"cmd": protocol.CMD_TIME_END})
    assert len(block["samples"]) == 4
    assert [kept["input_set"] for kept in timer.kept] == [1, 0]
    for kept in timer.kept:
        assert torch.equal(kept["outputs"], torch.full((4,), 2.0 * kept["input_set"]))


def test_a_cuda_graph_asked_for_on_the_cpu_is_timed_eagerly_and_says_why():
    _, (warm,) = _serve({**START, "graph": True})
    assert re.fullmatch(CLOCK, warm["method"]) and "cuda" in warm["graph_error"]


def test_stop_eof_or_an_unknown_command_end_the_dialogue_without_a_timer():
    assert _serve(START, {"cmd": protocol.CMD_STOP})[0] is None
    assert _serve(START)[0] is None                          # the parent closed the pipe
    assert _serve(START, {"cmd": "reboot"})[0] is None
    timer, events = _serve({"cmd": protocol.CMD_BLOCK, "reps": 2}, {"cmd": protocol.CMD_TIME_END})
    assert timer is None and events == []                    # a block before TIME_START is not served


def test_a_command_of_its_own_between_timings_is_answered_by_the_caller_and_the_dialogue_goes_on():
    """The oracle answers CMD_PACE (its GPU pace) between timings; inside a timing, or unanswered, it ends the
    dialogue as any unknown command does."""
    answered = []

    def pace(command: commands.Command) -> bool:
        answered.append(command.cmd)
        return command == commands.PACE

    channel = ScriptedChannel({"cmd": protocol.CMD_PACE, "per_call_ms": 1.0}, START,
                              {"cmd": protocol.CMD_BLOCK, "reps": 2}, {"cmd": protocol.CMD_TIME_END})
    sets = [[torch.ones(4)]]
    timer = serve_timing(channel, lambda inputs: inputs[0] * 2, sets, "cpu", other=pace)
    assert timer is not None and answered == [protocol.CMD_PACE]
    assert [event["event"] for event in channel.events] == [protocol.WARM, protocol.BLOCK]
    channel = ScriptedChannel(START, {"cmd": protocol.CMD_PACE})   # inside a timing: not the caller's
    assert serve_timing(channel, lambda inputs: inputs[0], sets, "cpu", other=pace) is None
    assert answered == [protocol.CMD_PACE]


def test_placements_rotate_the_timed_calls_among_copies_and_the_method_says_how_many():
    """config `timing_placements`: the timed calls go to each copy of the weights in turn; without copies to offer
    (or asked for one), the call itself is timed."""
    used, asked = [], []

    def placed(count):
        asked.append(count)
        return [lambda inputs, i=i: (used.append(i), inputs[0] * 2)[1] for i in range(count)]

    channel = ScriptedChannel({**START, "placements": 3}, {"cmd": protocol.CMD_BLOCK, "reps": 6, "keep": [0, 1, 2]},
                              {"cmd": protocol.CMD_TIME_END})
    sets = [[torch.full((4,), float(i))] for i in range(2)]
    timer = serve_timing(channel, lambda inputs: inputs[0] * 2, sets, "cpu", keep=lambda out: out.clone(),
                         placed=placed)
    warm, block = channel.events
    assert asked == [3] and re.fullmatch(CLOCK + ", 3 placements", warm["method"]) and len(block["samples"]) == 6
    assert sorted(set(used)) == [0, 1, 2] and max(used.count(i) for i in range(3)) - min(
        used.count(i) for i in range(3)) <= 1   # in turn: each copy as often as the others, give or take one
    for kept in timer.kept:
        assert torch.equal(kept["outputs"], torch.full((4,), 2.0 * kept["input_set"]))
    for command in (START, {**START, "placements": 1}, {**START, "placements": "3"}):
        asked.clear()
        channel = ScriptedChannel(command)
        serve_timing(channel, lambda inputs: inputs[0] * 2, sets, "cpu", placed=placed)
        assert asked == [] and re.fullmatch(CLOCK, channel.events[0]["method"])


def test_copies_of_the_weights_stop_at_the_byte_bound():
    from harness.children.timing_server import (
        PLACEMENT_BYTES,
        placements_within,
        weight_bytes,
    )

    model = torch.nn.Linear(8, 4)
    assert weight_bytes(model) == (8 * 4 + 4) * 4 and weight_bytes(object()) == 0
    assert placements_within(3, weight_bytes(model)) == 3
    assert placements_within(3, PLACEMENT_BYTES // 2) == 2 and placements_within(3, PLACEMENT_BYTES * 2) == 1
    assert placements_within(100, 0) == 8   # MAX_PLACEMENTS, whatever the bytes


def test_timing_placements_is_a_count_from_one_to_eight_and_left_out_of_the_hash_at_one():
    import pytest

    from harness.shared.config import ConfigError, load_config

    assert load_config(None, {}).timing_placements == 1
    assert load_config(None, {"timing_placements": 1}).hash() == load_config(None, {}).hash()
    assert load_config(None, {"timing_placements": 3}).hash() != load_config(None, {}).hash()
    for bad in (0, 9, 2.5, "3"):
        with pytest.raises(ConfigError, match="timing_placements"):
            load_config(None, {"timing_placements": bad})


def test_the_integrity_look_a_block_report_carries_counts_as_the_harnesss_work():
    # the parent's wall time around a block holds the snapshot its report carries: told as harness work, it is never
    # taken for work the events missed (timer_mismatch on an honest kernel)
    import time

    def slow_flags() -> dict:
        time.sleep(0.03)
        return {}

    channel = ScriptedChannel(START, {"cmd": protocol.CMD_BLOCK, "reps": 3, "keep": []}, {"cmd": protocol.CMD_TIME_END})
    serve_timing(channel, lambda inputs: inputs[0] * 2, [[torch.ones(4)]], "cpu", flags=slow_flags)
    block = channel.events[1]
    assert block["event"] == protocol.BLOCK and block["outside_ms"] >= 30.0
