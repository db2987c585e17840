"""Which sandbox layers this machine applies, and whether CUDA still initialises under each of them.

Run on a GPU machine after setup: `.venv/bin/python scripts/probe_sandbox.py`. Prints one line per layer set.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile

from harness.isolation import sandbox

EXTRA_WRITABLE = ("/dev/shm", "/proc")
CHILD = "import torch; torch.cuda.init(); print(torch.cuda.get_device_name(0), float(torch.ones(1, device='cuda')))"


def main() -> int:
    caps = sandbox.capabilities()
    print("capabilities:", caps)
    variants = {
        "all layers": caps,
        "no landlock": dataclasses.replace(caps, landlock_abi=0),
        "landlock abi 5 (no scoping)": dataclasses.replace(caps, landlock_abi=min(caps.landlock_abi, 5)),
        "landlock abi 3 (no TCP rules)": dataclasses.replace(caps, landlock_abi=min(caps.landlock_abi, 3)),
        "no netns": dataclasses.replace(caps, netns=False, netns_via_userns=False),
        "rlimits only": dataclasses.replace(caps, landlock_abi=0, netns=False, netns_via_userns=False,
                                            oom_adjustable=False),
    }
    with tempfile.TemporaryDirectory() as workdir:
        policy = sandbox.Policy(writable=(workdir,), limits=sandbox.Limits(cpu_s=300, file_bytes=2**34,
                                                                           extra_processes=512, open_files=4096))
        runs = [(name, variant, policy) for name, variant in variants.items()]
        runs += [(f"all layers, also writable {extra}", caps, dataclasses.replace(policy, writable=(workdir, extra)))
                 for extra in EXTRA_WRITABLE if os.path.isdir(extra)]
        for name, variant, policy in runs:
            sandbox.capabilities = lambda variant=variant: variant
            result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=workdir,
                                    preexec_fn=sandbox.preexec(policy),
                                    env=dict(os.environ, HOME=workdir, TMPDIR=workdir))
            last = (result.stdout.strip() or result.stderr.strip()).splitlines()[-1:] or ["(no output)"]
            print(f"{name:32s} rc={result.returncode} {last[0][:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
