"""OS-level limits for a child process, applied between fork and exec (parent side: `Popen(preexec_fn=...)`).

Layers, each used only where `capabilities()` found it working on this machine:
  - a user of its own: where the judge is root, the child runs as an unprivileged uid/gid from a reserved range
    (`pick_user`; one no running process has, no /etc/passwd entry, no supplementary groups, no new privileges), so
    file permissions keep it out of the judge's files, the build cache and other candidates' folders, it can signal
    no process but its own, and RLIMIT_NPROC binds it. Where the judge is not root the child keeps the judge's
    user; where the uid cannot reach the interpreter, the import roots or the GPU's device nodes (`user_unavailable`
    says which) it stays root and only the other layers hold;
  - rlimits: no core dumps, CPU seconds, file size, open files, no raised or real-time priority, and (not as root) a
    process count;
  - oom_score_adj 1000, so the kernel's OOM killer takes the child before the judge;
  - a network namespace with only a loopback that is down (as root directly, otherwise inside a user namespace
    that maps the own uid/gid to themselves);
  - Landlock: file writes only beneath `Policy.writable` (and writes to device nodes under /dev), TCP bind/connect
    denied (ABI >= 4), abstract unix sockets and signals scoped to the sandbox (ABI >= 6). Reads and execution
    stay open: the child needs Python, torch, the compilers and the GPU's device nodes;
  - capabilities: those that reach beyond the child's own processes (scheduling priority and affinity of others,
    administration, ptrace, raw I/O, modules, clock) are dropped from its bounding, effective, permitted, inheritable
    and ambient sets, so even as root it cannot raise its priority or pin itself over the process being timed.
What a machine lacks is said by `describe()`, never silently dropped. `JUDGE_SANDBOX=off` turns every layer off;
`JUDGE_CANDIDATE_USER=off` keeps the child as the judge's own user.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import resource
import secrets
import stat
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from harness.shared.paths import IMPORT_ROOT

try:
    import _imp  # CPython's import lock; without it the fork guard below holds nothing
except ImportError:   # pragma: no cover - other interpreters
    _imp = None

DISABLE_VARIABLE = "JUDGE_SANDBOX"  # JUDGE_SANDBOX=off: children run without any of these layers
USER_VARIABLE = "JUDGE_CANDIDATE_USER"   # JUDGE_CANDIDATE_USER=off: a root judge's children stay root
# Candidates' uids and gids (uid == gid): a range no distribution or container runtime hands out by default (those
# stay below 2^31 - 1 but use 0-65535, 100000+ in blocks of 65536, or LXD's 1000000+ block of a billion, which this
# range lies inside only on a host that maps a whole billion to one container).
UID_BASE = 2_000_000_000
UID_COUNT = 1_000_000
OOM_SCORE_ADJ = b"1000"

# Landlock (include/uapi/linux/landlock.h); syscall numbers are those of x86_64.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE = 1 << 1
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13      # ABI 2
FS_TRUNCATE = 1 << 14   # ABI 3
NET_BIND_TCP = 1 << 0   # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SYS_CAPGET = 125
SYS_CAPSET = 126
CAPABILITY_VERSION_3 = 0x20080522
# Dropped capabilities (include/uapi/linux/capability.h): what lets root act on the machine rather than on itself.
DROPPED_CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_PTRACE": 19,
                        "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23, "CAP_SYS_RESOURCE": 24,
                        "CAP_SYS_TIME": 25, "CAP_MKNOD": 27, "CAP_AUDIT_CONTROL": 30, "CAP_MAC_OVERRIDE": 32,
                        "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36,
                        "CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_SETPCAP": 8}   # CAP_SETPCAP last: it allows the rest
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
DEVICES = "/dev"  # GPU device nodes and /dev/null are opened for writing: write_file and truncate only
OWN_PROC = "/proc/self"

# Exit-status bits of the probe child (see _probe_in_child).
_PROBE_NETNS = 1 << 0
_PROBE_NETNS_USERNS = 1 << 1
_PROBE_OOM = 1 << 2
_PROBE_CAPS = 1 << 3
_PROBE_ABI_SHIFT = 4   # bits 4..7: the Landlock ABI that the probe child applied (0: none)


@dataclass(frozen=True)
class Limits:
    cpu_s: int            # RLIMIT_CPU (soft = hard): CPU seconds of the child itself, all its threads together
    file_bytes: int       # RLIMIT_FSIZE: largest file the child may write (its log included)
    extra_processes: int  # RLIMIT_NPROC = tasks (threads count) this uid already has + this; not enforced for root
    open_files: int       # RLIMIT_NOFILE


@dataclass(frozen=True)
class Policy:
    writable: tuple[str, ...]   # existing directories the child may create, modify and delete files beneath
    limits: Limits
    block_network: bool = True


@dataclass(frozen=True)
class User:
    """The unprivileged user a sandboxed child runs as (its gid equals its uid; no supplementary groups)."""
    uid: int
    gid: int

    def describe(self) -> str:
        return f"uid {self.uid} gid {self.gid} (unprivileged, its own)"


@dataclass(frozen=True)
class Capabilities:
    """What a throwaway child managed to apply on this machine, as this user."""
    landlock_abi: int       # 0: no Landlock (kernel, LSM list or a seccomp filter)
    netns: bool             # a network namespace could be created
    netns_via_userns: bool  # ... only inside a new user namespace (not root, or root without CAP_SYS_ADMIN)
    oom_adjustable: bool    # /proc/self/oom_score_adj could be written
    is_root: bool
    caps_droppable: bool = False   # DROPPED_CAPABILITIES could be dropped (or were never held)


@dataclass(frozen=True)
class _Libc:
    """libc entry points, resolved in the parent: dlsym between fork and exec could wait on a lock held by
    another thread of the parent at fork time."""
    syscall: Callable
    prctl: Callable
    unshare: Callable


def _libc() -> _Libc:
    library = ctypes.CDLL(None, use_errno=True)
    return _Libc(library.syscall, library.prctl, library.unshare)


class _RulesetAttr(ctypes.Structure):
    # Always passed whole: an older kernel accepts the larger struct as long as the fields it lacks are zero.
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class _Plan:
    """Everything the child applies, computed in the parent so the child only makes system calls."""
    rlimits: tuple[tuple[int, int], ...]
    oom: bool
    netns_flags: int                 # 0, CLONE_NEWNET, or CLONE_NEWUSER | CLONE_NEWNET
    id_maps: tuple[tuple[str, bytes], ...]
    landlock: Optional[tuple[_RulesetAttr, tuple[tuple[bytes, int], ...]]]
    drop_caps: bool = False


def sandbox_disabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "").strip().lower() == "off"


_GUARD = threading.local()   # this thread's fork_guard: held (the import lock) and when its fork was done


@contextlib.contextmanager
def fork_guard() -> Iterator[None]:
    """Hold the interpreter's import lock around one fork that runs Python in the child (os.fork, a Popen with
    preexec_fn) from a process with other threads. Such a fork takes logging's lock (logging's at-fork hook) and
    then the import lock; a thread importing under the import lock (a meta-path finder that imports, as setuptools'
    distutils shim does when torch.utils.cpp_extension is first imported) that logs meanwhile waits for logging's
    lock: neither goes on, ever. Taken here first, the import lock comes before logging's in every thread.
    It is given back as soon as the fork is done (`_forked`), not when the block ends: the child has its own copy of
    every lock by then, and its preexec and exec (a cgroup join, a network namespace: tens of milliseconds on a busy
    host) no longer hold up other threads' starts. `forked_at()` says when that was."""
    _GUARD.forked_at = None
    if _imp is None:
        yield
        return
    _imp.acquire_lock()
    _GUARD.held = True
    try:
        yield
    finally:
        if getattr(_GUARD, "held", False):   # no fork happened in the block
            _GUARD.held = False
            _imp.release_lock()


