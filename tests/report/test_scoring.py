import math
from dataclasses import replace

import pytest
from conftest import make

from harness.core.record import Record, Status
from harness.report.scoring import fast_p, geometric_mean_speedup, leaderboard, records_table


def test_fast_p_counts_passes_over_all_submissions():
    records = [make(speedup=2.5), make(speedup=1.2), make(speedup=0.5), make(Status.INCORRECT),
               make(Status.RULE_VIOLATION, speedup=9.0)]
    assert fast_p(records, 0) == pytest.approx(3 / 5)
    assert fast_p(records, 1) == pytest.approx(2 / 5)
    assert fast_p(records, 2) == pytest.approx(1 / 5)
    assert math.isnan(fast_p([], 1))


def test_geometric_mean_over_passes_only():
    records = [make(speedup=2.0), make(speedup=0.5), make(speedup=4.0), make(Status.INCORRECT, speedup=100.0)]
    assert geometric_mean_speedup(records) == pytest.approx(math.exp((math.log(2) + math.log(0.5) + math.log(4)) / 3))
    assert geometric_mean_speedup([make(Status.INCORRECT)]) is None


def test_geometric_mean_over_torch_compile_uses_records_that_have_it():
    records = [make(speedup=2.0, speedup_compile=1.5), make(speedup=1.0), make(speedup=3.0, speedup_compile=0.6)]
    assert geometric_mean_speedup(records, "speedup_compile") == pytest.approx(math.sqrt(1.5 * 0.6))
    board = leaderboard(records)
    assert board.loc[0, "geomean_speedup_compile"] == pytest.approx(math.sqrt(0.9))
    assert leaderboard([make(speedup=2.0)]).loc[0, "geomean_speedup_compile"] is None


def test_leaderboard_groups_by_model_and_run():
    records = [make(speedup=2.0, model="a"), make(Status.NO_CODE, model="a"), make(speedup=1.1, model="b"),
               make(Status.COMPILE_ERROR, model="b", run="r2")]
    board = leaderboard(records).set_index(["model", "run"])
    assert board.loc[("a", "r"), "n"] == 2
    assert board.loc[("a", "r"), "fast_1"] == pytest.approx(0.5)
    assert board.loc[("a", "r"), "compile_rate"] == pytest.approx(0.5)
    assert board.loc[("a", "r"), "no_code"] == 1
    assert board.loc[("b", "r2"), "compile_error"] == 1 and board.loc[("b", "r2"), "pass_rate"] == 0
    assert list(board.columns)[-len(Status):] == [s.value for s in Status]


def test_records_roundtrip_and_table():
    record = make(speedup=1.5, grads_not_comparable=("w",))
    assert Record.from_dict(__import__("json").loads(record.to_json())) == record
    table = records_table([record, replace(record, status=Status.TIMEOUT)])
    assert list(table["status"]) == ["pass", "timeout"] and table.loc[0, "grads_not_comparable"] == "w"
