"""How the judge tells an honest kernel from a gamed one, where the parent decides it: the static checks on the
source (static/), kernel attribution from a profiler trace (attribution.py), the pure detectors over what
the parent measured (detectors.py), and the rule profiles that turn findings into statuses (profiles.py). The
findings themselves are catalogued in harness/core/findings.py; the detectors that must run inside the candidate's
process are in harness/candidate/.

Runs in: the parent, except attribution.py, which the oracle and the candidate's process also use to count their
own kernels.
May import: core, backends.
"""
