"""Many submissions at once: the batch driver (driver.py: builds ahead on the CPU cores, evaluations on the GPU
workers, records as they finish), the engines that run those tasks (engines.py: threads of this process, or
Dask), and the batch entry point that keeps records and resumes (batch.py).

It takes `PipelineSettings` (harness/shared/settings.py), not the whole `Config`, which those settings carry to the
judging layer unread.

Runs in: the parent (the driver, its worker threads, or Dask workers). On Ctrl-C the driver stops every child
process (harness/isolation/spawn.py) before it keeps what finished.
May import: shared, submission, report, isolation, build, oracle, judge.
"""
