"""The build stage: a submission's extensions compiled ahead of its evaluation in a build-only candidate process,
on CPU cores with no GPU visible, and kept in a cache keyed by source, versions and GPU architecture (builder.py).

Runs in: the parent (a build pool thread); the builds themselves run in harness/children/candidate/main.py processes.
May import: shared, isolation.
"""
