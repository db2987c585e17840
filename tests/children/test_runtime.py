"""Helpers at the child's end: what crosses back to the parent, inputs on the device, errors for a table."""
import ctypes
import errno
import os
import pickle
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from harness.children import runtime
from harness.children.runtime import (
    backward,
    flatten_outputs,
    save_judged,
    short_error,
    to_device,
    to_plain_cpu,
)
from harness.shared import handover, protocol, resources
from harness.shared.environment import exec_source
from harness.shared.handover import Handover
from harness.shared.resources import JudgeShort, ran_short


class Lazy(torch.Tensor):
    """A tensor subclass that would compute (here: count) whenever torch touches it."""
    touched = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.touched += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_subclass_is_stripped_without_running_its_torch_function():
    lazy = torch.arange(6.0).as_subclass(Lazy)
    Lazy.touched = 0
    plain = to_plain_cpu(lazy)
    assert type(plain) is torch.Tensor and Lazy.touched == 0
    assert torch.equal(plain, torch.arange(6.0))


class Pending(torch.Tensor):
    """A tensor whose own methods would hand over another answer than its storage holds."""

    def detach(self):
        return torch.full(self.shape, 7.0)

    def to(self, *args, **kwargs):
        return torch.full(self.shape, 7.0)


def test_a_copy_calls_none_of_the_subclasss_own_methods(monkeypatch):
    plain = to_plain_cpu(torch.zeros(3).as_subclass(Pending))
    assert type(plain) is torch.Tensor and torch.equal(plain, torch.zeros(3))
    # nor a torch method the submission rebound: the copy's were bound when the harness was imported
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda self, *args, **kwargs: torch.full(self.shape, 7.0))
    assert torch.equal(to_plain_cpu(torch.zeros(3)), torch.zeros(3))


def test_a_plain_copy_is_detached_contiguous_and_shares_no_storage():
    source = torch.arange(6.0).reshape(2, 3).t().requires_grad_(True)
    plain = to_plain_cpu(source)
    with torch.no_grad():
        source.zero_()
    assert plain.is_contiguous() and not plain.requires_grad
    assert torch.equal(plain, torch.tensor([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]))


def test_non_tensors_cross_back_as_descriptions():
    assert to_plain_cpu(3) == {"not_a_tensor": "int"}
    assert to_plain_cpu(None) == {"not_a_tensor": "NoneType"}
    assert to_plain_cpu([torch.ones(1)]) == {"not_a_tensor": "list"}


def test_flatten_outputs():
    tensor = torch.ones(2)
    assert flatten_outputs(tensor)[0] is tensor and len(flatten_outputs(tensor)) == 1
    assert flatten_outputs((tensor, 3)) == [tensor, 3]
    assert flatten_outputs(None) == [None]


class PendingTuple(tuple):
    def __iter__(self):
        return iter([torch.full((2,), 7.0)])

    def __getitem__(self, index):
        return torch.full((2,), 7.0)


def test_flatten_outputs_reads_the_items_from_the_container_itself():
    held = torch.zeros(2)
    assert flatten_outputs(PendingTuple((held,)))[0] is held
    assert flatten_outputs(type("PendingList", (list,), {"__iter__": lambda self: iter([None])})([held]))[0] is held


def test_to_device_copies_and_asks_gradients_of_floating_tensors_only():
    floats, ints = torch.ones(3), torch.arange(3)
    moved = to_device([floats, ints, 7], "cpu", requires_grad=True)
    assert moved[0].requires_grad and not moved[1].requires_grad and moved[2] == 7
    floats.fill_(5.0)
    assert torch.equal(moved[0].detach(), torch.ones(3))   # a copy, not the caller's tensor
    assert not any(t.requires_grad for t in to_device([floats, ints], "cpu"))


def test_backward_gives_torchs_gradients_bit_for_bit_without_importing_sympy():
    def grads(run):
        torch.manual_seed(0)
        layer = torch.nn.Linear(7, 5).to(torch.bfloat16)
        x = torch.randn(3, 7, dtype=torch.bfloat16, requires_grad=True)
        hidden = layer(x)
        outputs = [hidden.tanh(), hidden.float().softmax(-1)]   # two outputs, two dtypes
        run([(out, torch.randn(out.shape, dtype=out.dtype)) for out in outputs])
        return [x.grad, layer.weight.grad, layer.bias.grad]

    ours = grads(backward)
    theirs = grads(lambda pairs: torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs]))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    script = ("import sys, torch; from harness.children.runtime import backward; "
              "x = torch.ones(3, requires_grad=True); backward([(x * 2, torch.ones(3))]); "
              "print(x.grad.tolist(), 'sympy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[2.0, 2.0, 2.0] False"


def test_short_error_is_the_type_and_first_meaningful_line():
    assert short_error(ValueError("\n\n   bad shape (2, 3)  \ntraceback noise")) == "ValueError: bad shape (2, 3)"
    assert short_error(RuntimeError()) == "RuntimeError"
    long = short_error(KeyError("x" * 1000), limit=50)
    assert len(long) == 50 and long.startswith("KeyError: 'xxx") and long.endswith("...")


SOURCE = """
from __future__ import annotations
from dataclasses import dataclass

@dataclass
class Point:
    x: int

ORIGIN = Point(0)
"""


def test_exec_source_registers_the_module_so_dataclasses_and_pickling_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "judge_test_exec", None)   # removed again after the test
    module = exec_source(SOURCE, "/problems/p.py", "judge_test_exec")
    assert sys.modules["judge_test_exec"] is module and module.__file__ == "/problems/p.py"
    assert pickle.loads(pickle.dumps(module.Point(3))) == module.Point(3)


