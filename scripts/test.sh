#!/usr/bin/env bash
# Set up and run the test suite; GPU tests (marker gpu) run only where CUDA is available.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest "$@"
