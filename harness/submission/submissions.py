"""Submissions: one file or one JSONL generation, and the problem each targets.

A batch SOURCE is a folder or a JSONL file. The problem of each submission comes from, in order: --problem (all of
them); a folder per problem (.../levelN/NN_Name/anything.py); KernelBench run naming resolved against the problems
folder (level_2_problem_62_sample_0_kernel.py, or level_2/problem_62.py); JSONL fields (problem, completion, model,
sample_id).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.shared.problems import (
    Problem,
    ProblemNotFound,
    find_problem,
    resolve_problem,
)

SUBMISSION_SUFFIXES = {".py", ".md", ".txt"}
IGNORED_NAMES = {"readme.md", "readme.txt", "__init__.py"}
_KB_FLAT = re.compile(r"level_?(?P<level>\d+)_problem_(?P<number>\d+)(?:_sample_(?P<sample>\d+))?", re.I)
_KB_NESTED_FILE = re.compile(r"^problem_(?P<number>\d+)(?:_sample_(?P<sample>\d+))?", re.I)
_LEVEL = re.compile(r"^level_?(?P<level>\d+)$", re.I)
_PROBLEM_FOLDER = re.compile(r"^(?P<number>\d+)_.+$")


@dataclass(frozen=True)
class Submission:
    label: str                 # what the record calls it: a path, or "<file.jsonl>:<line>"
    text: str                  # the raw content: Python source or raw model output
    is_python: bool            # a .py file is run as is; anything else goes through extraction
    problem: Problem
    model: Optional[str] = None
    run: Optional[str] = None
    sample_id: Optional[str] = None
    not_text: Optional[str] = None   # why the file is not UTF-8 text (then `text` holds it with U+FFFD replacements)

    @property
    def problem_id(self) -> str:
        return self.problem.id

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str


def from_file(path: Path, problem: Problem, run: Optional[str] = None, model: Optional[str] = None,
              sample_id: Optional[str] = None) -> Submission:
    raw = path.read_bytes()
    try:
        text, not_text = raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:   # as Python itself refuses such a source, the judge does not guess
        text = raw.decode("utf-8", errors="replace")
        not_text = f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
    return Submission(label=str(path), text=text, is_python=path.suffix == ".py", problem=problem, model=model,
                      run=run, sample_id=sample_id if sample_id is not None else path.stem, not_text=not_text)


def discover(source: Path, problem: Optional[Problem], problems_dir: Path, run: Optional[str] = None,
             model: Optional[str] = None) -> tuple[list[Submission], list[Skipped]]:
    if source.is_file() and source.suffix == ".jsonl":
        return _from_jsonl(source, problem, problems_dir, run, model)
    if source.is_file():
        files = [source]
    elif source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in SUBMISSION_SUFFIXES
                       and p.name.lower() not in IGNORED_NAMES and not p.name.startswith((".", "_"))
                       and "__pycache__" not in p.parts)
    else:
        raise FileNotFoundError(f"submission source not found: {source}")
    found, skipped = [], []
    for path in files:
        try:
            target, sample = (problem, None) if problem else _problem_from_path(path, problems_dir)
        except ProblemNotFound as exc:
            skipped.append(Skipped(str(path), str(exc)))
            continue
        found.append(from_file(path, target, run=run, model=model, sample_id=sample))
    return found, skipped


def _problem_from_path(path: Path, problems_dir: Path) -> tuple[Problem, Optional[str]]:
    folder, level_folder = path.parent.name, path.parent.parent.name
    if _PROBLEM_FOLDER.match(folder) and _LEVEL.match(level_folder):
        level = int(_LEVEL.match(level_folder)["level"])
        return find_problem(level, int(_PROBLEM_FOLDER.match(folder)["number"]), problems_dir), None
    flat = _KB_FLAT.search(path.name)
    if flat:
        return find_problem(int(flat["level"]), int(flat["number"]), problems_dir), flat["sample"]
    nested = _KB_NESTED_FILE.match(path.name)
    if nested and _LEVEL.match(folder):
        level = int(_LEVEL.match(folder)["level"])
        return find_problem(level, int(nested["number"]), problems_dir), nested["sample"]
    raise ProblemNotFound(f"cannot tell which problem {path} targets: pass --problem, or name it as "
                          "levelN/NN_Name/<file>, level_N_problem_NN_sample_K_kernel.py or level_N/problem_NN.py")


def _from_jsonl(source: Path, problem: Optional[Problem], problems_dir: Path, run: Optional[str],
                model: Optional[str]) -> tuple[list[Submission], list[Skipped]]:
    found, skipped = [], []
    for number, line in enumerate(source.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        label = f"{source}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            skipped.append(Skipped(label, f"not JSON: {exc}"))
            continue
        if not isinstance(row, dict) or not isinstance(row.get("completion"), str):
            skipped.append(Skipped(label, "no string field 'completion'"))
            continue
        try:
            target = problem or resolve_problem(str(row.get("problem", "")), problems_dir)
        except ProblemNotFound as exc:
            skipped.append(Skipped(label, str(exc)))
            continue
        sample = row.get("sample_id")
        found.append(Submission(label=label, text=row["completion"], is_python=False, problem=target,
                                model=row.get("model") if row.get("model") is not None else model, run=run,
                                sample_id=str(sample) if sample is not None else None))
    return found, skipped
