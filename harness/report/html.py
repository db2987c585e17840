"""HTML report: plots and one self-contained page from records alone (`run_eval.py report`).

Everything here is derived from records: fast_p, the leaderboard and the status counts come from
harness/report/scoring.py, grouped by (model, run, precision) as the leaderboard groups them. Record text (errors,
labels, ids) comes from untrusted submissions and is escaped wherever it reaches the page.
"""
from __future__ import annotations

import base64
import html
import math
import re
import statistics
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # no display: the plots are only ever written to files
from matplotlib.figure import Figure  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter  # noqa: E402

from harness.report import scoring  # noqa: E402
from harness.shared.findings import DEGENERATE_PROBLEM  # noqa: E402
from harness.shared.record import (  # noqa: E402
    Record,
    Status,
    read_records,  # noqa: E402
)

PLOTS = ("fast_p.png", "speedup.png", "status.png")
Group = tuple[str, str, str]   # (model, run, precision): scoring.group_records's key
GRID_POINTS = 400        # evenly spaced p values of the fast_p curve, besides every speedup seen
MAX_BREAKPOINTS = 2000   # beyond this many distinct speedups the even grid alone draws the curve
LABEL_CHARS = 48         # plot labels are cut to this; the tables carry the full text
ERROR_CHARS = 100        # the example error shown under a failing status in the per-problem table
DPI = 110

# Fixed colours so that a status looks the same in every report.
STATUS_COLOURS = {
    Status.PASS: "#2e7d32", Status.RULE_VIOLATION: "#8e24aa", Status.NEEDS_CUDA: "#b0bec5",
    Status.TOO_LARGE: "#455a64", Status.NO_CODE: "#78909c", Status.SYNTAX_ERROR: "#5d4037",
    Status.COMPILE_ERROR: "#ef6c00",
    Status.LOAD_ERROR: "#f9a825", Status.INIT_ERROR: "#fdd835", Status.RUNTIME_ERROR: "#c62828",
    Status.TIMEOUT: "#6d4c41", Status.CRASH: "#212121", Status.SHAPE_MISMATCH: "#1565c0",
    Status.DTYPE_MISMATCH: "#42a5f5", Status.INCORRECT: "#e57373", Status.NONDETERMINISTIC: "#00897b",
    Status.GRAD_MISMATCH: "#ad1457", Status.NO_GRAD: "#f48fb1", Status.JUDGE_ERROR: "#9e9e9e",
}
LIGHT_STATUSES = {Status.NEEDS_CUDA, Status.LOAD_ERROR, Status.INIT_ERROR, Status.NO_GRAD}  # black text on them


class NoRecords(Exception):
    """A RUN given to the report resolves to no records."""


def records_path(run: str, results_dir: Path) -> Path:
    """A run folder, a records.jsonl path, or a bare run name under results_dir -> its records.jsonl."""
    given = Path(run)
    if given.is_file():
        return given
    if given.is_dir():
        return given / "records.jsonl"
    return results_dir / run / "records.jsonl"


def load_runs(runs: list[str], results_dir: Path) -> dict[Path, list[Record]]:
    """records.jsonl path -> its records, for each RUN; NoRecords names the first RUN without any."""
    loaded = {}
    for run in runs:
        path = records_path(run, results_dir)
        records = read_records(path)
        if not records:
            raise NoRecords(f"no records for '{run}' (looked for {path})")
        loaded[path] = records
    return loaded


def default_out_dir(paths: list[Path], results_dir: Path) -> Path:
    return paths[0].parent / "report" if len(paths) == 1 else results_dir / "report"


