"""A submission whose text alone decides its verdict (too_large, not UTF-8 text, no_code, syntax_error), judged and
written without torch: what `submit` does before it loads the judge (harness/cli.py). The record, results.csv,
batch.json and the artifacts folder are those `run_batch` writes for the same submission (the same functions:
harness/judge/extraction.py prepare, run_folder.py); only the device is found another way, since torch is not
loaded to ask CUDA (`device_without_torch`).

Runs in: the parent (the submitting command). Loads no torch and no pandas.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Optional

from harness.judge.extraction import extract_submission, installed_torch_build, prepare, torch_version_file
from harness.pipeline.run_folder import RUN_LOG, SUMMARY_FILE, Summary, new_artifacts_dir, torn
from harness.report.rows import write_one_record_csv
from harness.shared.record import RECORDS_FILE, RESULTS_CSV, Record
from harness.shared.settings import CPU_PER_GPU_WORKER, PipelineSettings  # noqa: F401 (one figure, both paths)
from harness.submission.submissions import Submission

ENGINE = "local"   # the engine a one-submission run_batch uses (harness/pipeline/engines.py LocalEngine)
NVIDIA_DRIVER = Path("/proc/driver/nvidia")   # present while the NVIDIA kernel driver is loaded
WSL_GPU = Path("/dev/dxg")                    # WSL's GPU: CUDA without the NVIDIA driver's files


def device_without_torch(settings: PipelineSettings) -> tuple[Optional[str], str]:
    """(the device `resolve_device` would pick, how it was found), or (None, why not) when only CUDA could tell.

    The config's device (--device) when it names one. Otherwise CUDA is available to torch when its build has CUDA,
    the NVIDIA driver is loaded and CUDA_VISIBLE_DEVICES hides no GPU it lists; a build without CUDA, or a machine
    without the driver, is the CPU. That is what torch.cuda.is_available() answers on a working install; a driver too
    old for the build, or one that fails, it would answer otherwise (the record says the device it was judged for,
    and nothing ran on it)."""
    if settings.device is not None:
        return settings.device, "the config's (--device)"
    built = torch_version_file()
    if built.get("hip") is not None:
        return None, "a ROCm build of torch"
    if installed_torch_build()[1] is None:
        return "cpu", "torch is built without CUDA"
    if not NVIDIA_DRIVER.is_dir():
        if WSL_GPU.exists():
            return None, f"{WSL_GPU} (WSL): only CUDA tells"
        return "cpu", f"no NVIDIA driver ({NVIDIA_DRIVER})"
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        first = listed.split(",")[0].strip()
        if not first:
            return "cpu", "CUDA_VISIBLE_DEVICES is empty"
        if not (first.isdigit() or first.startswith(("GPU-", "MIG-"))):
            return None, f"CUDA_VISIBLE_DEVICES={listed!r}: only CUDA tells"
    if not _gpu_nodes():
        return None, "the NVIDIA driver is loaded but no /dev/nvidiaN is there: only CUDA tells"
    return "cuda", "torch built with CUDA, the NVIDIA driver loaded, GPUs in /dev"


def visible_gpus(settings: PipelineSettings) -> list[str]:
    """engines.visible_gpus without torch: the config's list, else CUDA_VISIBLE_DEVICES, else the GPU device nodes."""
    listed = settings.listed_gpus()
    return listed if listed is not None else [str(i) for i in range(len(_gpu_nodes()))]


def _gpu_nodes() -> list[str]:
    try:
        return [name for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name)]
    except OSError:
        return []


def judge_text(submission: Submission, settings: PipelineSettings, device: str, run_dir: Path
               ) -> Optional[tuple[Record, Summary]]:
    """The record and batch figures of a one-submission `run_batch(..., resume=False)` when extraction decides the
    verdict, written to `run_dir` as it writes them; None (nothing written) when the source goes on to a build, or
    when the device has no GPU to list (run_batch's own error then)."""
    started = time.monotonic()
    extracted = extract_submission(submission, settings.judge_config)
    if extracted.status is None:
        return None
    gpus = visible_gpus(settings) if device == "cuda" else []
    if device == "cuda" and not gpus:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = Summary(build_jobs=settings.build_slots(len(gpus)),
                      gpus=[f"gpu{g}" for g in gpus] or ["cpu"], engine=ENGINE, submissions=1, device=device)
    (run_dir / RUN_LOG).parent.mkdir(parents=True, exist_ok=True)
    artifacts = new_artifacts_dir(run_dir, submission)
    record = prepare(submission, settings.judge_config, device, artifacts, extracted)
    try:
        artifacts.rmdir()   # only if nothing was written there (too_large, not text)
    except OSError:
        pass
    records_path = run_dir / RECORDS_FILE
    with open(records_path, "a") as sink:
        if torn(records_path):
            sink.write("\n")   # a line torn by a killed run stays unreadable instead of swallowing this record
        sink.write(record.to_json() + "\n")
        sink.flush()
        os.fsync(sink.fileno())
    summary.wall_s = time.monotonic() - started
    summary.evaluated = 1
    summary.statuses = {record.status.value: 1}
    summary.gpu_busy_share = 0.0 if summary.wall_s > 0 else None
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary.__dict__, indent=1) + "\n")
    write_one_record_csv(record, run_dir / RESULTS_CSV)
    return record, summary

