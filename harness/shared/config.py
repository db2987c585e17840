"""Configuration: YAML file -> validated, frozen dataclass. Precedence: CLI > YAML > defaults.

`None` means "not set" throughout, so an explicit `false` or `0` in YAML or on the command line is kept.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from harness.shared import findings
from harness.shared.paths import configs_dirs


class ConfigError(ValueError):
    """A config file or value is invalid; the message names the file and the key."""


PRECISIONS = ("fp32", "fp16", "bf16")   # harness/shared/precision.py: what each one casts
BACKENDS = ("auto", "cuda", "triton", "cute", "tilelang")   # kernel languages (harness/shared/backends); auto: detected


@dataclass(frozen=True)
class PrecisionTolerance:
    """The default tolerances of one precision, used where neither the config nor the problem sets one."""
    atol: float        # outputs: |candidate - reference| <= atol + rtol * |reference|
    rtol: float
    grad_atol: float   # gradients (a weight gradient sums over the batch, so fp32 rounding moves it further)
    grad_rtol: float


# KernelBench's per-precision output tolerances (after torchbench): 1e-4 for fp32, 1e-2 for fp16 and bf16.
# Gradients: on level2/62 PyTorch's own fp32 fc.weight gradient lies up to ~4e-4 from the float64 value.
DEFAULT_TOLERANCES = (("fp32", PrecisionTolerance(1e-4, 1e-4, 1e-3, 1e-3)),
                      ("fp16", PrecisionTolerance(1e-2, 1e-2, 1e-2, 1e-2)),
                      ("bf16", PrecisionTolerance(1e-2, 1e-2, 1e-2, 1e-2)))


@dataclass(frozen=True)
class Config:
    device: Optional[str] = None        # "cpu" or "cuda"; None: cuda when available, else cpu
    seed: int = 42                      # seeds weights (both sides), inputs and grad_output
    trials: int = 5                     # forward passes on fresh seeded inputs
    backend: str = "auto"               # auto | cuda | triton | cute | tilelang: the submissions' kernel language
                                        # (harness/shared/backends); auto: detected from each source (cuda when none)
    precision: str = "fp32"             # fp32 | fp16 | bf16: the reference's parameters and floating inputs are cast
                                        # to it, and the candidate gets them so; fp32 keeps the problem's dtypes
    atol: Optional[float] = None        # None: the problem's ATOL, else the precision's default (`tolerances`)
    rtol: Optional[float] = None        # None: the problem's RTOL, else the precision's default
    grad_atol: Optional[float] = None   # None: the problem's GRAD_ATOL, else the precision's default
    grad_rtol: Optional[float] = None   # None: the problem's GRAD_RTOL, else the precision's default
    tolerances: tuple[tuple[str, PrecisionTolerance], ...] = DEFAULT_TOLERANCES  # per precision; an output gets
                                        # the looser of its dtype's and the run precision's (harness/shared/check.py)
    check_grad: bool = True             # run backward and compare gradients
    grad_mismatch_fails: bool = True    # a wrong gradient from an output with an autograd graph (backward raised,
                                        #   a gradient wrong or missing) is the status grad_mismatch: training with
                                        #   it goes wrong silently. False: only reported in grad_correct
    grad_failure_fails: bool = False    # True: every gradient failure is the status, no_grad too (an output with no
                                        #   graph: a forward-only kernel, whose backward fails loudly); False: no_grad
                                        #   only reported in grad_correct
    profile: str = "default"            # rule profile name, recorded on every record (configs/<profile>.yaml)
    forbid: tuple[str, ...] = findings.DEFAULT_FORBID  # findings (harness/shared/findings.py) that make a
                                                      # measured pass a rule_violation; groups expanded
    secret_inputs: bool = True          # draw trial inputs from an unpredictable seed (weights still use `seed`)
    spot_checks: int = 8                # timed calls whose outputs are checked against the reference
    fresh_inputs: int = 4               # after timing, one timed call on each of this many input sets the candidate
                                        # was never given, checked too (0: off); docs/timing.md "Fresh inputs"
    max_host_memory_gb: float = 48.0    # a candidate process group above this private resident memory is killed
    allow_tf32: bool = False            # TF32 for matmuls and cuDNN convolutions on both sides
    compile_timeout_s: float = 900.0    # limit for executing the module (extension builds included)
    light_cuda_headers: bool = True     # compile CUDA sources first with torch/extension.h reduced to torch/types.h,
                                        # as written if that fails (harness/children/candidate/extensions.py)
    run_timeout_s: float = 180.0        # limit for each later phase: checks, then timing
    oracle_timeout_s: float = 900.0     # limit for the reference process
    time_candidates: bool = True        # time correct submissions (and the reference)
    warmup_ms: float = 50.0             # each side warms up this long before its first block
    block_ms: float = 20.0              # one block of timed calls lasts about this long
    min_blocks: int = 24                # blocks per side at least (6 pairs are the fewest with a 95% CI of a median;
                                        #   24 hold five GPU submits within 3%: docs/benchmarks.md)
    target_ci: float = 0.01             # stop once each side's 95% CI of the median is within this share of it ...
    timing_cap_s: float = 3.0           # ... or once the blocks have taken this long (both sides together)
    ref_drift_margin: float = 0.15      # a reference block slower than its clean time's CI by more than this share is
    ref_drift_margin_cpu: float = 0.5   #   timed again (CPU: the second); docs/timing.md "Clean reference time"
    ref_drift_retries: int = 2          # times one such block is timed again before it counts as drifted
    max_block_reps: int = 1000          # timed calls in one block at most
    timing_placements: int = 1          # each side's timed calls rotate among this many copies of its weights (the
                                        #   candidate: as many ModelNew instances); docs/timing.md "Placements"
    ref_timing: str = "interleaved"     # interleaved | sequential | stored (reference/ baselines; see baselines.py)
    baselines_dir: Optional[str] = None  # None: reference/ in the data root (harness/shared/paths.py)
    l2_flush: bool = True               # flush the GPU L2 cache before each timed call (CUDA only)
    timing: str = "events"              # the timing method (TIMING_METHODS; docs/timing.md): events | events-sync |
                                        #   cuda-graph | kernelbench
    timer_host_ahead: bool = True       # CUDA: each timed call starts behind a spin, the host's head start to enqueue
    cuda_graph: bool = False            # time CUDA-graph replays of the forward (launch-bound problems); CUDA only
    max_log_bytes: int = 4_000_000      # a child's log keeps the first and last halves of this
    max_submission_bytes: int = 4_000_000  # a larger submission is recorded too_large, never extracted or run
    # How a batch runs (not in the config hash: they change how fast, never what a record says)
    build_jobs: Optional[int] = None    # build pool size; None: CPU cores - 2 per GPU worker, at least 1
    gpus: Optional[str] = None          # "0,1": GPUs with a worker each; None: every visible GPU (CPU: one worker)
    build_cache_dir: Optional[str] = None  # None: build-cache/ in the data root
    precompiled_headers: bool = True    # builds' C++ files read a torch/extension.h the judge precompiled, where
                                        # their flags fit one (GCC; kept in <build cache>-pch/); harness/build/pch.py
    oracles_per_gpu: int = 3            # references a GPU worker keeps running (started ahead, reused on return)
    warm_candidates: Optional[int] = None  # candidate processes a GPU worker keeps started ahead, each used for one
                                        # submission (0: each started on demand; None: 2 for a judge kept between
                                        # calls, 1 for a batch); harness/judge/warm.py
    warm_oracles: int = 1               # oracle processes a GPU worker keeps imported ahead of the next reference
                                        # start (0: each started on demand); harness/oracle/ahead.py
    ahead_budget_gb: Optional[float] = None  # host memory (on CUDA also GPU memory) the references a GPU worker
                                        # keeps may hold together (their feeds and truths, in memory): no reference
                                        # is started ahead beyond it; None: half the host's available memory;
                                        # harness/oracle/budget.py
    compare_on_gpu: bool = True         # a CUDA evaluation's outputs and gradients compared on its GPU in the
                                        # judging process (same figures; harness/judge/compare_on.py), not its CPU
    ref_grads_always: bool = False      # the reference's backward runs at its first submission whose outputs are
                                        # right, their autograd graph or not (False: at its first whose outputs have
                                        # one, the only case gradients are compared in); once per reference either way

    @property
    def timer_sync(self) -> str:
        """How the Timer ends a timed span under this config's method (harness/shared/timer.py SYNC_MODES)."""
        return TIMING_METHODS[self.timing]

    @property
    def graph_timing(self) -> bool:
        """Timed calls are CUDA-graph replays (`timing: cuda-graph`, or `cuda_graph: true` with another method)."""
        return self.cuda_graph or self.timing == "cuda-graph"

    @property
    def host_ahead(self) -> bool:
        """Timed calls on CUDA get the host's head start (never under KernelBench's method, which has none)."""
        return self.timer_host_ahead and self.timing != "kernelbench"

    def hash(self) -> str:
        """Short hash of every verdict-relevant setting; records of different configs never mix on resume."""
        verdict_relevant = {k: v for k, v in dataclasses.asdict(self).items()
                            if k not in OPERATIONAL and not (k in ADDED_LATER and getattr(self, k) == ADDED_LATER[k])}
        payload = json.dumps(verdict_relevant, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


# The timing methods a user chooses (`timing`, `--timing`), each the Timer's way to end a span:
#   events       the end event on the current stream, the host's round trip out of the span; work left on other
#                streams is found (the profiled forward's side streams, the gap to a second end event after a
#                device-wide synchronize) and then timed the conservative way, both sides alike
#   events-sync  a device-wide synchronize before the end event: every stream counted, the host's round trip too
#   cuda-graph   events on CUDA-graph replays of the forward (launch-bound problems)
#   kernelbench  KernelBench's cuda_event timing (synchronize, flush, start, call, end on the stream), no head
#                start, reported as means: for comparisons with published tables
TIMING_METHODS = {"events": "checked", "events-sync": "device", "cuda-graph": "checked", "kernelbench": "kernelbench"}
# Keys that were renamed: a config that still names one is told the new name.
RENAMED = {"timer_sync": "timing (timer_sync: device is timing: events-sync)"}

MAX_PLACEMENTS = 8   # timing_placements at most (harness/children/timing_server.py)

OPERATIONAL = {"build_jobs", "gpus", "build_cache_dir", "precompiled_headers", "oracles_per_gpu", "warm_candidates",
               "warm_oracles", "compare_on_gpu", "ahead_budget_gb", "ref_grads_always"}
# Keys added after records were first written, with their defaults: left out of the hash while at the default, so
# records judged before a key existed stay reusable; set to anything else, they count like every other key.
ADDED_LATER = {"max_submission_bytes": 4_000_000, "precision": "fp32", "tolerances": DEFAULT_TOLERANCES,
               "ref_drift_margin": 0.15, "ref_drift_margin_cpu": 0.5, "ref_drift_retries": 2, "backend": "auto",
               "light_cuda_headers": True, "timing_placements": 1}
_POSITIVE = {"trials", "max_host_memory_gb", "compile_timeout_s", "run_timeout_s", "oracle_timeout_s", "block_ms",
             "min_blocks", "target_ci", "timing_cap_s", "max_block_reps", "max_log_bytes", "max_submission_bytes",
             "timing_placements",
             "oracles_per_gpu"}
_CHOICES = {"device": (None, "cpu", "cuda"), "ref_timing": ("interleaved", "sequential", "stored"),
            "timing": tuple(TIMING_METHODS), "precision": PRECISIONS, "backend": BACKENDS}
_NON_NEGATIVE = {"atol", "rtol", "grad_atol", "grad_rtol", "warmup_ms", "spot_checks", "fresh_inputs",
                 "ref_drift_margin", "warm_candidates", "warm_oracles", "ahead_budget_gb",
                 "ref_drift_margin_cpu", "ref_drift_retries"}


def find_config(name_or_path: str | Path) -> Path:
    """A config by path, or by name: `strict` is configs/strict.yaml (in the data root, else the copy installed with
    the package; harness/shared/paths.py). An unknown name is a ConfigError that lists the known names and suggests the
    closest."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    folders = configs_dirs()
    for folder in folders:
        if (folder / f"{name_or_path}.yaml").is_file():
            return folder / f"{name_or_path}.yaml"
    names = sorted({p.stem for folder in folders for p in folder.glob("*.yaml")})
    close = difflib.get_close_matches(str(name_or_path), names, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ConfigError(f"{name_or_path}: no such config file, nor a name in configs/ ({', '.join(names)}){hint}")


def load_config(path: Optional[str | Path] = None, overrides: Optional[Mapping[str, Any]] = None) -> Config:
    """Build a Config from defaults, then the YAML file (default: configs/default.yaml, found as `find_config`
    finds names), then overrides.

    Overrides whose value is None are ignored (a CLI flag that was not given).
    """
    if path is None:
        found = [folder / "default.yaml" for folder in configs_dirs() if (folder / "default.yaml").is_file()]
        path = found[0] if found else None
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_yaml(Path(path)))
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return _validate(values, str(path) if path is not None else "the command line")


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys to values")
    return data


def _validate(values: dict[str, Any], origin: str) -> Config:
    fields = {f.name: f for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if key in RENAMED:
            raise ConfigError(f"{origin}: '{key}' is now {RENAMED[key]}")
        if key not in fields:
            raise ConfigError(f"{origin}: unknown key '{key}' (known: {', '.join(sorted(fields))})")
        checked[key] = _tolerances(value, origin) if key == "tolerances" else _coerce(key, value, hints[key], origin)
    if "forbid" in checked:
        try:
            checked["forbid"] = findings.expand(checked["forbid"])
        except findings.UnknownFinding as exc:
            raise ConfigError(f"{origin}: key 'forbid': {exc} (see harness/shared/findings.py)") from exc
    config = Config(**checked)
    for key, choices in _CHOICES.items():
        if getattr(config, key) not in choices:
            shown = " | ".join(str(c) for c in choices if c is not None)
            raise ConfigError(f"{origin}: key '{key}' must be {shown}, got {getattr(config, key)!r}")
    for key in _POSITIVE:
        if getattr(config, key) <= 0:
            raise ConfigError(f"{origin}: key '{key}' must be > 0, got {getattr(config, key)!r}")
    if config.timing_placements > MAX_PLACEMENTS:
        raise ConfigError(f"{origin}: key 'timing_placements' must be at most {MAX_PLACEMENTS}, got "
                          f"{config.timing_placements!r}")
    for key in _NON_NEGATIVE:
        value = getattr(config, key)
        if value is not None and value < 0:
            raise ConfigError(f"{origin}: key '{key}' must be >= 0, got {value!r}")
    return config


def _tolerances(value: Any, origin: str) -> tuple[tuple[str, PrecisionTolerance], ...]:
    """`{bf16: {atol: 2.0e-2}, ...}` -> the full table: precisions and fields left out keep their defaults."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{origin}: key 'tolerances' must map precisions ({', '.join(PRECISIONS)}) to "
                          f"{{atol, rtol, grad_atol, grad_rtol}}, got {value!r}")
    fields = [f.name for f in dataclasses.fields(PrecisionTolerance)]
    table = dict(DEFAULT_TOLERANCES)
    for precision, given in value.items():
        if precision not in table:
            raise ConfigError(f"{origin}: key 'tolerances': unknown precision {precision!r} "
                              f"(known: {', '.join(PRECISIONS)})")
        if not isinstance(given, Mapping):
            raise ConfigError(f"{origin}: key 'tolerances.{precision}' must be a mapping of {', '.join(fields)}")
        for name, number in given.items():
            if name not in fields:
                raise ConfigError(f"{origin}: unknown key 'tolerances.{precision}.{name}' (known: {', '.join(fields)})")
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
                hint = " (YAML reads 1e-2 as text: write 1.0e-2)" if isinstance(number, str) else ""
                raise ConfigError(f"{origin}: key 'tolerances.{precision}.{name}' must be a number >= 0, "
                                  f"got {number!r}{hint}")
        table[precision] = dataclasses.replace(table[precision], **{k: float(v) for k, v in given.items()})
    return tuple((precision, table[precision]) for precision in PRECISIONS)


def _coerce(key: str, value: Any, hint: Any, origin: str) -> Any:
    optional = typing.get_origin(hint) is typing.Union and type(None) in typing.get_args(hint)
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{origin}: key '{key}' must not be null")
    if typing.get_origin(base) is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{origin}: key '{key}' must be a list of names, got {value!r}")
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif base is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{origin}: key '{key}' must be {base.__name__}, got {type(value).__name__} {value!r}")
