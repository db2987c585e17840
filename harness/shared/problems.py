"""Problem loading: find KernelBench-format problem files and name them "levelN/NN".

Nothing here executes problem code: judging runs it in the oracle process (harness/children/oracle/main.py), and
`ProblemMetadata.from_module` reads the constants of a module someone else executed.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from harness.shared.paths import data_root

_PROBLEM_FILE = re.compile(r"^(?P<number>\d+)_(?P<name>.+)\.py$")
_LEVEL_DIR = re.compile(r"^level_?(?P<level>\d+)$")
_ID = re.compile(r"^level_?(?P<level>\d+)/(?:problem_)?(?P<number>\d+)$")
_STEM_ID = re.compile(r"^level_?(?P<level>\d+)/(?P<number>\d+)_(?P<name>.+)$")   # the file's stem: level1/16_ReLU


class ProblemNotFound(LookupError):
    pass


class ProblemMetadataError(ValueError):
    """A metadata constant in a problem file has the wrong type; the message names the file and the constant."""


@dataclass(frozen=True)
class ProblemMetadata:
    """Optional module-level constants of a problem file; a problem without them behaves as KernelBench's do."""
    description: Optional[str] = None          # DESCRIPTION: one line
    atol: Optional[float] = None               # ATOL, RTOL: output tolerance override
    rtol: Optional[float] = None
    grad_atol: Optional[float] = None          # GRAD_ATOL, GRAD_RTOL: gradient tolerance override
    grad_rtol: Optional[float] = None
    check_grad: bool = True                    # CHECK_GRAD = False: no backward check (e.g. argmax)
    devices: Optional[tuple[str, ...]] = None  # DEVICES = ("cuda",): the devices the problem is meant for

    @classmethod
    def from_module(cls, module: Any, origin: str) -> "ProblemMetadata":
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            constant = field.name.upper()
            if not hasattr(module, constant):
                continue
            value = getattr(module, constant)
            if field.name == "description" and isinstance(value, str):
                values[field.name] = value
            elif field.name == "check_grad" and isinstance(value, bool):
                values[field.name] = value
            elif field.name == "devices" and isinstance(value, (list, tuple)) and all(
                    d in ("cpu", "cuda") for d in value):
                values[field.name] = tuple(value)
            elif field.name in ("atol", "rtol", "grad_atol", "grad_rtol") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool) and value >= 0:
                values[field.name] = float(value)
            else:
                raise ProblemMetadataError(f"{origin}: constant {constant} has an invalid value {value!r}")
        return cls(**values)


@dataclass(frozen=True)
class Problem:
    id: str      # "level2/62"
    name: str    # "Matmul_GroupNorm_LeakyReLU_Sum"
    path: Path   # absolute path of the .py file

    @property
    def level(self) -> int:
        return int(self.id.split("/")[0].removeprefix("level"))


def problem_from_path(path: str | Path) -> Problem:
    """A problem file named levelN/NN_Name.py; a file elsewhere keeps its stem as the id."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ProblemNotFound(f"problem file not found: {path}")
    match = _PROBLEM_FILE.match(path.name)
    level = _LEVEL_DIR.match(path.parent.name)
    if match and level:
        return Problem(f"level{int(level['level'])}/{int(match['number'])}", match["name"], path)
    return Problem(path.stem, path.stem, path)


def default_problems_dir() -> Path:
    """problems/ in the data root (harness/shared/paths.py)."""
    return data_root() / "problems"


def list_problems(problems_dir: Optional[str | Path] = None) -> list[Problem]:
    root = Path(problems_dir) if problems_dir is not None else default_problems_dir()
    if not root.is_dir():
        raise ProblemNotFound(f"problems folder not found: {root}")
    found = []
    for level_dir in sorted(p for p in root.iterdir() if p.is_dir() and _LEVEL_DIR.match(p.name)):
        for path in level_dir.iterdir():
            if _PROBLEM_FILE.match(path.name):
                found.append(problem_from_path(path))
    return sorted(found, key=lambda p: (p.level, int(p.id.split("/")[1])))


def resolve_problem(spec: str | Path, problems_dir: Optional[str | Path] = None) -> Problem:
    """A path to a problem file, or an id such as "level2/62" (also "level_2/problem_62", or the file's stem
    "level2/62_Matmul_GroupNorm_LeakyReLU_Sum") under problems_dir (default: problems/ in the data root)."""
    text = str(spec)
    if Path(text).is_file():
        return problem_from_path(text)
    wanted = text.strip("/").removesuffix(".py")
    match = _ID.match(wanted) or _STEM_ID.match(wanted)
    if match is None:
        if text.endswith(".py"):
            return problem_from_path(text)   # a path that does not exist: "problem file not found"
        root = Path(problems_dir) if problems_dir is not None else default_problems_dir()
        raise ProblemNotFound(f"not a problem file or id (expected levelN/NN): {text!r}{_closest(wanted, root)}")
    problem = find_problem(int(match["level"]), int(match["number"]), problems_dir)
    name = match.groupdict().get("name")
    if name is not None and name != problem.name:   # the number found a file, the name is another's
        raise ProblemNotFound(f"no problem {wanted}: level{match['level']}/{match['number']} is "
                              f"{problem.path.stem}{_closest(wanted, problem.path.parent.parent)}")
    return problem


def find_problem(level: int, number: int, problems_dir: Optional[str | Path] = None) -> Problem:
    root = Path(problems_dir) if problems_dir is not None else default_problems_dir()
    candidates = []
    for level_name in (f"level{level}", f"level_{level}"):
        folder = root / level_name
        if folder.is_dir():
            candidates += [p for p in folder.iterdir()
                           if (m := _PROBLEM_FILE.match(p.name)) and int(m["number"]) == number]
    if not candidates:
        wanted = f"level{level}/{number}"
        raise ProblemNotFound(f"no problem {wanted} under {root}{_closest(wanted, root)}")
    if len(candidates) > 1:
        raise ProblemNotFound(f"several files for level{level}/{number}: {sorted(map(str, candidates))}")
    return problem_from_path(candidates[0])


def _closest(wanted: str, root: Path) -> str:
    """"; did you mean level2/62?" when a problem under `root` is close to `wanted` by its id or by its file's stem
    (level1/16_ReLU), else ""."""
    try:
        problems = list_problems(root)
    except ProblemNotFound:
        return ""
    by_name = {problem.id: problem.id for problem in problems}
    by_name.update({f"{problem.id.split('/')[0]}/{problem.path.stem}": problem.id for problem in problems})
    close = difflib.get_close_matches(wanted, list(by_name), n=1, cutoff=0.75)
    return f"; did you mean {by_name[close[0]]}?" if close else ""
