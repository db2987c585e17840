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
  cli         the command line (run_eval.py)

docs/architecture.md draws the processes and what crosses between them.
"""
