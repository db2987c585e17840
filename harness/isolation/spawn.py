"""Parent side of a child process: start it in its own process group, talk over pipes, enforce deadlines.

A child is `python -m <module> SPEC` with its own working directory, a reduced environment, optionally the sandbox of
harness/isolation/sandbox.py, and stdout/stderr drained by a thread into a log file that keeps only a head and a tail
(a flood never reaches the disk). The parent reads JSON event lines with a deadline per phase; an event without the
run's token is forged and ignored. On a missed deadline, or resident memory above the limit, the whole process group
is killed. A child that ends without its final event crashed: the exit code or signal says how. At the end every
process the child left behind (its descendants, its process group and session, its cgroup's members, anything
carrying the run's environment marker, and every process of the child's own user where it has one) is found and
killed. A sandboxed child runs as an unprivileged user of its own where the judge is root (sandbox.pick_user): its
folder is made writable to it alone (its group's); what the parent puts there stays the parent's, made readable.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from harness.isolation import sandbox
from harness.isolation.freeze import Cage, Freezer, join_in_child
from harness.isolation.policy import child_environment
from harness.shared import handover, protocol, specs
from harness.shared.handover import Handover, lend_socket

log = logging.getLogger(__name__)

EXIT_GRACE_S = 10.0  # after its last event a child has this long to exit before its group is killed
POLL_S = 0.5         # how often a silent child is checked for having exited and for its memory
LEFT_BYTES = 1 << 20  # what is read of a child's event pipe once it has exited
MIN_PASS_GAP_S = 0.1  # the memory watch's passes over /proc are at least this far apart
MARK_VARIABLE = "JUDGE_RUN_MARK"   # in every process a child starts, so leftovers are found after setsid
DEFAULT_LOG_BYTES = 4_000_000
STARTING_WAIT_S = 120.0   # the longest a timing waits for the GPU part of a candidate process's start
HOST_OOM_NOTE = "while the kernel's out-of-memory killer ran"   # a SIGKILL no one here sent, the OOM killer busy

@dataclass(frozen=True)
class Ended:
    """How a child ended when it stopped sending events."""
    timed_out: bool
    returncode: Optional[int]   # None when killed on timeout
    detail: str                 # "killed by SIGSEGV", "exited with code 3", "no event within 300 s"
    memory_exceeded: bool = False   # killed by the watchdog for its memory limit


def _preexec(policy: Optional[sandbox.Policy], nice: int, cage: Optional[Cage], cpus: Optional[tuple[int, ...]],
             user: Optional[sandbox.User]):
    confine = sandbox.preexec(policy, user) if policy is not None else None
    if not nice and cage is None and not cpus:
        return confine
    joins = cage.join_paths() if cage is not None else ()

    def start() -> None:   # between fork and exec; the cage first, before the sandbox closes the cgroup files
        if joins:
            join_in_child(joins)
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)   # inherited by every thread and process it starts
            except OSError:
                pass   # a core this process may not give (a cpuset changed since): the child runs unpinned
        if nice:
            os.nice(nice)
        if confine is not None:
            confine()
    return start


@dataclass
class Starts:
    """What starting children cost this process so far (a batch's batch.json has its own share: `starts`): the
    parent's side of each start, before the child runs its own code. Forks go one at a time through the fork lock
    (sandbox.fork_guard, held for the fork itself), so one slow fork holds up every other start."""
    children: int = 0
    cage_s: float = 0.0        # its cgroup made (Cage.create)
    lock_wait_s: float = 0.0   # waiting for the fork lock, held by other threads' forks
    fork_s: float = 0.0        # the fork, the lock held (copying the parent's page tables: grows with its memory)
    start_s: float = 0.0       # fork to exec: the fork and the confinement the child takes on before its program
    slowest_start_s: float = 0.0   # the slowest of this process so far

    def since(self, before: "Starts") -> dict:
        return {"children": self.children - before.children,
                **{name: round(getattr(self, name) - getattr(before, name), 3)
                   for name in ("cage_s", "lock_wait_s", "fork_s", "start_s")},
                "slowest_start_s": round(self.slowest_start_s, 3)}


_STARTS = Starts()
_STARTS_LOCK = threading.Lock()


def starts() -> Starts:
    """A copy of this process's start costs so far."""
    with _STARTS_LOCK:
        return dataclasses.replace(_STARTS)


def _count_start(cage_s: float, lock_wait_s: float, fork_s: float, start_s: float) -> None:
    with _STARTS_LOCK:
        _STARTS.children += 1
        _STARTS.cage_s += cage_s
        _STARTS.lock_wait_s += lock_wait_s
        _STARTS.fork_s += fork_s
        _STARTS.start_s += start_s
        _STARTS.slowest_start_s = max(_STARTS.slowest_start_s, start_s)


class ShuttingDown(RuntimeError):
    """No child is started once `stop_all` was called (the batch was interrupted)."""


_LIVE: "weakref.WeakSet[Child]" = weakref.WeakSet()   # children started by this process and not yet finished
_STOPPED = threading.Event()


def stop_all() -> int:
    """Kill every child this process started that is still running, and refuse new ones from now on (an
    interrupted batch: its worker threads must not leave processes behind). Returns how many were killed."""
    _STOPPED.set()
    children = list(_LIVE)
    for child in children:
        child.kill()
    return len(children)


def stopping() -> bool:
    """An interrupted batch is being wound down (stop_all): no child may start."""
    return _STOPPED.is_set()


def allow_new() -> None:
    """Children may be started again (after an interrupted batch has been wound down)."""
    _STOPPED.clear()


class StartGate:
    """Timings and the GPU part of starting a candidate process ahead (its CUDA context, the profiler's first
    session: harness/judge/warm.py) exclude each other on one GPU (start_gate). Such a start-up is not stopped
    halfway (a frozen process could hold a driver lock) and must not run beside a timed block, so the process starts
    up to its imports freely, then waits here until no timing runs. Timings may overlap each other; a timing waits
    only for start-ups already waiting or under way, so neither side starves."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._timings = 0
        self._starting = 0   # start-ups waiting for the gate or under way
        # held by a start-up whose GPU work must also be alone among start-ups (a GPU worker's gate: references
        # started in the background measuring the device's rates or timing themselves alone), inside start_up()
        self.alone = threading.Lock()

    @contextlib.contextmanager
    def start_up(self):
        with self._changed:
            self._starting += 1
            self._changed.wait_for(lambda: self._timings == 0)
        try:
            yield
        finally:
            with self._changed:
                self._starting -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def start_up_if_idle(self):
        """As start_up where no timing runs at this moment (gives True); else nothing is held (gives False at once)."""
        with self._changed:
            idle = self._timings == 0
            if idle:
                self._starting += 1
        try:
            yield idle
        finally:
            if idle:
                with self._changed:
                    self._starting -= 1
                    self._changed.notify_all()

    @contextlib.contextmanager
    def timing(self, timeout_s: float = STARTING_WAIT_S):
        """Waits (at most `timeout_s`) for start-ups already waiting or under way, then holds them off. Gives the
        seconds it waited."""
        began = time.monotonic()
        with self._changed:
            self._changed.wait_for(lambda: self._starting == 0, timeout_s)
            self._timings += 1
        try:
            yield time.monotonic() - began
        finally:
            with self._changed:
                self._timings -= 1
                self._changed.notify_all()


def place(device: str, env: Optional[dict] = None) -> str:
    """Where a timing or a start-up runs, as far as they can disturb each other: the host's cores on the CPU device
    (one place), else the GPU its CUDA_VISIBLE_DEVICES names ("" for the process's own, where it names none). GPU
    workers of one process time on GPUs of their own: one worker's timing neither waits for nor holds off another
    GPU's start-ups (a process-wide gate held every GPU's start-ups off while any of four workers timed)."""
    return "cpu" if device == "cpu" else str((env or {}).get("CUDA_VISIBLE_DEVICES", ""))


_GATES: dict[str, StartGate] = {}
_GATES_LOCK = threading.Lock()


def start_gate(device: str, env: Optional[dict] = None) -> StartGate:
    """The StartGate of a place (`place`): every timing and every GPU start-up there goes through it."""
    key = place(device, env)
    with _GATES_LOCK:
        if key not in _GATES:
            _GATES[key] = StartGate()
        return _GATES[key]


_HOLDING = threading.local()   # .paused: this thread is inside builds_paused (a nested one is part of the outer)


@contextlib.contextmanager
def builds_paused(device: str, env: Optional[dict] = None):
    """While the body times something on `device` (a GPU worker's: `env`, its CUDA_VISIBLE_DEVICES): no candidate
    process started ahead for that place goes through the GPU part of its start (start_gate; gives the seconds it
    waited there for start-ups under way; nested in another of the same thread, it is part of that one), and on the
    CPU device every build this process runs (whatever its niceness) and every candidate process still being
    started ahead is stopped meanwhile: they share its cores. One that starts, or is marked as starting, while the
    body runs is stopped at once (_stopped). A build's compile deadline keeps running while it is stopped. On a
    GPU, builds and the imports of processes being started ahead run on: they need no GPU and have cores of their
    own. A reference being started in the background for the same place is stopped on any device (its CPU work,
    drawing inputs on every core, can slow a launch-bound reference's blocks by more than the drift margin); its GPU
    work holds that place's gate, so it is never stopped halfway through that. Another GPU's are left alone: their
    GPU work is on their own GPU, and a short span that needs a quiet host stops them too (host_quieted)."""
    if getattr(_HOLDING, "paused", False):   # inside a hold of this thread's already: it covers this body too
        yield 0.0
        return
    here = place(device, env)

    def paused(child: "Child") -> bool:
        on_the_cpu = device == "cpu" and (child.is_build or _starting(child))
        return on_the_cpu or (child.pause_beside_timing and _starting(child) and child.place == here)

    with start_gate(device, env).timing() as waited_s, _stopped(paused):
        _HOLDING.paused = True
        try:
            yield waited_s
        finally:
            _HOLDING.paused = False


@contextlib.contextmanager
def host_quieted(device: str, env: Optional[dict] = None):
    """Inside builds_paused, for a short span whose verdict hangs on host noise (the second round of fresh calls,
    harness/judge/evaluate.py): on a GPU too, every build this process runs and every process still being started
    ahead, for any GPU, is stopped meanwhile, as builds_paused does on the CPU device. Its own GPU's are safe to
    stop (builds_paused holds that place's gate: none of them is in the GPU part of its start); one of another GPU
    caught in its GPU part only waits the span out, with its own GPU idle meanwhile. On the CPU device builds_paused
    stopped them already."""
    if device == "cpu":
        yield
        return
    here = place(device, env)
    with _stopped(lambda child: (child.is_build or _starting(child))
                  and not (child.pause_beside_timing and _starting(child) and child.place == here)):   # stopped
        yield


def _starting(child: "Child") -> bool:
    return child.settled is not None and not child.settled.is_set()


class _Hold:
    """One `_stopped` under way: what it picks and the children it stopped."""

    def __init__(self, which: Callable[["Child"], bool]):
        self.which = which
        self.held: list["Child"] = []

    def take(self, child: "Child") -> None:
        """Stop `child` for this hold if it picks it (under _HOLD_LOCK). A child held by several holds at once (two
        threads' timings) is stopped by the first and resumed by the last."""
        if child.ended is not None or child in self.held or not self.which(child):
            return
        count = _HELD.get(child, 0)
        if count == 0:
            child.freezer.freeze(hold=True)
        _HELD[child] = count + 1
        self.held.append(child)

    def release(self) -> None:
        for child in self.held:
            count = _HELD.pop(child, 1) - 1
            if count > 0:
                _HELD[child] = count
            else:
                child.freezer.thaw()


_HOLD_LOCK = threading.Lock()
_HOLDS: list[_Hold] = []   # the holds under way, any thread's
_HELD: "weakref.WeakKeyDictionary[Child, int]" = weakref.WeakKeyDictionary()   # a stopped child: by how many holds


@contextlib.contextmanager
def _stopped(which: Callable[["Child"], bool]):
    """Every live child `which` picks, stopped for the body, and every one started (or marked as starting) while
    the body runs, from then on: a build the pool sends, or a process started ahead, a moment after a timing began
    would otherwise run beside all of it. A build that ends meanwhile is simply gone: stopping it is a no-op, never
    an error."""
    hold = _Hold(which)
    with _HOLD_LOCK:
        _HOLDS.append(hold)
        for child in list(_LIVE):
            hold.take(child)
    try:
        yield
    finally:
        with _HOLD_LOCK:
            _HOLDS.remove(hold)
            hold.release()


def _held_if_paused(child: "Child") -> None:
    """`child` just started, or was just marked as starting: stopped by every hold under way that picks it."""
    with _HOLD_LOCK:
        for hold in _HOLDS:
            hold.take(child)


class Child:
    def __init__(self, module: str, spec, workdir: Path, log_path: Path, with_commands: bool,
                 policy: Optional[sandbox.Policy] = None, max_rss_bytes: Optional[int] = None,
                 max_log_bytes: int = DEFAULT_LOG_BYTES, env: Optional[dict[str, str]] = None, nice: int = 0,
                 caged: bool = False, max_processes: Optional[int] = None,
                 cpus: Optional[tuple[int, ...]] = None, handover: tuple[str, ...] = (), lend: bool = False,
                 build: bool = False):
        """`spec`: the child's spec (harness/shared/specs.py). `env` overrides the passed environment (e.g.
        CUDA_VISIBLE_DEVICES for one GPU worker's children); `nice` lowers the child's CPU priority (builds yield to
        the processes being timed). `build`: a build of the build pool (builds_paused stops it beside timings on
        the CPU device, whatever its niceness). `caged`: the child and everything it starts live in a cgroup of their
        own (harness/isolation/freeze.py; `max_processes` caps them there), where the machine allows one; `cage_note`
        says why not otherwise. `cpus`: the cores it may run on (its affinity, and the cage's cpuset.cpus where the
        cgroup has one, which the child cannot widen). `handover`: files the child writes for this process, each in a
        memfd made here (harness/shared/handover.py; `self.handover` reads them). `lend`: the child gets one end of a
        socket that `lend_fds` sends it fds over later (a candidate's feed: it may be started before its problem is
        known). A sandboxed child runs as a user of its own where the machine allows (`self.user`,
        sandbox.pick_user): `workdir` becomes writable to it alone (its group's, mode 0770), and what the parent put
        there stays the parent's, readable (`hand_over` for what comes later)."""
        if _STOPPED.is_set():
            raise ShuttingDown("the batch is stopping: no new child process")
        self.settled: Optional[threading.Event] = None   # started ahead: set once it is up (harness/judge/warm.py)
        # read by other threads through _LIVE (builds_paused, stop_all) from the moment the process is added there
        self.ended: Optional[Ended] = None
        self._freezer: Optional[Freezer] = None
        # stopped beside a timing of its place on any device while not settled (a reference started in the
        # background, whose GPU work holds its place's gate: harness/oracle/reference.py); otherwise only on the CPU
        # device
        self.pause_beside_timing = False
        self.place = place("cuda", env)   # the GPU it runs on, for builds_paused (the CPU device stops by kind)
        self.cage: Optional[Cage] = None
        self.cage_note = "not asked for"
        asked = time.perf_counter()
        if caged:
            self.cage, self.cage_note = Cage.create(max_processes, cpus=cpus)
        self.workdir = workdir
        self.is_build = build
        self.token = secrets.token_hex(16)
        self.mark = secrets.token_hex(8)
        self.max_rss_bytes = max_rss_bytes
        self.user = sandbox.pick_user() if policy is not None else None
        self.user_note = "" if self.user is not None or policy is None else sandbox.user_unavailable()
        event_r, event_w = os.pipe()
        command_r, command_w = os.pipe() if with_commands else (None, None)
        self.handover = Handover(handover, workdir)
        self._lend, lend_theirs = lend_socket() if lend else (None, None)
        lend_fd = lend_theirs.fileno() if lend_theirs is not None else None
        spec_path = workdir / protocol.SPEC_FILE
        specs.write_spec(spec_path, spec, specs.Wiring(event_w, command_r, self.token, self.handover.fds or None,
                                                       lend_fd))
        passed = tuple(fd for fd in (event_w, command_r, *self.handover.fds.values(), lend_fd) if fd is not None)
        named = {}
        if self.user is not None:
            # Its group's, not its: the child writes there, but cannot rename its folder away (sticky /tmp lets
            # only the owner) and put a link to a folder of the judge's in its place for the parent to write through
            os.chown(workdir, os.getuid(), self.user.gid)
            os.chmod(workdir, 0o770)
            for entry in os.scandir(workdir):
                self.hand_over(Path(entry.path))
            # getpass.getuser() (torch's inductor cache, ...) asks these before the password database, which has
            # no entry for this uid
            named = {"USER": f"candidate-{self.user.uid}", "LOGNAME": f"candidate-{self.user.uid}"}
        self._oom_kills_at_start = oom_kills()
        try:
            caged_at = time.perf_counter()
            environment = child_environment(workdir, {**named, **(env or {}), MARK_VARIABLE: self.mark})
            start = _preexec(policy, nice, self.cage, cpus, self.user)
            prepared = time.perf_counter()
            with sandbox.fork_guard():   # preexec_fn: Python runs between fork and exec (the lock: the fork only)
                locked = time.perf_counter()
                self.process = subprocess.Popen(
                    [sys.executable, "-m", module, str(spec_path)], cwd=workdir, env=environment,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=passed,
                    start_new_session=True, preexec_fn=start)
            forked = sandbox.forked_at()
        except BaseException:
            self.handover.close()
            if self._lend is not None:
                self._lend.close()
            raise
        finally:
            if lend_theirs is not None:
                lend_theirs.close()
        started = time.perf_counter()
        _count_start(caged_at - asked, locked - prepared, (forked or started) - locked, started - locked)
        os.close(event_w)
        if command_r is not None:
            os.close(command_r)
        self._born = start_ticks(self.process.pid)   # related processes: only those started since
        _LIVE.add(self)
        _held_if_paused(self)
        if self.max_rss_bytes:
            _MEMORY.watch(self.process.pid)
        self._events = event_r
        self._commands = command_w
        self._buffer = b""
        self.forged: list[str] = []     # event lines without the run's token
        self.output = CappedLog(log_path, max_log_bytes)
        self._drain = threading.Thread(target=self.output.drain, args=(self.process.stdout,), daemon=True)
        self._drain.start()

    def lend_fds(self, fds: list[int], mapped_bytes: int = 0) -> None:
        """Send the child `fds` over its lend socket (once: the parent's end is closed after). `mapped_bytes`: what
        the child may map of them: a memfd's pages it maps count in its resident memory (RssShmem) though they are
        the memfd's, so its memory limit is raised by as much."""
        if self._lend is None:
            raise RuntimeError("this child was started without a lend socket, or has been lent its fds already")
        sock, self._lend = self._lend, None
        handover.lend(sock, fds)
        if self.max_rss_bytes:
            self.max_rss_bytes += mapped_bytes

    def hand_over(self, path: Path) -> None:
        """Make what the parent put into the child's folder (`path`, a file or a folder and all beneath it)
        readable to the child's user; it stays the parent's, so the child cannot change it in place (a symlink is
        left as it is: never followed)."""
        if self.user is None:
            return
        for place in [path, *(sorted(path.rglob("*")) if path.is_dir() and not path.is_symlink() else [])]:
            mode = os.lstat(place).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(place, 0o755)
            elif stat.S_ISREG(mode):
                os.chmod(place, 0o755 if mode & 0o100 else 0o644)

    def _processes(self) -> list[tuple[int, str]]:
        return related_processes(self.process.pid, self.mark, self.user.uid if self.user is not None else None,
                                 self.cage.members() if self.cage is not None else (), self._born)

    def mark_starting(self, settled: threading.Event, beside_any_timing: bool = False) -> None:
        """Being started ahead until `settled` is set: builds_paused stops it beside a timing of the CPU device, and
        with `beside_any_timing` beside one of its own GPU too (a reference started in the background); at once if
        one is under way."""
        self.settled, self.pause_beside_timing = settled, beside_any_timing
        _held_if_paused(self)

    @property
    def freezer(self) -> Freezer:
        """Stops and resumes every process of this child (while the other side of a timing runs)."""
        if self._freezer is None:
            self._freezer = Freezer(self.process.pid, self._processes, self.cage)
        return self._freezer

    def isolation(self) -> str:
        """How this child's processes are held, for the record: the freeze mechanism and the cage's limits, and
        the user it ran as."""
        held = (self.cage.describe() if self.cage is not None
                else f"SIGSTOP/SIGCONT of the process group (no cgroup: {self.cage_note})")
        if self.user is not None:
            return f"{held}; ran as {self.user.describe()}"
        if self.user_note:
            return f"{held}; ran as the judge's user ({self.user_note})"
        return held

    def next_event(self, timeout_s: float) -> Optional[dict]:
        """The next event, or None once the child ended (see `ended`) or missed the deadline (killed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._next_line(deadline, timeout_s)
            if line is None:
                return None
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                event = None
            if isinstance(event, dict) and event.get("token") == self.token and "event" in event:
                event.pop("token")
                return event
            if len(self.forged) < 20:
                self.forged.append(line[:120].decode(errors="replace"))

    def _next_line(self, deadline: float, timeout_s: float) -> Optional[bytes]:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                self.ended = Ended(True, None, f"no progress within {timeout_s:g} s")
                return None
            ready, _, _ = select.select([self._events], [], [], min(remaining, POLL_S))
            if not ready:
                # A grandchild may hold the pipe open after the child died: the exit decides, not EOF. What the
                # child wrote before it exited is read first: its last event and its exit can both fall between
                # this thread's select and its poll (its wake-up can be late on a loaded judge)
                if self.process.poll() is not None:
                    if self._read_what_is_there():
                        continue
                    self.ended = self._wait_exit()
                    return None
                rss = _MEMORY.rss_bytes(self.process.pid) if self.max_rss_bytes else 0
                if self.max_rss_bytes and rss > self.max_rss_bytes:
                    self.kill()
                    self.ended = Ended(False, None, f"killed: resident memory {rss / 2**30:.1f} GB above the "
                                       f"{self.max_rss_bytes / 2**30:g} GB limit", memory_exceeded=True)
                    return None
                continue
            chunk = os.read(self._events, 65536)
            if not chunk:
                self.ended = self._wait_exit()
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _read_what_is_there(self) -> bool:
        """Add to the buffer what the event pipe holds now, without waiting (at most LEFT_BYTES: a process left
        behind that keeps writing cannot hold the reader); whether it held a whole line."""
        taken = 0
        while taken < LEFT_BYTES and select.select([self._events], [], [], 0)[0]:
            chunk = os.read(self._events, 65536)
            if not chunk:
                break
            self._buffer += chunk
            taken += len(chunk)
        return b"\n" in self._buffer

    def send(self, command: Any) -> None:
        """One command line: a command of harness/shared/commands.py (its `to_command()`)."""
        if self._commands is None:
            return
        try:
            os.write(self._commands, (json.dumps(command.to_command()) + "\n").encode())
        except OSError:  # the child is gone; its end shows in next_event
            pass

    def finish(self, grace_s: float = EXIT_GRACE_S) -> None:
        """Let the child exit after its last event (for up to `grace_s`; 0: not at all), then kill whatever is left
        of its group."""
        if self._commands is not None:
            os.close(self._commands)
            self._commands = None
        if grace_s > 0:
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("child %s did not exit within %.0f s; killing it", self.process.pid, grace_s)
        self.kill()
        _LIVE.discard(self)
        self.handover.close()
        if self._lend is not None:   # never lent anything (a process started ahead, closed unused)
            self._lend.close()
            self._lend = None
        self._drain.join(timeout=EXIT_GRACE_S)
        self.output.close()
        if self._events is not None:
            os.close(self._events)
            self._events = None

    def leftovers(self) -> list[str]:
        """Processes the child started that are still alive ("pid command"), the child itself excluded."""
        return [f"{pid} {name}" for pid, name in self._processes() if pid != self.process.pid]

    def kill(self) -> None:
        """SIGKILL the cage, the child's process group and every related process (setsid escapees included); a
        stopped process dies of SIGKILL too."""
        if self.cage is not None:
            self.cage.kill()
        for pid, _ in self._processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        _MEMORY.forget(self.process.pid)
        if self.cage is not None:
            self.cage.remove()

    def _wait_exit(self) -> Ended:
        try:
            code = self.process.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.returncode
        self.kill()  # whatever the child left behind in its group
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if code == -signal.SIGKILL and self._oom_kills_at_start is not None \
                    and (oom_kills() or 0) > self._oom_kills_at_start:
                return Ended(False, code, f"killed by SIGKILL {HOST_OOM_NOTE} (the host out of memory?)")
            return Ended(False, code, f"killed by {name}")
        return Ended(False, code, f"exited with code {code}")


def log_tail(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a child's log, stripped ("" when there is none)."""
    try:
        with path.open("rb") as stream:
            stream.seek(max(path.stat().st_size - max_bytes, 0))
            return stream.read().decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class Started:
    """A child run up to its first event: READY's fields, or why there are none (`error`). `child` is still
    running when `keep` was asked and READY came; otherwise it has been finished."""
    child: Child
    ready: Optional[dict]
    error: Optional[str]   # the child's FAILED message, or how it ended (`died`)
    status: Optional[str] = None   # the status its FAILED claimed (None: no FAILED came)

    @property
    def died(self) -> bool:
        """It ended or missed the deadline without reporting (rather than reporting FAILED)."""
        return self.ready is None and self.child.ended is not None


def start_until_ready(module: str, spec, workdir: Path, log_path: Path, timeout_s: float, keep: bool = False,
                      **options) -> Started:
    """Start a child and wait for READY (the oracle, a baseline, a problem check). `keep`: leave it running after
    READY (the oracle serves timing); otherwise, and on any failure, it is finished before this returns.
    `options` go to Child (with_commands, max_log_bytes, env, policy, ...)."""
    child = Child(module, spec, workdir, log_path, with_commands=options.pop("with_commands", keep), **options)
    return wait_until_ready(child, timeout_s, keep)


def wait_until_ready(child: Child, timeout_s: float, keep: bool = False) -> Started:
    """Wait for a started child's READY (see start_until_ready)."""
    try:
        event = child.next_event(timeout_s)
    except BaseException:
        child.finish()
        raise
    if event is not None and event["event"] == protocol.READY:
        if not keep:
            child.finish()
        event.pop("event")
        return Started(child, event, None)
    child.finish()
    reason = str(event.get("error", event["event"])) if event is not None else child.ended.detail
    return Started(child, None, reason, claimed_status(event))


def claimed_status(event: Optional[dict]) -> Optional[str]:
    """The status a child's FAILED event claims for its failure (e.g. JUDGE_SHORT), or None."""
    claimed = event.get("status") if event is not None and event["event"] == protocol.FAILED else None
    return claimed if isinstance(claimed, str) else None


class CappedLog:
    """Writes a child's output to a file, keeping the first and the last `max_bytes / 2` of it."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.head_bytes, self.tail_bytes = path, max_bytes // 2, max_bytes - max_bytes // 2
        self.total = 0
        self._lock = threading.Lock()
        self._file = open(path, "ab")
        self._written = 0
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0

    @property
    def flooded(self) -> bool:
        return self.total > self.head_bytes + self.tail_bytes

    def drain(self, stream) -> None:
        while True:
            chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
            if not chunk:
                return
            with self._lock:
                self._write(chunk)

    def _write(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_bytes - self._written
        if room > 0:
            self._file.write(chunk[:room])
            self._file.flush()
            self._written += min(room, len(chunk))
            chunk = chunk[room:]
        if chunk:
            self._tail.append(chunk)
            self._tail_size += len(chunk)
            while self._tail_size - len(self._tail[0]) >= self.tail_bytes:
                self._tail_size -= len(self._tail.popleft())

    def move_to(self, path: Path) -> None:
        """Go on in `path`, with what was written so far (a process started ahead gets its submission's log)."""
        with self._lock:
            self._file.close()
            shutil.move(self.path, path)
            self.path = path
            self._file = open(path, "ab")

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._file.closed:
            return
        tail = b"".join(self._tail)[-self.tail_bytes:] if self._tail else b""
        cut = self.total - self._written - len(tail)
        if cut > 0:
            self._file.write(f"\n[harness] ... {cut} bytes of output cut ...\n".encode())
        self._file.write(tail)
        self._file.close()


def _process_table() -> dict[int, tuple[int, int, int, str, int]]:
    """pid -> (ppid, process group, session, command name, start time in clock ticks since boot) for every visible
    process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                name, fields = stat
                table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]), name, int(fields[19]))
    return table


def _stat(pid: int) -> Optional[tuple[str, list[str]]]:
    """(command name, the fields after it) of /proc/PID/stat, None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:].split()


def start_ticks(pid: int) -> Optional[int]:
    """A process's start time in clock ticks since boot (/proc/PID/stat), None once it is gone."""
    stat = _stat(pid)
    return int(stat[1][19]) if stat is not None else None


class _Ties:
    """What ties the processes of one table (`_process_table`) together: parents, process groups and sessions."""

    def __init__(self, table: dict[int, tuple[int, int, int, str, int]]):
        self.table = table
        self._children: dict[int, list[int]] = {}
        self._led: dict[int, set[int]] = {}   # a process group's or session's leader -> its members
        for pid, (ppid, group, session, _, _) in table.items():
            self._children.setdefault(ppid, []).append(pid)
            self._led.setdefault(group, set()).add(pid)
            self._led.setdefault(session, set()).add(pid)

    def of(self, root: int) -> set[int]:
        """`root`, its descendants, and the members of the process group and session it leads."""
        found, stack = set(), [root] if root in self.table else []
        while stack:
            pid = stack.pop()
            if pid not in found:
                found.add(pid)
                stack.extend(self._children.get(pid, []))
        return found | self._led.get(root, set())


def _has_mark(pid: int, mark: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{MARK_VARIABLE}={mark}".encode() in f.read()
    except OSError:
        return False


def related_processes(root: int, mark: str, uid: Optional[int] = None, members: Iterable[int] = (),
                      born: Optional[int] = None) -> list[tuple[int, str]]:
    """(pid, name) of `root`, its descendants, its process group and session, processes with its mark (no mark:
    those alone), and those of `uid` (a user of the child's own: what escaped every other tie and cleared its
    environment, sandbox.pick_user) and `members` (its cgroup's). `born`: root's start time (`start_ticks`); the mark
    and the uid are looked for only in processes started since (none older can be the child's: its mark and its uid
    are its own), not in every process of the host."""
    ties = _Ties(_process_table())
    table = ties.table
    found = ties.of(root) | {pid for pid in members if pid in table}
    younger = [pid for pid, row in table.items() if pid not in found and (born is None or row[4] >= born)]
    if uid is not None:
        found |= {pid for pid in younger if _uid_of(pid) == uid}
    if mark:
        found |= {pid for pid in younger if pid != os.getpid() and _has_mark(pid, mark)}
    return [(pid, table[pid][3]) for pid in sorted(found) if table[pid][3] != "" and _alive(pid)]


def _uid_of(pid: int) -> Optional[int]:
    try:
        return sandbox.process_uid(pid)
    except (OSError, ValueError):   # ended meanwhile
        return None


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1][0] != "Z"   # zombies hold no resources


def oom_kills() -> Optional[int]:
    """How many processes the kernel's out-of-memory killer has killed since boot (/proc/vmstat), None where it does
    not say. A child's own memory limit is the watchdog's (it kills with a message of its own); a SIGKILL that nobody
    here sent while this count rose is most likely the host running out of memory (a child with oom_score_adj 1000
    is the kernel's first pick, whoever holds the memory). Its end says so; its status stays the child's: without
    a memory.max of its own the child's use cannot be told from the host's, and a candidate could run the host out
    on purpose."""
    try:
        with open("/proc/vmstat") as stats:
            for line in stats:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def group_rss_bytes(root: int) -> int:
    """Private resident memory of `root`'s process group and descendants: anonymous pages plus shared memory
    (RssAnon + RssShmem), what the processes hold and the machine cannot reclaim. Pages of mapped files (the
    libraries torch loads, some hundred MB per process) are left out: the kernel can drop them, and counting them
    made the limit depend on how much of libtorch happened to be paged in."""
    return groups_rss_bytes([root])[root]


def groups_rss_bytes(roots: Iterable[int]) -> dict[int, int]:
    """group_rss_bytes of each of `roots`, from one pass over /proc (each process's memory read once)."""
    ties = _Ties(_process_table())
    rss: dict[int, int] = {}
    totals = {}
    for root in roots:
        found = ties.of(root)
        for pid in found - rss.keys():
            rss[pid] = _private_rss_bytes(pid)   # 0 for a zombie: it holds no memory
        totals[root] = sum(rss[pid] for pid in found)
    return totals


class _MemoryWatch:
    """The resident memory (group_rss_bytes) of every child with a memory limit, measured for all of them by one
    thread, one pass over /proc every POLL_S; a child's wait for its events reads the last figure. A pass reads
    every process of the host: one per waiting child (dozens of builds in flight, each with its compilers) kept the
    judge's own threads, and with them every reference start and build hand-off, waiting for the interpreter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rss: dict[int, int] = {}   # watched root -> bytes at the last pass (0 before the first)
        self._thread: Optional[threading.Thread] = None
        self._wake = threading.Event()

    def watch(self, root: int) -> None:
        with self._lock:
            self._rss[root] = 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="memory-watch")
                self._thread.start()
        self._wake.set()   # measured at once, not a POLL_S later

    def forget(self, root: int) -> None:
        with self._lock:
            self._rss.pop(root, None)

    def rss_bytes(self, root: int) -> int:
        return self._rss.get(root, 0)

    def _run(self) -> None:
        while True:
            with self._lock:
                roots = list(self._rss)
            if roots:
                measured = groups_rss_bytes(roots)
                with self._lock:
                    for root, value in measured.items():
                        if root in self._rss:   # not forgotten meanwhile
                            self._rss[root] = value
            self._wake.wait(POLL_S)
            self._wake.clear()
            time.sleep(MIN_PASS_GAP_S)   # a burst of children started (a build pool filling) asks for one pass


_MEMORY = _MemoryWatch()


def _private_rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return sum(int(fields[key].split()[0]) for key in ("RssAnon", "RssShmem")) * 1024
    except (OSError, ValueError, KeyError, IndexError):
        return 0
