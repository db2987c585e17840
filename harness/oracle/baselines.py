"""Stored reference timings in reference/: one JSON file per (GPU or CPU name, torch version, CUDA version, precision).

`run_eval.py baseline` times every problem's reference in eager mode and under torch.compile, each in its own process
(harness/children/oracle/baseline.py) with the adaptive method of harness/shared/timer.py, measures the device's peaks
(one large copy, one large matmul) and merges the results into the environment's file with the date and the method's
parameters. A batch with `ref_timing: stored` takes the eager time from there instead of timing the reference next to
each candidate; every record names its reference's source. An entry is used only for the same problem text (its
sha256 is stored), so an edited problem is re-timed rather than compared with a stale number. An fp16 or bf16 run
(config `precision`) has files of its own, `...__bf16.json`, timed with the reference cast as the oracle casts it; an
fp32 file keeps the name it had before precision modes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, TypeVar

import torch

from harness.isolation import policy
from harness.isolation.spawn import start_until_ready
from harness.shared.config import Config, ConfigError
from harness.shared.messages import BaselineReady, Malformed, PeaksReady
from harness.shared.paths import data_root
from harness.shared.problems import Problem
from harness.shared.roofline import floor_ms
from harness.shared.settings import SandboxSettings, TimingSettings
from harness.shared.specs import BASELINE_MODULE, BaselineSpec
from harness.shared.timer import TimingStats

MODES = ("eager", "compile", "max-autotune")


def parse_modes(text: str) -> tuple[str, ...]:
    """"eager,compile" -> ("eager", "compile"); eager is always needed (the speedups are over it)."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if "eager" not in modes or any(m not in MODES for m in modes):
        raise ConfigError(f"--modes must include eager and come from {', '.join(MODES)}; got {text!r}")
    return modes


def file_name(device_name: str, torch_version: str = torch.__version__,
              cuda_version: Optional[str] = torch.version.cuda, precision: str = "fp32") -> str:
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", device_name).strip("-")
    suffix = "" if precision == "fp32" else f"__{precision}"
    return f"{slug}__torch-{torch_version.split('+')[0]}__cuda-{cuda_version or 'none'}{suffix}.json"


def directory(config: Config) -> Path:
    return Path(config.baselines_dir) if config.baselines_dir else data_root() / "reference"


def problem_hash(problem: Problem) -> str:
    return hashlib.sha256(problem.path.read_bytes()).hexdigest()[:16]


