"""The shared vocabulary: config, the result record and its reader, problems, the tolerance check, the findings
catalogue, one-at-a-time Python parsing, and what crosses between processes (the wire protocol and the typed
messages that validate it).

Runs in: every process (the parent, the oracle, the candidate's process); nothing here executes problem or
candidate code.
May import: nothing else of the harness.
"""
