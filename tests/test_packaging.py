"""Packaging (pyproject.toml): the package installed into a fresh virtual environment, run outside the checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import torch
from conftest import FIXTURES, REPO

from harness.shared.paths import ROOT_ENV

PACKAGE_SOURCES = ("pyproject.toml", "README.md", "harness", "configs")


def _run(*command: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_installed_kernel_judge_works_outside_the_checkout(tmp_path):
    source = tmp_path / "source"    # a copy: a build writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in PACKAGE_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    elsewhere = tmp_path / "elsewhere"   # no problems/ or configs/ here: what the judge needs must come with it
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (ROOT_ENV, "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=elsewhere,
                     env=env).stdout.strip())
    # The packages this interpreter sees (torch, the dependencies, setuptools), shared the way scripts/setup.sh
    # shares a host torch, not the checkout: a venv that already has torch and the dependencies.
    shared = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    assert any(Path(torch.__file__).is_relative_to(p) for p in shared)
    (site / "_shared.pth").write_text("".join(f"{p}\n" for p in shared))
    # setuptools >= 70.1 builds wheels by itself; else pip fetches a build backend (pyproject.toml's build-system).
    has_backend = _run(python, "-c", "import setuptools.command.bdist_wheel", cwd=elsewhere, env=env).returncode == 0
    install = _run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
                   *(["--no-build-isolation"] if has_backend else []), source, cwd=elsewhere, env=env)
    assert install.returncode == 0, install.stderr
    added = {p.name for p in site.iterdir()} - {"_shared.pth", "__pycache__"}
    assert {name.split("-")[0] for name in added} == {"harness", "kernel_judge"}, added   # nothing else pulled

    where = _run(python, "-c", "import harness; print(harness.__file__)", cwd=elsewhere, env=env)
    installed = Path(where.stdout.strip()).parent
    assert installed.is_relative_to(env_dir), where.stdout + where.stderr
    packages = {p.parent.relative_to(REPO / "harness") for p in (REPO / "harness").rglob("__init__.py")}
    assert packages <= {p.parent.relative_to(installed) for p in installed.rglob("__init__.py")}
    assert {p.name for p in (REPO / "configs").glob("*.yaml")} == {p.name for p in (installed / "configs").iterdir()}
    light = "children/candidate/light_include/torch/extension.h"
    assert (installed / light).read_text() == (REPO / "harness" / light).read_text()

    judge = env_dir / "bin" / "kernel-judge"
    usage = _run(judge, "--help", cwd=elsewhere, env=env)
    assert usage.returncode == 0, usage.stderr
    assert all(word in usage.stdout for word in ("submit", "batch", "leaderboard", "--root", "--results-dir"))

    no_code = FIXTURES / "cpu" / "no_code.md"
    results = tmp_path / "results"
    submit = _run(judge, "--root", REPO, "submit", "--problem", "level0/1", "--submission", no_code, "--device",
                  "cpu", "--json", "--results-dir", results, cwd=elsewhere, env=env)
    assert submit.returncode == 0, submit.stderr
    record = json.loads(submit.stdout)
    assert record["status"] == "no_code" and record["problem"] == "level0/1"
    assert (results / "submit" / "records.jsonl").is_file() and not list(elsewhere.iterdir())

    # No root at all: the problem by path, and the config by name from the copy installed with the package.
    problem = next((REPO / "problems" / "level0").glob("1_*.py"))
    strict = _run(judge, "submit", "--problem", problem, "--submission", no_code, "--device", "cpu", "--json",
                  "--config", "strict", "--results-dir", results, cwd=elsewhere, env=env)
    assert strict.returncode == 0, strict.stderr
    assert json.loads(strict.stdout)["profile"] == "strict"
