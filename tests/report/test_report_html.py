"""The HTML report (`run_eval.py report`): files, numbers, escaping, and the page as a real browser renders it."""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import REPO
from test_scoring import make

from harness.report import html as html_report
from harness.shared.record import Status

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE = '<script>alert("x")</script> & more'
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def records_alpha():
    """Model alpha, run r1: on level0/1 speedups 2.5, 1.2, 0.5, one incorrect; on level0/10 one pass with no
    speedup, one NaN speedup, two compile errors (one with a hostile message); level0/2 a timeout."""
    return [make(problem="level0/1", speedup=2.5, model="alpha", run="r1", device_name="Fake GPU 9000"),
            make(problem="level0/1", speedup=1.2, model="alpha", run="r1", device_name="Fake GPU 9000"),
            make(problem="level0/1", speedup=0.5, model="alpha", run="r1", device_name="Fake GPU 9000"),
            make(Status.INCORRECT, problem="level0/1", model="alpha", run="r1", error="values differ"),
            make(problem="level0/10", speedup=None, model="alpha", run="r1"),
            make(problem="level0/10", speedup=math.nan, model="alpha", run="r1"),
            make(Status.COMPILE_ERROR, problem="level0/10", model="alpha", run="r1", error=HOSTILE),
            make(Status.COMPILE_ERROR, problem="level0/10", model="alpha", run="r1", error="nvcc: error"),
            make(Status.TIMEOUT, problem="level0/2", model="alpha", run="r1", error="killed")]


def records_beta():
    """Model beta, run r2: no passes at all."""
    return [make(Status.RUNTIME_ERROR, problem="level0/1", model="beta", run="r2", error="CUDA error"),
            make(Status.RULE_VIOLATION, problem="level0/1", model="beta", run="r2", speedup=5.0)]


