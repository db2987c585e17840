"""In-process audit hook for the candidate's child (the `unsafe_` side): a tripwire that refuses and reports.

Installed once, after torch and CUDA are initialised and before the submission executes; an audit hook cannot be
removed. It refuses, with PermissionError, and reports:
  - sockets and name lookups, always;
  - process creation, unless an extension build is under way (`build_active()`: the builder runs ninja and the
    compilers) or the code asking is the submission's backend's own toolchain (`toolchains`: the folders of its
    packages, harness/shared/backends; Triton starts ptxas, the C compiler of its launcher and ldconfig when a kernel is
    first called): the first caller outside the standard library must lie in one of them, so a submission that
    calls subprocess itself, even through a name a toolchain module imported, is still refused;
  - ctypes (loading libraries, resolving symbols, raw memory) called by submission code outside a build (torch
    loads NVML through ctypes on the submission's behalf: the ctypes package is looked through to its caller);
  - the garbage collector's object lists and every thread's frames (gc.get_objects / get_referrers /
    get_referents, sys._current_frames), while submission code is anywhere on the calling stack;
  - frames and tracing (sys._getframe, a traceback's tb_frame, sys.settrace, ...), opening an inherited file
    descriptor, and changing the special attributes that Python audits (`__code__`, `__defaults__`, a class's
    `__name__` / `__bases__`, an object's `__class__`, ...) of torch, harness, time, sys, os or builtins objects,
    when submission code is what receives the result (the stdlib and torch use these on its behalf);
  - writing, creating, deleting, renaming, chmod/chown/utime/truncate of paths outside the writable directories
    (/dev/null allowed), whoever asks;
  - adding an audit hook, while submission code is anywhere on the calling stack (a hook added after this one would
    see, and could change, what this one answers on INTEGRITY_EVENT).
Code the submission compiles (exec, compile, code.replace) counts as the submission's, whatever filename it claims.

The hook also answers INTEGRITY_EVENT (`sys.audit(INTEGRITY_EVENT, None or a list)`) with the sealed integrity
snapshot it was given (harness/children/candidate/watch.py `sealed`): the snapshot lives in this hook's closure,
which no Python object the submission can reach refers to (gc's object lists are refused above).

Limits. Python audits neither plain attribute assignment (`torch.allclose = f`, `time.perf_counter = f`,
`Cls.method = f`) nor os.write on an inherited descriptor nor calls through ctypes function pointers obtained earlier,
and native code (every extension the submission builds) is not seen at all. The hook therefore keeps all its state
in closure cells, never in this module's globals or a class a submission could rebind, and calls only functions
captured at install time. It raises the cost of cheating in Python; the kernel layers (harness.isolation.sandbox)
are the boundary.
"""
from __future__ import annotations

import builtins
import inspect
import logging
import os
import sys
import threading
import traceback
import types
from typing import Callable, Optional, Sequence

MAX_REPORTS = 50
DETAIL_CHARS = 160
DEV_NULL = "/dev/null"

NETWORK = frozenset({"socket.__new__", "socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg",
                     "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"})
PROCESSES = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                       "os.forkpty", "pty.spawn"})
CTYPES = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function",
                    "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at", "ctypes.cdata",
                    "ctypes.cdata/buffer", "ctypes.PyObj_FromPtr"})