def _forked() -> None:
    """os.register_at_fork's after_in_parent: the forking thread, once its fork is done."""
    if getattr(_GUARD, "held", False):
        _GUARD.held = False
        _GUARD.forked_at = time.perf_counter()
        _imp.release_lock()


def forked_at() -> Optional[float]:
    """time.perf_counter() when this thread's last fork_guard gave the lock back after its fork (None: no fork)."""
    return getattr(_GUARD, "forked_at", None)


if _imp is not None:
    os.register_at_fork(after_in_parent=_forked)


@functools.lru_cache(maxsize=None)
def capabilities() -> Capabilities:
    """Probe once per process by forking a child that tries every layer; any failure reads as 'not available'."""
    is_root = os.geteuid() == 0
    try:
        with fork_guard():
            pid = os.fork()
    except OSError:
        return Capabilities(0, False, False, False, is_root)
    if pid == 0:
        status = 0
        try:
            status = _probe_in_child(is_root)
        finally:
            os._exit(status)
    try:
        _, wait_status = os.waitpid(pid, 0)
    except OSError:
        return Capabilities(0, False, False, False, is_root)
    bits = os.waitstatus_to_exitcode(wait_status)
    if bits < 0:  # killed by a signal (a seccomp filter that kills, say): trust nothing
        bits = 0
    return Capabilities(landlock_abi=bits >> _PROBE_ABI_SHIFT,
                        netns=bool(bits & (_PROBE_NETNS | _PROBE_NETNS_USERNS)),
                        netns_via_userns=bool(bits & _PROBE_NETNS_USERNS),
                        oom_adjustable=bool(bits & _PROBE_OOM), is_root=is_root,
                        caps_droppable=bool(bits & _PROBE_CAPS))


