"""Typed commands: the parent builds them, the child reads them back with their defaults applied in one place."""
import json

import pytest

from harness.shared import commands, protocol
from harness.shared.commands import FreshCall, GpuGo, Run, TimeBlock, TimeStart, parse
from harness.shared.messages import Malformed

SENT = [
    TimeStart(warmup_ms=20.0, l2_flush=False, sync="stream", graph=True, order_seed=12345, placements=3),
    TimeStart(),
    TimeBlock(reps=5, keep=(0, 3), ahead_ms=0.2),
    TimeBlock(reps=3, keep=(1,), ahead_ms=0.0, sets=(4, 0, 2)),
    TimeBlock(),
    FreshCall(l2_flush=False, sync="stream", ahead_ms=0.4, near=7),
    FreshCall(),
    Run({"device": "cpu", "out_dir": "/tmp/x", "seed": 3}),
    GpuGo({"bandwidth_gbps": 3000.0, "fp32_tflops": 50.5}),
    GpuGo(),
    GpuGo(keep=True),
    FreshCall(span_calls=14),
    FreshCall(path="/dev/shm/fresh-1-x/fresh.pt"),
    commands.TIME_END, commands.WARM_UP, commands.PACE, commands.STOP,
]


@pytest.mark.parametrize("command", SENT, ids=lambda c: type(c).__name__)
def test_what_the_parent_sends_the_child_reads_back_unchanged(command):
    line = json.loads(json.dumps(command.to_command()))
    assert parse(line) == command


def test_defaults_apply_where_the_parent_left_a_field_out():
    assert parse({"cmd": protocol.CMD_TIME_START}) == TimeStart(50.0, True, "checked", False, 0, 1)
    assert parse({"cmd": protocol.CMD_BLOCK}) == TimeBlock(1, (), 0.0)
    assert parse({"cmd": protocol.CMD_FRESH}) == FreshCall(True, "checked", 0.0, commands.FRESH_NEAR)
    assert parse({"cmd": protocol.CMD_FRESH}).path == ""   # FRESH_FILE in the candidate's folder
    assert parse({"cmd": protocol.CMD_GPU}).rates is None and parse({"cmd": protocol.CMD_GPU}).keep is False
    assert parse({"cmd": protocol.CMD_FRESH, "span_calls": 500}).span_calls == commands.FRESH_SPAN_CALLS_MAX
    assert parse({"cmd": protocol.CMD_FRESH, "span_calls": 0}).span_calls == 1


def test_a_head_start_out_of_range_is_none_and_near_calls_are_bounded():
    for ahead in (-1.0, commands.AHEAD_MAX_MS, 5e3):
        assert parse({"cmd": protocol.CMD_BLOCK, "ahead_ms": ahead}).ahead_ms == 0.0
    assert parse({"cmd": protocol.CMD_FRESH, "near": 10_000}).near == commands.FRESH_NEAR_MAX
    assert parse({"cmd": protocol.CMD_FRESH, "near": -4}).near == 0


def test_placements_other_than_a_whole_number_above_one_are_the_model_itself():
    for asked in (0, 1, "3", 2.5, True):
        assert parse({"cmd": protocol.CMD_TIME_START, "placements": asked}).placements == 1


@pytest.mark.parametrize("raw", [
    {"cmd": protocol.CMD_TIME_START, "l2_flush": "yes"},
    {"cmd": protocol.CMD_TIME_START, "warmup_ms": "50"},
    {"cmd": protocol.CMD_TIME_START, "order_seed": 1.5},
    {"cmd": protocol.CMD_BLOCK, "reps": "3"},
    {"cmd": protocol.CMD_BLOCK, "keep": [0, "1"]},
    {"cmd": protocol.CMD_BLOCK, "keep": [-1]},
    {"cmd": protocol.CMD_FRESH, "path": 3},
    {"cmd": protocol.CMD_BLOCK, "sets": [0, -1]},     # a negative index would count from the end of the sets
    {"cmd": protocol.CMD_BLOCK, "sets": [0, 1.0]},
    {"cmd": protocol.CMD_BLOCK, "sets": "0,1"},
    {"cmd": protocol.CMD_BLOCK, "ahead_ms": "0.2"},
    {"cmd": protocol.CMD_FRESH, "sync": 1},
    {"cmd": protocol.CMD_FRESH, "near": 2.0},
    {"cmd": protocol.CMD_RUN},
    {"cmd": protocol.CMD_RUN, "spec": ["device", "cpu"]},
])
def test_a_field_of_the_wrong_type_is_refused(raw):
    with pytest.raises(Malformed):
        parse(raw)


def test_an_unknown_or_missing_command_reads_as_stop():
    for raw in ({"cmd": "reboot"}, {}, None, {"cmd": protocol.CMD_STOP}):
        assert parse(raw) == commands.STOP


def test_rates_handed_over_are_kept_only_when_they_are_two_positive_numbers():
    assert parse({"cmd": protocol.CMD_GPU, "rates": {"bandwidth_gbps": 0, "fp32_tflops": 1}}) == GpuGo()
