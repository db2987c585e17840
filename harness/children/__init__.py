"""Everything that runs only inside a child process: the candidate's process (candidate/, next to untrusted code)
and the trusted reference's processes (oracle/: the oracle, stored baselines, problem checks), with what both kinds
use at their end of the pipes (runtime.py), the child's side of the timing dialogue (timing_server.py) and kernel
attribution from a profiler trace (attribution.py).

Runs in: child processes only. The parent starts them by module name (harness/shared/specs.py) and never imports
anything here; a child imports only harness/shared/ and its own side of this package (tests/test_architecture.py).
May import: shared.
"""