def write_report(runs: dict[Path, list[Record]], out_dir: Path, generated: Optional[datetime] = None) -> list[Path]:
    """Writes the three plots and report.html (plots embedded) into out_dir; returns the paths written."""
    records = [r for members in runs.values() for r in members]
    groups = scoring.group_records(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {}
    for name, draw in zip(PLOTS, (plot_fast_p, plot_speedups, plot_statuses)):
        figure = draw(groups)
        plots[name] = out_dir / name
        figure.savefig(plots[name], dpi=DPI)
    page = out_dir / "report.html"
    page.write_text(render_html(runs, groups, {name: path.read_bytes() for name, path in plots.items()},
                                generated or datetime.now(timezone.utc)), encoding="utf-8")
    return [*plots.values(), page]


# --- numbers ------------------------------------------------------------------------------------------------------

def pass_speedups(records: list[Record]) -> list[float]:
    """Speedups of the passes that have a finite, positive one (None and NaN are not measurements to plot)."""
    return [r.speedup for r in records
            if r.status == Status.PASS and r.speedup is not None and math.isfinite(r.speedup) and r.speedup > 0]


def fast_p_curve(records: list[Record], grid: list[float]) -> list[float]:
    return [scoring.fast_p(records, p) for p in grid]


def p_grid(groups: dict[Group, list[Record]]) -> list[float]:
    """0 to 1.1 x the largest speedup, evenly, plus every speedup seen: fast_p is a step function that changes
    only at a speedup, so with those points included a step plot of the grid is exact."""
    speedups = sorted({s for members in groups.values() for s in pass_speedups(members)})
    top = max([*speedups, 2.0 / 1.1]) * 1.1
    grid = {top * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)}
    if len(speedups) <= MAX_BREAKPOINTS:
        grid.update(speedups)
    return sorted(grid)


def failing_status(records: list[Record]) -> Optional[tuple[Status, int, str]]:
    """The most common status other than pass (ties: the earlier in pipeline order), its count and the first
    error message recorded with it."""
    counts = Counter(r.status for r in records if r.status != Status.PASS)
    if not counts:
        return None
    order = list(Status)
    status, count = min(counts.items(), key=lambda item: (-item[1], order.index(item[0])))
    error = next((r.error for r in records if r.status == status and r.error), "")
    return status, count, error


def problem_rows(groups: dict[Group, list[Record]]) -> list[tuple[str, list[Optional[dict]]]]:
    """(problem id, one cell per group) in natural id order; a cell is None where the group has no record of it."""
    problems = sorted({r.problem for members in groups.values() for r in members}, key=_natural)
    rows = []
    for problem in problems:
        cells = []
        for members in groups.values():
            mine = scoring.judged(r for r in members if r.problem == problem)   # judge_error: no verdict
            speedups = pass_speedups(mine)
            cells.append({"n": len(mine), "passes": sum(1 for r in mine if r.status == Status.PASS),
                          "best": max(speedups) if speedups else None,
                          "median": statistics.median(speedups) if speedups else None,
                          "failing": failing_status(mine)} if mine else None)
        rows.append((problem, cells))
    return rows


def degenerate_problems(groups: dict[Group, list[Record]]) -> dict[str, str]:
    """Problem id -> the degenerate_problem evidence one of its records carries, for the problems that have it."""
    found: dict[str, str] = {}
    for members in groups.values():
        for record in members:
            if scoring.is_degenerate(record) and record.problem not in found:
                found[record.problem] = (record.flag_evidence or {}).get(DEGENERATE_PROBLEM, "")
    return found


def _natural(text: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


# --- plots --------------------------------------------------------------------------------------------------------

def group_label(key: Group) -> str:
    """The group's label: model / run, and the precision where it is not fp32."""
    return " / ".join(key if key[2] != "fp32" else key[:2])


def _label(key: Group) -> str:
    text = group_label(key)
    text = text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 3] + "..."
    return text.replace("$", r"\$")  # a label is record text, not mathtext