def read(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def write(path: Path, environment: dict, method: dict, peaks: Optional[dict], entries: dict[str, dict]) -> dict:
    """Merge `entries` (problem id -> entry) into the file; peaks and method are replaced when given."""
    data = read(path)
    data["environment"] = environment
    data.setdefault("problems", {}).update(entries)
    if peaks is not None:
        data["peaks"] = peaks
    data["method"] = method
    data["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)   # a killed run leaves the old file, never half a file
    return data


@dataclass(frozen=True)
class Stored:
    """One problem's stored baseline."""
    file: str
    date: str                 # when this problem was timed
    eager: dict               # TimingStats fields
    compile: Optional[dict]   # TimingStats fields under torch.compile (default mode), None when absent or failed
    peaks: Optional[dict]     # the device's measured peaks: bandwidth_gbps, fp32_tflops

    @property
    def source(self) -> str:
        return f"stored {self.file} ({self.date[:10]})"


def lookup(config: Config, device_name: str, problem: Problem) -> tuple[Optional[Stored], str]:
    """(the stored baseline, "") or (None, why there is none)."""
    name = file_name(device_name, precision=config.precision)
    data = read(directory(config) / name)
    entry = data.get("problems", {}).get(problem.id)
    if not entry:
        return None, f"no stored baseline for {problem.id} in {name}"
    if entry.get("problem_sha256") != problem_hash(problem):
        return None, f"the stored baseline for {problem.id} in {name} is for another version of the problem file"
    eager = entry.get("eager")
    if not isinstance(eager, dict) or "median_ms" not in eager:
        return None, f"the stored baseline for {problem.id} in {name} has no eager time"
    missing = [field.name for field in dataclasses.fields(TimingStats) if field.name not in eager]
    if missing:   # an older or hand-edited file: timed live rather than failing after the candidate was timed
        return None, f"the stored baseline for {problem.id} in {name} lacks {', '.join(missing)}"
    if entry.get("allow_tf32", False) != config.allow_tf32:
        return None, (f"the stored baseline for {problem.id} in {name} was timed with "
                      f"allow_tf32={entry.get('allow_tf32')}")
    if entry.get("precision", "fp32") != config.precision:   # a file copied or renamed by hand
        return None, f"the stored baseline for {problem.id} in {name} was timed in {entry.get('precision')}"
    ahead = (data.get("method") or {}).get("timer_host_ahead", False)   # files from before the option: without
    on_cpu = (data.get("environment") or {}).get("device") == "cpu"     # where it changes nothing
    if config.ref_timing == "stored" and ahead != config.timer_host_ahead and not on_cpu:
        return None, (f"the stored baselines in {name} were timed with timer_host_ahead={ahead} "
                      f"(run_eval.py baseline times them again)")
    method = data.get("method") or {}   # files from before the `timing` key say timer_sync: device (events-sync)
    timed_by = method.get("timing") or ("events-sync" if method.get("timer_sync", "device") == "device" else "stream")
    if config.ref_timing == "stored" and timed_by != config.timing and not on_cpu:
        return None, (f"the stored baselines in {name} were timed with timing: {timed_by}, this run uses "
                      f"{config.timing} (run_eval.py baseline times them again)")
    compiled = entry.get("compile")
    return Stored(file=name, date=str(entry.get("date", "")), eager=eager,
                  compile=compiled if isinstance(compiled, dict) and "median_ms" in compiled else None,
                  peaks=data.get("peaks")), ""


Report = TypeVar("Report", BaselineReady, PeaksReady)


def _child(report: type[Report], config: Config, device: str, log_path: Path, problem: Optional[Problem] = None,
           modes: tuple[str, ...] = ()) -> tuple[Optional[Report], str]:
    """Run one baseline child to READY (a problem's times, or without one the device's peaks) and read its report
    as `report`; (it, "") or (None, why there is none)."""
    workdir = Path(tempfile.mkdtemp(prefix="baseline-"))
    try:
        spec = BaselineSpec.from_config(config, device, workdir, problem.path if problem else None, modes)
        started = start_until_ready(BASELINE_MODULE, spec, workdir, log_path, config.oracle_timeout_s,
                                    **policy.for_trusted(SandboxSettings.from_config(config)).options())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if started.ready is None:
        return None, started.error or "no report"
    try:
        return report.from_event(started.ready), ""
    except Malformed as exc:
        return None, f"its report is malformed: {exc}"


def run_baselines(problems: list[Problem], config: Config, device: str, modes: tuple[str, ...], log_dir: Path,
                  on_problem: Optional[Callable[[Problem, dict], None]] = None,
                  missing_only: bool = False) -> tuple[Path, dict]:
    """Time every problem's reference in each mode and merge the results into the environment's file.

    Peaks are measured first, in their own process. Each problem is written as soon as it is timed, so an
    interrupted run keeps what it finished; with `missing_only` a rerun skips problems whose entry is current
    (same problem text, every mode attempted). Returns (the file, its contents)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    rule = TimingSettings.from_config(config).rule
    method = {"rule": rule.to_dict(), "l2_flush": config.l2_flush, "timing": config.timing,
              "timer_host_ahead": config.timer_host_ahead,
              "trials": config.trials, "seed": config.seed, "modes": list(modes), "allow_tf32": config.allow_tf32,
              "precision": config.precision}
    measured, error = _child(PeaksReady, config, device, log_dir / "peaks.log")
    if measured is None:
        raise RuntimeError(f"measuring the device's peaks failed: {error} (log: {log_dir / 'peaks.log'})")
    peaks = measured.peaks()
    name = measured.device_name
    environment = {"device": device, "device_name": name, "torch": torch.__version__, "cuda": torch.version.cuda}
    path = directory(config) / file_name(name, precision=config.precision)
    data = write(path, environment, method, peaks, {})
    for problem in problems:
        if missing_only and _current(data.get("problems", {}).get(problem.id), problem, modes, config):
            continue
        log_path = log_dir / f"baseline-{problem.id.replace('/', '_')}.log"
        result, error = _child(BaselineReady, config, device, log_path, problem, modes)
        entry = {"problem_sha256": problem_hash(problem), "name": problem.name, "allow_tf32": config.allow_tf32,
                 "precision": config.precision, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if result is None:
            entry["error"] = error
        else:
            entry.update({"flops": result.flops, "bytes": result.bytes,
                          **{mode: result.modes.get(mode) for mode in modes}})
            entry["floor_ms"] = floor_ms(result.flops, result.bytes, peaks)
        data = write(path, environment, method, None, {problem.id: entry})
        if on_problem is not None:
            on_problem(problem, entry)
    return path, data


def _current(entry: Optional[dict], problem: Problem, modes: tuple[str, ...], config: Config) -> bool:
    return bool(entry) and entry.get("problem_sha256") == problem_hash(problem) and all(
        mode in entry for mode in modes) and entry.get("allow_tf32", False) == config.allow_tf32 and entry.get(
        "precision", "fp32") == config.precision
