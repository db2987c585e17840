"""How the judge tells an honest kernel from a gamed one, where the parent decides it: the static checks on the
source (static/), the pure detectors over what the parent measured (detectors.py, drift.py, degenerate.py), and the
rule profiles that turn findings into statuses (profiles.py). The findings themselves are catalogued in
harness/shared/findings.py; what must be observed inside the candidate's process (its kernels, its run-time
patches) is in harness/children/. A profile is built from `IntegritySettings` (harness/shared/settings.py), never the
whole Config.

Runs in: the parent.
May import: shared.
"""
