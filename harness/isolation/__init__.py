"""Child processes and their confinement: starting a child and talking to it under deadlines (spawn.py), the
kernel-level sandbox (sandbox.py), what each kind of child may see and do (policy.py: environment, writable
folders, limits), what each child is told to do (specs.py: one spec per child, built from the config), and the
helpers every child process uses at its end of the pipes (child_runtime.py).

Runs in: spawn.py, sandbox.py and policy.py in the parent; specs.py on both sides; child_runtime.py in the children.
May import: core, backends, timing.
"""
