"""The reference side: the oracle process that runs the trusted reference Model once per problem and then serves
its timing (child.py), the parent's handle on it (reference.py), the roofline floor (roofline.py), degenerate
problems (degenerate.py), stored baselines (baselines.py and baseline_child.py) and `problems --check`
(problem_check.py and problem_check_child.py).

Runs in: child.py, baseline_child.py and problem_check_child.py in their own processes (trusted problem code,
never candidate code); degenerate.py's probe in the oracle's process and its verdict in the parent; the rest in the
parent.
May import: core, timing, integrity, isolation.
"""
