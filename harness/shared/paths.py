"""Where things are. Two notions, kept apart:

- IMPORT_ROOT: the folder the `harness` package is imported from (a checkout, or site-packages once installed).
  Children get it on PYTHONPATH so that `python -m harness...` finds the same code as the parent.
- The data root (`data_root()`): where problems/, configs/, reference/, build-cache/ and results/ are by default.
  It is $KERNEL_JUDGE_ROOT when set (the command line's `--root` sets it for its process and what that starts), else
  the checkout holding this package when it has problems/ and configs/ (a clone, an editable install), else the
  current directory.

Named configs are looked up in <root>/configs/, then in the configs that came with the code (configs/ of the
checkout, or its copy installed as harness/configs/ by a wheel), so the judge knows `default`, `strict`, ... whatever
the root.
The root is read on every call, not at import, so `--root` given on the command line applies to every default.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional

IMPORT_ROOT = Path(__file__).resolve().parents[2]
IN_CHECKOUT = (IMPORT_ROOT / "problems").is_dir() and (IMPORT_ROOT / "configs").is_dir()   # a clone, editable install
SHIPPED_CONFIGS_DIR = IMPORT_ROOT / "configs" if IN_CHECKOUT else IMPORT_ROOT / "harness" / "configs"  # pyproject.toml
ROOT_ENV = "KERNEL_JUDGE_ROOT"


def data_root() -> Path:
    """The folder whose problems/, configs/, reference/, build-cache/ and results/ are the defaults."""
    explicit = os.environ.get(ROOT_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    if IN_CHECKOUT:
        return IMPORT_ROOT
    return Path.cwd()


def configs_dirs() -> list[Path]:
    """Folders searched for a config by name, first match first: <root>/configs, then the shipped configs."""
    return [folder for folder in (data_root() / "configs", SHIPPED_CONFIGS_DIR) if folder.is_dir()]


@contextlib.contextmanager
def use_root(root: Optional[Path]) -> Iterator[None]:
    """Within the block the data root is `root` (None: unchanged). It is set in the environment, so that processes
    started meanwhile (Dask workers of `--scheduler local`) resolve the same root."""
    if root is None:
        yield
        return
    previous = os.environ.get(ROOT_ENV)
    os.environ[ROOT_ENV] = str(root.expanduser().resolve())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ROOT_ENV, None)
        else:
            os.environ[ROOT_ENV] = previous