def _probe_in_child(is_root: bool) -> int:
    """Runs in the forked probe child, in the order preexec uses; returns the exit-status bits."""
    libc = _libc()
    bits = 0
    try:
        _write_proc("/proc/self/oom_score_adj", OOM_SCORE_ADJ)
        bits |= _PROBE_OOM
    except OSError:
        pass
    attempts = [(CLONE_NEWNET, _PROBE_NETNS)] if is_root else []
    attempts.append((CLONE_NEWUSER | CLONE_NEWNET, _PROBE_NETNS_USERNS))
    for flags, bit in attempts:
        try:
            _enter_netns(libc, flags, _id_maps(flags))
        except OSError:
            continue
        bits |= bit
        break
    try:
        abi = min(_landlock_abi(libc), 15)
        if abi > 0:
            _restrict(libc, _landlock_rules(abi, ("/",), True))
            bits |= abi << _PROBE_ABI_SHIFT
    except OSError:
        pass
    try:
        _drop_capabilities(libc)
        bits |= _PROBE_CAPS
    except OSError:
        pass
    return bits


@functools.lru_cache(maxsize=None)
def user_unavailable() -> Optional[str]:
    """None when sandboxed children can run as a user of their own here; else why not (they keep the judge's user).
    Probed once per process: a forked child takes the first uid of the range and checks that it can reach what
    every candidate needs (the interpreter, the standard library, site-packages and headers, torch, the harness, the
    GPU's device nodes); a machine whose interpreter lies in a folder only root may enter (/root) cannot."""
    if sandbox_disabled():
        return f"sandbox disabled by {DISABLE_VARIABLE}=off"
    if os.environ.get(USER_VARIABLE, "").strip().lower() == "off":
        return f"disabled by {USER_VARIABLE}=off"
    if os.geteuid() != 0:
        return "the judge is not root: the child runs as the judge's user"
    if capabilities().netns_via_userns:   # its user namespace maps root alone: no other uid exists inside it
        return "root without CAP_SYS_ADMIN: the network namespace needs a user namespace that maps only root"
    needed = _needed_paths()
    read, write = os.pipe()
    try:
        with fork_guard():
            pid = os.fork()
    except OSError as exc:
        os.close(read)
        os.close(write)
        return f"cannot fork the probe ({exc.strerror})"
    if pid == 0:
        try:
            os.close(read)
            os.write(write, _probe_user(User(UID_BASE, UID_BASE), needed).encode()[:2000])
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        why = pipe.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return why or None


def _needed_paths() -> tuple[tuple[str, int], ...]:
    """(path, access) that a candidate's process must have: what it executes, imports, compiles against, opens."""
    folders = {os.path.dirname(os.path.realpath(sys.executable))}
    folders |= {path for name, path in sysconfig.get_paths().items()
                if name in ("stdlib", "platstdlib", "purelib", "platlib", "include")}
    folders.add(str(IMPORT_ROOT / "harness"))
    torch = importlib.util.find_spec("torch")
    if torch is not None and torch.origin:
        folders.add(os.path.dirname(torch.origin))
    needed = [(os.path.realpath(sys.executable), os.X_OK)]
    needed += [(folder, os.R_OK | os.X_OK) for folder in sorted(folders) if os.path.isdir(folder)]
    # the children's folders are made in the temporary folder: a TMPDIR only root may enter (0700) shuts them out
    needed.append((os.path.realpath(tempfile.gettempdir()), os.X_OK))
    try:   # the GPU's device nodes (usually world read-write; where not, only root could use the GPU)
        nodes = sorted(entry.path for entry in os.scandir("/dev") if entry.name.startswith("nvidia")
                       and stat.S_ISCHR(os.stat(entry.path).st_mode))
    except OSError:
        nodes = []
    needed += [(node, os.R_OK | os.W_OK) for node in nodes]
    return tuple(needed)


