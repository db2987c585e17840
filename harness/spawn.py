"""Parent side of a child process: start it in its own process group, talk over pipes, enforce deadlines.

A child is `python -m <module> SPEC` with its own working directory, a reduced environment and stdout/stderr in a
log file. The parent reads JSON event lines with a deadline per phase; on a missed deadline the whole process
group is killed (that is a timeout). A child that ends without its final event crashed: the exit code or signal
says how.
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness import protocol

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_GRACE_S = 10.0  # after its last event a child has this long to exit before its group is killed
POLL_S = 0.5         # how often a silent child is checked for having exited

# Environment passed to children: names, and prefixes for toolchain families.
ENV_NAMES = {"PATH", "LANG", "LC_ALL", "TERM", "LD_LIBRARY_PATH", "CC", "CXX", "CUDA_HOME", "CUDA_PATH",
             "CUDA_VISIBLE_DEVICES", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NCCL_NVLS_ENABLE",
             "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "OMP_NUM_THREADS"}
ENV_PREFIXES = ("NVIDIA_", "CUDNN_")


@dataclass(frozen=True)
class Ended:
    """How a child ended when it stopped sending events."""
    timed_out: bool
    returncode: Optional[int]   # None when killed on timeout
    detail: str                 # "killed by SIGSEGV", "exited with code 3", "no event within 300 s"


def child_environment(workdir: Path, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    env.update({
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_EXTENSIONS_DIR": str(workdir / "torch_extensions"),
    })
    env.update(extra or {})
    return env


class Child:
    def __init__(self, module: str, spec: dict, workdir: Path, log_path: Path, with_commands: bool):
        self.workdir = workdir
        event_r, event_w = os.pipe()
        command_r, command_w = os.pipe() if with_commands else (None, None)
        spec = dict(spec, event_fd=event_w, command_fd=command_r)
        spec_path = workdir / protocol.SPEC_FILE
        spec_path.write_text(json.dumps(spec))
        passed = tuple(fd for fd in (event_w, command_r) if fd is not None)
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, str(spec_path)], cwd=workdir, env=child_environment(workdir),
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, pass_fds=passed,
                start_new_session=True)
        os.close(event_w)
        if command_r is not None:
            os.close(command_r)
        self._events = event_r
        self._commands = command_w
        self._buffer = b""
        self.ended: Optional[Ended] = None

    def next_event(self, timeout_s: float) -> Optional[dict]:
        """The next event, or None once the child ended (see `ended`) or missed the deadline (killed)."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                self.ended = Ended(True, None, f"no progress within {timeout_s:g} s")
                return None
            ready, _, _ = select.select([self._events], [], [], min(remaining, POLL_S))
            if not ready:
                # A grandchild may hold the pipe open after the child died: the exit decides, not EOF.
                if self.process.poll() is not None:
                    self.ended = self._wait_exit()
                    return None
                continue
            chunk = os.read(self._events, 65536)
            if not chunk:
                self.ended = self._wait_exit()
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or "event" not in event:
            return {"event": "garbled", "line": line[:200].decode(errors="replace")}
        return event

    def send(self, command: str) -> None:
        if self._commands is None:
            return
        try:
            os.write(self._commands, (command + "\n").encode())
        except OSError:  # the child is gone; its end shows in next_event
            pass

    def finish(self) -> None:
        """Let the child exit after its last event, then kill whatever is left of its group."""
        if self._commands is not None:
            os.close(self._commands)
            self._commands = None
        try:
            self.process.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("child %s did not exit within %.0f s; killing it", self.process.pid, EXIT_GRACE_S)
        self.kill()
        if self._events is not None:
            os.close(self._events)
            self._events = None

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()

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
            return Ended(False, code, f"killed by {name}")
        return Ended(False, code, f"exited with code {code}")
