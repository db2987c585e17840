"""The parent's handle on the candidate's process: one phase at a time, each with its own deadline, in the sandbox.

Runs in the parent (a GPU worker). The child is harness/candidate/child.py, started by module name and never
imported here; what comes back is event lines (harness/core/protocol.py) and weights_only torch.save files.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from harness.build.builder import install
from harness.core import findings, protocol
from harness.core.config import Config
from harness.core.record import Status
from harness.isolation import sandbox
from harness.isolation.spawn import Child
from harness.oracle.reference import Reference
from harness.timing.interleave import SideStopped


@dataclass(frozen=True)
class Stop:
    """A stage ended the run: its status and short message."""
    status: Status
    error: str
    compile_s: Optional[float] = None   # how long the module ran before a compile or load failure


class CandidateRun:
    """The candidate's child process, one phase at a time, each with its own deadline, inside the sandbox."""

    def __init__(self, source_path: Path, ref: Reference, config: Config, log_path: Path,
                 libraries: Optional[dict] = None):
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="candidate-"))
        shutil.copy(source_path, self.workdir / "submission.py")
        spec = {"source_path": str(self.workdir / "submission.py"), "feed": str(ref.feed_path),
                "device": ref.device, "seed": config.seed, "check_grad": ref.check_grad,
                "allow_tf32": config.allow_tf32, "out_dir": str(self.workdir),
                "prebuilt": install(libraries, self.workdir / "prebuilt") if libraries else {}}
        policy = sandbox.Policy(writable=(str(self.workdir),), limits=sandbox.limits_for(config))
        self.sandbox_warnings = sandbox.describe(policy)[1]
        self.child = Child("harness.candidate.child", spec, self.workdir, log_path, with_commands=True,
                           policy=policy, max_rss_bytes=int(config.max_host_memory_gb * 2**30),
                           max_log_bytes=config.max_log_bytes, env=ref.env)
        self.phase = "compile"
        self.reused = 0     # extension calls served by the build pool's libraries (reported by the child)
        self.findings: dict[str, str] = {}     # dynamic findings reported by the child or seen here
        self.kernels: Optional[dict] = None
        self._blocked: list[str] = []

    def __enter__(self) -> "CandidateRun":
        return self

    def __exit__(self, *exc_info) -> None:
        leftovers = self.child.leftovers()
        if leftovers:
            self.findings["spawned_processes"] = f"{len(leftovers)} process(es) left running: " + ", ".join(
                leftovers[:4])
        self.child.finish()
        if self.child.forged:
            self.findings["forged_events"] = f"{len(self.child.forged)} event line(s) without the run's token, " \
                f"e.g. {self.child.forged[0]!r}"
        if self.child.output.flooded:
            self.findings["output_flood"] = f"{self.child.output.total / 2**20:.1f} MB of output, " \
                f"cut to {self.config.max_log_bytes / 2**20:.1f} MB"
        if self._blocked:
            self.findings["sandbox_blocked"] = "; ".join(self._blocked[:5]) + (
                f" (+{len(self._blocked) - 5} more)" if len(self._blocked) > 5 else "")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def until_compiled(self) -> dict | Stop:
        event = self._expect(protocol.COMPILED, self.config.compile_timeout_s)
        if isinstance(event, dict) and isinstance(event.get("reused"), int):
            self.reused = event["reused"]
        return event

    def until_checked(self) -> dict | Stop:
        self.phase = "checks"
        event = self._expect(protocol.CHECKED, self.config.run_timeout_s)
        if isinstance(event, Stop):
            return event
        self.kernels = event.get("kernels") if isinstance(event.get("kernels"), dict) else None
        try:
            return torch.load(self.workdir / protocol.RESULT_FILE, weights_only=True)
        except Exception as exc:  # boundary: whatever the child left there is untrusted
            return Stop(Status.RUNTIME_ERROR, f"unreadable result: {type(exc).__name__}: {str(exc)[:200]}")

    def expect(self, wanted: str, timeout_s: float) -> dict:
        """For the timing dialogue: the event, or SideStopped carrying the Stop."""
        event = self._expect(wanted, timeout_s)
        if isinstance(event, Stop):
            raise SideStopped("candidate", event)
        return event

    def spot_checks(self) -> Optional[list]:
        try:
            kept = torch.load(self.workdir / protocol.SPOT_FILE, weights_only=True)
        except Exception:  # boundary: missing or forged
            return None
        return kept if isinstance(kept, list) else None

    def _expect(self, wanted: str, timeout_s: float) -> dict | Stop:
        deadline = time.monotonic() + timeout_s
        while True:
            event = self.child.next_event(max(deadline - time.monotonic(), 0.0))
            if event is None:
                ended = self.child.ended
                if ended.timed_out:
                    return Stop(Status.TIMEOUT, f"{self.phase} exceeded {timeout_s:g} s")
                if ended.memory_exceeded:
                    return Stop(Status.RUNTIME_ERROR, f"{ended.detail} during {self.phase}")
                return Stop(Status.CRASH, f"{ended.detail} during {self.phase}")
            if event["event"] == protocol.AUDIT:
                self._blocked.append(f"{str(event.get('what'))[:40]}: {str(event.get('detail'))[:120]}")
                continue
            self._merge_flags(event.get("flags"))
            if event["event"] == protocol.FAILED:
                compile_s = event.get("compile_s")
                return Stop(_status(event.get("status")), str(event.get("error"))[:400],
                            compile_s if isinstance(compile_s, (int, float)) else None)
            if event["event"] != wanted:
                return Stop(Status.CRASH, f"protocol violation during {self.phase}: got {event['event']!r}")
            return event

    def _merge_flags(self, flags: object) -> None:
        """Findings the child reports; only known dynamic names are kept (the child is untrusted)."""
        if isinstance(flags, dict):
            for name, evidence in flags.items():
                if name in findings.DYNAMIC:
                    self.findings[name] = str(evidence)[:300]


def _status(value: object) -> Status:
    try:
        return Status(value)
    except ValueError:
        return Status.CRASH
