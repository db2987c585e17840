"""Build stage (parent side): compile a submission's extensions ahead of its evaluation, on CPU cores, and cache them.

A build is the submission's module executed in a build-only child (harness/children/candidate/main.py with
`build_only`): the same sandbox as an evaluation, but no GPU visible (a module that runs GPU work at import cannot
disturb a timing on the GPU workers) and TORCH_CUDA_ARCH_LIST set to the evaluation GPU's architecture. Each load_inline
/ load call that returns a module leaves a library; the parent copies those (paths checked to lie in the child's own
folder) into the cache, keyed by the extracted source, torch and CUDA versions, device and GPU architecture. The
evaluation child then imports a library whose call matches instead of compiling again.

A backend that compiles its kernels on their first call (Triton; harness/shared/backends `builds_ahead`) has nothing to
build here unless its source also builds an extension: no child is started, the build is `none` (`needs_cuda`
for a CPU target) and the evaluation JIT-compiles the kernels inside its sandbox before any timing.

The build decides the statuses that need no GPU: compile_error (a build failed), needs_cuda (CUDA sources, or a
backend whose kernels run only on CUDA, for a CPU evaluation) and a module that does not finish within
compile_timeout_s (timeout). Anything else that goes
wrong in the module (load_error, a crash) may depend on the GPU it could not see: that build is `deferred` and the
evaluation runs the module as it always would.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch

from harness.build import pch
from harness.isolation import policy, spawn
from harness.isolation.spawn import Child
from harness.shared import backends, protocol, resources
from harness.shared.config import Config
from harness.shared.environment import device_name
from harness.shared.messages import Compiled, Failed, Malformed, Product
from harness.shared.paths import IMPORT_ROOT
from harness.shared.record import Status
from harness.shared.settings import SandboxSettings
from harness.shared.specs import CANDIDATE_MODULE, CandidateSpec

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
LOG_FILE = "build.log"
LIB_SUFFIX = ".so"
VERDICTS = {"compile_error": Status.COMPILE_ERROR, "needs_cuda": Status.NEEDS_CUDA}
# Room a build needs in its folder: a compile that failed with less free there may have failed for want of it (the
# compiler's objects, torch's headers precompiled), which is the machine's failure, not the submission's
BUILD_ROOM_BYTES = 256 << 20
# Where a build's folder goes when neither TMPDIR nor KERNEL_JUDGE_BUILD_TMP names one: memory while there is room
# (resources.memory_folder), else the temporary folder. A CUDA build writes tens of MB there that are deleted once
# its libraries are in the cache (nvcc's preprocessed sources, objects): in memory they never reach the disk.
BUILD_TMP_ENV = "KERNEL_JUDGE_BUILD_TMP"
LAST_WORDS_BYTES = 300   # of a build child's output that ended with no result, in the deferred build's error


@dataclass(frozen=True)
class Target:
    """What builds are for: the evaluation device and, on CUDA, the GPU's name and architecture ("9.0")."""
    device: str
    arch: Optional[str] = None
    device_name: Optional[str] = None


@dataclass(frozen=True)
class Build:
    """A submission's build. `libraries`: call key -> {"module": name, "path": file} (or "data": bytes when the
    build travels to another machine). `status` is the verdict for built == "failed", else None."""
    key: str
    outcome: str                        # built | cached | failed | needs_cuda | deferred | none (no extension
                                        # at import, or a backend that compiles on first call)
    status: Optional[Status] = None
    error: Optional[str] = None
    compile_s: Optional[float] = None   # the module's execution time in the build child, builds included
    cpu_s: float = 0.0                  # CPU time of the build child and its compilers (0 for a cache hit)
    libraries: dict = field(default_factory=dict)
    device_name: Optional[str] = None
    log_path: Optional[str] = None      # the build child's output (compiler errors)
    light: Optional[bool] = None        # the record's light_headers (harness/shared/messages.py Compiled)


