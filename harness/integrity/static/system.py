"""Checks on what the code reaches beyond its forward: packages, processes, threads, the network, native code,
environment variables, files, ways to end the process, and random number generator state.
"""
from __future__ import annotations

import ast
import re
import sys
from typing import Callable

from harness.integrity.static.source import (
    _Hit,
    _in_strings,
    _matches,
    _Module,
    _named,
    _shown,
)
from harness.shared.findings import (
    ENV_ACCESS,
    EXITS,
    FILE_IO,
    IMPORTS_BEYOND_TORCH,
    NATIVE_ACCESS,
    NETWORK,
    PROCESS_SPAWN,
    SEED_CONTROL,
    THREADS,
)


def _check_imports(module: _Module) -> list[_Hit]:
    """Beyond torch, the standard library and the packages of the submission's backend (triton under Triton)."""
    hits = []
    for line, name in module.imports:
        top = name.split(".")[0]
        if top != "torch" and top not in sys.stdlib_module_names and top not in module.backend.imports:
            hits.append(_Hit(line, name))
    return hits


def _names_check(*patterns: str) -> Callable[[_Module], list[_Hit]]:
    return lambda module: _named(module, patterns)


_PROCESS_NAMES = ("subprocess", "multiprocessing", "torch.multiprocessing", "pty",
                  "concurrent.futures.ProcessPoolExecutor", "os.fork", "os.forkpty", "os.system", "os.popen",
                  "os.spawn*", "os.exec*", "os.posix_spawn*")
_THREAD_NAMES = ("threading", "_thread", "concurrent.futures.ThreadPoolExecutor", "asyncio")
_NETWORK_NAMES = ("socket", "ssl", "http", "urllib", "urllib3", "requests", "httpx", "ftplib", "smtplib",
                  "telnetlib", "xmlrpc", "websocket", "websockets", "aiohttp")
_NATIVE_NAMES = ("ctypes", "_ctypes", "cffi", "mmap", "torch.ops.load_library", "torch.classes.load_library")
_ENV_NAMES = ("os.environ", "os.environb", "os.getenv", "os.putenv", "os.unsetenv")
_SEED_NAMES = ("torch.manual_seed", "torch.seed", "torch.initial_seed", "torch.random", "torch.set_rng_state",
               "torch.get_rng_state", "torch.Generator", "torch.default_generator", "torch.cuda.manual_seed",
               "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all", "torch.cuda.initial_seed",
               "torch.cuda.random", "torch.cuda.set_rng_state", "torch.cuda.get_rng_state",
               "torch.cuda.set_rng_state_all", "torch.cuda.get_rng_state_all", "random.seed", "random.setstate",
               "numpy.random.seed", "numpy.random.default_rng", "numpy.random.RandomState")


def _check_exits(module: _Module) -> list[_Hit]:
    hits = _named(module, ("sys.exit", "os._exit", "os.abort", "os.kill", "os.killpg", "builtins.exit",
                           "builtins.quit", "signal"))
    for node in module.nodes:
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = module.resolve(raised)
            if name in ("builtins.SystemExit", "builtins.KeyboardInterrupt"):
                hits.append(_Hit(node.lineno, f"raise {_shown(name)}"))
    return hits


_FILE_NAMES = ("builtins.open", "io.open", "io.FileIO", "os.open", "os.write", "os.fdopen", "os.dup", "os.dup2",
               "os.pipe", "os.remove", "os.unlink", "os.rename", "os.renames", "os.replace", "os.mkdir",
               "os.makedirs", "os.rmdir", "os.removedirs", "os.chmod", "os.chown", "os.symlink", "os.link",
               "os.truncate", "os.ftruncate", "shutil", "tempfile", "torch.save", "torch.load")
_PATH_METHODS = {"write_text", "write_bytes", "open", "unlink", "mkdir", "rename", "touch", "rmdir"}
_FD_PATHS = re.compile(r"/proc/self/fd|/dev/fd\b")


def _check_file_io(module: _Module) -> list[_Hit]:
    hits = _named(module, _FILE_NAMES)
    # pathlib-style methods, whatever they are called on (the receiver's type is not known statically)
    hits += [_Hit(call.lineno, f".{call.func.attr}()") for call, name in module.calls()
             if isinstance(call.func, ast.Attribute) and call.func.attr in _PATH_METHODS
             and not _matches(name, _FILE_NAMES)]
    hits += _in_strings(module, _FD_PATHS, raw=True)
    return hits


CHECKS: dict[str, Callable[[_Module], list[_Hit]]] = {
    IMPORTS_BEYOND_TORCH: _check_imports,
    PROCESS_SPAWN: _names_check(*_PROCESS_NAMES),
    THREADS: _names_check(*_THREAD_NAMES),
    NETWORK: _names_check(*_NETWORK_NAMES),
    NATIVE_ACCESS: _names_check(*_NATIVE_NAMES),
    EXITS: _check_exits,
    ENV_ACCESS: _names_check(*_ENV_NAMES),
    FILE_IO: _check_file_io,
    SEED_CONTROL: _names_check(*_SEED_NAMES),
}
