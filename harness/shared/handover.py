"""Files a child writes for the parent (its outputs and gradients, its spot-checked and fresh outputs), handed over
in memory and sealed before the parent reads them.

The parent makes one memfd per file name (`Handover`, before the child starts) and the child inherits them; the
child's harness code writes each file with torch.save into its memfd (`save`). When the child reports it written, the
parent seals the memfd (no more writes, no shrinking or growing, no further seals) and maps it (`Handover.load`): the
tensors are read from the pages the child wrote, not copied into the parent's memory first (a served level2/62
submit read 0.35 s of result and 0.17 s of spot outputs that way), and no process can change them or truncate the
file under the mapping any more (a truncated mapping would kill the parent with SIGBUS).

A child that holds a writable shared mapping of its memfd, or sealed it itself, makes the seal fail: that file is
then read into the parent's memory (a read, never a mapping), as every file was before. A name without a memfd (the
process had none made, or it is asked for more fresh outputs than were made) is a file in the child's folder, read
the same way. What the child wrote is untrusted either way: `load` raises whatever torch.load raises on it.
Each file is written once and read once: the candidate's process closes its fd of a memfd once it has written it,
and the parent its own as it reads it (`release`), so the pages go as soon as the tensors loaded from them are
dropped, not when the process ends (a level-1 problem's outputs of every trial are gigabytes).

The oracle's files go the same way (`oracle_files`), and its feed goes on to the candidates: sealed (`seal`; the
oracle is trusted and writes into no mapping, so its seal never fails), each candidate gets its own read-only open
of it (`read_only`), passed over the socket its process is started with (`lend`, `receive`: a process started ahead
exists before its problem is known, so the fd cannot come with its start). The seals make the memfd's bytes final for
every holder: a write, a shared writable mapping, a truncation, a growth, a hole punched and a seal removed are all
refused (EPERM) through any fd of it, a read-write one reopened from /proc/self/fd/N included.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
import socket
import threading
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from harness.shared import protocol

log = logging.getLogger(__name__)

SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def candidate_files(fresh_inputs: int) -> tuple[str, ...]:
    """The files a candidate's process hands over: trial 0's outputs, its result, its spot outputs, and the outputs
    of each call on a fresh input set (up to two rounds of the config's `fresh_inputs`: harness/judge/evaluate.py
    `_fresh_rounds`)."""
    return (protocol.FIRST_FILE, protocol.RESULT_FILE, protocol.SPOT_FILE,
            *(fresh_out_file(i) for i in range(2 * fresh_inputs)))


def oracle_files() -> tuple[str, ...]:
    """The files an oracle's process hands over: the feed (lent on to each candidate), the truth and, when asked, the
    reference's gradients and the fresh input sets with its outputs (the parent's)."""
    return (protocol.FEED_FILE, protocol.TRUTH_FILE, protocol.GRADIENTS_FILE, protocol.FRESH_SETS_FILE)


def fresh_out_file(index: int) -> str:
    """The name of the outputs of the `index`th call on a fresh input set (0-based)."""
    return f"{Path(protocol.FRESH_OUT_FILE).stem}.{index}.pt"


class Handover:
    """The parent's memfds for one child: `fds` (name -> fd) go to the child; `load` seals and maps one."""

    def __init__(self, file_names: tuple[str, ...], folder: Path):
        self.folder = folder   # where a name without a memfd is read from
        self.fds: dict[str, int] = {}
        self.mapped: dict[str, bool] = {}   # name -> whether its last load was a sealed mapping (else a read)
        try:
            for name in file_names:
                self.fds[name] = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (AttributeError, OSError):   # no memfd here: every name is a file in the child's folder
            self.close()

    def load(self, name: str) -> Any:
        """The torch.load of what the child wrote under `name`: mapped once sealed, else read."""
        fd = self.fds.get(name)
        if fd is None:
            self.mapped[name] = False
            return torch.load(self.folder / name, weights_only=True)
        path = f"/proc/self/fd/{fd}"
        sealed = self.seal(name)
        self.mapped[name] = sealed
        if sealed:
            return torch.load(path, weights_only=True, mmap=True)
        with open(path, "rb") as f:   # a read: a file shrunk meanwhile is a parse error here, never a fault
            return torch.load(f, weights_only=True)

    def seal(self, name: str) -> bool:
        """Seal the memfd of `name` for good (FileNotFoundError: nothing was written into it); False where the seal
        was refused (warned)."""
        fd = self.fds[name]
        if os.fstat(fd).st_size == 0:
            raise FileNotFoundError(f"the child wrote nothing as {name}")
        try:
            return seal(fd)
        except OSError as exc:   # EBUSY: a writable shared mapping of it exists; EPERM: sealed by the child first
            log.warning("%s could not be sealed (%s): read instead of mapped", name, exc.strerror)
            return False

    def size(self, name: str) -> int:
        """Bytes written under `name` (its memfd's, else its file's)."""
        fd = self.fds.get(name)
        return os.fstat(fd).st_size if fd is not None else (self.folder / name).stat().st_size

    def release(self, name: str) -> None:
        """The parent's fd of `name` closed once it is read: its pages go when nothing maps them any more and the
        child closed its fd too (a later `load` of the name reads a file in the folder)."""
        fd = self.fds.pop(name, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """The parent's fds closed; tensors still mapped keep their pages until they are dropped."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


def save(value: Any, name: str, fds: Optional[Mapping[str, int]], folder: Path) -> None:
    """In the child: torch.save `value` into the memfd inherited for `name`, or (none) into `folder / name`."""
    fd = (fds or {}).get(name)
    if fd is None:
        torch.save(value, folder / name)
        return
    os.lseek(fd, 0, os.SEEK_SET)   # each memfd is written once: anything already there came from submission code
    with os.fdopen(os.dup(fd), "wb") as f:
        torch.save(value, f)


def save_in_place(value: Any, name: str, fds: Optional[Mapping[str, int]], folder: Path,
                  how: Optional[str] = None) -> None:
    """In a trusted child (the oracle): `value` saved as torch.save would, into the memfd inherited for `name` (or
    `folder / name`), its tensors' bytes copied straight into the file's pages from wherever the tensors are (a GPU's
    included): no host copy of them first, and none made by torch.save. The layout is written with its data left out
    (torch.serialization.skip_data), the file's whole size is then allocated (a file system or memory that cannot
    hold it fails here with OSError, not later with SIGBUS on a page of the mapping), the file is mapped shared as
    torch.load maps it, and each tensor copied into its place. The mapping is gone when this returns: the parent's
    seal refuses a memfd that a writable shared mapping still holds. A reader sees exactly what torch.save would
    have written (the same torch.load, mapped or read). `how`: the copy's way from a GPU (`_fill`; None: FILL_HOW)."""
    sources: list[torch.Tensor] = []
    layout = _walk(value, sources, lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
    fd = (fds or {}).get(name)
    path = str(folder / name) if fd is None else f"/proc/self/fd/{fd}"
    with open(path, "wb") as f, torch.serialization.skip_data():   # "wb" truncates: the memfd is written once
        torch.save(layout, f)
        f.flush()
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    _fill(path, sources, FILL_HOW if how is None else how)


# How GPU tensors reach the file's mapped pages (CPU ones are copied as they are):
#   "plain"     copy_ into the mapping: the driver stages pageable memory itself, faulting each page in as it goes;
#   "populate"  the mapping's page tables filled first (madvise MADV_POPULATE_WRITE), then as "plain";
#   "register"  the mapping pinned for the copy (cudaHostRegister), the GPU's DMA writing the pages directly;
#   "staged"    through two pinned buffers of STAGE_BYTES, the GPU filling one while the host copies the other;
#   "populate_staged"  the page tables filled first, then as "staged";
#   "staged_threads"   as "staged", the pieces shared among STAGE_THREADS host threads, each with its own two
#                      buffers and CUDA stream (the host's side of the copy, page faults included, on several cores).
#   The default is "staged"; KERNEL_JUDGE_FILL_HOW names another for a process and its children (the benches'
#   comparisons of the ways on a whole evaluation).
FILL_WAYS = ("plain", "populate", "register", "staged", "populate_staged", "staged_threads")
FILL_HOW = os.environ.get("KERNEL_JUDGE_FILL_HOW") or "staged"
if FILL_HOW not in FILL_WAYS:
    raise ValueError(f"KERNEL_JUDGE_FILL_HOW must be one of {FILL_WAYS}, got {FILL_HOW!r}")
STAGE_BYTES = 64 << 20
STAGE_THREADS = 4
MADV_POPULATE_WRITE = 23   # Linux 5.14


def _fill(path: str, sources: list[torch.Tensor], how: str = "plain") -> None:
    """Copy `sources` into the tensors of the file at `path`, mapped shared, the GPU's tensors as `how` says
    (FILL_WAYS); the mapping's last references are this function's locals, so it is unmapped when it returns."""
    if how not in FILL_WAYS:
        raise ValueError(f"how must be one of {FILL_WAYS}, got {how!r}")
    with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):
        mapped = torch.load(path, weights_only=True, mmap=True)
    targets: list[torch.Tensor] = []
    _walk(mapped, targets)
    if len(targets) != len(sources):
        raise RuntimeError(f"{path}: {len(sources)} tensors saved, {len(targets)} mapped back")
    gpu = [(target, source) for target, source in zip(targets, sources) if source.is_cuda and source.numel()]
    populate, register = how in ("populate", "populate_staged"), how == "register"
    span = _span(target for target, _ in gpu) if gpu and (populate or register) else None
    if span is not None and populate:
        _populate(*span)
    registered = span is not None and register and _register(*span)
    staging = [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)] if (
        gpu and how in ("staged", "populate_staged")) else None
    try:
        with torch.no_grad():
            if how == "staged_threads" and gpu:
                _staged_in_threads(gpu, STAGE_THREADS)
            for target, source in zip(targets, sources):
                if how == "staged_threads" and source.is_cuda and source.numel():
                    continue   # copied above
                if staging is not None and source.is_cuda and source.numel():
                    _staged_copy(target, source, staging)
                else:
                    target.copy_(source)
            if gpu:
                torch.cuda.synchronize()
    finally:
        if registered:
            torch.cuda.cudart().cudaHostUnregister(span[0])


