"""The judge running short: when a failure is the machine's (no room for a file, no memory), not a problem's.

Such a failure gives the submission the status judge_error (harness/shared/record.py): no verdict, judged again on
resume. It is decided from facts, never from an error's wording: an exception's type or errno, or, where torch hides
both (torch.save reports a full disk as a RuntimeError of its zip writer), whether the folder can hold the bytes.
Only the judge's own code asks this (the parent, and the oracle process for its trusted reference): a candidate's
MemoryError stays its own failure.
"""
from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Optional

# errnos of a write or an allocation the machine could not serve (disk full, quota, file size limit, memory)
SHORT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOMEM})


class JudgeShort(RuntimeError):
    """The judge ran short of a resource (disk, memory) doing its own work."""


def ran_short(exc: BaseException) -> bool:
    """`exc` (or what it was raised from) says the machine ran short: a MemoryError, a CUDA out-of-memory error,
    an OSError whose errno is in SHORT_ERRNOS, or JudgeShort."""
    return short_cause(exc) is not None


def short_cause(exc: BaseException) -> Optional[BaseException]:
    """The link of `exc`'s chain that says the machine ran short (see ran_short), or None."""
    seen = 0
    while exc is not None and seen < 8:   # the chain a `raise ... from` left, a few links deep
        if isinstance(exc, (JudgeShort, MemoryError)):
            return exc
        if isinstance(exc, OSError) and exc.errno in SHORT_ERRNOS:
            return exc
        if _cuda_out_of_memory(exc):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _cuda_out_of_memory(exc: BaseException) -> bool:
    import sys

    torch = sys.modules.get("torch")   # never imported for this: a process without torch has no CUDA error
    kind = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch is not None else None
    return kind is not None and isinstance(exc, kind)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still write on `folder`'s filesystem."""
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


def no_room(folder: Path, needed: int) -> Optional[str]:
    """Why `folder` cannot take a file of `needed` bytes (its free space, this process's file size limit), or None."""
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and limit < needed:
        return f"a file of {_size(needed)} is over this process's file size limit ({_size(limit)})"
    free = free_bytes(folder)
    if free < needed:
        return f"{folder} has {_size(free)} free, a file of {_size(needed)} does not fit"
    return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity: taskset, a container's cpuset), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# A folder in memory (this tmpfs) for transient files that would otherwise go to disk and be deleted before they are
# written back (a build's intermediates, a candidate's fresh input sets): used while it and the machine's available
# memory keep MEMORY_RESERVE_BYTES free beyond what is put there.
MEMORY_TMP = Path("/dev/shm")
MEMORY_RESERVE_BYTES = 8 << 30


def memory_folder(needed: int = 0) -> Optional[Path]:
    """MEMORY_TMP where this process may make folders in it and both it and the host's available memory have
    `needed` bytes and MEMORY_RESERVE_BYTES free; else None (the caller's folder on disk)."""
    try:
        if not (MEMORY_TMP.is_dir() and os.access(MEMORY_TMP, os.W_OK | os.X_OK)):
            return None
        room = min(free_bytes(MEMORY_TMP), available_memory() or 0)
    except OSError:
        return None
    return MEMORY_TMP if room >= needed + MEMORY_RESERVE_BYTES else None


_SWEPT: set[tuple[str, str]] = set()   # (folder, prefix) whose leftovers this process has removed
_SWEEP_LOCK = threading.Lock()


def scratch_folder(prefix: str, parent: Optional[str | Path] = None) -> Path:
    """A new folder `<prefix>-<pid>-...` in `parent` (None: the temporary folder). The first of a prefix in a parent
    in this process first removes the ones there that a process no longer running left (a judge killed mid-way: in
    memory they would hold RAM until the machine restarts)."""
    root = str(parent or tempfile.gettempdir())
    with _SWEEP_LOCK:
        if (root, prefix) not in _SWEPT:
            _SWEPT.add((root, prefix))
            _sweep(Path(root), prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir=root))


def _sweep(root: Path, prefix: str) -> None:
    """Remove root's <prefix>-<pid>-* folders of this user whose process is gone."""
    leftover = re.compile(rf"{re.escape(prefix)}-(\d+)-")
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        match = leftover.match(entry.name)
        try:
            if match is None or not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _alive(int(match.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # someone else's: alive
        return True
    return True


def no_memory(needed: int) -> Optional[str]:
    """Why a memfd of `needed` bytes cannot be written (this process's file size limit, which binds a memfd as a
    file; the host's available memory), or None. A memfd's pages are host memory that nothing can swap out but the
    swap: a write past what is available invites the out-of-memory killer onto any process of the machine."""
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and limit < needed:
        return f"a file of {_size(needed)} is over this process's file size limit ({_size(limit)})"
    available = available_memory()
    if available is not None and available < needed:
        return f"the host has {_size(available)} of memory available, {_size(needed)} do not fit"
    return None


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"