def cache_key(source: str, target: Target, light: bool = False) -> str:
    """`light`: the config's light_cuda_headers (CUDA builds only: a CPU build never uses it)."""
    parts = [source, torch.__version__, torch.version.cuda, target.device, target.arch]
    if light and target.device == "cuda":
        parts.append("light_cuda_headers")
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def build(source: str, config: Config, target: Target, cache_dir: Path, log_path: Path, ship: bool = False,
          nice: int = 0) -> Build:
    """The cached build of `source`, else a build in a child. `ship`: carry the libraries' bytes (the evaluation
    may run on another machine). `nice`: the build child's CPU priority offset. Builds of one key in this process
    run one at a time, so the same source handed in twice at once compiles once (the second finds the cache)."""
    key = cache_key(source, target, config.light_cuda_headers)
    backend = backends.select(config.backend, source)
    if not backends.needs_build(backend, source):
        return _nothing_ahead(backend, key, target)
    with _one_at_a_time(key):
        return _cached_or_built(source, key, config, target, cache_dir, log_path, ship, nice)


def _nothing_ahead(backend: backends.Backend, key: str, target: Target) -> Build:
    """A backend whose kernels compile on their first call, in the evaluation: no build child. Kernels that run
    only on CUDA cannot run on a CPU target: needs_cuda, an environment fact, as for CUDA sources."""
    if backend.needs_cuda and target.device != "cuda":
        return Build(key, "needs_cuda", status=Status.NEEDS_CUDA, device_name=target.device_name,
                     error=f"the submission's {backend.name} kernels need CUDA and the device is not CUDA")
    return Build(key, "none", device_name=target.device_name)


def _cached_or_built(source: str, key: str, config: Config, target: Target, cache_dir: Path, log_path: Path,
                     ship: bool, nice: int) -> Build:
    cached = _read_entry(cache_dir / key, ship)
    if cached is not None:
        manifest, libraries = cached
        if manifest.get("status") is not None:   # a build that failed the same way before: its verdict and log
            log_path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cache_dir / key / LOG_FILE, log_path)
            return Build(key, "cached", status=Status(manifest["status"]), error=manifest.get("error"),
                         compile_s=manifest.get("compile_s"), device_name=target.device_name, log_path=str(log_path))
        return Build(key, "cached", compile_s=manifest.get("compile_s"), libraries=libraries,
                     device_name=target.device_name, light=manifest.get("light"))
    workdir = _build_folder()
    try:
        return _build_in_child(source, key, config, target, cache_dir, log_path, workdir, ship, nice)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def build_parent() -> Optional[str]:
    """The folder a build's own folder is made in (None: the temporary folder): KERNEL_JUDGE_BUILD_TMP where set;
    the temporary folder where TMPDIR is set; else memory where there is room (resources.memory_folder)."""
    named = os.environ.get(BUILD_TMP_ENV)
    if named:
        return named
    if os.environ.get("TMPDIR"):
        return None
    memory = resources.memory_folder()
    return None if memory is None else str(memory)


def _build_folder() -> Path:
    """A new folder for one build, named after this process (resources.scratch_folder: a judge killed mid-build
    leaves nothing in memory past the next judge's first build)."""
    return resources.scratch_folder("build", build_parent())


_KEYS_LOCK = threading.Lock()
_KEYS: dict[str, tuple[threading.Lock, int]] = {}   # cache key -> (its lock, builds holding or awaiting it)


@contextlib.contextmanager
def _one_at_a_time(key: str) -> Iterator[None]:
    with _KEYS_LOCK:
        lock, users = _KEYS.get(key, (threading.Lock(), 0))
        _KEYS[key] = (lock, users + 1)
    try:
        with lock:
            yield
    finally:
        with _KEYS_LOCK:
            lock, users = _KEYS[key]
            if users == 1:
                del _KEYS[key]
            else:
                _KEYS[key] = (lock, users - 1)


