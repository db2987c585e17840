"""The extraction stage of judging: the verdicts the submission's text alone decides (too_large, a file that is not
UTF-8 text, no_code, syntax_error), the record every later stage starts from, and the rule profile's word on a
status.

Runs in the parent and loads no torch (the command line decides these verdicts before it loads any: cli.py): the
record's torch and CUDA versions are read from torch's installed version file when torch is not loaded.
"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from harness.integrity import profiles as rules
from harness.shared import backends
from harness.shared.config import Config
from harness.shared.record import Record, Status, record_fields
from harness.shared.settings import IntegritySettings
from harness.submission.extract import Extraction, extract
from harness.submission.submissions import Submission

NO_CODE_ERROR = "no complete Python block that defines ModelNew"


@dataclass(frozen=True)
class Extracted:
    """What extraction made of a submission, nothing written yet."""
    extraction: Optional[Extraction]   # None: never extracted (too large, or not UTF-8 text)
    status: Optional[Status]           # the verdict the text decides; None: the source goes on to the build
    error: Optional[str]               # that verdict's message


def extract_submission(submission: Submission, config: Config) -> Extracted:
    """The verdict the text alone decides, if any (pure: reads nothing, writes nothing)."""
    size = len(submission.text.encode())
    if size > config.max_submission_bytes:   # nothing of it is copied, extracted or run
        return Extracted(None, Status.TOO_LARGE, f"the submission is {size / 1e6:.1f} MB, above max_submission_bytes "
                                                 f"({config.max_submission_bytes / 1e6:g} MB)")
    if submission.not_text is not None:
        return Extracted(None, Status.SYNTAX_ERROR, submission.not_text)
    extraction = extract(submission.text, submission.is_python)
    if extraction.source is None:
        return Extracted(extraction, Status.NO_CODE, NO_CODE_ERROR)
    if extraction.syntax_error:
        return Extracted(extraction, Status.SYNTAX_ERROR, extraction.syntax_error)
    return Extracted(extraction, None, None)


def prepare(submission: Submission, config: Config, device: str, artifacts_dir: Path,
            extracted: Optional[Extracted] = None) -> Record | tuple[Record, str]:
    """Extraction: the final record for too_large / no_code / syntax_error (a file that is not UTF-8 text included),
    else (the record so far, the extracted source). The prose around the code goes to explanation.md and the source
    to source.py in `artifacts_dir`. `extracted`: extract_submission's answer when the caller has it already."""
    if extracted is None:
        extracted = extract_submission(submission, config)
    record = blank_record(submission, config, device)
    found = extracted.extraction
    if found is not None:
        artifacts_dir.mkdir(parents=True, exist_ok=True)
        if found.explanation:
            explanation_path = artifacts_dir / "explanation.md"
            explanation_path.write_text(found.explanation)
            record = replace(record, explanation_path=str(explanation_path))
        if found.source is not None:
            source_path = artifacts_dir / "source.py"
            source_path.write_text(found.source)
            record = replace(record, source_path=str(source_path),
                             backend=backends.select(config.backend, found.source).name)
    if extracted.status is not None:
        return apply_profile(replace(record, status=extracted.status, error=extracted.error), {}, config)
    return record, found.source


def blank_record(submission: Submission, config: Config, device: str) -> Record:
    """Every measurement None (not measured); identity, environment and provenance filled in."""
    torch_version, cuda_version = torch_versions()
    known = dict(problem=submission.problem_id, submission=submission.label, submission_hash=submission.hash,
                 model=submission.model, run=submission.run, sample_id=submission.sample_id, status=Status.CRASH,
                 profile=config.profile, device=device, precision=config.precision, allow_tf32=config.allow_tf32,
                 torch_version=torch_version, cuda_version=cuda_version, config_hash=config.hash(),
                 timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return Record(**{name: known.get(name) for name in record_fields()})


def apply_profile(record: Record, findings: dict[str, str], config: Config) -> Record:
    """check_status is the measured status; the profile turns forbidden findings into rule_violation."""
    record = replace(record, check_status=record.status, flags=tuple(sorted(findings)),
                     flag_evidence=dict(sorted(findings.items())), profile=config.profile)
    status, message = rules.derive(record.status, record.grad_failure, findings, record.tolerance_needed,
                                   rules.Profile.from_settings(IntegritySettings.from_config(config)))
    if status == record.status:
        return record
    if record.grad_failure is not None and status == record.grad_failure:
        message = record.error
    return replace(record, status=status, error=message)


def torch_versions() -> tuple[str, Optional[str]]:
    """(torch.__version__, torch.version.cuda): from torch when it is loaded, else read from its version file."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__, torch.version.cuda
    return installed_torch_build()


@functools.lru_cache(maxsize=1)
def installed_torch_build() -> tuple[str, Optional[str]]:
    """torch's version and the CUDA version it was built with, as torch/version.py states them, without importing
    torch (its package is found, not loaded); the distribution's version, and no CUDA, if that file is unreadable."""
    values = torch_version_file()
    version = values.get("__version__")
    if not isinstance(version, str):
        version = importlib.metadata.version("torch")
    cuda = values.get("cuda")
    return version, cuda if isinstance(cuda, str) else None


@functools.lru_cache(maxsize=1)
def torch_version_file() -> dict:
    """The constants torch/version.py assigns (__version__, cuda, hip, ...): {} if it cannot be read."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        tree = ast.parse((Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    values = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(
            node, "target", None) if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            values[target.id] = node.value.value
    return values