def _probe_user(user: User, needed: tuple[tuple[str, int], ...]) -> str:
    """In the forked probe: become `user`, then say what it cannot reach ("" when nothing)."""
    try:
        become(user)
    except OSError as exc:
        return f"cannot switch to uid {user.uid} ({exc.strerror}: not mapped in this user namespace?)"
    for path, access in needed:
        if not os.access(path, access):
            return f"an unprivileged uid cannot reach {path}"
    return ""


def become(user: User) -> None:
    """Drop to `user` for good: no supplementary groups, then gid, then uid (real, effective and saved). Leaving
    uid 0 also clears every capability the process held."""
    os.setgroups([])
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)


_USERS_LOCK = threading.Lock()
_USER_OFFSET = [secrets.randbelow(UID_COUNT)]   # where this process starts: concurrent judges rarely meet


def pick_user() -> Optional[User]:
    """A user of the range that no running process has (one per child: what another child left, or another judge's
    child, is not its), or None where user_unavailable() says why not."""
    if user_unavailable() is not None:
        return None
    taken = _running_uids()
    with _USERS_LOCK:
        for _ in range(UID_COUNT):
            uid = UID_BASE + _USER_OFFSET[0] % UID_COUNT
            _USER_OFFSET[0] += 1
            if uid not in taken:
                return User(uid, uid)
    return None


def _running_uids() -> set[int]:
    """The uids of running processes. A process's /proc folder is its uid's (no new privileges: its uids are
    one), or, on some kernels, root's while it is not dumpable: only those root's are read for their real uid."""
    uids = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                owner = entry.stat().st_uid
                uids.add(owner if owner != 0 else process_uid(int(entry.name)))
            except (OSError, ValueError):
                continue
    return uids