def _build_in_child(source: str, key: str, config: Config, target: Target, cache_dir: Path, log_path: Path,
                    workdir: Path, ship: bool, nice: int) -> Build:
    source_path = workdir / "submission.py"
    source_path.write_text(source)
    pch_root = pch.prepare(cache_dir, source) if config.precompiled_headers else None
    spec = CandidateSpec.for_build(config, source_path, workdir, target.device, pch_root)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child = Child(CANDIDATE_MODULE, spec, workdir, log_path, with_commands=True,
                  **policy.for_build(SandboxSettings.from_config(config), workdir, target.arch, nice).options())
    try:
        event = _next_result(child, config.compile_timeout_s)
    finally:
        child.finish()
    made = dict(key=key, device_name=target.device_name, log_path=str(log_path))
    if event is None:
        if child.ended.timed_out:
            return Build(outcome="failed", status=Status.TIMEOUT, compile_s=config.compile_timeout_s,
                         error=f"compile exceeded {config.compile_timeout_s:g} s", **made)
        last = spawn.log_tail(log_path, LAST_WORDS_BYTES).splitlines()[-1:]
        said = f" (its output ended: {last[0]})" if last else ""
        return Build(outcome="deferred", error=f"build child: {child.ended.detail}{said}", **made)
    if event["event"] == protocol.FAILED:
        failed = Failed.from_event(event)
        status = VERDICTS.get(failed.status)
        if status is None:   # load_error and the like: the GPU the module could not see may matter
            return Build(outcome="deferred", error=failed.error, **made)
        short = resources.no_room(workdir, BUILD_ROOM_BYTES) if status == Status.COMPILE_ERROR else None
        if short is not None:   # never kept: the same source builds once there is room
            return Build(outcome="failed", status=Status.JUDGE_ERROR, compile_s=failed.compile_s,
                         error=f"the judge ran short while building: {short}", **made)
        outcome = "needs_cuda" if status == Status.NEEDS_CUDA else "failed"   # an environment fact, not a failure
        verdict = Build(outcome=outcome, status=status, error=failed.error, compile_s=failed.compile_s, **made)
        _store_failure(verdict, cache_dir / key, log_path)
        return verdict
    try:
        compiled = Compiled.from_event(event)
    except Malformed as exc:   # the module ran but its report is broken: the evaluation will run it again
        return Build(outcome="deferred", error=f"build child: {exc}", **made)
    compile_s, cpu_s, light = compiled.compile_s, compiled.cpu_s, compiled.light_headers
    try:
        libraries = _store(compiled.products, workdir, cache_dir / key, compile_s, light)
    except OSError as exc:
        if not resources.ran_short(exc):
            raise
        return Build(outcome="failed", status=Status.JUDGE_ERROR, compile_s=compile_s, cpu_s=cpu_s,
                     error=f"the judge ran short storing the build: {exc}", **made)
    if libraries is None:   # kept too, so that a rerun does not execute the module only to learn this again
        _publish(_staging(cache_dir / key, {"compile_s": compile_s, "calls": {}}), cache_dir / key)
        return Build(outcome="none", compile_s=compile_s, cpu_s=cpu_s, **made)
    stored = _read_entry(cache_dir / key, ship)
    return Build(outcome="built", compile_s=compile_s, cpu_s=cpu_s, libraries=stored[1] if stored else {},
                 light=light, **made)


def _store_failure(failed: Build, entry: Path, log_path: Path) -> None:
    """A build verdict is as deterministic as a build: kept with its log so that a rerun under another config does
    not compile it again. (A module that timed out is not kept: that can depend on the machine's load.)"""
    staging = _staging(entry, {"status": failed.status.value, "error": failed.error, "compile_s": failed.compile_s,
                               "calls": {}})
    if log_path.is_file():
        shutil.copyfile(log_path, staging / LOG_FILE)
    else:
        (staging / LOG_FILE).write_text("")
    _publish(staging, entry)


def _next_result(child: Child, timeout_s: float) -> Optional[dict]:
    """COMPILED or FAILED (audit events skipped), or None when the child ended or timed out."""
    deadline = time.monotonic() + timeout_s
    while True:
        event = child.next_event(max(deadline - time.monotonic(), 0.0))
        if event is None or event["event"] in (protocol.COMPILED, protocol.FAILED):
            return event