def _style(index: int) -> dict:
    return {"color": f"C{index % 10}", "linestyle": ("-", "--", ":", "-.")[index // 10 % 4]}


def _no_passes(ax) -> None:
    ax.text(0.5, 0.5, "no passes", transform=ax.transAxes, ha="center", va="center", fontsize=16, color="#777",
            bbox={"facecolor": "white", "edgecolor": "none"}, zorder=5)


def plot_fast_p(groups: dict[Group, list[Record]]) -> Figure:
    figure = Figure(figsize=(9, 4.6), layout="constrained")
    ax = figure.add_subplot()
    grid = p_grid(groups)
    for index, (key, members) in enumerate(groups.items()):
        passes = len(pass_speedups(members))
        ax.plot(grid, fast_p_curve(members, grid), drawstyle="steps-post", linewidth=1.8,
                label=f"{_label(key)} (n={len(members)}" + (")" if passes else ", no passes)"), **_style(index))
    if not any(pass_speedups(members) for members in groups.values()):
        _no_passes(ax)
    if grid[-1] > 10:  # a few large speedups would squash the interesting range near 1x into a corner
        ax.set_xscale("symlog", linthresh=1.0, linscale=1.0)
        decades = range(math.ceil(math.log10(grid[-1])))
        ax.set_xticks([0, 0.5, 1, *[m * 10 ** k for k in decades for m in (2, 5, 10) if m * 10 ** k <= grid[-1]]])
    ax.axvline(1.0, color="#555", linestyle=":", linewidth=1)
    ax.set_xlim(0, grid[-1])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_ylim(-0.02, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("p (speedup over eager PyTorch)")
    ax.set_ylabel("fast_p: share of all submissions")
    ax.set_title("fast_p: passing and more than p times as fast as the reference")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    return figure


def plot_speedups(groups: dict[Group, list[Record]]) -> Figure:
    keys = list(groups)
    figure = Figure(figsize=(9, max(2.6, 0.55 * len(keys) + 1.6)), layout="constrained")
    ax = figure.add_subplot()
    everything = [s for members in groups.values() for s in pass_speedups(members)]
    labels = []
    for key in keys:
        speedups = pass_speedups(groups[key])
        labels.append(f"{_label(key)}\n" + (f"{len(speedups)} passes, median {statistics.median(speedups):.3g}x"
                                            if speedups else "no passes"))
    ax.set_yticks(range(len(keys)), labels, fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("speedup over eager PyTorch (log scale)")
    ax.set_title("speedups of passing submissions: dots, interquartile range (bar), median (|)")
    if everything:
        low, high = min(min(everything), 1.0) / 1.5, max(max(everything), 1.0) * 1.5
    else:
        low, high = 0.5, 2.0
        _no_passes(ax)
    ax.set_xlim(low, high)
    ax.axvline(1.0, color="#555", linestyle="--", linewidth=1)
    for index, key in enumerate(keys):
        speedups = sorted(pass_speedups(groups[key]))
        if not speedups:
            continue  # its tick label says "no passes"
        offsets = [((i * 0.618) % 1 - 0.5) * 0.5 for i in range(len(speedups))]  # even spread, no randomness
        colour = _style(index)["color"]
        ax.scatter(speedups, [index + o for o in offsets], s=14, alpha=0.6, color=colour, linewidths=0)
        quartiles = statistics.quantiles(speedups, n=4) if len(speedups) > 1 else [speedups[0]] * 3
        ax.hlines(index, quartiles[0], quartiles[2], linewidth=7, alpha=0.3, color=colour)
        ax.plot([quartiles[1]], [index], marker="|", markersize=22, markeredgewidth=2.5, color="black")
    ax.grid(axis="x", which="both", alpha=0.25)
    return figure


def plot_statuses(groups: dict[Group, list[Record]]) -> Figure:
    keys = list(groups)
    counts = [scoring.status_counts(groups[key]) for key in keys]
    present = [s for s in Status if any(s.value in c for c in counts)]
    figure = Figure(figsize=(9, max(2.4, 0.5 * len(keys) + 1.9)), layout="constrained")
    ax = figure.add_subplot()
    lefts = [0.0] * len(keys)
    for status in present:
        shares = [c.get(status.value, 0) / len(groups[key]) for c, key in zip(counts, keys)]
        ax.barh(range(len(keys)), shares, left=lefts, height=0.7, color=STATUS_COLOURS[status], edgecolor="white",
                label=status.value)
        text = "black" if status in LIGHT_STATUSES else "white"
        for index, (share, left) in enumerate(zip(shares, lefts)):
            if share >= 0.04:  # room for the count inside the segment
                ax.text(left + share / 2, index, str(counts[index][status.value]), ha="center", va="center",
                        fontsize=8, color=text)
        lefts = [left + share for left, share in zip(lefts, shares)]
    ax.set_yticks(range(len(keys)), [f"{_label(k)} (n={len(groups[k])})" for k in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of submissions (numbers: count)")
    ax.set_title("status of every submission")
    figure.legend(loc="outside lower center", ncols=min(6, max(1, len(present))), fontsize=8, frameon=False)
    return figure


# --- page ---------------------------------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #222; margin: 24px auto;
       max-width: 1200px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 8px; } h2 { font-size: 17px; margin: 28px 0 8px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
dl.meta dt { color: #666; } dl.meta dd { margin: 0; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12.5px; }
th, td { border: 1px solid #ddd; padding: 3px 5px; vertical-align: top; }
th { background: #f3f3f3; }
td.label { white-space: nowrap; } td.statuses { min-width: 200px; } span.pair { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafafa; }
td.fail { max-width: 260px; } td.fail small { display: block; color: #777; overflow-wrap: anywhere; }
td.none { color: #aaa; text-align: center; }
img { max-width: 100%; height: auto; display: block; margin: 4px 0; }
p.note { color: #555; margin: 4px 0 0; max-width: 900px; }
span.degenerate { background: #fff3cd; color: #7a5b00; border-radius: 3px; padding: 0 4px; font-size: 11px; }
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Optional[float], digits: int = 3, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}g}{suffix}"


def _pct(value: Optional[float]) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def _leaderboard_html(groups: dict[Group, list[Record]]) -> str:
    """With records of degenerate problems: their count, and fast_p and geomean x without them, in columns of their
    own."""
    board = scoring.leaderboard([r for members in groups.values() for r in members])
    rates = ["compile_rate", "correct_rate", "grad_correct_rate", "pass_rate",
             *[f"fast_{p:g}" for p in scoring.FAST_P]]
    split = bool((board["n_degenerate"] > 0).any())
    without = [f"fast_{p:g}_nondegenerate" for p in scoring.FAST_P] if split else []
    head = ["model", "run", "precision", "n", *[r.removesuffix("_rate") for r in rates], "geomean x", "x compile",
            *(["degenerate", *[f"{r.removesuffix('_nondegenerate')} w/o degenerate" for r in without],
               "geomean x w/o degenerate"] if split else []), "statuses"]
    rows = []
    for _, row in board.iterrows():
        statuses = ", ".join(f'<span class="pair">{_e(s.value)}: {int(row[s.value])}</span>'
                             for s in Status if row[s.value] > 0)
        cells = [f'<td class="label">{_e(row["model"])}</td>', f'<td class="label">{_e(row["run"])}</td>',
                 f'<td class="label">{_e(row["precision"])}</td>', f'<td class="num">{row["n"]}</td>',
                 *[f'<td class="num">{_pct(row[r])}</td>' for r in rates],
                 f'<td class="num">{_num(row["geomean_speedup"])}</td>',
                 f'<td class="num">{_num(row["geomean_speedup_compile"])}</td>',
                 *([f'<td class="num">{int(row["n_degenerate"])}</td>',
                    *[f'<td class="num">{_pct(row[r])}</td>' for r in without],
                    f'<td class="num">{_num(row["geomean_speedup_nondegenerate"])}</td>'] if split else []),
                 f'<td class="statuses">{statuses}</td>']
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return ('<div class="scroll"><table id="leaderboard"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "\n".join(rows) + "</tbody></table></div>")


def _problems_html(groups: dict[Group, list[Record]]) -> str:
    fields = ("n", "pass", "best x", "median x", "most common failure")
    head = ('<tr><th rowspan="2">problem</th>'
            + "".join(f'<th colspan="{len(fields)}">{_e(group_label(key))}</th>' for key in groups) + "</tr><tr>"
            + "".join(f"<th>{f}</th>" for _ in groups for f in fields) + "</tr>")
    rows = []
    degenerate = degenerate_problems(groups)
    for problem, cells in problem_rows(groups):
        mark = (f' <span class="degenerate" title="{_e(degenerate[problem])}">degenerate</span>'
                if problem in degenerate else "")
        tds = [f'<td class="label">{_e(problem)}{mark}</td>']
        for cell in cells:
            if cell is None:
                tds.append(f'<td class="none" colspan="{len(fields)}">no record</td>')
                continue
            failing = "-"
            if cell["failing"] is not None:
                status, count, error = cell["failing"]
                shown = error if len(error) <= ERROR_CHARS else error[:ERROR_CHARS - 3] + "..."
                failing = f"{_e(status.value)} ({count})" + (f'<small title="{_e(error)}">{_e(shown)}</small>'
                                                            if error else "")
            tds += [f'<td class="num">{cell["n"]}</td>', f'<td class="num">{cell["passes"]}</td>',
                    f'<td class="num">{_num(cell["best"])}</td>', f'<td class="num">{_num(cell["median"])}</td>',
                    f'<td class="fail">{failing}</td>']
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return ('<div class="scroll"><table id="problems"><thead>' + head + "</thead><tbody>" + "\n".join(rows)
            + "</tbody></table></div>")


def _degenerate_note(groups: dict[Group, list[Record]]) -> str:
    count = sum(1 for members in groups.values() for r in members if scoring.is_degenerate(r))
    if not count:
        return ""
    return (f"{count} record(s) judged a degenerate problem (finding degenerate_problem: a constant, or an answer "
            "that ignores an input, passes); the columns w/o degenerate give fast_p and geomean x without them, over "
            "the records of the other problems.")


def render_html(runs: dict[Path, list[Record]], groups: dict[Group, list[Record]],
                pngs: dict[str, bytes], generated: datetime) -> str:
    records = [r for members in runs.values() for r in members]
    devices = sorted({f"{r.device_name} ({r.device})" if r.device_name else r.device for r in records})
    torches = sorted({f"{r.torch_version}" + (f", CUDA {r.cuda_version}" if r.cuda_version else "")
                      for r in records})
    profiles = sorted({r.profile for r in records if r.profile})
    sources = "<br>".join(f"{_e(path)}: {len(members)} records" for path, members in runs.items())
    meta = [("runs", sources), ("records", f"{len(records)} in {len(groups)} model/run/precision group(s)"),
            ("generated", _e(generated.strftime("%Y-%m-%d %H:%M UTC"))), ("devices", _e(", ".join(devices))),
            ("torch", _e("; ".join(torches))), ("profiles", _e(", ".join(profiles) or "-"))]

    def image(name: str, alt: str) -> str:
        data = base64.b64encode(pngs[name]).decode("ascii")
        return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'

    fast_ps = ", ".join(f"{p:g}" for p in scoring.FAST_P)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>kernel judge report</title>
<style>{CSS}</style></head>
<body>
<h1>kernel judge report</h1>
<dl class="meta">{"".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta)}</dl>

<h2>Leaderboard</h2>
{_leaderboard_html(groups)}
<p class="note">Rates are shares of all n submissions of a model/run. fast_p (p = {fast_ps}) counts submissions
that pass and run more than p times as fast as eager PyTorch (fast_0 is the pass rate); geomean x is the geometric
mean speedup of the passes, x compile the same over torch.compile where a stored baseline exists.
{_degenerate_note(groups)}</p>

<h2>fast_p over p</h2>
{image("fast_p.png", "fast_p curve per model/run")}
<p class="note">Each line is a model/run: the share of all its submissions that pass and run more than p times as
fast as the reference. It starts at the pass rate (p = 0); the dotted line marks p = 1.</p>

<h2>Speedup distribution</h2>
{image("speedup.png", "speedup distribution per model/run")}
<p class="note">Speedups of passing submissions only, log scale; the dashed line is 1x (as fast as eager).</p>

<h2>Statuses</h2>
{image("status.png", "status breakdown per model/run")}

<h2>Per problem</h2>
{_problems_html(groups)}
<p class="note">n: records of the problem; pass: those with status pass; best and median speedup over the passes;
most common failure: the commonest status other than pass, with the first error recorded for it. A problem marked
<span class="degenerate">degenerate</span> has an output that does not depend on its inputs, or on one of them (the
mark's tooltip says which): a right answer there can skip that work.</p>
</body></html>
"""
