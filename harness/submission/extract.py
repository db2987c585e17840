"""Extraction: raw model output (prose, <think> blocks, fenced code, truncation) -> the Python source to run.

Runs in the parent and only reads text; nothing here executes candidate code (ast.parse does not execute).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from harness.shared import parsing

PYTHON_LANGS = {"", "python", "py", "python3", "py3"}
# A ModelNew definition, recognised textually so that a block with a syntax error still counts as code.
_DEFINES_MODELNEW = re.compile(r"^\s*(class\s+ModelNew\b|ModelNew\s*(:[^=]*)?=)", re.MULTILINE)
_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+#.-]*)[^\n]*$", re.MULTILINE)
_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)


@dataclass(frozen=True)
class CodeBlock:
    lang: str
    code: str
    start: int   # offset of the opening fence in the text
    end: int     # offset just past the closing fence


@dataclass(frozen=True)
class Extraction:
    source: Optional[str]        # None: no code found (status no_code)
    explanation: Optional[str]   # prose outside code and <think> blocks, if any
    syntax_error: Optional[str]  # "SyntaxError: ... (line N)" when the source does not parse


def fenced_blocks(text: str) -> list[CodeBlock]:
    """Complete fenced blocks in order; a fence left open by truncation yields no block."""
    blocks = []
    pos = 0
    while True:
        opening = _FENCE.search(text, pos)
        if opening is None:
            return blocks
        fence = opening.group("fence")
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        close = closing.search(text, opening.end())
        if close is None:
            return blocks  # truncated: everything after the opening fence is an unfinished block
        body = text[opening.end() + 1:close.start()]
        blocks.append(CodeBlock(opening.group("lang").lower(), body, opening.start(), close.end()))
        pos = close.end()


def extract(text: str, is_python_file: bool) -> Extraction:
    """A .py file is the source as is; raw output gives its last complete Python block that defines ModelNew. A
    source without a single statement is no code."""
    if is_python_file:
        source, explanation = text, None
    else:
        source, explanation = _from_raw_output(text)
    if source is None:
        return Extraction(None, explanation, None)
    problem = syntax_problem(source)
    if problem is None and not parsing.parse(source).body:
        return Extraction(None, explanation, None)   # empty, or comments only: no code, decided without running it
    return Extraction(source, explanation, problem)


def syntax_problem(source: str) -> Optional[str]:
    try:
        parsing.parse(source)
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg}" + (f" (line {exc.lineno})" if exc.lineno is not None else "")
    except ValueError as exc:  # e.g. null bytes in the source
        return f"ValueError: {exc}"
    return None


def _from_raw_output(text: str) -> tuple[Optional[str], Optional[str]]:
    blocks = fenced_blocks(text)
    chosen = None
    for block in blocks:
        if block.lang in PYTHON_LANGS and _DEFINES_MODELNEW.search(block.code):
            chosen = block
    if chosen is not None:
        return chosen.code, _prose(text, blocks)
    if not blocks and _DEFINES_MODELNEW.search(text) and syntax_problem(text) is None:
        return text, None  # bare code with no fences at all
    return None, _prose(text, blocks)


def _prose(text: str, blocks: list[CodeBlock]) -> Optional[str]:
    """The text outside every fenced block, with <think> sections removed."""
    pieces, pos = [], 0
    for block in blocks:
        pieces.append(text[pos:block.start])
        pos = block.end
    pieces.append(text[pos:])
    prose = _THINK.sub("", "".join(pieces))
    prose = prose.split("</think>")[-1]  # a dangling close tag: what precedes it was reasoning
    prose = re.sub(r"\n{3,}", "\n\n", prose).strip()
    return prose or None
