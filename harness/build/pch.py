"""Precompiled torch/extension.h for builds' C++ files (parent side): made by the judge, read by the build children.

`prepare(cache_dir, source)` gives the folder a build child may take precompiled headers from and starts making,
in a process of their own that outlives this one (a CLI `submit` may end before a header is made: it takes longer
than a build), those the source looks like it will want (harness/shared/pch.py names the variants; a build whose
flags ask for one not made yet compiles the header as usual). A variant is made once per toolchain (the
folder's name hashes the compiler, torch and Python), by this process alone: the candidate's code never writes
where its own or another submission's build reads. The folder sits beside the build cache (`<cache>-pch`; the cache
itself is the judge's alone, 0700), readable by the candidate's user, and is used only while it is this process's
user's and writable by no one else. Across processes a lock file makes each variant once; it is
written under a temporary name and renamed into place, so a build never sees half a header.

The header is made with the flags torch.utils.cpp_extension gives a C++-only build (its include folders, Python's,
-DTORCH_API_INCLUDE_EXTENSION_H, -fPIC, its C++ standard) and the variant's -O level; a CUDA build's main.cpp gets
the same and CUDA's include folder, which GCC does not check. GCC checks the rest against each build's and ignores a
header that does not fit, so a mismatch costs the time saved, never a different build.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Optional

from harness.shared import pch
from harness.shared.paths import IMPORT_ROOT

log = logging.getLogger(__name__)

SUFFIX = "-pch"   # the folder beside the build cache
MAKE_TIMEOUT_S = 900
_MAKING: set[Path] = set()   # variant headers this process is making
_LOCK = threading.Lock()
_TOOLCHAIN_LOCK = threading.Lock()
_CFLAGS = re.compile(r"extra_cflags\s*=\s*\[([^\]]*)\]")
# the C++ standard torch's builder gives every extension build (docstrings elsewhere in the file name others)
_STANDARD = re.compile(r"common_cflags\s*\+=\s*\[\s*['\"]-std=(c\+\+\d\d)['\"]")


def prepare(cache_dir: Path, source: str) -> Optional[Path]:
    """The folder of precompiled headers for builds on this machine (None where GCC is not the compiler), after
    starting to make the variants `source` seems to ask for that are not there yet."""
    toolchain = _toolchain()
    if toolchain is None:
        return None
    cache_dir = Path(cache_dir)
    root = cache_dir.with_name(cache_dir.name + SUFFIX) / toolchain["key"]
    try:
        for folder in (root.parent, root):
            try:
                folder.mkdir(mode=0o755, parents=folder == root.parent)
                folder.chmod(0o755)   # made now: the umask may have taken the candidate's user's reading away
            except FileExistsError:   # kept from before: used only as this process's user left it
                pass
            held = folder.lstat()
            if held.st_uid != os.getuid() or held.st_mode & 0o022 or not folder.is_dir() or folder.is_symlink():
                log.warning("precompiled headers not used: %s is not this user's alone", folder)
                return None
    except OSError as exc:
        log.warning("precompiled headers not used: %s", exc)
        return None
    for name in wanted(source):
        target = pch.header(root, name)
        with _LOCK:
            if target.exists() or target in _MAKING or failed(root, name).exists():
                continue
            _MAKING.add(target)   # for this process's life: the maker says nothing back, a build finds its header
        try:
            subprocess.Popen([sys.executable, "-c", _MAKER, str(target), name, json.dumps(toolchain)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True,
                             env={**os.environ, "PYTHONPATH": str(IMPORT_ROOT), "TMPDIR": str(root)})
        except OSError as exc:   # no process to spare: the builds read the header as usual
            log.warning("precompiled torch/extension.h (%s) not started: %s", name, exc)
    return root


# the maker's process: make() and nothing else, its warnings to its own stderr (nowhere: it is detached)
_MAKER = ("import json, sys; from pathlib import Path; from harness.build.pch import make; "
          "sys.exit(0 if make(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])) else 1)")


def wanted(source: str) -> set[str]:
    """The variants a submission's text looks like it builds with: the -O level of each `extra_cflags=[...]` list
    holding nothing else, O0 where a load_inline call gives none. A guess, for what to make ahead only."""
    lists = _CFLAGS.findall(source)
    found = {pch.variant([flag.strip().strip("'\"") for flag in listed.split(",") if flag.strip()])
             for listed in lists}
    if len(lists) < source.count("load_inline("):
        found.add("O0")
    return found - {None}


def make(target: Path, name: str, toolchain: Optional[dict] = None) -> bool:
    """Make variant `name`'s header at `target` unless it is there (one process at a time). Whether it is there."""
    toolchain = toolchain or _toolchain()
    if toolchain is None:
        return False
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    target.parent.chmod(0o755)
    target.parent.parent.chmod(0o755)
    with open(target.parent.parent.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return True
        for stale in target.parent.glob(f".{target.name}.*"):   # a maker killed mid-way (its lock went with it)
            stale.unlink(missing_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        level = [] if name == "O0" else [f"-{name}"]
        command = [toolchain["compiler"], "-x", "c++-header", toolchain["header"], "-o", str(partial),
                   *toolchain["flags"], *level]
        try:
            done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=MAKE_TIMEOUT_S)
            why = done.stderr[-2000:] if done.returncode != 0 else None
        except subprocess.TimeoutExpired:
            why = f"the compiler took over {MAKE_TIMEOUT_S} s"
        if why is not None:   # noted, so that later processes on this toolchain do not try again
            partial.unlink(missing_ok=True)
            _write_text(failed(target.parent.parent.parent, name), why)
            log.warning("precompiled torch/extension.h (%s) could not be made: %s", name, why[-500:])
            return False
        os.chmod(partial, 0o644)
        # the header itself beside it, for an include the precompiled one cannot stand for (a second one, or a
        # build GCC finds it does not fit): GCC then reads this folder's extension.h, which is torch's
        _write_text(target.with_suffix(""), f'#include "{toolchain["header"]}"\n')
        partial.rename(target)
        return True


def failed(root: Path, name: str) -> Path:
    """The note a variant that could not be made leaves (the compiler's last words): it is not tried again."""
    return root / f"{name}.failed"


def _write_text(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    os.chmod(partial, 0o644)
    partial.rename(path)


def _toolchain() -> Optional[dict]:
    """The compiler and flags a C++-only torch extension build uses here, and a key naming them; None where the
    compiler is not GCC (other compilers do not read .gch files) or torch's builder is not the one known. Found
    once per process: the build pool's threads ask at once, the first finds it, the others wait for its answer."""
    with _TOOLCHAIN_LOCK:
        return _find_toolchain()


def builder_standard(builder_source: str) -> Optional[str]:
    """The -std= value torch's extension builder (the source of torch.utils.cpp_extension) gives every build; None
    where it is not the one flag it always was."""
    standards = set(_STANDARD.findall(builder_source))
    return standards.pop() if len(standards) == 1 else None


@functools.cache
def _find_toolchain() -> Optional[dict]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import torch
        from torch.utils import cpp_extension
        compiler = shutil.which(cpp_extension.get_cxx_compiler())
        version = subprocess.run([compiler, "-v"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                                 timeout=30).stderr if compiler else ""
        header = Path(cpp_extension.include_paths("cpu")[0]) / "torch" / "extension.h"
        builder_source = Path(cpp_extension.__file__).read_text()
    except (ImportError, OSError, subprocess.SubprocessError, TypeError, IndexError):
        return None
    if "gcc version" not in version or not header.is_file():
        return None
    standard = builder_standard(builder_source)
    if standard is None:
        return None
    python = sysconfig.get_path("include", scheme="posix_prefix")
    flags = ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    for folder in [*cpp_extension.include_paths("cpu"), python]:
        flags += ["-isystem", folder]
    flags += ["-fPIC", f"-std={standard}"]
    described = "\n".join([compiler, version.strip().splitlines()[-1], torch.__version__, str(header), *flags])
    return {"compiler": compiler, "header": str(header), "flags": flags,
            "key": hashlib.sha256(described.encode()).hexdigest()[:16]}
