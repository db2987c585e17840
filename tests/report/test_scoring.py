import json
import math
from dataclasses import replace

import pytest
from conftest import make

from harness.report.scoring import (
    fast_p,
    geometric_mean_speedup,
    leaderboard,
    records_table,
)
from harness.shared.record import Record, Status


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


def test_the_leaderboard_never_mixes_precisions_in_one_row():
    records = [make(speedup=2.0), make(speedup=4.0, precision="bf16"), make(Status.INCORRECT, precision="bf16")]
    board = leaderboard(records).set_index(["model", "run", "precision"])
    assert board.loc[("m", "r", "fp32"), "n"] == 1 and board.loc[("m", "r", "fp32"), "geomean_speedup"] == 2.0
    assert board.loc[("m", "r", "bf16"), "n"] == 2 and board.loc[("m", "r", "bf16"), "pass_rate"] == 0.5
    assert list(records_table(records)["precision"]) == ["fp32", "bf16", "bf16"]   # results.csv's column


def test_records_written_before_precision_modes_read_as_fp32():
    row = json.loads(make(speedup=1.5).to_json())
    del row["precision"], row["atol"], row["rtol"], row["allow_tf32"]
    old = Record.from_dict(row)
    assert old.precision == "fp32" and old.atol is None and old.allow_tf32 is None
    assert Record.from_dict(json.loads(make(precision="bf16").to_json())).precision == "bf16"


def _degenerate(**fields):
    return make(flags=("degenerate_problem",), flag_evidence={"degenerate_problem": "output 0: the constant 0 passes"},
                **fields)


def test_fast_p_and_geomean_are_also_given_without_degenerate_problems():
    records = [_degenerate(speedup=100.0, problem="level0/6"), make(speedup=2.0), make(speedup=0.5),
               make(Status.INCORRECT)]
    row = leaderboard(records).iloc[0]
    assert row["n"] == 4 and row["n_degenerate"] == 1
    assert row["fast_1"] == pytest.approx(2 / 4) and row["fast_1_nondegenerate"] == pytest.approx(1 / 3)
    assert row["fast_0_nondegenerate"] == pytest.approx(2 / 3)
    assert row["geomean_speedup"] == pytest.approx(100 ** (1 / 3))
    assert row["geomean_speedup_nondegenerate"] == pytest.approx(1.0)
    only = leaderboard([_degenerate(speedup=9.0)]).iloc[0]
    assert math.isnan(only["fast_1_nondegenerate"]) and only["geomean_speedup_nondegenerate"] is None
    clean = leaderboard([make(speedup=3.0)]).iloc[0]
    assert clean["n_degenerate"] == 0 and clean["geomean_speedup_nondegenerate"] == clean["geomean_speedup"]
