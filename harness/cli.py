"""Command line: judge one submission, batch a folder or JSONL, or aggregate records into a leaderboard.
`kernel-judge` (the installed command) and `python run_eval.py` (in a checkout) take the same arguments.

  run_eval.py submit --problem P --submission S [--device cpu|cuda] [--precision fp32|fp16|bf16] [--config C] [--json]
                   [--no-server | --no-background] [--idle-timeout S]
  run_eval.py batch SOURCE [--problem P | --problems-dir D] [--run NAME] [--model M] [--scheduler ADDRESS]
                   (submit, batch and serve also: [--backend auto|cuda|triton|cute|tilelang] [--trials N]
                    [--timing events|events-sync|cuda-graph|kernelbench])
  run_eval.py serve [--device cpu|cuda] [--config C] [--idle-timeout S]   (later submits with the same config are
                   judged by it; a submit that finds none starts one in the background, which stops when idle)
  run_eval.py scheduler [--port 8786]
  run_eval.py worker --scheduler tcp://HOST:8786 [--gpus 0,1] [--build-jobs N]
  run_eval.py leaderboard [RESULTS...]
  run_eval.py report RUN... [--out DIR]
  run_eval.py baseline [--problems-dir D] [--only PREFIX] [--modes eager,compile]
  run_eval.py problems [--check] [--problems-dir D] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Optional

from harness.serve import DEFAULT_IDLE_TIMEOUT_S
from harness.shared.config import (
    BACKENDS,
    PRECISIONS,
    TIMING_METHODS,
    ConfigError,
    find_config,
    load_config,
)
from harness.shared.paths import ROOT_ENV, data_root, use_root
from harness.shared.problems import (
    ProblemNotFound,
    default_problems_dir,
    resolve_problem,
)
from harness.shared.record import read_records
from harness.shared.settings import PipelineSettings
from harness.submission.submissions import discover, from_file

EXIT_USAGE = 2          # bad arguments, config, problem or submission path, an unwritable results folder
EXIT_REFERENCE = 3      # the reference itself failed for some problem
EXIT_JUDGE_ERROR = 4    # batch: some submission has no verdict because the judge ran short (judge_error; rerun)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)
EXIT_TERMINATED = 143   # SIGTERM (128 + 15), stopped as Ctrl-C stops it
BACKGROUND_ENV = "KERNEL_JUDGE_BACKGROUND"   # 0 (or false, no, off): a submit starts no background judge
TEXT_VERDICT_ENV = "KERNEL_JUDGE_TEXT_VERDICT"   # 0 (or false, no, off): a submit whose text decides its verdict
                                                # still takes the judge's path (loads torch, asks or starts a judge)
_OFF = ("0", "false", "no", "off")

log = logging.getLogger(__name__)


class UsageError(Exception):
    """Bad input found before any work starts: reported in one line, exit 2."""


_terminated = False   # this command got SIGTERM (its exit code and message say so)


def _terminate(signum, frame) -> None:
    """SIGTERM (`kill`, a batch system's or a service manager's stop; the only polite stop that reaches a command
    started in the background of a script, which ignores SIGINT) raises KeyboardInterrupt in the main thread, so
    the command keeps its finished records and stops every child process as on Ctrl-C."""
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _stacks_on_request()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    global _terminated
    _terminated = False
    previous = _take_sigterm()
    try:
        with use_root(args.root):
            _default_folders(args)
            return args.handler(args)
    except ProblemNotFound as exc:
        print(f"error: {exc}{_root_hint(args)}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, FileNotFoundError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("terminated (SIGTERM)" if _terminated else "interrupted", file=sys.stderr)
        return EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _take_sigterm():
    """_terminate for SIGTERM where this is the main thread and SIGTERM is not ignored; the handler it replaced, or
    None where it installed none."""
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            return None
        return signal.signal(signal.SIGTERM, _terminate)
    except ValueError:   # not the main thread (main() called from another thread of a program)
        return None


def _stacks_on_request() -> None:
    """`kill -USR1 PID` writes every thread's stack to the command's stderr (a batch that seems stuck says where it
    waits) instead of ending it. Not where stderr has no file (a caller that captured it in memory)."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation is both an OSError and a ValueError
        pass


