"""What both sides need to know of the process they run in: the threads a child uses on the CPU device, the device's
name, and how a problem or submission source becomes a module (the oracle and candidate load theirs; the parent
loads a problem's source to list and check it, never a submission's).
"""
from __future__ import annotations

import sys
import types

import torch

CPU_THREADS = 1   # torch's intra-op threads of every child on the CPU device (oracle and candidate alike)


def exec_source(source: str, filename: str, module_name: str) -> types.ModuleType:
    """Execute a Python source as a fresh module registered in sys.modules (pickling and dataclasses need that)."""
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    code = compile(source, filename, "exec")
    exec(code, module.__dict__)
    return module


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(torch.cuda.current_device())
    import platform
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
