"""What both sides of the process boundary load: the config, the result record and its reader, problems, the
tolerance check, the findings catalogue, one-at-a-time Python parsing, the kernel languages (backends/), the timer
and its stopping rule, the roofline arithmetic, the child specs, and what crosses between processes (the wire
protocol, the typed messages and commands that validate it, the memfd handover of result files).

Runs in: every process (the parent, the oracle, the candidate's process). Nothing here executes candidate code; a
module here may be loaded next to it, so the parent trusts no number one of these functions computed in a child.
May import: nothing else of the harness.
"""