def process_uid(pid: int) -> int:
    """The real uid of a process (the owner of its /proc files is root while it is not dumpable)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise ValueError(f"no Uid line for {pid}")


def preexec(policy: Policy, user: Optional[User] = None) -> Callable[[], None]:
    """The function for Popen(preexec_fn=...): applies the layers capabilities() found working, nothing else, and
    last runs the child as `user` (pick_user) where one is given."""
    if sandbox_disabled():
        return _nothing
    for path in policy.writable:
        if not os.path.isdir(path):  # the child would fail to open it for its Landlock rule
            raise ValueError(f"writable directory {path!r} does not exist")
    plan = _plan(policy, capabilities(), user)
    libc = _libc() if plan.netns_flags or plan.landlock or plan.drop_caps or user else None

    def apply() -> None:  # between fork and exec: system calls only
        if plan.oom:
            _write_proc("/proc/self/oom_score_adj", OOM_SCORE_ADJ)
        if plan.netns_flags:
            _enter_netns(libc, plan.netns_flags, plan.id_maps)
        if plan.landlock is not None:
            _restrict(libc, plan.landlock)
        if plan.drop_caps:
            _drop_capabilities(libc)
        if user is not None:   # after what needs root (the namespace, the bounding set); setuid binaries give nothing
            _check(libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0),
                              ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl(PR_SET_NO_NEW_PRIVS)")
            become(user)
        # Last: this runs before Popen closes the parent's descriptors, so the lowest free one can lie beyond
        # RLIMIT_NOFILE, and every open above would fail once the limits are set (lowering needs no capability).
        for which, value in plan.rlimits:
            resource.setrlimit(which, (value, value))

    return apply


def describe(policy: Policy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(layers applied, one line each), (what is missing on this machine and what that leaves open)."""
    if sandbox_disabled():
        return (), (f"sandbox disabled by {DISABLE_VARIABLE}=off",)
    caps = capabilities()
    limits = policy.limits
    own_user = caps.is_root and user_unavailable() is None
    applied = [f"rlimits: cpu {limits.cpu_s} s, files up to {limits.file_bytes / 2**20:g} MiB, "
               f"{limits.open_files} open files"
               + ("" if caps.is_root and not own_user else f", {limits.extra_processes} more processes")]
    warnings = []
    if own_user:
        applied.append("an unprivileged uid of its own: the judge's files, the build cache and other candidates' "
                       "folders out of reach by permission, no signals to other users' processes")
    elif caps.is_root:
        warnings.append(f"root ({user_unavailable()}): RLIMIT_NPROC is not enforced (a cgroup's pids.max caps "
                        "processes where one could be made, see the record's isolation field) and file permissions "
                        "do not keep it from the judge's files")
    if caps.caps_droppable:
        applied.append("no priority raise, real-time class or capabilities over other processes (CAP_SYS_NICE, "
                       "CAP_SYS_ADMIN, CAP_SYS_PTRACE and others dropped)")
    elif caps.is_root:
        warnings.append("capabilities could not be dropped: as root the child may raise its priority")
    if caps.oom_adjustable:
        applied.append("oom_score_adj 1000")
    else:
        warnings.append("oom_score_adj not writable: the OOM killer may pick the judge instead of the child")
    abi = caps.landlock_abi
    netns = policy.block_network and caps.netns
    if netns:
        applied.append("netns (in a user namespace)" if caps.netns_via_userns else "netns")
    if abi:
        count = len(policy.writable)
        parts = [f"landlock-abi{abi}: writes only in {count} dir{'' if count == 1 else 's'}"]
        if policy.block_network and abi >= 4:
            parts.append("TCP denied")
        if abi >= 6:
            parts.append("abstract unix sockets and signals scoped")
        applied.append(", ".join(parts))
        if abi < 3:
            warnings.append(f"Landlock ABI {abi} < 3: truncating files outside the writable dirs is not blocked")
        if abi < 6 and not own_user:
            warnings.append(f"Landlock ABI {abi} < 6: the child can signal processes of its uid outside the sandbox")
    else:
        warnings.append("no Landlock: file writes outside the writable dirs are not blocked by the kernel")
    if policy.block_network and not netns:
        if abi >= 4:
            warnings.append("no network namespace: UDP/raw sockets are not blocked")
        else:
            warnings.append("no network namespace and no Landlock ABI >= 4: the network is not blocked")
    return tuple(applied), tuple(warnings)


def _nothing() -> None:
    pass


def _plan(policy: Policy, caps: Capabilities, user: Optional[User] = None) -> _Plan:
    limits = policy.limits
    wanted = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, limits.cpu_s),
              (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_NOFILE, limits.open_files),
              (resource.RLIMIT_NICE, 0), (resource.RLIMIT_RTPRIO, 0)]   # root ignores these without CAP_SYS_NICE
    if user is not None:   # a uid of its own: the count is this child's alone
        wanted.append((resource.RLIMIT_NPROC, _tasks_of_uid(user.uid) + limits.extra_processes))
    elif not caps.is_root:
        wanted.append((resource.RLIMIT_NPROC, _tasks_of_uid(os.getuid()) + limits.extra_processes))
    # Never above the current hard limit: raising it needs privileges, and the child must not fail halfway.
    rlimits = tuple((which, _clamp(value, resource.getrlimit(which)[1])) for which, value in wanted)
    netns_flags = 0
    if policy.block_network and caps.netns:
        netns_flags = CLONE_NEWUSER | CLONE_NEWNET if caps.netns_via_userns else CLONE_NEWNET
    landlock = None
    if caps.landlock_abi:
        landlock = _landlock_rules(caps.landlock_abi, policy.writable, policy.block_network)
    return _Plan(rlimits, caps.oom_adjustable, netns_flags, _id_maps(netns_flags), landlock, caps.caps_droppable)


