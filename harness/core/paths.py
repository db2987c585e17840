"""Where the repository's own folders are: every default path of the harness is relative to REPO_ROOT."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
