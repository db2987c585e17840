"""Child processes and their confinement, from the parent's side: starting a child and talking to it under
deadlines (spawn.py), the kernel-level sandbox (sandbox.py), what each kind of child may see and do (policy.py:
environment, writable folders, limits), processes started ahead of their work (started_ahead.py) and stopping a
child while its reference is timed (freeze.py). What each child is told (the specs) and the files it hands back are
in harness/shared/; the child's own end of the pipes is in harness/children/. The confinement is built from
`SandboxSettings` (harness/shared/settings.py), never the whole Config.

Runs in: the parent.
May import: shared.
"""
