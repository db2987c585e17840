"""How fast GPU tensors reach a memfd's pages, each way harness/shared/handover.py _fill knows (FILL_WAYS): the copy
the oracle makes of a large problem's truth and feed (level2/19: five 2.2 GB outputs, the input sets alike). Beside
them, the other transfers a large problem's evaluation makes: GPU tensors to fresh host tensors (`.cpu()`, as
to_plain_cpu copies a candidate's outputs), to pinned ones, and a mapped memfd's tensors to the GPU (a candidate's
trials from the feed), as they are and with the mapping registered read-only first.

    python bench/handover_copy.py [--gb 11] [--tensors 5] [--rounds 2] [--out FILE.json]

Each round writes the same GPU tensors into a fresh memfd each way, in a rotated order, and checks a few slices of
what landed against the sources. Prints seconds and GB/s per way (the median of the rounds); needs CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.shared import handover  # noqa: E402


def write_once(value: list, how: str, folder: Path) -> float:
    fd = os.memfd_create("bench", os.MFD_CLOEXEC)
    try:
        began = time.perf_counter()
        handover.save_in_place(value, "bench.pt", {"bench.pt": fd}, folder, how=how)
        seconds = time.perf_counter() - began
        landed = torch.load(f"/proc/self/fd/{fd}", weights_only=True, mmap=True)
        for source, copy in zip(value, landed):
            for part in (slice(0, 1000), slice(source.numel() // 2, source.numel() // 2 + 1000), slice(-1000, None)):
                if not torch.equal(source.reshape(-1)[part].cpu(), copy.reshape(-1)[part]):
                    raise RuntimeError(f"{how}: the copy differs from its source")
        return seconds
    finally:
        os.close(fd)


def to_host(value: list, pinned: bool) -> float:
    began = time.perf_counter()
    if pinned:
        copies = [torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for v in value]
        for copy, source in zip(copies, value):
            copy.copy_(source)
    else:
        copies = [v.cpu() for v in value]
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    del copies
    return seconds


def from_mapping(value: list, registered: bool, folder: Path) -> float:
    """The tensors saved into a memfd, sealed and mapped as a candidate maps its feed, then copied to the GPU."""
    fd = os.memfd_create("bench", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        handover.save_in_place(value, "bench.pt", {"bench.pt": fd}, folder, how="plain")
        handover.seal(fd)
        mapped = torch.load(f"/proc/self/fd/{fd}", weights_only=True, mmap=True)
        began = time.perf_counter()
        span = handover._span(mapped) if registered else None
        done = span is not None and handover._register(*span, flags=handover.REGISTER_READ_ONLY)
        try:
            on_gpu = [t.to("cuda", non_blocking=done) for t in mapped]
            torch.cuda.synchronize()
        finally:
            if done:
                torch.cuda.cudart().cudaHostUnregister(span[0])
        seconds = time.perf_counter() - began
        if registered and not done:
            print("  (the mapping could not be registered: a plain copy)")
        del on_gpu, mapped
        return seconds
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=11.0, help="GB in all (default: five level2/19 outputs)")
    parser.add_argument("--tensors", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    each = int(args.gb * 1e9 / 4 / args.tensors)
    value = [torch.randn(each, device="cuda") for _ in range(args.tensors)]
    host = [v.cpu() for v in value]
    nbytes = sum(v.numel() * v.element_size() for v in value)
    ways = list(handover.FILL_WAYS) + ["host"]
    others = {"to_fresh_host": lambda folder: to_host(value, False),
              "to_pinned_host": lambda folder: to_host(value, True),
              "mapping_to_gpu": lambda folder: from_mapping(value, False, folder),
              "registered_mapping_to_gpu": lambda folder: from_mapping(value, True, folder)}
    seconds: dict[str, list[float]] = {way: [] for way in ways + list(others)}
    errors: dict[str, str] = {}   # a way that failed (a refused registration, ...): said, the others still timed

    def attempt(way: str, run) -> None:
        if way in errors:
            return
        try:
            seconds[way].append(run())
        except Exception as exc:
            errors[way] = f"{type(exc).__name__}: {exc}"[:300]

    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for way in ways[round_ % len(ways):] + ways[:round_ % len(ways)]:
                source, how = (host, "plain") if way == "host" else (value, way)
                attempt(way, lambda: write_once(source, how, Path(folder)))
            for name, run in others.items():
                attempt(name, lambda: run(Path(folder)))
    rows = {way: {"seconds": statistics.median(times), "gb_per_s": nbytes / 1e9 / statistics.median(times),
                  "all_seconds": times} if times else {"error": errors.get(way, "not timed")}
            for way, times in seconds.items()}
    print(f"{torch.cuda.get_device_name()}, {nbytes / 1e9:.1f} GB in {args.tensors} tensors, {args.rounds} rounds")
    for way, row in rows.items():
        if "error" in row:
            print(f"  {way:26s} failed: {row['error']}")
        else:
            print(f"  {way:26s} {row['seconds']:7.2f} s  {row['gb_per_s']:6.2f} GB/s")
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "bytes": nbytes, "ways": rows},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
