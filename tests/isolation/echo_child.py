"""A tiny child for tests/isolation/test_spawn.py, started by `Child` as `python -m tests.isolation.echo_child SPEC`.

It reads its spec the way the harness's children do (harness/shared/specs.py) and then behaves as `mode` says.
It imports no torch, so it starts in a fraction of a second."""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from harness.shared import protocol, specs


@dataclass(frozen=True)
class EchoSpec:
    mode: str   # echo | forge | exit | segfault | sleep | last


@dataclass(frozen=True)
class EchoReady:
    """Its READY: what it found in its environment and folder."""
    env: list
    home: object
    spec_left: bool

    def to_event(self) -> dict:
        return {"event": protocol.READY, "env": self.env, "home": self.home, "spec_left": self.spec_left}


@dataclass(frozen=True)
class Echo:
    """The command line it was sent, as it read it."""
    command: dict

    def to_event(self) -> dict:
        return {"event": "echo", "command": self.command}


def main(spec_path: str) -> None:
    spec, wiring = specs.read_spec(spec_path, EchoSpec)
    print(f"echo child started in mode {spec.mode}", flush=True)
    if spec.mode == "exit":
        sys.exit(3)
    if spec.mode == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if spec.mode == "sleep":
        time.sleep(60)
    channel = protocol.ChildChannel(wiring.event_fd, wiring.command_fd, wiring.token)
    if spec.mode == "forge":   # what a submission writing to the inherited descriptor would send
        os.write(wiring.event_fd, b'{"event": "ready", "token": "guessed"}\nnot json at all\n')
    if spec.mode == "last":   # a second's silence, then one event and the exit at once, as a build child ends
        time.sleep(1.0)
    channel.send(EchoReady(sorted(os.environ), os.environ.get("HOME"), os.path.exists(spec_path)))
    if spec.mode == "last":
        os._exit(0)
    while (command := channel.receive())["cmd"] != protocol.CMD_STOP:
        channel.send(Echo(command))
    channel.close()


if __name__ == "__main__":
    main(sys.argv[1])