class Tables(HTMLParser):
    """Cell texts of every <tr> of each table with an id, every <img> src, and every tag name seen."""

    def __init__(self):
        super().__init__()
        self.tags: set[str] = set()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[str] = []
        self._table = self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "table":
            self._table = attrs.get("id")
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag == "img":
            self.images.append(attrs.get("src", ""))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append(" ".join(" ".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parse(page: str) -> Tables:
    tables = Tables()
    tables.feed(page)
    return tables


def row(table: list[list[str]], first: str) -> list[str]:
    return next(r for r in table if r and r[0] == first)


@pytest.fixture()
def report(tmp_path):
    runs = {tmp_path / "r1" / "records.jsonl": records_alpha(), tmp_path / "r2" / "records.jsonl": records_beta()}
    paths = html_report.write_report(runs, tmp_path / "out", generated=NOW)
    return tmp_path / "out", paths


def test_writes_valid_pngs_and_one_page(report):
    out, paths = report
    assert [p.name for p in paths] == ["fast_p.png", "speedup.png", "status.png", "report.html"]
    for name in html_report.PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name


def test_page_is_self_contained_and_escapes_record_text(report):
    out, _ = report
    page = (out / "report.html").read_text()
    assert 'src="http' not in page and "<link" not in page and "<script" not in page and "url(" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in page
    tables = parse(page)
    assert "script" not in tables.tags
    images = tables.images
    assert len(images) == 3 and all(src.startswith("data:image/png;base64,") for src in images)
    assert "2026-11-21 12:00 UTC" in page and "Fake GPU 9000 (cpu)" in page
    assert "r1/records.jsonl: 9 records" in page and "r2/records.jsonl: 2 records" in page


def test_leaderboard_numbers(report):
    out, _ = report
    board = parse((out / "report.html").read_text()).tables["leaderboard"]
    assert board[0][:4] == ["model", "run", "precision", "n"]
    header = board[0]
    alpha = dict(zip(header, row(board, "alpha")))
    # Computed here, not by scoring: 9 records, passes 2.5, 1.2, 0.5, None, NaN.
    assert alpha["n"] == "9" and alpha["pass"] == f"{5 / 9:.1%}" == "55.6%"
    assert alpha["fast_0"] == "55.6%" and alpha["fast_1"] == f"{2 / 9:.1%}" and alpha["fast_2"] == f"{1 / 9:.1%}"
    assert alpha["geomean x"] == f"{(2.5 * 1.2 * 0.5) ** (1 / 3):.3g}"  # NaN and None are not speedups
    assert "compile_error: 2" in alpha["statuses"] and "timeout: 1" in alpha["statuses"]
    beta = dict(zip(header, row(board, "beta")))
    assert beta["pass"] == "0.0%" and beta["geomean x"] == "-" and "rule_violation: 1" in beta["statuses"]


def test_per_problem_rows(report):
    out, _ = report
    table = parse((out / "report.html").read_text()).tables["problems"]
    assert [r[0] for r in table[2:]] == ["level0/1", "level0/2", "level0/10"]  # natural order
    assert table[0] == ["problem", "alpha / r1", "beta / r2"]
    # alpha: n, pass, best, median, failure; then beta's five cells.
    assert row(table, "level0/1") == ["level0/1", "4", "3", "2.5", "1.2", "incorrect (1) values differ",
                                      "2", "0", "-", "-", "runtime_error (1) CUDA error"]
    level10 = row(table, "level0/10")
    assert level10[1:5] == ["4", "2", "-", "-"]  # two passes, neither with a usable speedup
    assert level10[5] == f"compile_error (2) {HOSTILE}"  # the parser unescapes: the page showed it as text
    assert row(table, "level0/2")[1:] == ["1", "0", "-", "-", "timeout (1) killed", "no record"]


def test_no_passes_still_writes_everything(tmp_path):
    paths = html_report.write_report({tmp_path / "records.jsonl": records_beta()}, tmp_path / "out")
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    for plot in (html_report.plot_fast_p, html_report.plot_speedups):
        assert "no passes" in [text.get_text() for text in plot({("beta", "r2", "fp32"): records_beta()}).axes[0].texts]


def test_labels_are_plain_text_and_large_speedups_fit(tmp_path):
    records = [make(model="$x^{", run="r", speedup=40.0), make(model="$x^{", run="r", speedup=0.9)]
    paths = html_report.write_report({tmp_path / "records.jsonl": records}, tmp_path / "out")
    assert all(p.stat().st_size > 0 for p in paths)
    assert html_report.plot_fast_p({("$x^{", "r", "fp32"): records}).axes[0].get_xscale() == "symlog"


def test_fast_p_curve_is_scoring_fast_p():
    records = records_alpha()
    grid = html_report.p_grid({("alpha", "r1", "fp32"): records})
    assert grid[0] == 0 and grid[-1] == pytest.approx(2.5 * 1.1) and {0.5, 1.2, 2.5} <= set(grid)
    curve = dict(zip(grid, html_report.fast_p_curve(records, grid)))
    assert curve[0] == pytest.approx(5 / 9) and curve[1.2] == pytest.approx(1 / 9) and curve[2.5] == 0


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_eval.py"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_cli_report(tmp_path):
    results = tmp_path / "results"
    (results / "r1").mkdir(parents=True)
    (results / "r1" / "records.jsonl").write_text("".join(r.to_json() + "\n" for r in records_alpha()))
    result = run_cli("--results-dir", str(results), "report", "r1")
    assert result.returncode == 0, result.stderr
    written = result.stdout.split()
    assert written == [str(results / "r1" / "report" / name) for name in (*html_report.PLOTS, "report.html")]
    assert all(Path(p).is_file() for p in written)
    empty = run_cli("--results-dir", str(results), "report", "r1", "nothing-here")
    assert empty.returncode == 2 and "no records for 'nothing-here'" in empty.stderr


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="needs chromium (or chromium-browser) on PATH; CI has none")
def test_page_in_headless_chromium(report, tmp_path):
    out, _ = report
    url = (out / "report.html").resolve().as_uri()
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,3000", url], capture_output=True,
                   timeout=120, check=True)
    assert shot.read_bytes()[:8] == PNG_MAGIC
    image = __import__("matplotlib.image", fromlist=["imread"]).imread(shot)
    assert image.shape[:2] == (3000, 1280)
    colours = {tuple(pixel) for pixel in (image[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50  # text, tables and plots, not a blank page
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout
    tables = parse(dom)
    assert [r[0] for r in tables.tables["problems"][2:]] == ["level0/1", "level0/2", "level0/10"]
    assert row(tables.tables["leaderboard"], "alpha")[2] == "9"
    assert len(tables.images) == 3 and all(src.startswith("data:image/png;base64,") for src in tables.images)
    assert row(tables.tables["problems"], "level0/10")[5] == f"compile_error (2) {HOSTILE}"
    assert "script" not in tables.tags  # the browser kept the hostile error as text, not as an element


def test_a_group_is_labelled_with_its_precision_unless_fp32():
    assert html_report.group_label(("alpha", "r1", "fp32")) == "alpha / r1"
    assert html_report.group_label(("alpha", "r1", "bf16")) == "alpha / r1 / bf16"


def test_degenerate_problems_are_marked_and_scored_without_them(tmp_path):
    evidence = "output 0: the constant 0 passes on all 5 trials"
    records = [*records_alpha(), make(problem="level0/6", speedup=1000.0, model="alpha", run="r1",
                                      flags=("degenerate_problem",), flag_evidence={"degenerate_problem": evidence})]
    html_report.write_report({tmp_path / "records.jsonl": records}, tmp_path / "out", generated=NOW)
    page = (tmp_path / "out" / "report.html").read_text()
    tables = parse(page)
    problems = [r[0] for r in tables.tables["problems"][2:]]
    assert "level0/6 degenerate" in problems and "level0/1" in problems   # only the degenerate one is marked
    assert f'title="{evidence}"' in page
    board = tables.tables["leaderboard"]
    alpha = dict(zip(board[0], row(board, "alpha")))
    assert alpha["n"] == "10" and alpha["degenerate"] == "1"
    assert alpha["fast_1"] == f"{3 / 10:.1%}" and alpha["fast_1 w/o degenerate"] == f"{2 / 9:.1%}"
    assert alpha["geomean x w/o degenerate"] == f"{(2.5 * 1.2 * 0.5) ** (1 / 3):.3g}"
    assert "1 record(s) judged a degenerate problem" in page
    plain = parse(html_report.render_html({}, {("alpha", "r1", "fp32"): records_alpha()}, {name: b"" for name in
                                          html_report.PLOTS}, NOW))
    assert "degenerate" not in plain.tables["leaderboard"][0]