def _store(products: dict[str, Product], workdir: Path, entry: Path, compile_s: Optional[float],
           light: Optional[bool] = None) -> Optional[dict]:
    """Copy the child's libraries into the cache entry; only regular files inside its own folder are taken."""
    if not products:
        return None
    root = workdir.resolve()
    manifest: dict[str, dict] = {}
    staging = _staging(entry)
    for call, product in products.items():
        module, file = product.module, product.file
        path = Path(file).resolve()
        if not path.is_file() or root not in path.parents:
            log.warning("ignoring a build product outside the build folder: %s", file)
            continue
        if path.stat().st_nlink != 1:   # a hard link to a file outside would carry that file into the cache
            log.warning("ignoring a build product with other links to it: %s", file)
            continue
        (staging / call).mkdir()
        shutil.copyfile(path, staging / call / f"{module}{LIB_SUFFIX}")
        manifest[call] = {"module": module}
    if not manifest:
        shutil.rmtree(staging, ignore_errors=True)
        return None
    (staging / MANIFEST).write_text(json.dumps({"compile_s": compile_s, "light": light, "calls": manifest}))
    _publish(staging, entry)
    return manifest


def _staging(entry: Path, manifest: Optional[dict] = None) -> Path:
    """A private folder next to the entry, published whole by _publish (readers never see half an entry)."""
    # the cache's own folder, when made here, is the judge's alone (0700): a candidate reads its libraries from
    # the copy put into its folder (install), never from the cache
    entry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    if manifest is not None:
        (staging / MANIFEST).write_text(json.dumps(manifest))
    return staging


def _publish(staging: Path, entry: Path) -> None:
    try:
        os.rename(staging, entry)   # atomic; another worker's identical entry may have landed first
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def _read_entry(entry: Path, ship: bool) -> Optional[tuple[dict, dict]]:
    """(the manifest, the libraries) of a cache entry, or None when there is none (or it is incomplete)."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    libraries = {}
    for call, item in manifest.get("calls", {}).items():
        path = entry / call / f"{item['module']}{LIB_SUFFIX}"
        if not path.is_file():
            return None
        libraries[call] = {"module": item["module"], **({"data": path.read_bytes()} if ship else {"path": str(path)})}
    return manifest, libraries


def install(libraries: dict, folder: Path) -> dict:
    """Put a build's libraries under `folder` for an evaluation child: call key -> {"module", "dir"}."""
    ready = {}
    for call, item in libraries.items():
        target = folder / call
        target.mkdir(parents=True, exist_ok=True)
        destination = target / f"{item['module']}{LIB_SUFFIX}"
        if "data" in item:
            destination.write_bytes(item["data"])
        else:
            shutil.copyfile(item["path"], destination)
        ready[call] = {"module": item["module"], "dir": str(target)}
    return ready


def describe_target(device: str, env: Optional[dict] = None) -> Target:
    """The build target of this machine's (first visible, or env's) GPU, asked in a child so that the calling
    process never creates a CUDA context; CPU: the processor's name."""
    if device != "cuda":
        return Target(device, None, device_name(device))
    uniform = uniform_gpus()
    if uniform is not None:   # every GPU here is the same model: no need to ask which one `env` names
        return Target(device, uniform[1], uniform[0])
    probe = ("import json, torch; from harness.shared.environment import device_name; "
             "major, minor = torch.cuda.get_device_capability(); "
             "print(json.dumps([device_name('cuda'), f'{major}.{minor}']))")
    child_env = {**os.environ, **(env or {}), "PYTHONPATH": str(IMPORT_ROOT)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=child_env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"could not query the GPU: {done.stderr.strip()[-400:]}")
    name, arch = json.loads(done.stdout.strip().splitlines()[-1])
    return Target(device, arch, name)


def uniform_gpus() -> Optional[tuple[str, str]]:
    """(name, arch) when nvidia-smi lists GPUs of one model only (well under a second, where the probe above takes
    seconds: it imports torch and creates a CUDA context); None without nvidia-smi or with mixed models."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = {tuple(part.strip() for part in line.rsplit(",", 1)) for line in done.stdout.splitlines() if line.strip()}
    if done.returncode != 0 or len(rows) != 1:
        return None
    row = rows.pop()
    if len(row) != 2 or not re.fullmatch(r"\d+\.\d+", row[1]):
        return None
    return row[0], row[1]
