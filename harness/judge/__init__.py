"""Judging one submission against one problem: extraction, the candidate's process against the reference, the
checks, the timing, and the verdict as a Record (evaluate.py); the parent's handle on the candidate's process
(candidate_run.py); the speedup arithmetic (speedup.py).

Runs in: the parent (a GPU worker).
May import: shared, timing, submission, integrity, isolation, oracle, build.
"""
