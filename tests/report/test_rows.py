"""results.csv's rows (harness/report/rows.py): one record's table written without pandas is the one pandas writes."""
from __future__ import annotations

from conftest import make

from harness.report.rows import record_row, write_one_record_csv
from harness.report.scoring import records_table
from harness.shared.record import Status


def test_one_records_csv_without_pandas_is_the_one_pandas_writes(tmp_path):
    records = [
        make(Status.NO_CODE, error="no complete Python block that defines ModelNew", flags=(), flag_evidence={},
             check_status=Status.NO_CODE, allow_tf32=False),
        make(speedup=2.0, runtime_ms=0.1 + 0.2, runtime_reps=48, max_rel_error=1e-7, flags=("a", "b"),
             flag_evidence={"a": 'line 1: "x", y'}, sandbox_warnings=("no cgroup", "no netns"), phases={"load": 1.5},
             grads_not_comparable=("w",), error="two\nlines, \"quoted\"", check_status=Status.PASS,
             grad_failure=Status.NO_GRAD, timing_converged=True, tolerance_needed=float("inf")),
    ]
    for index, record in enumerate(records):
        ours, theirs = tmp_path / f"ours-{index}.csv", tmp_path / f"pandas-{index}.csv"
        write_one_record_csv(record, ours)
        records_table([record]).to_csv(theirs, index=False)
        assert ours.read_bytes() == theirs.read_bytes()


def test_a_row_holds_statuses_as_values_and_lists_as_text():
    row = record_row(make(Status.RULE_VIOLATION, flags=("x", "y"), flag_evidence={"x": "e"},
                          sandbox_warnings=("one", "two"), check_status=Status.PASS))
    assert row["status"] == "rule_violation" and row["check_status"] == "pass" and row["grad_failure"] is None
    assert row["flags"] == "x y" and row["flag_evidence"] == '{"x": "e"}' and row["sandbox_warnings"] == "one | two"
