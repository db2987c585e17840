"""Everything that runs inside the candidate's process, next to untrusted code: the process's main program
(child.py, started as `python -m harness.candidate.child`), the extension builders' wrappers (extensions.py), the
audit hook (guard.py) and the run-time integrity snapshot (watch.py).

Runs in: the candidate's process only (an evaluation, or a build in the build pool). Nothing else in the harness
imports this package: the parent starts it by module name and reads back only event lines and tensor files.
May import: core, backends, timing, integrity, isolation.
"""
