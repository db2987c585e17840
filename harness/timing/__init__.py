"""The timing method: the timer (timer.py: one call of a zero-argument closure at a time, L2 flush outside the
timed span, CUDA events or host clock), the child's side of the timing dialogue (serve.py), the parent's side that
interleaves the candidate's blocks with the reference's and cross-checks them with its own wall clock
(interleave.py), and the stopping rule built from the config (rule.py). docs/timing.md explains the method.

Runs in: timer.py and serve.py in the process that owns the code being timed (oracle or candidate);
interleave.py and rule.py in the parent.
May import: core.
"""
