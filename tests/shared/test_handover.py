"""Files handed over in memfds: written by a child, sealed and mapped by the parent; a child that keeps a way to
change the file after it reported it written gets it read, not mapped."""
import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.shared import handover, protocol
from harness.shared.handover import Handover

REPO = Path(__file__).resolve().parents[2]

WRITE = """
import json, mmap, os, sys, time, torch
from pathlib import Path
from harness.shared import handover
fds = json.loads(sys.argv[1])
handover.save({"outputs": [torch.arange(6.0)], "grads": {"w": torch.ones(3, 3)}}, "result.pt", fds, Path("."))
if sys.argv[2] == "map":   # keeps a shared writable mapping, then overwrites the file after reporting it written
    view = mmap.mmap(fds["result.pt"], os.fstat(fds["result.pt"]).st_size, mmap.MAP_SHARED, mmap.PROT_WRITE)
print("written", flush=True)
sys.stdin.readline()   # the parent has loaded it
if sys.argv[2] == "map":
    view[:] = b"\\0" * len(view)
    print("overwritten", flush=True)
else:
    fd = fds["result.pt"]
    for attempt in (lambda: os.ftruncate(fd, 0), lambda: os.pwrite(fd, b"x", 0)):
        try:
            attempt()
            print("changed", flush=True)
        except OSError as exc:
            print(exc.errno, flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def _writer(mode: str, folder: Path):
    """A child that wrote its result into the memfd it inherited, waiting for a line before its next step; `mode`:
    `plain`, or `map` (it keeps a writable shared mapping of the memfd)."""
    pipe = Handover(handover.candidate_files(1), folder)
    child = subprocess.Popen([sys.executable, "-c", WRITE, json.dumps(pipe.fds), mode], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             pass_fds=tuple(pipe.fds.values()))
    try:
        assert child.stdout.readline().strip() == "written"
        yield pipe, child
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=30)
        pipe.close()


def _next_step(child: subprocess.Popen) -> None:
    child.stdin.write("\n")
    child.stdin.flush()


def test_the_parent_maps_a_sealed_file_that_the_child_can_no_longer_change_or_shrink(tmp_path):
    with _writer("plain", tmp_path) as (pipe, child):
        loaded = pipe.load(protocol.RESULT_FILE)
        assert pipe.mapped[protocol.RESULT_FILE]
        assert torch.equal(loaded["outputs"][0], torch.arange(6.0))
        assert torch.equal(loaded["grads"]["w"], torch.ones(3, 3))
        _next_step(child)
        # both a truncation (which would fault the parent's mapping) and a write are refused by the seals
        assert [child.stdout.readline().strip() for _ in range(2)] == [str(errno.EPERM)] * 2
        assert torch.equal(loaded["outputs"][0], torch.arange(6.0))


def test_a_child_holding_a_writable_mapping_gets_its_file_read_into_the_parents_memory(tmp_path):
    with _writer("map", tmp_path) as (pipe, child):
        loaded = pipe.load(protocol.RESULT_FILE)
        assert not pipe.mapped[protocol.RESULT_FILE]   # the seal was refused (EBUSY): a private copy instead
        _next_step(child)
        assert child.stdout.readline().strip() == "overwritten"
        assert torch.equal(loaded["outputs"][0], torch.arange(6.0))   # the copy did not change with the file


def test_a_file_sealed_by_its_writer_is_read_not_mapped(tmp_path):
    pipe = Handover((protocol.SPOT_FILE,), tmp_path)
    handover.save([torch.zeros(2)], protocol.SPOT_FILE, pipe.fds, tmp_path)
    fcntl.fcntl(pipe.fds[protocol.SPOT_FILE], fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL)   # no seal can be added now
    assert torch.equal(pipe.load(protocol.SPOT_FILE)[0], torch.zeros(2))
    assert not pipe.mapped[protocol.SPOT_FILE]
    pipe.close()


def test_a_name_without_a_memfd_is_the_file_in_the_folder_and_nothing_written_is_missing(tmp_path):
    pipe = Handover((protocol.RESULT_FILE,), tmp_path)
    fresh = handover.fresh_out_file(7)   # more fresh calls than memfds were made for
    handover.save([torch.ones(1)], fresh, pipe.fds, tmp_path)
    assert (tmp_path / fresh).exists()
    assert torch.equal(pipe.load(fresh)[0], torch.ones(1))
    with pytest.raises(FileNotFoundError):
        pipe.load(protocol.RESULT_FILE)
    pipe.close()
    assert pipe.fds == {}


def test_a_candidates_process_gets_its_first_trial_result_spot_and_each_fresh_output_apart():
    names = handover.candidate_files(4)
    assert names[:3] == (protocol.FIRST_FILE, protocol.RESULT_FILE, protocol.SPOT_FILE)
    assert len(set(names)) == len(names) == 3 + 8   # two rounds of fresh inputs, one memfd per call


F_SEAL_FUTURE_WRITE = 0x10   # linux/fcntl.h (Python's fcntl has no name for it)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02   # linux/falloc.h


def _refused(attempt) -> int:
    """The errno `attempt` fails with (0: it went through)."""
    try:
        attempt()
    except OSError as exc:
        return exc.errno
    return 0


def test_a_sealed_memfd_lent_read_only_cannot_be_changed_through_any_fd_of_it(tmp_path):
    pipe = Handover((protocol.FEED_FILE,), tmp_path)
    handover.save({"trials": [[torch.arange(4096.0)]]}, protocol.FEED_FILE, pipe.fds, tmp_path)
    assert pipe.seal(protocol.FEED_FILE)
    feed = pipe.fds[protocol.FEED_FILE]
    before = os.pread(feed, 1 << 20, 0)
    lent = handover.read_only(feed)
    assert fcntl.fcntl(lent, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    reopened = os.open(f"/proc/self/fd/{lent}", os.O_RDWR)   # as a candidate could (here as root): no help to it
    size = len(before)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def upgraded_mapping(fd: int) -> None:   # a shared read-only mapping, then made writable
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        if libc.mprotect(address, size, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    def punched(fd: int) -> None:
        if libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(4096)) != 0:
            raise OSError(ctypes.get_errno(), "fallocate")

    for fd in (lent, reopened, feed):   # the parent's own read-write fd included
        attempts = {
            "write": lambda: os.pwrite(fd, b"x" * 64, size // 2),
            "shared writable mapping": lambda: mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_WRITE),
            "mapping made writable": lambda: upgraded_mapping(fd),
            "shrink": lambda: os.ftruncate(fd, 0),
            "grow": lambda: os.ftruncate(fd, 2 * size),
            "grow by fallocate": lambda: os.posix_fallocate(fd, size, 4096),
            "hole punched": lambda: punched(fd),
            "one more seal": lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, F_SEAL_FUTURE_WRITE),
        }
        refused = {name: _refused(attempt) for name, attempt in attempts.items()}
        assert all(refused.values()), (fd, refused)
    assert fcntl.fcntl(lent, fcntl.F_GET_SEALS) == handover.SEALS   # no seal was removed or added
    assert os.pread(feed, 1 << 20, 0) == before and os.fstat(feed).st_size == size
    for fd in (lent, reopened):
        os.close(fd)
    pipe.close()


def test_fds_lent_over_a_socket_arrive_in_the_other_process_and_the_parents_end_is_closed(tmp_path):
    pipe = Handover((protocol.FEED_FILE,), tmp_path)
    handover.save([torch.ones(3)], protocol.FEED_FILE, pipe.fds, tmp_path)
    assert pipe.seal(protocol.FEED_FILE)
    mine, theirs = handover.lend_socket()
    script = ("import sys, torch; from harness.shared import handover; "
              "fd, = handover.receive(int(sys.argv[1])); print(torch.load(f'/proc/self/fd/{fd}', mmap=True)[0].sum())")
    child = subprocess.Popen([sys.executable, "-c", script, str(theirs.fileno())], cwd=REPO, stdout=subprocess.PIPE,
                             text=True, pass_fds=(theirs.fileno(),))
    theirs.close()
    lent = handover.read_only(pipe.fds[protocol.FEED_FILE])
    handover.lend(mine, [lent])
    os.close(lent)
    assert mine.fileno() == -1   # closed: nothing more can be sent, nothing read back
    out, _ = child.communicate(timeout=60)
    assert out.strip() == "tensor(3.)"
    pipe.close()


def test_a_trusted_writer_saves_in_place_what_torch_save_would_and_leaves_no_mapping_behind(tmp_path):
    """save_in_place: the layout written without data, then each tensor copied into the mapped file. The parent
    reads back exactly the value (views, non-contiguous tensors, dtypes, nested containers, non-tensors), and its
    seal succeeds: no writable shared mapping is left in the writer. Without a memfd, the same into the folder."""
    files = Handover(handover.oracle_files(), tmp_path)
    base = torch.arange(24.0).reshape(4, 6)
    value = {"trials": [[base.t(), torch.tensor(3, dtype=torch.int64)], [base[1:, ::2], 7]],
             "state_dict": {"w": torch.ones(2, 2, dtype=torch.float16), "mask": torch.tensor([True, False])},
             "empty": torch.empty(0, 5), "flag": True, "pair": (torch.full((3,), -1.5), None)}
    handover.save_in_place(value, protocol.FEED_FILE, files.fds, tmp_path)
    loaded = files.load(protocol.FEED_FILE)
    assert files.mapped[protocol.FEED_FILE] is True   # sealed: the writer's shared mapping was gone
    plain_path = tmp_path / "plain.pt"
    torch.save(value, plain_path)
    expected = torch.load(plain_path, weights_only=True)

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    assert same(loaded, expected)
    handover.save_in_place(value, "folder.pt", {}, tmp_path)
    assert same(torch.load(tmp_path / "folder.pt", weights_only=True), expected)
    files.close()


def test_a_trusted_writer_that_cannot_allocate_its_file_fails_before_mapping_it(tmp_path, monkeypatch):
    """The file's size is allocated before it is mapped: a memfd or folder that cannot hold it raises OSError there
    (the judge's JudgeShort), never SIGBUS on a page of the mapping later."""
    files = Handover(handover.oracle_files(), tmp_path)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(handover.os, "posix_fallocate", full)
    with pytest.raises(OSError, match="No space left"):
        handover.save_in_place({"x": torch.ones(1 << 20)}, protocol.TRUTH_FILE, files.fds, tmp_path)
    files.close()


def test_every_way_of_filling_a_file_writes_what_torch_save_would_and_an_unknown_one_is_refused(tmp_path):
    """On the CPU every FILL_WAYS way copies as "plain" does (the ways differ for GPU tensors only); the parent's seal
    succeeds after each."""
    value = {"a": torch.arange(10.0), "b": [torch.ones(3, 3, dtype=torch.float16)[:, 1], 5]}
    for how in handover.FILL_WAYS:
        files = Handover(handover.oracle_files(), tmp_path)
        handover.save_in_place(value, protocol.TRUTH_FILE, files.fds, tmp_path, how=how)
        loaded = files.load(protocol.TRUTH_FILE)
        assert files.mapped[protocol.TRUTH_FILE] is True
        assert torch.equal(loaded["a"], value["a"]) and torch.equal(loaded["b"][0], value["b"][0])
        assert loaded["b"][1] == 5
        files.close()
    with pytest.raises(ValueError, match="how must be one of"):
        handover.save_in_place(value, "x.pt", {}, tmp_path, how="fast")


@pytest.mark.gpu
def test_on_cuda_every_way_of_filling_a_file_lands_the_gpus_bytes(tmp_path):
    """GPU tensors, some larger than a staging buffer and not a multiple of it, one non-contiguous, one empty: each
    way lands exactly their bytes and leaves the memfd sealable (no mapping, no registration left behind)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    big = handover.STAGE_BYTES // 4 * 2 + 12345
    value = [torch.randn(big, device="cuda"), torch.randn(64, 48, device="cuda").t(),
             torch.empty(0, device="cuda"), torch.arange(7, device="cuda", dtype=torch.int64), torch.ones(3)]
    for how in handover.FILL_WAYS:
        files = Handover(handover.oracle_files(), tmp_path)
        handover.save_in_place(value, protocol.TRUTH_FILE, files.fds, tmp_path, how=how)
        loaded = files.load(protocol.TRUTH_FILE)
        assert files.mapped[protocol.TRUTH_FILE] is True, how
        assert all(torch.equal(a.cpu(), b) for a, b in zip(value, loaded)), how
        files.close()


@pytest.mark.gpu
def test_on_cuda_a_refused_registration_leaves_no_error_for_torchs_next_launch():
    """cudaHostRegister's refusal is the CUDA runtime's last error until read: cleared, torch's next kernel launch
    check does not raise it."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert handover._register(0, mmap.PAGESIZE) is False   # a null address: refused
    assert torch.equal((torch.ones(4, device="cuda") + 1).cpu(), torch.full((4,), 2.0))
