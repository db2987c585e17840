"""Precompiled torch/extension.h for builds' C++ files: which one a build can use, and where it lies.

Compiling torch/extension.h is about half of a small C++ extension's build. GCC takes `torch/extension.h.gch` in an
include folder searched before torch's own in place of the header, when the build's macros and code-generation
options match those it was made with, and ignores it otherwise (the header is then read as usual). The judge makes
one per optimisation level a build asks for ("O0" to "O3"; harness/build/pch.py), in a folder of its own beside the
build cache; the candidate's process only ever reads it (harness/children/candidate/extensions.py puts its folder
first on the include path of a build whose own flags name nothing beyond that level).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Sequence

HEADER = Path("torch") / "extension.h.gch"   # inside a variant's folder
_LEVEL = re.compile(r"-O([0-3])")


def variant(extra_cflags: Optional[Sequence[str] | str]) -> Optional[str]:
    """The variant a C++ build with these extra flags can use: its -O level (the last one given, "O0" with none),
    or None where it passes anything else (a macro, a code-generation option: its own header is compiled as usual)."""
    flags = [extra_cflags] if isinstance(extra_cflags, str) else list(extra_cflags or [])
    level = "0"
    for flag in flags:
        if not isinstance(flag, str):
            return None
        found = _LEVEL.fullmatch(flag.strip())
        if found is None:
            return None
        level = found.group(1)
    return f"O{level}"


def header(root: Path, name: str) -> Path:
    """The precompiled header of variant `name` under the judge's folder `root`."""
    return root / name / HEADER
