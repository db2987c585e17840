#!/usr/bin/env bash
# Idempotent setup: .venv with the dependencies. A torch already installed for python3 (a CUDA build on a GPU
# machine) is reused through --system-site-packages; otherwise the pinned CPU-capable torch==2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet torch==2.13.0
fi
.venv/bin/pip install --quiet -r requirements.txt
.venv/bin/python -c "import torch; print(f'torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}')"
