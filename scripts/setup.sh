#!/usr/bin/env bash
# Idempotent setup: .venv with torch, then this repository installed editable with its dev extras
# (`pip install -e ".[dev]"`, pyproject.toml). torch comes first because the package does not list it (pip would
# resolve it to a multi-GB CUDA build): a torch already installed for python3 (a CUDA build on a GPU machine,
# possibly inside another virtual environment) is reused by putting python3's site-packages on the .venv's path;
# otherwise the pinned torch==2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv --system-site-packages .venv
fi
if "$python" -c "import torch" >/dev/null 2>&1; then
  venv_site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$python" -c "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])" \
    > "$venv_site/_host_site_packages.pth"
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
# Reinstalled only when pyproject.toml changed since (pip rewrites the kernel-judge script on every install).
if [ ! -x .venv/bin/kernel-judge ] || [ pyproject.toml -nt .venv/bin/kernel-judge ]; then
  .venv/bin/pip install --quiet -e ".[dev]"
fi
.venv/bin/python -c "import torch; print(f'torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}')"