def _clamp(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _tasks_of_uid(uid: int) -> int:
    """Tasks (threads) whose real uid is `uid`, as far as this /proc shows them: RLIMIT_NPROC counts those."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # a process's /proc folder is its uid's, or (some kernels) root's while it is not dumpable
            if entry.stat().st_uid not in (uid, 0):
                continue
            with open(f"/proc/{entry.name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError):  # the process ended meanwhile
            continue
    return count


def _id_maps(netns_flags: int) -> tuple[tuple[str, bytes], ...]:
    if not netns_flags & CLONE_NEWUSER:
        return ()
    uid, gid = os.getuid(), os.getgid()
    return (("/proc/self/setgroups", b"deny"), ("/proc/self/uid_map", f"{uid} {uid} 1".encode()),
            ("/proc/self/gid_map", f"{gid} {gid} 1".encode()))


def _landlock_rules(abi: int, writable: tuple[str, ...], block_network: bool):
    """The ruleset attribute and (directory, allowed accesses) rules for this ABI."""
    writes = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR | FS_MAKE_REG
              | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)
    device_writes = FS_WRITE_FILE
    if abi >= 2:
        writes |= FS_REFER
    if abi >= 3:
        writes |= FS_TRUNCATE
        device_writes |= FS_TRUNCATE
    attr = _RulesetAttr(handled_access_fs=writes)
    if abi >= 4 and block_network:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP  # handled with no rule: every port denied
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    # Absolute: the child opens them after changing into its working directory.
    rules = tuple((os.fsencode(os.path.abspath(path)), writes) for path in writable)
    rules += ((os.fsencode(DEVICES), device_writes),)
    # The CUDA driver writes to the process's own /proc entries while it initialises (without this,
    # cudaGetDeviceCount fails with "OS call failed"). Opened in the child, /proc/self is its own.
    rules += ((os.fsencode(OWN_PROC), device_writes),)
    return attr, rules


def _landlock_abi(libc: _Libc) -> int:
    abi = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_long(0),
                       ctypes.c_long(LANDLOCK_CREATE_RULESET_VERSION))
    return max(abi, 0)


def _restrict(libc: _Libc, landlock) -> None:
    """No new privileges, then the Landlock ruleset for this process and everything it starts."""
    attr, rules = landlock
    _check(libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)), "prctl(PR_SET_NO_NEW_PRIVS)")
    ruleset = _check(libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                                  ctypes.c_long(ctypes.sizeof(attr)), ctypes.c_long(0)), "landlock_create_ruleset")
    try:
        for path, allowed in rules:
            directory = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneathAttr(allowed_access=allowed, parent_fd=directory)
                _check(libc.syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_long(ruleset),
                                    ctypes.c_long(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                                    ctypes.c_long(0)), "landlock_add_rule")
            finally:
                os.close(directory)
        _check(libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_long(ruleset), ctypes.c_long(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _drop_capabilities(libc: _Libc) -> None:
    """DROPPED_CAPABILITIES out of the bounding set (so exec cannot give them back, even to root), then out of the
    effective, permitted and inheritable sets, and the ambient set cleared. A capability this kernel does not know
    (EINVAL) is not held anyway; without CAP_SETPCAP the bounding set cannot shrink, which is fine only when the
    process holds none of them (an ordinary user)."""
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.syscall(ctypes.c_long(SYS_CAPGET), ctypes.byref(header), ctypes.byref(data)), "capget")
    held = any(data[cap // 32].permitted & (1 << cap % 32) for cap in DROPPED_CAPABILITIES.values())
    for cap in DROPPED_CAPABILITIES.values():
        if libc.prctl(ctypes.c_int(PR_CAPBSET_DROP), ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) < 0:
            errno = ctypes.get_errno()
            if errno == 22:   # EINVAL: unknown to this kernel
                continue
            if held:
                raise OSError(errno, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(errno)}")
    for cap in DROPPED_CAPABILITIES.values():
        word, bit = cap // 32, 1 << cap % 32
        data[word].effective &= ~bit
        data[word].permitted &= ~bit
        data[word].inheritable &= ~bit
    _check(libc.syscall(ctypes.c_long(SYS_CAPSET), ctypes.byref(header), ctypes.byref(data)), "capset")
    libc.prctl(ctypes.c_int(PR_CAP_AMBIENT), ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), ctypes.c_ulong(0),
               ctypes.c_ulong(0), ctypes.c_ulong(0))


def _enter_netns(libc: _Libc, flags: int, id_maps: tuple[tuple[str, bytes], ...]) -> None:
    _check(libc.unshare(ctypes.c_int(flags)), "unshare")
    for path, content in id_maps:
        _write_proc(path, content)


def _write_proc(path: str, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result
