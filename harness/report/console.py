"""Reporting: rich tables for records and leaderboards. The only module that uses rich."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Optional

from rich.console import Console
from rich.table import Table

from harness.shared.findings import DEGENERATE_PROBLEM
from harness.shared.record import Record, Status

if TYPE_CHECKING:   # only for annotations: a record's panel is printed without loading pandas (cli.py)
    import pandas as pd

STATUS_STYLE = {Status.PASS: "bold green", Status.NEEDS_CUDA: "yellow", Status.RULE_VIOLATION: "magenta"}


def _num(value: Optional[float], digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}g}"


def _flag(value: Optional[bool]) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def _status(record: Record) -> str:
    style = STATUS_STYLE.get(record.status, "red")
    return f"[{style}]{record.status.value}[/{style}]"


def record_panel(record: Record, summary=None) -> Table:
    """One record as a two-column table; with the batch's `summary` (batch.json figures), where the time went."""
    table = Table(title=f"{record.problem}  {record.submission}", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("status", _status(record)),
        ("compiled / correct / grad_correct",
         f"{_flag(record.compiled)} / {_flag(record.correct)} / {_flag(record.grad_correct)}"),
        ("max abs / rel error", _errors(record)),
        ("precision: atol / rtol", f"{record.precision or '-'}: {_num(record.atol)} / {_num(record.rtol)}"),
        ("backend", _backend(record)),
        ("grad max abs error", f"{_num(record.grad_max_abs_error)} over {record.grads_compared or 0} gradients"),
        ("runtime ms [95% CI] n", f"{_num(record.runtime_ms, 4)} [{_num(record.runtime_ci_low_ms, 4)}, "
                                  f"{_num(record.runtime_ci_high_ms, 4)}] {record.runtime_reps or '-'}"),
        ("reference ms [95% CI] n", f"{_num(record.ref_runtime_ms, 4)} [{_num(record.ref_runtime_ci_low_ms, 4)}, "
                                    f"{_num(record.ref_runtime_ci_high_ms, 4)}] {record.ref_runtime_reps or '-'}"
                                    f" ({record.ref_source or '-'})"),
        ("speedup [95% CI]", f"{_num(record.speedup)} [{_num(record.speedup_ci_low)}, "
                             f"{_num(record.speedup_ci_high)}]; over torch.compile {_num(record.speedup_compile)}"),
        ("timing", f"{record.timing_method or '-'}, {record.timing_blocks or '-'} blocks, "
                   f"converged {_flag(record.timing_converged)}, speed of light {_num(record.sol_fraction, 2)}"),
        ("compile s", _num(record.compile_s) + _build_note(record, summary)),
        *([("time s", _phases(summary))] if summary is not None else []),
        ("error", record.error or "-"),
        *([("degenerate problem", f"{degenerate} (the speedup says little about the kernels)")]
          if (degenerate := (record.flag_evidence or {}).get(DEGENERATE_PROBLEM)) else []),
        ("device", f"{record.device} ({record.device_name or '-'}), torch {record.torch_version}, "
                   f"CUDA {record.cuda_version or '-'}"),
        ("log", record.log_path or "-"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def _errors(record: Record) -> str:
    """The record's largest errors over every trial and output (an `incorrect` error row names the worst of them)."""
    text = f"{_num(record.max_abs_error)} / {_num(record.max_rel_error)}"
    if record.max_rel_error == 0 and record.max_abs_error:   # the relative error counts where the reference is not 0
        text += " (every difference lies where the reference is 0)"
    return text


# What the backend names cover, where the name alone misleads: "cuda" is any torch C++/CUDA extension.
_BACKEND_NOTES = {"cuda": "C++/CUDA extensions through torch.utils.cpp_extension"}


def _backend(record: Record) -> str:
    if record.backend is None:
        return "-"
    note = _BACKEND_NOTES.get(record.backend)
    if note and record.device == "cpu":
        note += ", C++ on the CPU device"
    return f"{record.backend} ({note})" if note else record.backend


def results_table(records: Iterable[Record], title: str = "results") -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("problem", "submission", "status", "correct", "grad", "max abs err", "ms", "ref ms", "speedup",
                   "error"):
        table.add_column(column, overflow="fold", max_width=48 if column == "error" else None)
    for record in records:
        name = record.submission if len(record.submission) <= 40 else "..." + record.submission[-37:]
        table.add_row(record.problem, name, _status(record), _flag(record.correct), _flag(record.grad_correct),
                      _num(record.max_abs_error), _num(record.runtime_ms, 4), _num(record.ref_runtime_ms, 4),
                      _num(record.speedup), (record.error or "")[:140])
    return table


def leaderboard_table(board: pd.DataFrame, title: str = "leaderboard") -> Table:
    """With records of degenerate problems, a column counts them and each fast_p and geomean cell gives the value
    without them in parentheses."""
    table = Table(title=title, title_justify="left")
    rates = ["compile_rate", "correct_rate", "grad_correct_rate", "pass_rate", "fast_0", "fast_1", "fast_1.5",
             "fast_2"]
    split = "n_degenerate" in board and bool((board["n_degenerate"] > 0).any())
    for column in ["model", "run", "precision", "n", *(["degenerate"] if split else []),
                   *[r.removesuffix("_rate") for r in rates], "geomean x", "x compile", "statuses"]:
        table.add_column(column, justify="left" if column in ("model", "run", "precision", "statuses") else "right",
                         overflow="fold")
    statuses = [s.value for s in Status]
    for _, row in board.iterrows():
        counts = " ".join(f"{name}:{int(row[name])}" for name in statuses if row[name] > 0)
        cells, geomean = [_pct(row[r]) for r in rates], _num(row["geomean_speedup"])
        if split:
            cells = [cell + (f" ({_pct(row[r + '_nondegenerate'])})" if r.startswith("fast_") else "")
                     for r, cell in zip(rates, cells)]
            geomean += f" ({_num(row['geomean_speedup_nondegenerate'])})"
        table.add_row(str(row["model"]), str(row["run"]), str(row["precision"]), str(row["n"]),
                      *([str(int(row["n_degenerate"]))] if split else []), *cells, geomean,
                      _num(row["geomean_speedup_compile"]), counts)
    if split:
        table.caption = ("in parentheses: fast_p and geomean x without the records of degenerate problems "
                         "(degenerate_problem: a constant, or an answer that ignores an input, passes)")
    return table


def _pct(value: Optional[float]) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, width=160 if not Console().is_terminal else None)


def problem_check_table(reports, device: str) -> Table:
    table = Table(title=f"problem check on {device}", title_justify="left")
    for column in ("id", "outputs", "eager ms", "peak MB" if device == "cuda" else "tensors MB", "flags"):
        table.add_column(column, overflow="fold")
    for report in reports:
        info = report.info
        outputs = " ".join(str(o.shape) if o.shape is not None else o.dtype for o in info.outputs) if info else ""
        memory = (info.peak_mb if device == "cuda" else info.tensor_mb) if info else None
        flags = "; ".join(report.flags) or "[green]ok[/green]"
        if report.error:
            flags = f"[red]{report.error}[/red]"
        elif report.flags:
            flags = f"[yellow]{flags}[/yellow]"
        table.add_row(report.problem.id, outputs, _num(info.eager_ms if info else None, 4), _num(memory, 4), flags)
    return table


def baseline_table(data: dict, ids: list[str], title: str) -> Table:
    """The stored baselines of `ids` from a reference/ file: eager and compile medians with their CIs."""
    table = Table(title=title, title_justify="left")
    for column in ("problem", "eager ms", "95% CI", "n", "compile ms", "compile / eager", "floor ms", "note"):
        table.add_column(column, overflow="fold")
    for problem_id in ids:
        entry = data.get("problems", {}).get(problem_id, {})
        eager, compiled = entry.get("eager") or {}, entry.get("compile") or {}
        ratio = compiled["median_ms"] / eager["median_ms"] if "median_ms" in compiled and eager else None
        table.add_row(problem_id, _num(eager.get("median_ms"), 4),
                      f"[{_num(eager.get('ci_low_ms'), 4)}, {_num(eager.get('ci_high_ms'), 4)}]",
                      str(eager.get("reps", "-")), _num(compiled.get("median_ms"), 4), _num(ratio),
                      _num(entry.get("floor_ms"), 3), entry.get("error") or compiled.get("error") or "")
    peaks = data.get("peaks") or {}
    precision = (data.get("method") or {}).get("precision", "fp32")
    matmul = "fp32 matmul" if precision == "fp32" else f"matmul (the faster of fp32 and {precision})"
    table.caption = (f"peaks: copy {_num(peaks.get('bandwidth_gbps'), 4)} GB/s, {matmul} "
                     f"{_num(peaks.get('fp32_tflops'), 4)} TFLOP/s")
    return table


class BatchView:
    """The live view of a batch: done / total, a count per status, builds running and ahead of the GPU workers,
    and what each GPU worker is on. Use as a context manager; `update` takes harness.pipeline.Progress.

    Where the console is not a terminal (stderr sent to a file or a pipe) nothing is redrawn: one whole line is
    written each time a submission finishes, so what follows (the results, "interrupted: ...") starts a line."""

    def __init__(self, total: int, out: Console, device: str = "cuda"):
        from rich.console import Group
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        self.out, self.total = out, total
        self.workers = _workers(device)
        self.live = None
        self.last_done: Optional[int] = None
        if not out.is_terminal:
            return
        self.bar = Progress(TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=out)
        self.task = self.bar.add_task("judging", total=total)
        self.detail = Text("")
        self.live = Live(Group(self.bar, self.detail), console=out, refresh_per_second=4)

    def __enter__(self) -> "BatchView":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.live is not None:
            self.live.__exit__(*exc_info)

    def update(self, progress) -> None:
        statuses = " ".join(f"{name}:{count}" for name, count in sorted(progress.statuses.items())) or "-"
        if self.live is None:
            if progress.done != self.last_done:
                self.last_done = progress.done
                reused = f" ({progress.reused} reused from an earlier run)" if progress.reused else ""
                self.out.print(f"judged {progress.done}/{self.total}{reused}  statuses {statuses}", highlight=False,
                               soft_wrap=True)
            return
        self.bar.update(self.task, completed=progress.done)
        busy = [f"{worker}:{problem}" for worker, problem in progress.gpu_busy.items() if problem]
        workers = (f"{self.workers} busy {progress.evaluating}/{progress.workers}"
                   + (f" ({', '.join(busy)})" if busy else ""))
        self.detail.plain = (f"statuses  {statuses}\n"
                             f"builds    {progress.building} queued or running, {progress.builds_ahead} built ahead "
                             f"of the {self.workers}\n{workers}"
                             + (f"\nreused    {progress.reused} records from an earlier run"
                                if progress.reused else ""))


def _workers(device: str) -> str:
    return "GPU workers" if device == "cuda" else "CPU workers"


def _build_note(record: Record, summary) -> str:
    """Whether the extensions were built now or came from the build cache (then compile s is the original build's),
    and whether a CUDA source needed torch/extension.h whole (record field light_headers)."""
    builds = (summary.builds or {}) if summary is not None else {}
    light = " (CUDA sources compiled as written: the light torch/extension.h did not build)" \
        if record.light_headers is False else ""
    if builds.get("cached"):
        return " (cached: this build was done by an earlier run; nothing compiled now)" + light
    if record.prebuilt:
        return " (built ahead in the build pool)" + light
    return light


def _phases(summary) -> str:
    if summary.gpu_tasks:
        evaluation = f"evaluation {summary.gpu_s:.1f}"
    else:   # extraction decided it before any build started, or the build did (compile_error, needs_cuda)
        evaluation = "no evaluation (decided by " + ("the build)" if summary.builds else "extraction, nothing ran)")
    return f"wall {summary.wall_s:.1f}: build {summary.build_cpu_s:.1f} CPU s, {evaluation}"


def throughput_line(summary) -> str:
    """One line from batch.json's figures."""
    share = f"{summary.gpu_busy_share:.0%}" if summary.gpu_busy_share is not None else "-"
    return (f"wall {summary.wall_s:.1f} s; builds {summary.builds or {}} on {summary.build_jobs} build jobs, "
            f"{summary.build_cpu_s:.1f} CPU s; {_workers(summary.device)} {len(summary.gpus)}: "
            f"{summary.gpu_s:.1f} s busy "
            f"({share} of wall x workers); {summary.evaluated} evaluated, {summary.reused} reused")