def _span(targets) -> Optional[tuple[int, int]]:
    """(page-aligned address, length) covering every tensor of `targets` (their bytes in one mapping)."""
    page = mmap.PAGESIZE
    ranges = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in targets if t.numel()]
    if not ranges:
        return None
    low = min(a for a, _ in ranges) // page * page
    high = -(-max(b for _, b in ranges) // page) * page
    return low, high - low


def _populate(address: int, length: int) -> None:
    """The mapping's page tables filled for writing before the copy (best effort: an older kernel has no such
    advice, and the copy then faults the pages in itself)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_POPULATE_WRITE)


REGISTER_READ_ONLY = 8   # cudaHostRegisterReadOnly: a mapping the GPU only reads from


def _register(address: int, length: int, flags: int = 0) -> bool:
    """Pin [address, address + length) for the GPU's copies, cudaHostRegister `flags` (whether it was: a refusal
    leaves the copy pageable, its error cleared from the CUDA runtime, which would otherwise raise it at torch's next
    kernel launch check)."""
    if int(torch.cuda.cudart().cudaHostRegister(address, length, flags)) == 0:
        return True
    clear_cuda_error()
    return False


def clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error (cudaGetLastError) in the runtime library this process loaded, which
    torch's bindings do not offer; RuntimeError where that library is not found (a runtime linked into torch)."""
    import ctypes
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart.so" in line.split()[-1]}
    if not paths:
        raise RuntimeError("a CUDA error could not be cleared: no libcudart.so loaded in this process")
    for path in paths:
        ctypes.CDLL(path).cudaGetLastError()


