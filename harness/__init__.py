"""The kernel judge. Its top folders say where their code runs (each package's docstring says what it may import;
tests/test_architecture.py holds the tree to it):

  children/     only inside child processes; the parent never imports it
    candidate/    the untrusted candidate's process: its main program, audit hook, run-time snapshot
    oracle/       the trusted reference's processes: oracle, stored baselines, problem checks
  shared/       loaded on both sides: config, records, problems, checks, findings, timer, specs, wire protocol,
                typed messages, kernel languages (backends/)

  the parent's packages:
  submission    submissions and source extraction (read as text, never executed here)
  build         compiling extensions ahead, the build cache
  isolation     starting and confining child processes
  oracle        the parent's handles on the reference processes, baselines, problem checks
  timing        the parent's side of the timing dialogue (interleaving, wall-clock cross-checks)
  integrity     static checks, detectors, rule profiles
  judge         one submission against one problem -> Record
  pipeline      batches: driver, engines, resume
  report        scoring, leaderboard, terminal and HTML reports
  api           the Python API: `Judge`, which keeps workers and references running between calls
  serve         `run_eval.py serve`: a Judge behind a Unix socket, which `submit` hands its submission to (starting
                one in the background when none runs)
  cli           the command line (run_eval.py)

docs/architecture.md draws the processes and what crosses between them. `from harness import Judge` loads the API
(and torch) on first use only: importing `harness` itself stays cheap, and child processes never load it.
"""

__all__ = ["Judge", "JudgeClosed"]


def __getattr__(name: str):
    if name in __all__:
        from harness import api

        return getattr(api, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