# Whole-process views: refused while submission code is anywhere on the calling stack.
GLOBAL_INTROSPECTION = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                                  "sys._current_exceptions"})
HOOKS = frozenset({"sys.addaudithook"})   # refused while submission code is anywhere on the calling stack
# The event the candidate's process raises to reach the sealed integrity snapshot (harness/children/candidate/main.py
# remember, report): its argument is None (remember what differs now) or a list (append what was seen).
INTEGRITY_EVENT = "harness.integrity"
# Refused when submission code receives the result: the stdlib and torch call these on its behalf all the time
# (namedtuple, typing and enum read the caller's module from sys._getframe(1); traceback formatting reads tb_frame).
FRAME_INTROSPECTION = frozenset({"sys._getframe", "sys.settrace", "sys.setprofile"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})  # of "object.__getattr__" events
SPECIAL_ATTRIBUTES = frozenset({"object.__setattr__", "object.__delattr__"})
CODE_CREATION = frozenset({"compile", "code.__new__"})
# Path arguments of the file events: (index of the path, index of its dir_fd or None, follow a final symlink).
PATH_EVENTS = {
    "os.remove": ((0, 1, False),), "os.rmdir": ((0, 1, False),), "os.mkdir": ((0, 2, False),),
    "os.rename": ((0, 2, False), (1, 3, False)), "os.link": ((0, 2, False), (1, 3, False)),
    "os.symlink": ((1, 2, False),), "os.chmod": ((0, 2, True),), "os.chown": ((0, 3, True),),
    "os.utime": ((0, 3, True),), "os.truncate": ((0, None, True),), "os.setxattr": ((0, None, True),),
    "os.removexattr": ((0, None, True),),
}
WATCHED = (NETWORK | PROCESSES | CTYPES | GLOBAL_INTROSPECTION | FRAME_INTROSPECTION | SPECIAL_ATTRIBUTES
           | CODE_CREATION | HOOKS | {"open", "object.__getattr__", INTEGRITY_EVENT} | frozenset(PATH_EVENTS))
OPEN_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PROTECTED_MODULES = frozenset({"torch", "time", "builtins", "harness", "sys", "os", "__main__"})
CTYPES_DIR = os.path.dirname(os.__file__) + "/ctypes/"   # the ctypes package: forwards to its caller
STDLIB_DIR = os.path.dirname(os.__file__) + "/"   # subprocess, os, shutil: they start processes for their caller
# Helpers that hand the frame (or file) they obtain to their caller: the caller is the one that receives it.
FORWARDERS = frozenset(function.__code__ for function in (
    inspect.currentframe, inspect.stack, inspect.trace, inspect.getouterframes, inspect.getinnerframes,
    traceback.walk_stack, traceback.walk_tb, logging.currentframe, os.fdopen))


def install(report: Callable[[str, str], None], submission_file: str, writable: Sequence[str],
            build_active: Callable[[], bool], toolchains: Sequence[str] = (),
            integrity: Optional[Callable[[Optional[list]], None]] = None) -> None:
    """Install the hook for the rest of this process's life. `report(event, detail)` is called for each refusal,
    at most MAX_REPORTS times; `submission_file` is the submission's file (any spelling of its path); `toolchains`:
    folders whose code may start processes (the backend's compilers); `integrity`: the sealed snapshot that
    INTEGRITY_EVENT reaches, held by nothing else."""
    sys.addaudithook(_make_hook(report, submission_file, writable, build_active, toolchains, integrity))