def _staged_copy(target: torch.Tensor, source: torch.Tensor, staging: list[torch.Tensor]) -> None:
    """`source` (a GPU tensor) into `target` (host memory) through the pinned `staging` buffers, in turns: the GPU
    copies a piece into one while the host copies the previous piece out of the other."""
    _copy_pieces(_pieces(target, source), staging, torch.cuda.current_stream())


def _pieces(target: torch.Tensor, source: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, int, int]]:
    """(target bytes, source bytes, offset, length) for each STAGE_BYTES piece of `source`."""
    flat_target = target.reshape(-1).view(torch.uint8)
    flat_source = source.contiguous().reshape(-1).view(torch.uint8)
    total = flat_source.numel()
    return [(flat_target, flat_source, offset, min(STAGE_BYTES, total - offset))
            for offset in range(0, total, STAGE_BYTES)]


def _copy_pieces(pieces: list, staging: list[torch.Tensor], stream) -> None:
    """Each piece GPU -> one of the two `staging` buffers (on `stream`, the current one) -> host, in turns."""
    events = [torch.cuda.Event(), torch.cuda.Event()]
    pending: list[tuple[int, torch.Tensor, int, int]] = []   # (buffer, target, offset, length) copied in, not yet out

    def drain() -> None:
        which, flat_target, offset, length = pending.pop(0)
        events[which].synchronize()
        flat_target[offset:offset + length].copy_(staging[which][:length])

    for turn, (flat_target, flat_source, offset, length) in enumerate(pieces):
        which = turn % 2
        if len(pending) == 2:
            drain()
        staging[which][:length].copy_(flat_source[offset:offset + length], non_blocking=True)
        events[which].record(stream)
        pending.append((which, flat_target, offset, length))
    while pending:
        drain()


