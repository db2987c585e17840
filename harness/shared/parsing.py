"""`ast.parse` behind one lock per process.

CPython 3.11 keeps the recursion depth of its AST-to-Python conversion in state shared by the interpreter's
threads, so two threads parsing at once can fail with `SystemError: AST constructor recursion depth mismatch`. A
batch parses from several threads (the driver extracting and statically checking one submission while an engine
thread checks another); CI saw that error end a whole batch fixture. Parsing a submission takes milliseconds, so
one at a time costs nothing measurable.
"""
from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source), one thread at a time (raises what ast.parse raises)."""
    with _LOCK:
        return ast.parse(source, filename)