def _make_hook(report: Callable[[str, str], None], submission_file: str, writable: Sequence[str],
               build_active: Callable[[], bool], toolchains: Sequence[str] = (),
               integrity: Optional[Callable[[Optional[list]], None]] = None) -> Callable[[str, tuple], None]:
    # Everything the hook touches is bound here: names looked up at call time (this module's globals, builtins,
    # os.path) could be rebound by the submission without any audit event.
    getframe, readlink, getcwd, os_open, os_close = sys._getframe, os.readlink, os.getcwd, os.open, os.close
    isinstance_, type_, getattr_, repr_ = builtins.isinstance, builtins.type, builtins.getattr, builtins.repr
    int_, str_, bytes_, sequences = builtins.int, builtins.str, builtins.bytes, (builtins.tuple, builtins.list)
    len_ = builtins.len
    refused = builtins.PermissionError
    module_type = types.ModuleType
    named_types = (builtins.type, types.FunctionType, types.BuiltinFunctionType)
    plain_types = (str_, bytes_, int_, builtins.float, builtins.bool, builtins.type(None))
    watched, network, processes, ctypes_events = WATCHED, NETWORK, PROCESSES, CTYPES
    global_introspection, frame_attributes, special_attributes = GLOBAL_INTROSPECTION, FRAME_ATTRIBUTES, \
        SPECIAL_ATTRIBUTES
    code_creation, path_events, open_writes = CODE_CREATION, dict(PATH_EVENTS), OPEN_WRITES
    hooks, integrity_event = HOOKS, INTEGRITY_EVENT
    protected, forwarders, own_file = PROTECTED_MODULES, FORWARDERS, _make_hook.__code__.co_filename
    max_reports, detail_chars, dev_null = MAX_REPORTS, DETAIL_CHARS, DEV_NULL
    ctypes_dir, stdlib_dir = CTYPES_DIR, STDLIB_DIR
    toolchain_dirs = tuple(folder.rstrip("/") + "/" for folder in toolchains)
    o_path = os.O_PATH | os.O_CLOEXEC
    local = threading.local()   # .walking: inside our own stack walk; .reporting: inside report()
    reports = [0]

    def real_path(path: str) -> Optional[str]:
        """Where the kernel resolves an existing path to (symlinks followed), or None."""
        try:
            fd = os_open(path, o_path)
        except (OSError, ValueError):
            return None
        try:
            return readlink(f"/proc/self/fd/{fd}")
        finally:
            os_close(fd)

    def resolve(path, dir_fd, follow: bool) -> Optional[str]:
        """The absolute path an operation acts on; follow=False: the final component itself, not its target."""
        try:
            if type_(path) is int_:  # ftruncate, fchmod, ...: the file the descriptor is open on
                return readlink(f"/proc/self/fd/{path}")
            if type_(path) is bytes_:
                path = path.decode("utf-8", "surrogateescape")
            if type_(path) is not str_:
                return None
            if not path.startswith("/"):
                base = readlink(f"/proc/self/fd/{dir_fd}") if type_(dir_fd) is int_ and dir_fd >= 0 else getcwd()
                path = base + "/" + path
            if follow:
                real = real_path(path)
                if real is not None:
                    return real
                try:
                    readlink(path)
                    return None  # a dangling symlink: the file would be created wherever it points
                except OSError:
                    pass
            head, _, tail = path.rstrip("/").rpartition("/")
            parent = real_path(head or "/")
            if parent is None or tail in ("", ".", ".."):
                return None
            return parent.rstrip("/") + "/" + tail
        except (OSError, ValueError):
            return None

    untrusted = {submission_file}
    real = real_path(submission_file)
    if real is not None:
        untrusted.add(real)
    verdicts: dict = {}  # co_filename -> whether its frames are the submission's, each filename resolved once
    roots = tuple(real_path(path) or path.rstrip("/") for path in writable)

    def is_untrusted(filename) -> bool:
        verdict = verdicts.get(filename)
        if verdict is None:
            verdict = filename in untrusted or (type_(filename) is str_ and filename.startswith("/")
                                                and real_path(filename) in untrusted)
            verdicts[filename] = verdict
        return verdict

    def submission_code(anywhere: bool) -> bool:
        """Whether submission code is anywhere on the calling stack, or (anywhere=False) is the code that
        receives the result: the first caller below this hook that is not a forwarding helper."""
        local.walking = True
        try:
            frame = getframe(1)
            while frame is not None:
                code = frame.f_code
                if is_untrusted(code.co_filename):
                    return True
                if (not anywhere and code.co_filename != own_file and code not in forwarders
                        and not code.co_filename.startswith(ctypes_dir)):
                    return False
                frame = frame.f_back
            return False
        finally:
            local.walking = False

    def first_caller() -> Optional[str]:
        """The file of the first caller below this hook outside the standard library (installed packages aside);
        None when that is the submission's code or there is none."""
        local.walking = True
        try:
            frame = getframe(1)
            while frame is not None:
                filename = frame.f_code.co_filename
                if is_untrusted(filename):
                    return None
                if filename != own_file and not (type_(filename) is str_ and filename.startswith(stdlib_dir)
                                                  and "-packages/" not in filename):
                    return filename if type_(filename) is str_ else None
                frame = frame.f_back
            return None
        finally:
            local.walking = False

    def toolchain_asks(caller: Optional[str]) -> bool:
        """The first caller is code of the backend's toolchain (and no submission code comes before it)."""
        return caller is not None and len(toolchain_dirs) > 0 and caller.startswith(toolchain_dirs)

    def where(caller: Optional[str]) -> str:
        """For the evidence: who asked, as the installed package's path (the submission: 'the submission')."""
        if caller is None:
            return "the submission"
        return caller.rsplit("-packages/", 1)[-1][:detail_chars]

    def outside_writable(path, dir_fd, follow: bool) -> Optional[str]:
        resolved = resolve(path, dir_fd, follow)
        if resolved is None:
            return f"write to a path that cannot be resolved: {brief(path)}"
        if resolved == dev_null:
            return None
        for root in roots:
            if resolved == root or resolved.startswith(root + "/"):
                return None
        return f"write outside the writable directories: {resolved[:detail_chars]}"

    def owner_module(obj) -> str:
        """The module a module, class or function belongs to (for any other object: its class's module)."""
        if isinstance_(obj, module_type):
            name = getattr_(obj, "__name__", "")
        elif isinstance_(obj, named_types):
            name = getattr_(obj, "__module__", "")
        else:
            name = getattr_(type_(obj), "__module__", "")
        return name if type_(name) is str_ else ""

    def brief(value) -> str:
        """A short description that never calls the submission's __repr__."""
        if type_(value) in sequences:
            text = "(" + ", ".join([brief(item) for item in value]) + ")"
        elif type_(value) in plain_types:
            text = repr_(value)
        else:
            text = f"<{type_(value).__name__}>"
        return text[:detail_chars]

    def refusal(event: str, args: tuple) -> Optional[str]:
        """Why this event is refused, or None to allow it."""
        if event in network:
            return f"network: {brief(args)}"
        if event in processes:
            if build_active():
                return None
            caller = first_caller()
            if toolchain_asks(caller):
                return None
            return f"process creation outside an extension build (from {where(caller)}): {brief(args[:2])}"
        if event in ctypes_events:
            # torch itself loads NVML through ctypes when submission code calls into torch.cuda: only the
            # submission's own ctypes use (looking through the ctypes package) is refused
            if build_active() or not submission_code(False):
                return None
            return f"ctypes from submission code: {brief(args[:2])}"
        if event == "open":
            path, _, flags = args
            if type_(path) is int_:
                return f"opening inherited file descriptor {path}" if submission_code(False) else None
            if not flags & open_writes:
                return None
            return outside_writable(path, None, True)
        if event in path_events:
            for index, dir_index, follow in path_events[event]:
                detail = outside_writable(args[index], None if dir_index is None else args[dir_index], follow)
                if detail is not None:
                    return detail
            return None
        if event in code_creation:
            filename = args[1]
            if type_(filename) is str_ and submission_code(False):
                untrusted.add(filename)
                verdicts[filename] = True
            return None
        if event in special_attributes:
            if owner_module(args[0]).partition(".")[0] in protected and submission_code(False):
                return f"changing {brief(args[1])} of a {owner_module(args[0])} object"
            return None
        if event in hooks:
            return "adding an audit hook from submission code" if submission_code(True) else None
        if submission_code(event in global_introspection):
            return "introspection from submission code" + (f": .{args[1]}" if event == "object.__getattr__" else "")
        return None

    def hook(event: str, args: tuple) -> None:  # every audit event of the process calls this: cheap exit first
        if event not in watched:
            return
        if event == integrity_event:
            if integrity is not None and len_(args) == 1:
                integrity(args[0])
            return
        if event == "object.__getattr__" and args[1] not in frame_attributes:
            return  # f_code, __code__ and the like: torch reads them all the time
        if event in ("sys._getframe", "object.__getattr__") and getattr_(local, "walking", False):
            return  # raised by our own stack walk
        detail = refusal(event, args)
        if detail is None:
            return
        if reports[0] < max_reports and not getattr_(local, "reporting", False):
            reports[0] += 1
            local.reporting = True
            try:
                report(event, detail)
            except Exception:  # a broken reporter must not turn a refusal into an allowance
                pass
            finally:
                local.reporting = False
        raise refused(f"judge sandbox: {event} is not allowed ({detail})")

    return hook
