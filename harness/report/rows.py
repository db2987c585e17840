"""A record as a row of results.csv: the cell values `scoring.records_table` puts in its table, and a writer for one
record's table that needs no pandas (the command line writes a record extraction decided without loading it).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from harness.shared.record import Record, Status, record_fields


def record_row(record: Record) -> dict:
    """The record's fields as results.csv holds them: statuses as their values, name lists joined by spaces, warning
    lines by " | ", the evidence as JSON."""
    row = {name: getattr(record, name) for name in record_fields()}
    for name in ("status", "check_status", "grad_failure"):
        if isinstance(row[name], Status):
            row[name] = row[name].value
    for name in ("grads_not_comparable", "flags"):
        if isinstance(row[name], (tuple, list)):
            row[name] = " ".join(row[name])
    if isinstance(row["sandbox_warnings"], (tuple, list)):
        row["sandbox_warnings"] = " | ".join(row["sandbox_warnings"])
    if isinstance(row["flag_evidence"], dict):
        row["flag_evidence"] = json.dumps(row["flag_evidence"])
    return row


def write_one_record_csv(record: Record, path: Path) -> None:
    """results.csv for one record, as `scoring.records_table([record]).to_csv(path, index=False)` writes it (pandas
    writes through the csv module too; a one-row table keeps each cell's own type, so only missing values and
    floats need its formatting: empty cells, the float's repr)."""
    row = record_row(record)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(record_fields())
        writer.writerow(_cell(row[name]) for name in record_fields())


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)
