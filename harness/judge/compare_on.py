"""Where the judging process compares a CUDA evaluation's outputs and gradients: its GPU, or the CPU.

Runs in the parent. With the config's `compare_on_gpu`, the comparisons of harness/shared/check.py move each chunk to
the GPU the evaluation ran on (the GPU worker's `CUDA_VISIBLE_DEVICES` entry, found among the GPUs this process
sees) and compare there; the figures are the same as on the CPU. This process then holds a CUDA context of its own
on that GPU. It compares only between the timed phases of that GPU's evaluation, never while a block is timed there.
Anything that keeps it from the GPU (no CUDA in this process, a GPU it cannot see or map, a context that cannot be
made) leaves the comparisons on the CPU, logged once per GPU.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Optional

import torch

from harness.shared.config import Config

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_DEVICES: dict[Optional[str], Optional[torch.device]] = {}   # GPU id (None: this process's current) -> its device


def comparison_device(config: Config, device: str, env: Optional[dict]) -> Optional[torch.device]:
    """The torch device for an evaluation on `device` by the worker whose children get `env`; None: the CPU."""
    if not config.compare_on_gpu or device != "cuda":
        return None
    gpu = (env or {}).get("CUDA_VISIBLE_DEVICES")
    with _LOCK:
        if gpu not in _DEVICES:
            _DEVICES[gpu] = _open(gpu)
        return _DEVICES[gpu]


def _open(gpu: Optional[str]) -> Optional[torch.device]:
    """The device for a worker's GPU id, its context made here (once per GPU), or None with the reason logged."""
    try:
        index = visible_index(gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if index is None:
            raise RuntimeError(f"GPU {gpu!r} is not among this process's ({os.environ.get('CUDA_VISIBLE_DEVICES')})")
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise RuntimeError(f"no CUDA device {index} in this process")
        target = torch.device("cuda", index)
        torch.zeros(1, device=target).add_(1).item()   # the context, made now rather than inside a comparison
        return target
    except Exception as exc:   # the CPU does the same comparisons, only slower
        log.warning("comparisons stay on the CPU for GPU %s: %s", gpu, exc)
        return None


def visible_index(gpu: Optional[str], listed: Optional[str]) -> Optional[int]:
    """This process's CUDA index for a worker's GPU id: its position in this process's CUDA_VISIBLE_DEVICES when that
    is set (`listed`), else the id itself when it is a number; None (the worker got no id): the current device."""
    if gpu is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    gpu = gpu.strip()
    if listed is not None:
        ids = [g.strip() for g in listed.split(",") if g.strip()]
        return ids.index(gpu) if gpu in ids else None
    return int(gpu) if gpu.isdigit() else None
