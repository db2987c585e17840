"""The parent parses candidate sources from several threads; CPython 3.11 can fail two parses at once with
`SystemError: AST constructor recursion depth mismatch` (a CI batch fixture ended so). Every parse goes through
harness.shared.parsing, one at a time."""
from __future__ import annotations

import ast

from harness.shared import parsing
from harness.shared.backends import common
from harness.submission import extract


def test_a_parse_holds_the_lock(monkeypatch):
    held = []
    real = ast.parse

    def watched(source, filename="<unknown>"):
        held.append(parsing._LOCK.locked())
        return real(source, filename)

    monkeypatch.setattr(ast, "parse", watched)
    assert isinstance(parsing.parse("x = 1"), ast.Module)
    assert held == [True] and not parsing._LOCK.locked()


def test_the_parent_s_parsers_go_through_it(monkeypatch):
    calls = []
    real = parsing.parse

    def counted(source, filename="<unknown>"):
        calls.append(source)
        return real(source, filename)

    monkeypatch.setattr(parsing, "parse", counted)
    assert common.parse("import triton\n") is not None
    assert extract.syntax_problem("def f(:\n") is not None and extract.syntax_problem("y = 2\n") is None
    assert calls == ["import triton\n", "def f(:\n", "y = 2\n"]