def _default_folders(args: argparse.Namespace) -> None:
    """Folders not given on the command line are in the data root, known once --root is applied."""
    if args.results_dir is None:
        args.results_dir = data_root() / "results"
    if getattr(args, "problems_dir", "") is None:
        args.problems_dir = default_problems_dir()
        args.problems_dir_defaulted = True


def _root_hint(args: argparse.Namespace) -> str:
    """Where a defaulted problems/ that does not exist came from, and how to name another (outside a checkout the
    data root is the current folder)."""
    if not getattr(args, "problems_dir_defaulted", False) or Path(args.problems_dir).is_dir():
        return ""
    return (f" (problems/ is looked for in the data root, {Path(args.problems_dir).parent}: give --root FOLDER or set "
            f"{ROOT_ENV}, or --problems-dir)")


def _overrides(args: argparse.Namespace) -> dict:
    """The config keys the command line sets (None: the config file's value stands)."""
    return {"device": getattr(args, "device", None), "trials": getattr(args, "trials", None),
            "precision": getattr(args, "precision", None), "backend": getattr(args, "backend", None),
            "timing": getattr(args, "timing", None)}


def _config(args: argparse.Namespace):
    return load_config(find_config(args.config) if args.config else None, _overrides(args))


def _writable(folder: Path) -> Path:
    """`folder`, created if need be, after a small write and fsync there: an unwritable or full results folder is a
    one-line error before any work, not a traceback after it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise UsageError(f"cannot write to {folder}: {exc.strerror or exc}") from exc
    return folder


def _interrupted(outcome) -> int:
    """A batch or submit stopped by Ctrl-C or SIGTERM: what it kept, and the exit code of the signal."""
    print(f"{'terminated (SIGTERM)' if _terminated else 'interrupted'}: {len(outcome.records)} records kept in "
          f"{outcome.run_dir}, rerun the same command to resume", file=sys.stderr)
    return EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED


def cmd_submit(args: argparse.Namespace) -> int:
    config = _config(args)
    problem = resolve_problem(args.problem, args.problems_dir)
    path = Path(args.submission)
    if not path.is_file():
        raise FileNotFoundError(f"submission not found: {path}")
    submission = from_file(path, problem, run=args.run, model=args.model)
    results_dir = _writable(args.results_dir)
    decided = _decided_by_text(args, config, submission, results_dir)
    if decided is not None:
        return decided
    if not args.no_server:
        served = _submit_to_server(args, config, problem, path, results_dir)
        if served is not None:
            return served
    from harness.pipeline.batch import run_batch
    from harness.report import console as report

    outcome = run_batch([submission], PipelineSettings.from_config(config), results_dir / args.run, resume=False)
    if outcome.interrupted:
        return _interrupted(outcome)
    if outcome.problem_errors:
        print(f"error: {outcome.problem_errors[0]}", file=sys.stderr)
        return EXIT_REFERENCE
    record = outcome.records[0]
    if args.json:
        sys.stdout.write(record.to_json() + "\n")
    else:
        report.console().print(report.record_panel(record, outcome.summary))
    return 0


def _decided_by_text(args: argparse.Namespace, config, submission, results_dir: Path) -> Optional[int]:
    """A submission whose text alone decides the verdict (too_large, not UTF-8 text, no_code, syntax_error) is judged
    here without torch, no judge asked or started: the record, results and panel of a submit without a server. None:
    take the judge's path (the source goes on to a build, only CUDA could tell the device, or a running judge
    serves this folder and the submit names no device: that judge's device is the record's)."""
    from harness import serve
    from harness.pipeline import text_verdict

    if os.environ.get(TEXT_VERDICT_ENV, "1").strip().lower() in _OFF:
        return None
    if config.device is None and not args.no_server and serve.answering(results_dir):
        return None
    settings = PipelineSettings.from_config(config)
    device, how = text_verdict.device_without_torch(settings)
    if device is None:
        log.info("the judge's path for %s: the device needs CUDA to tell (%s)", submission.label, how)
        return None
    decided = text_verdict.judge_text(submission, settings, device, results_dir / args.run)
    if decided is None:
        return None
    record, summary = decided
    log.info("%s decided by its text on %s (%s), torch not loaded", submission.label, device, how)
    if args.json:
        sys.stdout.write(record.to_json() + "\n")
    else:
        from harness.report import console as report

        report.console().print(report.record_panel(record, summary))
    return 0


def _submit_to_server(args: argparse.Namespace, config, problem, path: Path, results_dir: Path) -> Optional[int]:
    """Judged by `run_eval.py serve` when one serves this results folder under the same config and device, started
    in the background here when none does (unless opted out): the exit code, with the record printed and written as
    a submit without a server writes it; None: judge here."""
    from harness import serve
    from harness.shared.record import Record

    request = {"problem": str(problem.path.resolve()), "submission": str(path.resolve()), "run": args.run,
               "model": args.model, "config_hash": serve.config_key(config), "device": config.device}
    try:
        reply = serve.ask(results_dir, request)
        if reply is None and _background_wanted(args) and _start_background(args, results_dir):
            reply = serve.ask(results_dir, request)
    except serve.ServerGone as exc:
        print(f"note: {exc}; judging here", file=sys.stderr)
        return None
    if reply is None:
        return None
    if "refused" in reply:
        print(f"note: the judge server did not take this submit ({reply['refused']}); judging here", file=sys.stderr)
        return None
    if "record" not in reply:
        print(f"error: the judge server: {reply.get('error', reply)}", file=sys.stderr)
        return EXIT_REFERENCE
    record = Record.from_dict(reply["record"])   # the server wrote records.jsonl and results.csv
    if args.json:
        sys.stdout.write(record.to_json() + "\n")
    else:
        from harness.report import console as report

        report.console().print(report.record_panel(record))
    print(_served_by(reply.get("server") or {}, results_dir), file=sys.stderr)
    return 0


def _background_wanted(args: argparse.Namespace) -> bool:
    return not args.no_background and os.environ.get(BACKGROUND_ENV, "1").strip().lower() not in _OFF


def _start_background(args: argparse.Namespace, results_dir: Path) -> bool:
    """Start a background judge for this submit's results folder, config and device (`serve --background`), or find
    one another submit just started; False (said on stderr): judge here."""
    from harness import serve
    from harness.shared.config import find_config

    serve_args = ["-v", "--root", str(data_root().resolve()), "--results-dir", str(results_dir.resolve()), "serve",
                  "--background", "--idle-timeout", f"{args.idle_timeout:g}",
                  "--problems-dir", str(Path(args.problems_dir).resolve())]
    if args.config:
        serve_args += ["--config", str(Path(find_config(args.config)).resolve())]
    for flag, value in (("--device", args.device), ("--trials", args.trials), ("--precision", args.precision),
                        ("--backend", args.backend)):
        if value is not None:
            serve_args += [flag, str(value)]
    try:
        pid = serve.start_background(results_dir, serve_args)
    except (serve.StartFailed, OSError) as exc:
        print(f"note: no background judge ({exc}); judging here", file=sys.stderr)
        return False
    if pid is not None:
        print(f"started a background judge (pid {pid}) for {results_dir.resolve()}: later submits with this config "
              f"and device go to it; log {serve.log_path(results_dir)}", file=sys.stderr, flush=True)
    return True


def _served_by(server: dict, results_dir: Path) -> str:
    from harness import serve

    if not server.get("background"):
        return f"(judged by the server at {serve.socket_path(results_dir)})"
    pid, idle = server.get("pid"), server.get("idle_timeout_s")
    return (f"(judged by the background judge, pid {pid}: it stops after {idle:g} s without a submit, or now with "
            f"`kill {pid}`; --no-server judges in this process, --no-background or {BACKGROUND_ENV}=0 starts none)")


def cmd_serve(args: argparse.Namespace) -> int:
    from harness import serve
    from harness.api import Judge

    config = _config(args)   # checked (and its errors reported) before anything starts
    results_dir = _writable(args.results_dir)
    overrides = {k: v for k, v in _overrides(args).items() if v is not None and k != "device"}
    judge = Judge(device=config.device, config=args.config, overrides=overrides, problems_dir=args.problems_dir,
                  results_dir=results_dir, run="submit", model=args.model)
    until = (f"it stops after {args.idle_timeout:g} s without a submit" if args.idle_timeout is not None
             else "Ctrl-C stops it")
    try:
        serve.serve(judge, results_dir, idle_timeout_s=args.idle_timeout, background=args.background,
                    on_ready=lambda path: print(
                        f"pid {os.getpid()} serving submits for {results_dir} on {judge.device}, config "
                        f"{judge.config.hash()}, at {path}; {until}", file=sys.stderr, flush=True))
    except RuntimeError as exc:
        judge.close()
        raise UsageError(str(exc)) from exc
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from harness.pipeline.batch import resolve_device, run_batch
    from harness.pipeline.run_folder import RunBusy
    from harness.report import console as report
    from harness.report import scoring

    config = _config(args)
    problem = resolve_problem(args.problem, args.problems_dir) if args.problem else None
    source = Path(args.source)
    run = args.run or source.stem.strip(".") or "batch"
    submissions, skipped = discover(source, problem, Path(args.problems_dir), run=run, model=args.model)
    out = report.console()
    for item in skipped:
        out.print(f"[yellow]skipped[/yellow] {item.label}: {item.reason}")
    if not submissions:
        why = f"{len(skipped)} file(s) skipped, e.g. {skipped[0].reason}" if skipped else "no submission files"
        raise UsageError(f"nothing to judge in {source}: {why}")
    results_dir = _writable(args.results_dir)
    device = resolve_device(config.device)
    out.print(f"{len(submissions)} submissions, device {device}, run '{run}', "
              f"config {config.hash()}" + (f", Dask scheduler {args.scheduler}" if args.scheduler else ""))
    try:
        with report.BatchView(len(submissions), report.console(stderr=True), device) as view:
            outcome = run_batch(submissions, PipelineSettings.from_config(config), results_dir / run,
                                on_progress=view.update, scheduler=args.scheduler)
    except RunBusy as exc:
        raise UsageError(str(exc)) from None
    if outcome.interrupted:
        return _interrupted(outcome)
    out.print(report.results_table(outcome.records, title=f"results ({outcome.run_dir})"))
    out.print(report.leaderboard_table(scoring.leaderboard(outcome.records), title=f"leaderboard for run '{run}'"))
    out.print(f"records: {outcome.run_dir / 'records.jsonl'} ({outcome.reused} reused from an earlier run); "
              f"table: {outcome.run_dir / 'results.csv'}")
    out.print(report.throughput_line(outcome.summary) + f" ({outcome.run_dir / 'batch.json'})")
    for error in outcome.problem_errors:
        out.print(f"[red]reference failed[/red]: {error}")
    for label, why in outcome.no_verdict:   # a reason's own brackets are not rich markup
        out.print(f"[yellow]no verdict[/yellow] {escape(label)}: {escape(why)}")
    if outcome.no_verdict:
        out.print(f"{len(outcome.no_verdict)} of {outcome.summary.submissions} submissions without a verdict "
                  "(listed in batch.json under no_verdict); rerun the same command to judge them again")
    if outcome.problem_errors:
        return EXIT_REFERENCE
    return EXIT_JUDGE_ERROR if outcome.no_verdict else 0


def cmd_scheduler(args: argparse.Namespace) -> int:
    from harness.pipeline.engines import serve_scheduler

    serve_scheduler(args.port)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from harness.pipeline.batch import resolve_device
    from harness.pipeline.engines import serve_workers

    overrides = {"gpus": args.gpus, "build_jobs": args.build_jobs, "device": args.device}
    config = load_config(find_config(args.config) if args.config else None, overrides)
    serve_workers(args.scheduler, PipelineSettings.from_config(config), resolve_device(config.device))
    return 0


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from harness.report import console as report
    from harness.report import scoring

    sources = [Path(p) for p in args.results] or sorted(args.results_dir.glob("*/records.jsonl"))
    records = []
    for source in sources:
        path = source / "records.jsonl" if source.is_dir() else source
        if not path.is_file():
            raise FileNotFoundError(f"no records at {path}")
        records += read_records(path)
    profile = None
    if args.profile:
        from harness.integrity.profiles import load_profile

        profile = load_profile(args.profile)
    board = scoring.leaderboard(records, profile)
    suffix = f"-{profile.name}" if profile else ""
    out_path = Path(args.output) if args.output else args.results_dir / f"leaderboard{suffix}.csv"
    _writable(out_path.parent)
    board.to_csv(out_path, index=False)
    out = report.console()
    out.print(report.leaderboard_table(board, title=f"leaderboard under profile '{profile.name}'" if profile
                                       else "leaderboard (each record's own profile)"))
    out.print(f"{len(records)} records from {len(sources)} source(s); written to {out_path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report import html as html_report

    try:
        runs = html_report.load_runs(args.runs, args.results_dir)
    except html_report.NoRecords as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out_dir = _writable(Path(args.out) if args.out else html_report.default_out_dir(list(runs), args.results_dir))
    for path in html_report.write_report(runs, out_dir):
        print(path)
    return 0


def cmd_problems(args: argparse.Namespace) -> int:
    import pandas as pd
    from rich.table import Table

    from harness.oracle.problem_check import check_problem, list_problem
    from harness.pipeline.batch import resolve_device
    from harness.report import console as report
    from harness.shared.problems import list_problems

    problems = list_problems(args.problems_dir)
    if args.only:
        problems = [p for p in problems if p.id.startswith(args.only)]
    out = report.console()
    if not args.check:
        table = Table(title=f"{len(problems)} problems in {args.problems_dir}", title_justify="left")
        for column in ("id", "name", "inputs", "description"):
            table.add_column(column, overflow="fold")
        for problem in problems:
            listing = list_problem(problem)
            table.add_row(problem.id, problem.name, "\n".join(listing.inputs) or f"[red]{listing.error}[/red]",
                          listing.description or "")
        out.print(table)
        return 0
    config = _config(args)
    device = resolve_device(config.device)
    reports = []
    for index, problem in enumerate(problems, start=1):
        print(f"[{index}/{len(problems)}] checking {problem.id} on {device}", file=sys.stderr, flush=True)
        reports.append(check_problem(problem, config, device, args.results_dir / "problem-checks" / "logs"))
    out.print(report.problem_check_table(reports, device))
    rows = [{"problem": r.problem.id, "name": r.problem.name, "device": r.device, **_checked(r.info),
             "flags": "; ".join(r.flags), "error": r.error} for r in reports]
    path = args.results_dir / "problem-checks" / f"check-{device}.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    weak = [r for r in reports if r.flags]
    out.print(f"{len(weak)} of {len(reports)} problems flagged; table written to {path}")
    return 0


def _checked(info) -> dict:
    """A problem check's columns of the problems table (its report: a ProblemCheckReady, None when it failed)."""
    if info is None:
        return {"device_name": None, "eager_ms": None, "peak_mb": None, "tensor_mb": None, "outputs": ""}
    return {"device_name": info.device_name, "eager_ms": info.eager_ms, "peak_mb": info.peak_mb,
            "tensor_mb": info.tensor_mb,
            "outputs": " ".join(str(list(o.shape) if o.shape is not None else None) for o in info.outputs)}


