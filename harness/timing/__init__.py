"""The parent's side of the timing dialogue: it interleaves the candidate's blocks with the reference's and
cross-checks them with its own wall clock (interleave.py). The timer itself and the stopping rule are in
harness/shared/ (timer.py, rule.py), the child's side of the dialogue in harness/children/timing_server.py.
docs/timing.md explains the method. It takes `TimingSettings` (harness/shared/settings.py), never the whole Config.

Runs in: the parent.
May import: shared.
"""
