"""The kernel judge. Subpackages by where their code runs (each one's docstring says which process and what it may
import; tests/test_architecture.py holds them to it):

  core        shared vocabulary: config, records, problems, checks, findings, wire protocol and messages
  timing      the timer, the timing dialogue, interleaving, the stopping rule
  submission  submissions and source extraction (read as text, never executed here)
  integrity   static checks, kernel attribution, detectors, rule profiles
  isolation   child processes, sandbox, confinement policy, child specs
  candidate   everything inside the untrusted candidate's process
  oracle      the trusted reference process, roofline, baselines, problem checks
  build       compiling extensions ahead, the build cache
  judge       one submission against one problem -> Record
  pipeline    batches: driver, engines, resume
  report      scoring, leaderboard, terminal and HTML reports
  api         the Python API: `Judge`, which keeps workers and references running between calls
  serve       `run_eval.py serve`: a Judge behind a Unix socket, which `submit` hands its submission to
  cli         the command line (run_eval.py)

docs/architecture.md draws the processes and what crosses between them. `from harness import Judge` loads the API
(and torch) on first use only: importing `harness` itself stays cheap, and child processes never load it.
"""

__all__ = ["Judge", "JudgeClosed"]


def __getattr__(name: str):
    if name in __all__:
        from harness import api

        return getattr(api, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
