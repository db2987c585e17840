"""The terminal tables: statuses, numbers to three significant digits, "-" for what was not measured."""
import io

from conftest import make
from rich.console import Console

from harness.pipeline.driver import Progress
from harness.report.console import BatchView, leaderboard_table, record_panel, results_table
from harness.report.scoring import leaderboard
from harness.shared.record import Status


def _rows(table) -> list[list[str]]:
    """The body rows of a rendered table, as their cells' text."""
    console = Console(record=True, width=200)
    console.print(table)
    return [[cell.strip() for cell in line.strip().strip("│").split("│")]
            for line in console.export_text().splitlines() if line.startswith("│")]


def test_record_panel_shows_the_measurements_and_dashes_for_the_rest():
    record = make(speedup=2.34567, runtime_ms=1.5, runtime_ci_low_ms=1.25, runtime_ci_high_ms=1.75,
                  runtime_reps=60, ref_runtime_ms=3.5, max_abs_error=float("nan"), error=None)
    panel = dict(_rows(record_panel(record)))
    assert panel["status"] == "pass"
    assert panel["compiled / correct / grad_correct"] == "yes / yes / -"
    assert panel["max abs / rel error"] == "- / -"                       # NaN and None alike
    assert panel["runtime ms [95% CI] n"] == "1.5 [1.25, 1.75] 60"
    assert panel["reference ms [95% CI] n"] == "3.5 [-, -] - (-)"
    assert panel["speedup [95% CI]"] == "2.35 [-, -]; over torch.compile -"
    assert panel["error"] == "-"
    assert panel["compile s"] == "-"
    fell_back = dict(_rows(record_panel(make(compile_s=41.0, prebuilt=True, light_headers=False))))
    assert fell_back["compile s"] == ("41 (built ahead in the build pool) (CUDA sources compiled as written: the light "
                                      "torch/extension.h did not build)")


def test_results_table_has_a_row_per_record_with_its_status():
    long_name = "submissions/model-x/" + "deep/" * 10 + "kernel_17.py"
    records = [make(speedup=1.5, runtime_ms=0.25, ref_runtime_ms=0.375),
               make(Status.COMPILE_ERROR, submission=long_name, error="nvcc: error: bad")]
    passed, failed = _rows(results_table(records))
    assert passed == ["level0/1", "s.py", "pass", "yes", "-", "-", "0.25", "0.375", "1.5", ""]
    assert failed == ["level0/1", "..." + long_name[-37:], "compile_error", "no", "-", "-", "-", "-", "-",
                      "nvcc: error: bad"]


def test_leaderboard_table_shows_rates_geomean_and_status_counts():
    records = [make(speedup=2.0, model="a"), make(speedup=8.0, model="a"), make(Status.INCORRECT, model="a"),
               make(Status.TIMEOUT, model="a")]
    (row,) = _rows(leaderboard_table(leaderboard(records)))
    # model, run, precision, n, compile, correct, grad_correct, pass, fast_0, fast_1, fast_1.5, fast_2, geomean,
    # x compile
    assert row[:4] == ["a", "r", "fp32", "4"] and row[4] == "100%" and row[-3:-1] == ["4", "-"]
    assert row[7:12] == ["50%", "50%", "50%", "50%", "25%"]   # 2.0 is not faster than 2x
    assert set(row[-1].split()) == {"pass:2", "incorrect:1", "timeout:1"}


def test_degenerate_problems_show_in_the_leaderboard_and_the_record_panel():
    degenerate = make(speedup=100.0, problem="level0/6", flags=("degenerate_problem",),
                      flag_evidence={"degenerate_problem": "output 0: the constant 0 passes on all 5 trials"})
    table = leaderboard_table(leaderboard([degenerate, make(speedup=4.0), make(Status.INCORRECT)]))
    (row,) = _rows(table)
    # model, run, precision, n, degenerate, compile, correct, grad_correct, pass, fast_0 .. fast_2, geomean, ...
    assert row[3:5] == ["3", "1"]
    assert row[9:14] == ["67% (50%)", "67% (50%)", "67% (50%)", "67% (50%)", "20 (4)"]
    assert "without the records of degenerate problems" in table.caption
    assert len(_rows(leaderboard_table(leaderboard([make(speedup=4.0)])))[0]) == 15   # no such column without them
    panel = dict(_rows(record_panel(degenerate)))
    assert panel["degenerate problem"].startswith("output 0: the constant 0 passes on all 5 trials")
    assert "degenerate problem" not in dict(_rows(record_panel(make(speedup=4.0))))


def test_the_panel_says_what_its_figures_are():
    """The error figures are the record's (over every trial); a relative error of 0 beside an absolute one says the
    differences lie where the reference is 0; the cuda backend on the CPU device is C++."""
    record = make(status=Status.INCORRECT, max_abs_error=0.0427, max_rel_error=0.0, backend="cuda",
                  error="trial 3 output 0: max abs error 0.0427 (atol 0.0001, rtol 0.0001)")
    panel = dict(_rows(record_panel(record)))
    assert panel["max abs / rel error"] == "0.0427 / 0 (every difference lies where the reference is 0)"
    assert "0.0427" in panel["error"]
    assert panel["backend"] == "cuda (C++/CUDA extensions through torch.utils.cpp_extension, C++ on the CPU device)"
    assert dict(_rows(record_panel(make(backend="triton", device="cuda"))))["backend"] == "triton"


def test_the_batch_view_writes_whole_lines_when_not_a_terminal():
    stream = io.StringIO()
    out = Console(file=stream, force_terminal=False, width=160)
    progress = Progress(total=2, workers=1, gpu_busy={"cpu": "level0/3"})
    with BatchView(2, out, "cpu") as view:
        view.update(progress)
        progress.count(make(status=Status.PASS))
        view.update(progress)
        view.update(progress)   # nothing new: nothing written
    out.print("results (run)")
    lines = stream.getvalue().split("\n")
    assert lines == ["judged 0/2  statuses -", "judged 1/2  statuses pass:1", "results (run)", ""]


def test_the_panel_says_who_decided_a_record_no_evaluation_ran_for():
    from harness.pipeline.driver import Summary

    extracted = Summary(build_jobs=1, gpus=["cpu"], engine="local", submissions=1, device="cpu")
    assert dict(_rows(record_panel(make(status=Status.NO_CODE), extracted)))["time s"].endswith(
        "no evaluation (decided by extraction, nothing ran)")
    built = Summary(build_jobs=1, gpus=["cpu"], engine="local", submissions=1, device="cpu", builds={"failed": 1})
    assert dict(_rows(record_panel(make(status=Status.COMPILE_ERROR), built)))["time s"].endswith(
        "no evaluation (decided by the build)")