# ---------------------------------------------------------------- the oracle's feed and truth (save_judged)

def test_a_judged_file_goes_into_its_memfd_and_nothing_into_the_folder(tmp_path):
    files = Handover(handover.oracle_files(), tmp_path)
    save_judged({"x": torch.ones(3)}, protocol.FEED_FILE, files.fds, tmp_path, 12)
    assert os.listdir(tmp_path) == [] and torch.equal(files.load(protocol.FEED_FILE)["x"], torch.ones(3))
    save_judged([torch.zeros(2)], protocol.TRUTH_FILE, None, tmp_path, 8)   # no memfd: the file, as before
    assert os.listdir(tmp_path) == [protocol.TRUTH_FILE]
    files.close()


def test_a_memfd_the_hosts_memory_cannot_hold_is_judge_short_before_anything_is_written(tmp_path, monkeypatch):
    files = Handover(handover.oracle_files(), tmp_path)
    monkeypatch.setattr(resources, "available_memory", lambda: 1 << 20)
    with pytest.raises(JudgeShort, match="memory available") as short:
        save_judged({"x": torch.ones(3)}, protocol.FEED_FILE, files.fds, tmp_path, 2 << 20)
    assert ran_short(short.value) and os.fstat(files.fds[protocol.FEED_FILE]).st_size == 0
    save_judged({"x": torch.ones(3)}, protocol.FEED_FILE, files.fds, tmp_path, 12)   # what fits is written
    files.close()


def test_a_memfd_write_refused_for_want_of_memory_is_judge_short_and_its_pages_are_given_back(tmp_path, monkeypatch):
    files = Handover(handover.oracle_files(), tmp_path)

    def refused(value, name, fds, folder):   # part written, then the kernel's ENOMEM inside torch's zip writer
        os.write(fds[name], b"part of a feed")
        try:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos 704 vs 598") from None

    monkeypatch.setattr(runtime.handover, "save_in_place", refused)
    with pytest.raises(JudgeShort, match=f"writing {protocol.FEED_FILE}: OSError: .*Cannot allocate memory") as short:
        save_judged({"x": torch.ones(3)}, protocol.FEED_FILE, files.fds, tmp_path, 12)
    assert ran_short(short.value) and os.fstat(files.fds[protocol.FEED_FILE]).st_size == 0
    files.close()


def test_a_memfd_the_host_cannot_back_is_judge_short_before_any_page_is_written(tmp_path, monkeypatch):
    """The in-place save allocates the whole file first: where the kernel refuses (ENOSPC from fallocate on a memfd
    whose memory is not there), the oracle reports JudgeShort and the memfd is empty again, with no SIGBUS."""
    files = Handover(handover.oracle_files(), tmp_path)

    def refused(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(handover.os, "posix_fallocate", refused)
    with pytest.raises(JudgeShort, match=f"writing {protocol.TRUTH_FILE}: OSError: .*No space left"):
        save_judged({"x": torch.ones(1 << 16)}, protocol.TRUTH_FILE, files.fds, tmp_path, 1 << 18)
    assert os.fstat(files.fds[protocol.TRUTH_FILE]).st_size == 0
    files.close()


_SPANS = """
import ctypes, resource, sys, torch
from harness.children import runtime
torch.set_num_threads(1)
# a history that left glibc's thresholds low (they move with what the process freed before): blocks of 256 kB mapped
# apart, a freed heap top given back at once; "steady" then configures the child as the judge does
mallopt = ctypes.CDLL(None).mallopt
mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
mallopt(runtime._M_MMAP_THRESHOLD, 128 << 10)
mallopt(runtime._M_TRIM_THRESHOLD, 0)
if sys.argv[1] == "steady":
    runtime.configure_precision(False, "cpu")
known = [torch.randn(64, 1024) for _ in range(4)]


def span():   # as a timed span of 8 calls of a small kernel: each call's own clone of its input set, then its output
    clones = [known[i % 4].clone() for i in range(8)]
    return [torch.relu(x) for x in clones]


for _ in range(10):
    span()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    span()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallopt"), reason="glibc's mallopt")
def test_a_cpu_child_keeps_its_heap_so_that_repeated_spans_touch_no_new_page():
    # glibc maps and unmaps such spans' blocks anew, or gives the heap top back, on thresholds that move with the
    # process's history (a page fault every 4 kB, each span): a small CPU kernel's spans read 5x slow or not
    # depending on it. Whatever the history left, the judge's configuration keeps the pages.
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _SPANS, mode], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    low, steady = faults("low"), faults("steady")
    assert low > 40 * 64, f"low thresholds: {low} page faults in 40 spans (the premise)"
    assert steady < 40, f"steady heap: {steady} page faults in 40 spans"
