"""The trusted reference's processes: the oracle that runs the reference Model once per problem and then serves its
timing (main.py), the swapped-input probe for degenerate problems (degenerate.py), the GPU pace reading (pace.py),
stored baselines (baseline.py) and `problems --check` (problem_check.py).

Runs in: those processes only (trusted problem code, never candidate code); the parent's handles on them are in
harness/oracle/.
"""