def cmd_baseline(args: argparse.Namespace) -> int:
    from harness.oracle import baselines
    from harness.pipeline.batch import resolve_device
    from harness.report import console as report
    from harness.shared.problems import list_problems

    config = _config(args)
    device = resolve_device(config.device)
    modes = baselines.parse_modes(args.modes)
    problems = [p for p in list_problems(args.problems_dir) if not args.only or p.id.startswith(args.only)]
    if not problems:
        print(f"error: no problems in {args.problems_dir}" + (f" starting with {args.only}" if args.only else ""),
              file=sys.stderr)
        return EXIT_USAGE
    failed, done = [], []

    def on_problem(problem, entry) -> None:
        done.append(problem.id)
        eager = (entry.get("eager") or {}).get("median_ms")
        compiled = entry.get("compile") or {}
        shown = f"compile {compiled['median_ms']:.4g} ms" if "median_ms" in compiled else (
            f"compile failed: {compiled['error']}" if "error" in compiled else "")
        if eager is None:
            failed.append(problem.id)
        print(f"{problem.id}: " + (f"eager {eager:.4g} ms {shown}" if eager is not None
                                   else f"failed: {entry.get('error')}"), file=sys.stderr, flush=True)

    path, data = baselines.run_baselines(problems, config, device, modes, args.results_dir / "baseline-logs",
                                         on_problem, missing_only=args.missing)
    report.console().print(report.baseline_table(data, [p.id for p in problems], title=str(path)))
    print(f"{len(done) - len(failed)} of {len(problems)} problems timed now ({len(problems) - len(done)} current "
          f"entries kept); written to {path}")
    return EXIT_REFERENCE if failed else 0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    root_help = (f"folder holding problems/, configs/, reference/, build-cache/ and results/ (default: ${ROOT_ENV}, "
                 "else the checkout this harness runs from, else the current directory)")
    parser.add_argument("--root", type=Path, help=root_help)
    parser.add_argument("--results-dir", type=Path, help="where runs are written (default: results/ in the root)")
    # Also accepted after the command (`batch SRC --results-dir D`); there they win over those given before.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=argparse.SUPPRESS, help=root_help)
    common.add_argument("--results-dir", type=Path, default=argparse.SUPPRESS,
                        help="where runs are written and read (default: results/ in the root)")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, **options) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], **options)

    def precision(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--precision", choices=PRECISIONS, help="cast the reference's parameters and floating inputs "
                         "to this dtype, for both sides; fp32 keeps the problem's dtypes (default: the config's, fp32)")

    def judged(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--problems-dir", type=Path, help="folder of levelN/NN_Name.py problems (default: "
                         "problems/ in the root; a KernelBench checkout's works)")
        sub.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
        sub.add_argument("--config", help="YAML config: a path, or a name in configs/ such as strict (default: "
                         "configs/default.yaml)")
        sub.add_argument("--trials", type=int, help="forward trials on fresh inputs (overrides the config)")
        precision(sub)
        sub.add_argument("--backend", choices=BACKENDS, help="the submissions' kernel language (docs/backends.md); "
                         "auto detects it from each source (default: the config's, auto)")
        sub.add_argument("--timing", choices=tuple(TIMING_METHODS), help="the timing method (docs/timing.md): events "
                         "ends each span with the call's work on its stream; events-sync after a device-wide "
                         "synchronize; cuda-graph times graph replays; kernelbench reproduces KernelBench's "
                         "cuda_event numbers (default: the config's, events)")
        sub.add_argument("--model", help="model label for the records")

    submit = command("submit", help="judge one submission")
    submit.add_argument("--problem", required=True, help="problem file or id (level2/62)")
    submit.add_argument("--submission", required=True, help=".py source, or raw model output (.md/.txt)")
    submit.add_argument("--json", action="store_true", help="print the record as one JSON object, nothing else")
    submit.add_argument("--run", default="submit", help="results/<run>/ receives the record (default: submit)")
    submit.add_argument("--no-server", action="store_true", help="judge in this process, even when a server runs "
                        "for this results folder (default: a running server with the same config and device judges; "
                        "when none runs, one is started in the background)")
    submit.add_argument("--no-background", action="store_true", help=f"start no background judge: a running one "
                        f"still judges (also: {BACKGROUND_ENV}=0)")
    submit.add_argument("--idle-timeout", type=_positive_seconds, default=DEFAULT_IDLE_TIMEOUT_S, metavar="S",
                        help="a background judge this submit starts stops after S seconds without a submit "
                        f"(default: {DEFAULT_IDLE_TIMEOUT_S:g})")
    judged(submit)
    submit.set_defaults(handler=cmd_submit)

    served = command("serve", help="keep a judge running for `submit`: references, workers and candidate processes "
                     "started once, not per command")
    served.add_argument("--idle-timeout", type=_positive_seconds, metavar="S",
                        help="stop after S seconds without a submit (default: run until Ctrl-C or SIGTERM)")
    served.add_argument("--background", action="store_true", help=argparse.SUPPRESS)   # started by a submit
    judged(served)
    served.set_defaults(handler=cmd_serve)

    batch = command("batch", help="judge a folder or a JSONL file of generations")
    batch.add_argument("source", help="folder of submissions, or JSONL with problem/completion/model/sample_id")
    batch.add_argument("--problem", help="problem file or id for every submission")
    batch.add_argument("--run", help="run name: results/<run>/ (default: the source's name)")
    batch.add_argument("--scheduler", help="run on a Dask cluster: tcp://HOST:8786 (workers started with "
                       "`run_eval.py worker`), or 'local' for one on this machine (default: this process's own "
                       "build pool and GPU workers)")
    judged(batch)
    batch.set_defaults(handler=cmd_batch)

    scheduler = command("scheduler", help="run the Dask scheduler for multi-machine batches")
    scheduler.add_argument("--port", type=int, default=8786, help="TCP port (default: 8786)")
    scheduler.set_defaults(handler=cmd_scheduler)

    worker = command("worker", help="join this machine to a Dask scheduler: a worker per GPU and a "
                                 "build worker (run one per machine)")
    worker.add_argument("--scheduler", required=True, help="scheduler address, e.g. tcp://HOST:8786")
    worker.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    worker.add_argument("--gpus", help="GPU ids to serve, e.g. 0,1 (default: every visible GPU)")
    worker.add_argument("--build-jobs", type=int, help="build slots (default: CPU cores - 2 per GPU)")
    worker.add_argument("--config", help="YAML config (build_jobs, gpus, build_cache_dir)")
    worker.set_defaults(handler=cmd_worker)

    board = command("leaderboard", help="aggregate records by model and run")
    board.add_argument("results", nargs="*", help="results/<run> folders or records.jsonl files (default: all)")
    board.add_argument("--output", help="CSV path (default: results/leaderboard[-PROFILE].csv)")
    board.add_argument("--profile", help="re-derive every status under this rule profile: a name in configs/ "
                       "(default, strict, fusion, kernelbench-legacy) or a YAML path")
    board.set_defaults(handler=cmd_leaderboard)

    report = command("report", help="plots and one self-contained HTML page from records")
    report.add_argument("runs", nargs="+", metavar="RUN",
                        help="results/<run> folder, records.jsonl file, or run name under --results-dir")
    report.add_argument("--out", help="output folder (default: results/<run>/report for one run, else "
                        "results/report)")
    report.set_defaults(handler=cmd_report)

    baseline = command("baseline", help="time every problem's reference (eager, torch.compile) and "
                                   "store it in reference/ for this GPU, torch and CUDA")
    baseline.add_argument("--problems-dir", type=Path, help="default: problems/ in the root")
    baseline.add_argument("--only", help="only ids starting with this, e.g. level1/")
    baseline.add_argument("--modes", default="eager,compile",
                          help="comma-separated: eager, compile (inductor default), max-autotune (default: "
                          "eager,compile)")
    baseline.add_argument("--missing", action="store_true",
                          help="skip problems whose stored entry is current (resume an interrupted run)")
    baseline.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    baseline.add_argument("--config", help="YAML config (timing method, tf32, baselines_dir)")
    precision(baseline)
    baseline.set_defaults(handler=cmd_baseline)

    problems = command("problems", help="list problems; --check runs each reference and flags weak ones")
    problems.add_argument("--check", action="store_true", help="run each reference once on the device")
    problems.add_argument("--only", help="only ids starting with this, e.g. level1/")
    problems.add_argument("--problems-dir", type=Path, help="default: problems/ in the root")
    problems.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available, else cpu")
    problems.add_argument("--config", help="YAML config (timing budgets, tf32)")
    precision(problems)
    problems.set_defaults(handler=cmd_problems)
    return parser

