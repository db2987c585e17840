"""Everything that runs inside the candidate's process, next to untrusted code: the process's main program
(main.py, started as `python -m harness.children.candidate.main`), the fast model construction (construct.py), the
extension builders' wrappers (extensions.py), the audit hook (guard.py) and the run-time integrity snapshot
(watch.py).

Runs in: the candidate's process only (an evaluation, or a build in the build pool). Nothing outside it imports
this package: the parent reads back only event lines and tensor files.
"""
