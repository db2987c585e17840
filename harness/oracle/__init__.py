"""The parent's handles on the reference side: the reference process per problem (reference.py), references started
ahead (ahead.py), stored baselines (baselines.py) and `problems --check` (problem_check.py). The processes themselves
are in harness/children/oracle/.

Runs in: the parent.
May import: shared, integrity, isolation.
"""