def _staged_in_threads(pairs: list[tuple[torch.Tensor, torch.Tensor]], threads: int) -> None:
    """Each (host target, GPU source) of `pairs` copied as _staged_copy does, its STAGE_BYTES pieces dealt among
    `threads` host threads in turn, each with its own two pinned buffers and CUDA stream (which first waits for the
    work queued on the current one: the sources' producers). The first error raised in a thread is raised here."""
    pieces = [piece for target, source in pairs for piece in _pieces(target, source)]
    lanes = [pieces[i::threads] for i in range(min(threads, len(pieces)))]
    current, device = torch.cuda.current_stream(), torch.cuda.current_device()
    errors: list[BaseException] = []

    def lane(work: list) -> None:
        try:
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream()
            stream.wait_stream(current)
            staging = [torch.empty(STAGE_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            with torch.cuda.stream(stream):
                _copy_pieces(work, staging, stream)
        except BaseException as exc:  # re-raised in the calling thread
            errors.append(exc)

    workers = [threading.Thread(target=lane, args=(work,), daemon=True) for work in lanes]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def _walk(value: Any, found: list, make: Optional[Any] = None) -> Any:
    """`value` rebuilt (dicts, lists, tuples) with each tensor appended to `found` in order and, given `make`,
    replaced by make(tensor)."""
    if isinstance(value, torch.Tensor):
        found.append(value)
        return make(value) if make is not None else value
    if isinstance(value, dict):
        return {key: _walk(item, found, make) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_walk(item, found, make) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def seal(fd: int) -> bool:
    """Add every seal of SEALS to the memfd `fd`; whether it now has them all. OSError where the kernel refuses."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS


def read_only(fd: int) -> int:
    """A new read-only open of the memfd `fd` (close-on-exec): what a candidate is lent. Open as read-only, it cannot
    write; that it could reopen /proc/self/fd/N read-write is why only a sealed memfd is lent."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)


def lend_socket() -> tuple[socket.socket, socket.socket]:
    """(the parent's end, the child's end; the child's goes to it through pass_fds)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def lend(sock: socket.socket, fds: list[int]) -> None:
    """Send `fds` over the parent's end of a lend socket, once; the end is closed (the child can never send back)."""
    try:
        socket.send_fds(sock, [b"lent"], fds)
    finally:
        sock.close()


def receive(fd: int, most: int = 4) -> list[int]:
    """In the child: the fds lent over its end `fd` of a lend socket (blocks until they come), which is then closed.
    Received close-on-exec: a process the child starts does not inherit them unasked."""
    sock = socket.socket(fileno=fd)
    try:
        _, fds, _, _ = socket.recv_fds(sock, 16, most, socket.MSG_CMSG_CLOEXEC)
    finally:
        sock.close()
    return fds
